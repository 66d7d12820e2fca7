"""SwapProfile (core/swap_profile.py): the boundary swaps' profile, written once, only when asked for."""
from vla_edge_ros.core.swap_profile import ENV, SwapProfile


def _busy(n: int) -> int:
    return sum(i * i for i in range(n))


def test_profiles_only_the_calls_it_runs_and_writes_both_orders(tmp_path):
    prof = SwapProfile(tmp_path / "sub" / "swaps.txt")
    assert prof.write() is None and not (tmp_path / "sub").exists()      # no call: nothing written
    assert prof.call(_busy, 20_000) == _busy(20_000)
    _busy(10)                                                             # outside: not profiled
    assert prof.call(_busy, n=5_000) == _busy(5_000)
    written = prof.write()
    text = written.read_text()
    assert prof.calls == 2 and text.startswith(f"{ENV}: 2 calls")
    assert "--- sorted by tottime ---" in text and "--- sorted by cumulative ---" in text
    rows = [line.split() for line in text.splitlines() if line.endswith("(_busy)")]
    assert rows and all(row[0] == "2" for row in rows)                  # _busy counted twice, not three times


def test_an_exception_leaves_the_profiler_off(tmp_path):
    prof = SwapProfile(tmp_path / "swaps.txt")
    try:
        prof.call(lambda: 1 / 0)
    except ZeroDivisionError:
        pass
    assert prof.call(_busy, 100) == _busy(100)       # enabling again works: the first call disabled it
    assert prof.write().exists()


def test_off_unless_the_environment_names_a_file(monkeypatch, tmp_path):
    monkeypatch.delenv(ENV, raising=False)
    assert SwapProfile.from_env() is None
    monkeypatch.setenv(ENV, "")
    assert SwapProfile.from_env() is None
    monkeypatch.setenv(ENV, str(tmp_path / "p.txt"))
    assert SwapProfile.from_env().path == tmp_path / "p.txt"
