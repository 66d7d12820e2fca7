"""Where a cycle's time goes: the engine's phase laps add up to its elapsed time, each phase is recorded only in the
cycles it ran in, and the numbers reach the demo/soak report's table through the /diagnostics values."""
import time

import numpy as np
import pytest

from vla_edge_ros.core.engine_factory import primary_engine
from vla_edge_ros import config as C
from vla_edge_ros.core import cycle_result as R
from vla_edge_ros.core.cycle_phases import IN_CYCLE, OVERLAPPING, PhaseClock, PhaseStats
from vla_edge_ros.core.footage import read_clip
from vla_edge_ros.core.frames import Frame
from vla_edge_ros.nodes.conversions import flatten
from vla_edge_ros.tools.demo_report import build_report, format_table


@pytest.fixture(scope="module")
def engine_and_results(tiny_model_dir):
    # A deadline no loaded machine misses with the tiny model: these tests are about the bookkeeping, not speed.
    cfg = C.load(overrides={"model.path": str(tiny_model_dir), "model.backend": "numpy", "cycle.stale_frame_ms": 1e9,
                            "cycle.deadline_ms": 1000.0})
    eng = primary_engine(cfg)
    clip = read_clip("bikes.mp4", max_frames=6)
    results = []
    for i in range(12):
        start = time.perf_counter()
        results.append(eng.run_cycle(Frame(pixels=clip[i % 6], stamp_s=float(i), frame_id=i // 2), now_s=float(i),
                                     cycle_start_perf=start))
    # A cycle that cannot be admitted: its boundary was a whole deadline ago.
    results.append(eng.run_cycle(Frame(pixels=clip[0], stamp_s=12.0, frame_id=7), now_s=12.0,
                                 cycle_start_perf=time.perf_counter() - 1.0))
    return eng, results


def test_the_laps_add_up_to_the_cycle_and_name_only_what_ran(engine_and_results):
    _, results = engine_and_results
    for r in results[:-1]:
        assert r.is_action, r.detail
        assert set(r.phases_ms) <= set(IN_CYCLE) | set(OVERLAPPING)
        off_cpu = r.phases_ms.pop("off_cpu")
        assert 0.0 <= off_cpu <= r.elapsed_ms
        # Linux (as here and on the robot) says how much of it was waiting for a core; the kernel's clock and
        # the thread's CPU clock tick apart, so a wait the thread clock missed may show by a tick's worth.
        assert 0.0 <= r.phases_ms.pop("run_queue") <= off_cpu + 1.0
        assert 0.0 <= r.phases_ms.pop("stolen") <= off_cpu
        assert {"wake", "admission", "slots", "prefill", "decode", "finish"} <= set(r.phases_ms)
        assert ("vision" in r.phases_ms) == r.new_frame          # a repeated frame is not encoded again
        assert r.phases_ms["prefill"] == pytest.approx(r.prefill_ms)
        assert r.phases_ms["decode"] >= r.decode_ms - 1e-6          # plus what ran between the call and the lap
        assert sum(r.phases_ms.values()) == pytest.approx(r.elapsed_ms, abs=1e-6)
    refused = results[-1]
    assert refused.reason == R.REFUSED_BUDGET
    assert "prefill" not in refused.phases_ms and refused.phases_ms["wake"] >= 1000.0


def test_the_phase_table_reaches_the_report_through_diagnostics_values(engine_and_results):
    eng, results = engine_and_results
    eng.phases.record("publish", 0.4)
    eng.phases.record("frame_decode", 0.2)
    summary = eng.phases.summary()
    admitted = [r for r in results if "prefill" in r.phases_ms]
    assert summary["prefill"]["n"] == len(admitted)
    assert summary["prefill"]["p50"] == pytest.approx(np.percentile([r.prefill_ms for r in admitted], 50))
    values = flatten({"phase": summary})                          # as the reasoning node publishes them
    report = build_report([], values, {}, {"seconds": 1.0, "deadline_ms": 33.0, "camera_hz": 60.0})
    assert report["phases_ms"]["decode"]["p99"] == pytest.approx(summary["decode"]["p99"], rel=1e-5)
    assert report["phases_ms"]["late_cycles"] == summary["late_cycles"]
    table = format_table({**report, "model": "tiny", "backend": "numpy", "camera_to_first_action_s": 0.0,
                          "max_publish_ms": 0.0})
    for name in ("wake", "admission", "vision", "slots", "prefill", "decode", "finish", "publish", "frame_decode"):
        assert any(line.startswith(name) for line in table.splitlines()), name
    assert "rebase" not in table.split("where the cycle's time went")[1]   # never ran: no row


def test_phase_names_are_checked_and_stats_are_bounded():
    clock = PhaseClock(time.perf_counter())
    with pytest.raises(ValueError, match="unknown cycle phase 'prefil'"):
        clock.add("prefil", 1.0)
    stats = PhaseStats(samples=4)
    for ms in range(10):
        stats.record_cycle({"decode": float(ms)}, late=ms >= 8)
    s = stats.summary()
    assert s["decode"]["n"] == 4 and s["decode"]["max"] == 9.0 and s["late_cycles"] == 2
    assert s["decode"]["late_p50"] == pytest.approx(8.5)


def test_the_phase_record_is_resident_from_the_start_and_recording_adds_no_memory():
    """A node runs forever: its phase record is allocated and written when it is made, so filling it touches no
    new page (a record that grew as it filled read as a leak in the soaks' memory check). Measured in a fresh
    process: in this one, heap pages freed by earlier tests are resident already and would hide the allocation."""
    import json
    import subprocess
    import sys

    probe = """
import json
from vla_edge_ros.core.cycle_phases import DEFAULT_SAMPLES, PHASES, PhaseStats
from vla_edge_ros.core.metrics import read_memory_bytes
rss = lambda: read_memory_bytes()["VmRSS"]
before = rss()
stats = PhaseStats()
made = rss() - before
filled_from = rss()
for i in range(DEFAULT_SAMPLES):
    stats.record_cycle({name: float(i % 17) for name in PHASES}, late=i % 2 == 0)
print(json.dumps({"made": made, "grown": rss() - filled_from, "n": stats.summary()["decode"]["n"],
                  "reserved": 2 * len(PHASES) * DEFAULT_SAMPLES * 8, "samples": DEFAULT_SAMPLES}))
"""
    out = json.loads(subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True,
                                    text=True).stdout.splitlines()[-1])
    assert out["made"] >= 0.9 * out["reserved"], out          # every ring, all cycles and late ones, resident now
    assert out["grown"] < 0.1 * out["reserved"], out
    assert out["n"] == out["samples"]
