"""`vla-edge soak` verdict (tools/soak.py): what a long run must show, judged from its report and
the memory samples, without running one (the soak itself is a command, not a CI test)."""
from vla_edge_ros.tools import soak

MIB = 2 ** 20


def _samples(rss_by_minute: dict, pid_change_at: float | None = None, minutes: float = 3.0,
             period: float | None = None) -> list:
    """Samples every `period` s (the soak's SAMPLE_PERIOD_S unless given) for `minutes`; rss_by_minute: node ->
    function(t_s) -> MiB."""
    period = soak.SAMPLE_PERIOD_S if period is None else period
    out = []
    for i in range(int(minutes * 60 / period) + 1):
        t = i * period
        out.append({"t_s": t, "rss_bytes": {n: int(f(t) * MIB) for n, f in rss_by_minute.items()},
                    "pid": {n: (2 if pid_change_at is not None and t >= pid_change_at else 1) for n in rss_by_minute}})
    return out


def _report(**kw) -> dict:
    return {"cycle_id_gaps": 0, "lost_cycles": 0, "admitted_miss_rate": 0.0, "ended_early": "", "actions": 5000,
            "restarts": {"camera": 0, "reasoning": 0, "reconciler": 0}, "died_during_run": [],
            "exit_codes": {"camera": 0, "reasoning": 0, "reconciler": 0}, **kw}


def test_growth_in_the_first_minute_is_not_judged_growth_after_it_is():
    warm = _samples({"reasoning": lambda t: 100 + min(t, 60) * 0.5})           # +30 MiB while warming up, flat after
    result = soak.verdict(_report(), warm)
    assert result["passed"] and result["checks"]["rss_growth_reasoning"]["value"] == 0
    leak = _samples({"reasoning": lambda t: 100 + t / 20}, minutes=4)          # 3 MiB a minute, for ever
    result = soak.verdict(_report(), leak)
    # The peak of the last minute (t = 240 s) against the peak of the first after the warm-up (its last sample).
    last_early = max(s["t_s"] for s in leak if s["t_s"] < 120)
    assert not result["passed"] and result["checks"]["rss_growth_reasoning"]["value"] == \
        int(112 * MIB) - int((100 + last_early / 20) * MIB)
    assert "FAIL rss_growth_reasoning" in soak.format_verdict(result)


def test_a_heap_that_swings_within_a_bound_is_no_growth_wherever_the_last_sample_falls():
    """A sawtooth of 40 MiB every 50 s (the 7B soak's reasoning node): its peaks stay; a leak on top of it shows."""
    def swing(t):
        return 470 + 40 * ((t % 50) / 50)
    for shift in (0, 20, 40):
        result = soak.verdict(_report(), _samples({"reasoning": lambda t: swing(t + shift)}, minutes=4))
        assert result["passed"], (shift, result["checks"]["rss_growth_reasoning"])
    leaking = _samples({"reasoning": lambda t: swing(t) + t / 20}, minutes=4)
    assert not soak.verdict(_report(), leaking)["passed"]


def test_a_heap_trimmed_about_every_10_s_reads_as_no_growth_sampled_every_second():
    """The model nodes hand their free heap back every ~10 s (memory.heap_trim_interval_s; 23-25 trims in a 240 s H200
    soak): a sawtooth of ~7 MiB (the fifteenth session's reconciler: 389-396 MiB) with a period of ~10.4 s and no
    growth. Sampled every second each window holds whole teeth, whatever their phase; sampled every 10 s (the soak
    before), the part of a tooth each sample saw drifted, and the windows' highest samples read several MiB of
    growth that was not there. A leak on top of the teeth still shows."""
    def teeth(shift):
        return lambda t: 389 + 7 * (((t + shift) % 10.4) / 10.4)
    for shift in (0.0, 2.6, 5.2, 7.8):
        growth = soak.rss_growth(_samples({"reconciler": teeth(shift)}, minutes=4))["reconciler"]
        assert abs(growth) < 0.4 * MIB, (shift, growth / MIB)
    aliased = [soak.rss_growth(_samples({"reconciler": teeth(shift)}, minutes=4, period=10.0))["reconciler"]
               for shift in (0.0, 2.6, 5.2, 7.8)]
    assert max(aliased) > 2.5 * MIB, [a / MIB for a in aliased]                   # what 10 s sampling read
    leaking = _samples({"reconciler": lambda t: teeth(0.0)(t) + t / 20}, minutes=4)   # 3 MiB a minute under them
    assert not soak.verdict(_report(), leaking)["passed"]


def test_gaps_lost_cycles_misses_and_a_restart_fail_the_soak():
    flat = _samples({"reasoning": lambda t: 100, "reconciler": lambda t: 80})
    assert soak.verdict(_report(), flat)["passed"]
    assert not soak.verdict(_report(cycle_id_gaps=1), flat)["passed"]
    assert not soak.verdict(_report(lost_cycles=3, ended_early="node 'reasoning' exited"), flat)["passed"]
    assert not soak.verdict(_report(admitted_miss_rate=0.0011), flat)["passed"]
    assert soak.verdict(_report(admitted_miss_rate=0.001), flat)["passed"]
    restarted = _samples({"reconciler": lambda t: 80}, pid_change_at=120.0)     # a new process: growth unknown
    result = soak.verdict(_report(), restarted)
    assert result["checks"]["rss_growth_reconciler"]["value"] is None and not result["passed"]


def test_the_growth_is_split_by_kind_from_the_real_proc_status_of_a_process():
    """The sampler reads VmRSS and its parts of a live process; a process that maps 32 MiB of anonymous memory
    between two samples shows it as anon growth, and the verdict prints the split."""
    import subprocess
    import sys

    class Procs:
        def __init__(self, proc):
            self.procs = {"worker": proc}

    child = subprocess.Popen([sys.executable, "-c", "import sys, numpy as np\n"
                              "sys.stdin.readline(); a = np.ones(32 * 2**20, np.uint8); print('ok', flush=True)\n"
                              "sys.stdin.readline()"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        sampler = soak.MemorySampler()
        sampler.maybe_sample(Procs(child))
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "ok"
        sampler._next = 0.0                                      # take the next sample now
        sampler.maybe_sample(Procs(child))
    finally:
        child.stdin.write("\n")
        child.stdin.flush()
        child.wait(timeout=10)
    first, last = sampler.samples
    assert set(first["rss_kinds"]["worker"]) == {"anon", "file", "shmem"}
    end = soak.WARMUP_S + 2 * soak.PEAK_WINDOW_S                  # two windows apart: judged
    kinds = soak.rss_growth_by_kind([dict(first, t_s=soak.WARMUP_S), dict(last, t_s=end)])["worker"]
    assert kinds["anon"] >= 30 * MIB and abs(kinds["shmem"]) < MIB, kinds
    assert last["rss_bytes"]["worker"] - first["rss_bytes"]["worker"] >= 30 * MIB
    result = soak.verdict(_report(), [dict(first, t_s=soak.WARMUP_S), dict(last, t_s=end)])
    assert "by kind: anon +" in soak.format_verdict(result)


def test_a_run_too_short_for_two_memory_windows_cannot_pass_on_memory():
    """The first and the last window of a run under WARMUP_S + 2 PEAK_WINDOW_S hold the same samples: its growth
    read exactly 0 whatever the nodes did (a leak of 20 MiB a minute passed a 2-minute soak). Such a run fails,
    saying why."""
    leak = _samples({"reasoning": lambda t: 100 + t / 3}, minutes=2)             # 20 MiB a minute
    result = soak.verdict(_report(), leak)
    assert not result["passed"] and "rss_growth_reasoning" not in result["checks"]
    assert "a soak of at least 3 minutes" in soak.format_verdict(result)
    assert not soak.verdict(_report(), [])["passed"], "no memory samples: nothing judged"


def test_a_run_of_no_actions_or_with_a_failed_node_fails_the_soak():
    """Every cycle answered by a refusal, an engine error or a missing frame has no gaps and no admitted misses;
    a node that restarted, died or exited with an error is a failed soak whatever the counts say."""
    flat = _samples({"reasoning": lambda t: 100})
    assert soak.verdict(_report(), flat)["passed"]
    assert not soak.verdict(_report(actions=0), flat)["passed"]
    assert not soak.verdict(_report(restarts={"camera": 0, "reasoning": 0, "reconciler": 1}), flat)["passed"]
    assert not soak.verdict(_report(died_during_run=["camera"]), flat)["passed"]
    failed = soak.verdict(_report(exit_codes={"camera": 0, "reasoning": -11, "reconciler": 0}), flat)
    assert not failed["passed"] and "reasoning exit -11" in soak.format_verdict(failed)
