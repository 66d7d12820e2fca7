"""core/heap_trim.py: free heap memory handed back to the OS between cycles.

The mechanism in a clean process with the node's glibc thresholds (core/malloc_threshold.py): a burst of extra
live vision-row arrays, once freed, stays resident as free heap; one trim returns it. And the trim's gating: at
most once per interval, only with enough slack before the next boundary, off at interval 0.
"""
import subprocess
import sys
import textwrap

import pytest

from vla_edge_ros import config as C
from vla_edge_ros.core.heap_trim import HeapTrim

BURST = textwrap.dedent("""
    import collections, numpy as np
    from vla_edge_ros.core.malloc_threshold import pin_mmap_threshold
    from vla_edge_ros.core.heap_trim import HeapTrim
    assert pin_mmap_threshold(4.0) is None                # the nodes' default (memory.malloc_mmap_threshold_mib)
    def rss_mib():
        return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2 ** 20
    frames = collections.OrderedDict()                    # the retained frames' vision rows, oldest first
    def admit(i):
        a = np.empty((32, 1536), np.float32); a.fill(1.0)  # one frame's rows on the 1.5B shape: 192 KiB
        frames[i] = a
        if len(frames) > 125:
            frames.popitem(last=False)
    for i in range(2000):
        admit(i)
    steady = rss_mib()
    burst = [np.array(a) for a in list(frames.values())[:30]]   # 30 extra live copies at once, then gone
    del burst
    for i in range(2000, 4000):
        admit(i)
    after_burst = rss_mib()
    trim = HeapTrim(interval_s=1e-9, min_slack_ms=0.0)
    ms = trim.maybe_trim(slack_ms=30.0)
    print(steady, after_burst, rss_mib(), ms)
""")


def test_a_freed_burst_stays_resident_until_the_heap_is_trimmed():
    done = subprocess.run([sys.executable, "-c", BURST], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    steady, after_burst, after_trim, ms = (float(x) for x in done.stdout.split())
    assert after_burst - steady > 3.0, (steady, after_burst)      # ~5.6 MiB of freed rows still resident
    assert after_trim - steady < 1.0, (steady, after_burst, after_trim)
    assert 0.0 <= ms < 100.0


class _Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_the_trim_runs_at_most_once_per_interval_and_only_with_slack():
    clock = _Clock()
    trim = HeapTrim(interval_s=10.0, min_slack_ms=8.0, clock=clock)
    assert trim.why_off is None
    assert trim.maybe_trim(slack_ms=20.0) is None            # not due: the interval counts from construction
    clock.t += 10.0
    assert trim.maybe_trim(slack_ms=7.9) is None             # due, but too close to the next boundary
    assert trim.maybe_trim(slack_ms=8.0) is not None and trim.count == 1
    clock.t += 9.9
    assert trim.maybe_trim(slack_ms=30.0) is None            # once per interval
    clock.t += 0.1
    assert trim.maybe_trim(slack_ms=30.0) is not None and trim.count == 2


def test_interval_zero_turns_it_off_and_says_so():
    trim = HeapTrim(interval_s=0.0, min_slack_ms=0.0)
    assert trim.maybe_trim(slack_ms=1e9) is None and trim.count == 0
    assert "heap_trim_interval_s is 0" in trim.why_off
    with pytest.raises(ValueError, match="interval_s >= 0"):
        HeapTrim(interval_s=-1.0, min_slack_ms=0.0)
    with pytest.raises(C.ConfigError, match="heap_trim_interval_s"):
        C.load().replace({"memory.heap_trim_interval_s": -1.0})


def test_the_reconciler_worker_trims_while_no_round_runs(tiny_model_dir, tmp_path):
    """The reconciler's worker (its own thread, as in the node) trims the heap while idle: no frame ever arrives,
    so no round runs, and at an interval of 50 ms it has trimmed within a second; at 0 it never does."""
    import time
    from vla_edge_ros.core.engine_factory import reconciler_state
    from vla_edge_ros.core.reconciliation import StateReconciler
    from vla_edge_ros.core.swap_protocol import ReconcilerWorker, SnapshotStore
    for interval, trims in ((0.05, lambda n: n >= 2), (0.0, lambda n: n == 0)):
        cfg = C.load(overrides={"model.path": str(tiny_model_dir), "memory.heap_trim_interval_s": interval})
        worker = ReconcilerWorker(StateReconciler(cfg, reconciler_state(cfg)), SnapshotStore(tmp_path / f"s{interval}"))
        worker.start()
        try:
            time.sleep(1.0)
        finally:
            worker.stop()
        assert trims(worker.summary()["heap_trims"]), (interval, worker.summary()["heap_trims"])
