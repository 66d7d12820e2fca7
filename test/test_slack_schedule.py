"""The reconciler works only in the primary's slack: the cycle clock shared between the two node
processes (core/cycle_clock.py) and the step sizing both drivers use (core/slack_scheduler.py).

The worker test runs a real StateReconciler on the numpy tiny engine against a
primary that publishes cycle ends on the real shared file, and records when
each reconciler step ran: every step must start after a cycle ended and end
before that cycle's next boundary.
"""
import subprocess
import sys
import threading
import time

import pytest

from vla_edge_ros import config as C
from vla_edge_ros.core.cycle_clock import CycleClockReader, CycleClockWriter, clock_path
from vla_edge_ros.core.gap_ledger import SUMMARY_PREFIXES, GapLedger
from vla_edge_ros.core.engine_factory import reconciler_state
from vla_edge_ros.core.footage import read_clip
from vla_edge_ros.core.frames import Frame
from vla_edge_ros.core.reconciliation import StateReconciler
from vla_edge_ros.core.slack_scheduler import HEADROOM, PROBE_MIN_SHARE, SlackScheduler
from vla_edge_ros.core.step_costs import StepCosts
from vla_edge_ros.core.swap_protocol import ReconcilerWorker, SnapshotStore

READER = """
import sys, time
from vla_edge_ros.core.cycle_clock import CycleClockReader
r = CycleClockReader(sys.argv[1])
w = r.window()
print("none" if w is None else f"{w[0]} {w[1]}")
"""


def test_the_clock_crosses_processes_and_goes_stale_without_cycles(tmp_path):
    path = tmp_path / "clock"
    writer = CycleClockWriter(path, period_s=0.033)
    reader = CycleClockReader(path)
    assert reader.window() is None                           # written, but no cycle has ended yet
    now = time.perf_counter_ns()
    writer.cycle_ended(now + 9_000_000, end_ns=now)
    seq, left = reader.window(now_ns=now + 1_000_000)
    assert left == 8_000_000 and seq % 2 == 0
    assert reader.window(now_ns=now + 4 * 33_000_000) is None   # no cycle for 3 periods: the primary is idle
    # Another process reads the same window, later. Its interpreter may take longer to start than 3 periods of 33
    # ms on a loaded machine (the reader would call the primary idle), so this writer's period is 60 s.
    slow_path = tmp_path / "slow_clock"
    slow = CycleClockWriter(slow_path, period_s=60.0)
    t0 = time.perf_counter_ns()
    slow.cycle_ended(t0 + 30_000_000_000, end_ns=t0)
    slow_seq, _ = CycleClockReader(slow_path).window()
    out = subprocess.run([sys.executable, "-c", READER, str(slow_path)], capture_output=True, text=True, timeout=60)
    child_seq, child_left = (int(v) for v in out.stdout.split())
    waited = time.perf_counter_ns() - t0                      # the child read between t0 and now: later than t0
    assert child_seq == slow_seq and 30_000_000_000 - waited <= child_left < 30_000_000_000
    slow.close()
    second = CycleClockWriter(path, period_s=1.0)            # a restarted primary replaces the file ...
    second.cycle_ended(time.perf_counter_ns() + 5_000_000)
    assert reader.window() is not None                       # ... and the reader finds the new one
    writer.close()
    assert path.exists(), "the first writer removed its successor's file"
    second.close()
    assert not path.exists() and reader.window() is None


def test_clock_paths_keep_graphs_apart():
    assert clock_path(3, "/") != clock_path(4, "/") != clock_path(3, "/robot_b")
    assert clock_path(None, "/").name.endswith("d0_root")


def test_steps_are_sized_to_the_window_with_headroom_and_margin():
    sched = SlackScheduler(tokens_per_frame=32, max_tokens_per_step=128, margin_ms=2.0)
    assert sched.frames_for(1.5) == 0 and sched.windows_too_small == 1
    assert sched.frames_for(10.0) == 1                      # no measurement yet: a one-frame probe
    sched.observe(19.2, 32)                                  # the first step: one-time costs, not a measurement
    assert sched.frames_for(10.0) == 0                       # a step of unknown cost only opens a window ...
    sched.new_window(gap_ms=30.0)
    assert sched.frames_for(10.0) == 0                       # ... that has most of its gap left
    sched.new_window(gap_ms=12.0)
    assert sched.costs.estimate(1) is None and sched.frames_for(10.0) == 1   # so a second one-frame probe
    sched.observe(4.8, 32)                                   # one frame: 4.8 ms
    # Two frames, not measured: planned at twice one frame (an upper bound when a step has a fixed part).
    assert sched.planned_ms(2) == pytest.approx(HEADROOM * 9.6)
    assert sched.frames_for(2.0 + HEADROOM * 9.6 + 0.1) == 2
    assert sched.frames_for(100.0) == 2                      # untried sizes are reached gradually: 2x measured
    assert sched.frames_for(2.0 + HEADROOM * 4.8 - 0.1) == 0
    sched.observe(30.0, 64)                                  # two frames, the first time: that size's warm-up
    assert sched.costs.estimate(2) == pytest.approx(9.6) and sched.frames_for(100.0) == 2     # not measured yet
    sched.observe(6.0, 64)                                   # two frames: 6.0 ms, a fixed part shows
    assert sched.costs.estimate(4) == pytest.approx(3.6 + 1.2 * 4)    # fit 3.6 + 1.2 k over the sizes measured
    assert sched.frames_for(100.0) == 4                      # capped at max_tokens_per_step (4 frames)
    assert sched.summary()["step_ms_by_frames"] == {"1": 4.8, "2": 6.0}


def test_with_a_fixed_cost_per_forward_steps_grow_to_the_largest_that_fits():
    """The GPU's bulk prefill: a forward costs ~3 ms plus a little per row. Steps double while the measured costs
    say the next size fits, and settle on the largest size whose estimate fits the gap."""
    sched = SlackScheduler(tokens_per_frame=32, max_tokens_per_step=1024, margin_ms=2.0)
    window = 2.0 + 10.0

    def cost(frames):                                        # the device: 3 ms + 0.05 ms per frame
        return 3.0 + 0.05 * frames

    planned = []
    sched.observe(40.0, 32)                                  # warm-up
    for _ in range(12):
        frames = sched.frames_for(window)
        planned.append(frames)
        sched.observe(cost(frames), frames * 32)
    # each size measured (after its warm-up step) before twice it is planned
    assert planned[:10] == [1, 2, 2, 4, 4, 8, 8, 16, 16, 32], planned
    assert planned[-1] == 32                                 # the cap: 1024 tokens
    assert all(HEADROOM * cost(f) <= 10.0 for f in planned)  # never planned past the window


def test_estimates_never_undercut_a_smaller_measured_step():
    sched = SlackScheduler(tokens_per_frame=32, max_tokens_per_step=512, margin_ms=0.0)
    sched.observe(50.0, 32)                                  # warm-up
    for frames, ms in ((1, 4.0), (4, 3.0), (8, 9.0)):        # noise: four frames measured cheaper than one
        sched.observe(ms, frames * 32)
        sched.observe(ms, frames * 32)                       # (the first of each size is its warm-up)
    assert sched.costs.estimate(2) >= 4.0 and sched.costs.estimate(3) >= 4.0
    assert sched.costs.estimate(6) >= 4.0 and sched.costs.estimate(16) >= 9.0
    assert sched.costs.eligible(sched.max_frames) == 16


def test_an_offer_is_planned_in_the_window_too():
    sched = SlackScheduler(tokens_per_frame=32, max_tokens_per_step=128, margin_ms=2.0)
    assert not sched.offer_fits(2.0) and sched.offer_fits(2.1)      # unmeasured, gap unknown: any usable window
    sched.observe_offer(30.0)                                 # the first export: one-time costs, not measured
    assert sched.offer_fits(2.1)
    sched.observe_offer(4.0)
    assert not sched.offer_fits(2.0 + HEADROOM * 4.0 - 0.1) and sched.offer_fits(2.0 + HEADROOM * 4.0)
    assert sched.summary()["offer_ms"] == pytest.approx(4.0) and sched.summary()["offers_postponed"] == 2


def test_an_offer_of_unknown_cost_needs_most_of_its_gap_as_a_probe_step_does():
    sched = SlackScheduler(tokens_per_frame=32, max_tokens_per_step=128, margin_ms=2.0)
    for _ in range(2):                                        # the warm-up export, then the first measured one
        sched.new_window(20.0)
        assert not sched.offer_fits(PROBE_MIN_SHARE * 20.0 - 0.1)     # what steps left of the gap: not tried
        assert sched.offer_fits(PROBE_MIN_SHARE * 20.0)
        sched.observe_offer(6.0)
    sched.new_window(20.0)                                    # measured: planned by its cost, wherever it falls
    assert sched.offer_fits(2.0 + HEADROOM * 6.0) and not sched.offer_fits(2.0 + HEADROOM * 6.0 - 0.1)


def test_an_offer_of_unknown_cost_waits_for_half_a_gap_only_so_long():
    """Once a round has caught up, each gap's first step computes the frame that just arrived; where it takes more
    than half the gap, no gap leaves an unmeasured export its share, and nothing would ever measure one. So after
    UNKNOWN_OFFER_PATIENCE gaps it takes any usable time, as before the share rule."""
    from vla_edge_ros.core.slack_scheduler import UNKNOWN_OFFER_PATIENCE
    sched = SlackScheduler(tokens_per_frame=32, max_tokens_per_step=128, margin_ms=2.0)
    tried = []
    for _ in range(UNKNOWN_OFFER_PATIENCE + 1):
        sched.new_window(20.0)
        tried.append(sched.offer_fits(7.0))                   # 13 ms of the gap went to its step
    assert tried == [False] * UNKNOWN_OFFER_PATIENCE + [True]
    assert not sched.offer_fits(2.0), "still only in usable time"


def test_a_gap_the_driver_plans_twice_is_declined_once():
    """The node's worker plans each gap twice (steps, the inbox drained, steps again): a gap that fits nothing
    counts once toward starvation and its relaxation, as STARVED_AFTER_WINDOWS says, not twice."""
    from vla_edge_ros.core.slack_scheduler import STARVED_AFTER_WINDOWS
    sched = SlackScheduler(tokens_per_frame=32, max_tokens_per_step=128, margin_ms=2.0)
    sched.observe(20.0, 32)                                   # warm-up
    for _ in range(4):
        sched.observe(12.0, 32)
    for _ in range(STARVED_AFTER_WINDOWS - 1):
        sched.new_window(9.0)
        assert sched.frames_for(9.0) == 0 and sched.frames_for(8.0) == 0
    assert not sched.starved and sched.windows_too_small == STARVED_AFTER_WINDOWS - 1
    sched.new_window(9.0)
    sched.frames_for(9.0)
    assert sched.starved


def test_relaxing_an_estimate_that_follows_the_context_never_raises_it():
    """asr.step_cost_follows_context: samples moved to the context planned for, then relaxed by the same factor
    and floored by the moved samples. Relaxed as one figure taken from the samples as measured, the estimate at
    the start of a round (little context) went up: 1.5 -> 4.75 ms here."""
    costs = StepCosts(follow_context=True)
    costs.observe(1, 99.0, 100)                               # warm-up
    for i in range(16):                                       # 1 ms + 0.001 ms per context token
        costs.observe(1, 1.0 + 0.001 * 1000 * (i + 1), 1000 * (i + 1))
    early, late = costs.estimate(1, 500), costs.estimate(1, 16000)
    assert early == pytest.approx(1.5, abs=0.05) and late == pytest.approx(17.0, abs=0.3)
    assert costs.relax(0.5, 10)
    assert costs.estimate(1, 500) <= early and costs.estimate(1, 16000) <= late
    assert costs.estimate(1, 16000) >= 0.5 * late, "never below what half the factor allows"


@pytest.fixture(scope="module")
def frames():
    return read_clip("bikes.mp4", max_frames=24)


def test_the_worker_steps_only_between_a_cycle_end_and_the_next_boundary(tiny_model_dir, frames, tmp_path):
    cfg = C.load(overrides={"model.path": str(tiny_model_dir), "model.backend": "numpy", "kv.capacity_tokens": 480,
                            "asr.warmup_tokens_per_step": 64})
    rec = StateReconciler(cfg, reconciler_state(cfg))
    steps = []
    real_step = rec.step

    def recorded_step(max_tokens):                            # instrumentation: when each step ran
        t0 = time.perf_counter_ns()
        done = real_step(max_tokens)
        if done:
            steps.append((t0, time.perf_counter_ns(), done))
        return done

    rec.step = recorded_step
    offers = []
    real_make_offer = rec.make_offer

    def recorded_make_offer():                                # the export is device work too: inside a gap
        t0 = time.perf_counter_ns()
        snap = real_make_offer()
        offers.append((t0, time.perf_counter_ns(), 0))
        return snap

    rec.make_offer = recorded_make_offer
    path = tmp_path / "clock"
    writer = CycleClockWriter(path, period_s=0.040)
    worker = ReconcilerWorker(rec, SnapshotStore(tmp_path / "snaps"), clock=CycleClockReader(path))
    cycles = []                                               # (cycle end, next boundary) the primary published
    stop = threading.Event()

    def primary():                                            # 40 ms cycles: 15 ms busy, then 25 ms of slack
        boundary = time.perf_counter_ns()
        while not stop.is_set():
            time.sleep(max(0.0, (boundary + 15_000_000 - time.perf_counter_ns()) / 1e9))
            end, nxt = time.perf_counter_ns(), boundary + 40_000_000
            cycles.append((end, nxt))
            writer.cycle_ended(nxt, end_ns=end)
            time.sleep(max(0.0, (nxt - time.perf_counter_ns()) / 1e9))
            boundary = nxt

    thread = threading.Thread(target=primary, daemon=True)
    thread.start()
    while not cycles:                                         # the primary is live before the work arrives
        time.sleep(0.005)
    worker.start()
    try:
        for i, px in enumerate(frames[:12]):                  # 12 frames: a csr round starts at the 11th
            worker.on_chunk(Frame(px, float(i), i + 1), 0, i + 1)
        deadline = time.monotonic() + 30
        while worker.offer is None and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        worker.stop()
        stop.set()
        thread.join(timeout=2)
        writer.close()
    assert worker.offer is not None and worker.error is None, worker.summary()
    assert len(steps) >= 2 and offers, (steps, offers)
    for start, end, _ in steps + offers:
        gap = next(((e, n) for e, n in reversed(cycles) if e <= start), None)
        assert gap is not None, "a step started before any cycle had ended"
        # A step is planned to fit its window with HEADROOM; on a busy 2-core machine the numpy step itself can
        # run longer than planned (one ran 0.38 ms past the boundary in CI). What a schedule that ignored the
        # window would do, starting steps that mostly lie past the boundary, still fails here.
        over = end - gap[1]
        assert over <= 0.5 * (end - start), (f"a step of {(end - start) / 1e6:.2f} ms ran {over / 1e6:.2f} ms into "
                                             f"the next cycle")
    summary = worker.summary()
    assert summary["schedule"] == "slack" and summary["steps"] == len(steps)
    assert 0 < summary["step_host_ms_per_token_p50"] <= summary["step_ms_per_token_p50"], summary
    # The gap ledger: every gap it counts is one the primary published; the gaps are the 25 ms of slack (less where
    # the primary's thread woke late for its cycle end on a loaded machine, never more).
    assert 1 <= summary["gaps_stepped"] <= summary["gaps_seen"] <= len(cycles), summary
    assert 10 <= summary["gap_ms_p50"] <= 25.5 and 0 <= summary["gap_late_ms_p50"] < summary["gap_ms_p50"], summary
    assert summary["gap_frames_mean"] > 0 and summary["drain_ms_max"] > 0, summary


def test_the_gap_ledger_counts_cycle_ends_it_never_read_only_while_a_round_has_work():
    ledger = GapLedger()
    assert ledger.seen(2, 25.0, 24.0, busy=True)
    assert not ledger.seen(2, 25.0, 10.0, busy=True)         # the same cycle end read again: not a new gap
    assert ledger.seen(8, 25.0, 5.0, busy=True)              # cycle ends 4 and 6 were never read
    assert ledger.seen(14, 25.0, 20.0, busy=False)           # 10 and 12 passed while there was nothing to do
    ledger.used(25.0, 12.5, 3, fitted=True, backlog=8)
    ledger.used(25.0, 0.0, 0, fitted=False, backlog=1)
    s = ledger.summary()
    assert (s["gaps_seen"], s["gaps_missed"], s["gaps_idle"], s["gaps_stepped"], s["gaps_nothing_fit"]) == \
        (3, 2, 1, 1, 1), s
    assert s["gap_late_ms_p50"] == 10.5 and s["gap_used_share_p50"] == 0.25 and s["gap_frames_mean"] == 1.5, s
    assert s["gap_frames_backlogged_mean"] == 3, s                  # the gap that began with 8 frames to compute
    assert all(k.startswith(SUMMARY_PREFIXES) for k in s), s       # what the demo report picks its fields by


def test_a_step_that_does_not_fit_is_never_started_and_starvation_is_reported():
    """On the H200 a one-frame reconciler step cost ~12 ms while the primary left ~5 ms: trying it anyway
    made late cycles. It is declined every time, and after STARVED_AFTER_WINDOWS the scheduler says so."""
    from vla_edge_ros.core.slack_scheduler import STARVED_AFTER_WINDOWS
    sched = SlackScheduler(tokens_per_frame=32, max_tokens_per_step=128, margin_ms=2.0)
    sched.observe(12.0, 32)                                  # warm-up step
    sched.observe(12.0, 32)
    assert [sched.frames_for(7.0) for _ in range(STARVED_AFTER_WINDOWS)] == [0] * STARVED_AFTER_WINDOWS
    assert sched.starved and sched.one_frame_ms() == pytest.approx(HEADROOM * 12.0)
    assert sched.relaxations == 0                            # nothing cheaper was ever measured: no relaxing
    assert sched.frames_for(2.0 + HEADROOM * 12.0 + 0.1) == 1 and not sched.starved


def test_an_estimate_inflated_by_a_burst_relaxes_to_costs_really_measured():
    """A loaded machine (CI) measured expensive steps for long enough to move the median: the estimate then
    fitted no window, and with no step there was no new measurement, so the reconciler starved for good. Now
    each STARVED_AFTER_WINDOWS declined windows halve the estimate, never below the 10th percentile of the
    measured costs."""
    from vla_edge_ros.core.slack_scheduler import STARVED_AFTER_WINDOWS
    sched = SlackScheduler(tokens_per_frame=32, max_tokens_per_step=128, margin_ms=2.0)
    sched.observe(20.0, 32)                                  # warm-up step
    for _ in range(8):
        sched.observe(3.2, 32)                               # 0.1 ms per token: 4 ms planned per frame
    for _ in range(10):
        sched.observe(25.6, 32)                              # a burst at 0.8 ms per token, most of the samples
    assert sched.costs.estimate(1) > 0.7 * 32
    window = 2.0 + 4.5                                       # fits a frame at the cost measured before the burst
    declined = [sched.frames_for(window) for _ in range(STARVED_AFTER_WINDOWS)]
    assert declined == [0] * STARVED_AFTER_WINDOWS and sched.starved and sched.relaxations == 1
    while sched.frames_for(window) == 0:
        assert sched.relaxations < 5, "the estimate never came back down"
    assert sched.costs.estimate(1) == pytest.approx(3.2) and not sched.starved
    assert sched.summary()["relaxations"] == sched.relaxations


def test_the_summary_reports_the_spread_of_step_costs_without_the_warm_up():
    sched = SlackScheduler(tokens_per_frame=32, max_tokens_per_step=128, margin_ms=2.0)
    assert sched.summary()["step_ms_per_token_p50"] == "" and sched.summary()["step_host_ms_per_token_p50"] == ""
    sched.observe(40.0, 32, host_ms=30.0)                    # warm-up: reported apart, not in the spread
    for i in range(10):                                      # 0.1 .. 1.0 ms per token, a tenth of it on the host
        sched.observe(3.2 * (i + 1), 32, host_ms=0.32 * (i + 1))
    s = sched.summary()
    assert s["warmup_step_ms_per_token"] == pytest.approx(1.25)
    # metrics.percentile: linear between the closest ranks, as numpy's default
    assert (s["step_ms_per_token_p10"], s["step_ms_per_token_p50"], s["step_ms_per_token_p90"]) == \
        pytest.approx((0.19, 0.55, 0.91))
    assert s["step_host_ms_per_token_p50"] == pytest.approx(0.055)
    sched.observe(3.2, 32)                                   # a caller that cannot split host and device time
    assert sched.summary()["step_host_ms_per_token_p50"] == pytest.approx(0.055)


def test_one_slow_step_does_not_price_its_size_out_of_the_gap():
    """The H200 graph: one 4-frame step measured 38 ms (it met a cycle, or paid a one-time cost) where 4 frames
    cost ~7 ms, and as a running average that one sample kept every step above 2 frames out of the gap for the
    rest of a 4-minute soak. The median of a size's samples shrugs it off."""
    sched = SlackScheduler(tokens_per_frame=32, max_tokens_per_step=256, margin_ms=2.0)
    sched.observe(40.0, 32)                                  # warm-up of the process (and of one frame)
    for frames, ms in ((1, 3.5), (2, 5.5), (4, 6.6)):
        for _ in range(4):                                   # the first of each size is its warm-up
            sched.observe(ms, frames * 32)
    sched.observe(38.0, 4 * 32)                              # one slow step
    assert sched.costs.estimate(4) == pytest.approx(6.6)
    assert sched.frames_for(2.0 + HEADROOM * 6.6 + 0.1) == 4


def _a_round_at_growing_context(sched, cost, sizes, start=100, grow=128):
    """Steps of the given sizes through a round: the state grows by `grow` tokens a frame computed (its own 32 and
    the primary's frames mirrored meanwhile)."""
    context = start
    for frames in sizes:
        sched.observe(cost(frames, context), frames * 32, context_tokens=context)
        context += frames * grow
    return context


def test_following_the_context_plans_a_late_step_at_its_own_context():
    """A step's rows attend to the state held so far: on the 1.5B at 32K on the H200 a one-frame step cost ~3 ms
    over an empty state and ~3x that over ~600 frames. The median of a size's samples lags that growth; moved to
    the step's own context it does not, and a spike (one step meeting a cycle) does not bend the slope."""
    def cost(frames, context):                               # 1 ms + 0.2 ms a frame + 0.3 us a frame per token held
        return 1.0 + frames * (0.2 + 0.3e-3 * context)

    blind = SlackScheduler(tokens_per_frame=32, max_tokens_per_step=128, margin_ms=0.0)
    aware = SlackScheduler(tokens_per_frame=32, max_tokens_per_step=128, margin_ms=0.0, follow_context=True)
    sizes = [1] + [1, 2] * 20 + [2] * 4                      # warm-ups first, then a round's steps
    for sched in (blind, aware):
        sched.observe(40.0, 32, context_tokens=0)            # the process's warm-up
        end = _a_round_at_growing_context(sched, cost, sizes)
    aware.observe(60.0, 64, context_tokens=end - 64)         # a spike, late in the round
    blind.observe(60.0, 64, context_tokens=end - 64)
    late = end + 64
    assert aware.costs.ms_per_frame_context == pytest.approx(0.3e-3, rel=0.05)
    for frames in (1, 2):
        truth = cost(frames, late)
        assert aware.costs.estimate(frames, late) == pytest.approx(truth, rel=0.05)
        assert blind.costs.estimate(frames, late) < 0.75 * truth       # the median of the round so far
    # A window that the truth fits only at one frame: the blind plan takes two and overruns, the aware one does not.
    window = HEADROOM * blind.costs.estimate(2, late) + 0.05
    assert HEADROOM * cost(1, late) <= window < HEADROOM * cost(2, late)
    assert blind.frames_for(window, late) == 2 and aware.frames_for(window, late) == 1
    # Without the context (a caller that does not give it) the plan is the samples' own median, as before.
    assert aware.costs.estimate(1) == pytest.approx(blind.costs.estimate(1))
    assert aware.summary()["step_ms_per_frame_context"] == aware.costs.ms_per_frame_context
    assert blind.costs.ms_per_frame_context == 0.0


def test_a_slope_needs_samples_spread_over_the_context():
    """Steps all at about the same context (the CPU's small arenas) say nothing about the context: no slope."""
    sched = SlackScheduler(tokens_per_frame=32, max_tokens_per_step=128, margin_ms=0.0, follow_context=True)
    sched.observe(40.0, 32, context_tokens=0)
    for i in range(30):
        sched.observe(3.0 + 0.01 * (i % 3), 32, context_tokens=900 + (i % 5))
    assert sched.costs.ms_per_frame_context == 0.0
    assert sched.costs.estimate(1, 30_000) == pytest.approx(sched.costs.estimate(1))


def test_a_step_planned_in_pieces_fits_by_its_largest_piece_and_a_piece_that_never_fits_starves():
    """core/gap_steps.py's plans: fitting_frames with a share (a piece of a step's layers) allows bigger steps than
    the window holds whole, without counting a plan; plan_piece counts as frames_for does, so a piece that never
    fits ends in `starved` after STARVED_AFTER_WINDOWS declined gaps."""
    from vla_edge_ros.core.slack_scheduler import STARVED_AFTER_WINDOWS
    sched = SlackScheduler(tokens_per_frame=32, max_tokens_per_step=256, margin_ms=2.0)
    assert sched.fitting_frames(20.0) == 0                                  # nothing measured: no plan
    for frames, ms in ((1, 12.0), (2, 16.0), (4, 24.0), (8, 40.0)):
        sched.observe(ms, frames * 32)                                      # each size's warm-up
        sched.observe(ms, frames * 32)
    assert sched.fitting_frames(20.0) == 1                                  # 1.25 x 12 <= 18
    # The costs are 8 + 4 k exactly, so the fit between the sizes is too: 5 frames cost 28, 6 cost 32.
    assert sched.fitting_frames(20.0, share=0.5) == 5                       # 1.25 x 28 / 2 <= 18 < 1.25 x 32 / 2
    assert sched.fitting_frames(20.0, share=1 / 3) == 8 and sched.windows_too_small == 0     # the cap
    assert sched.plan_piece(20.0, 4, 0.5) and not sched.plan_piece(8.0, 4, 0.5)
    assert sched.windows_too_small == 1 and not sched.starved
    assert not any(sched.plan_piece(8.0, 4, 0.5) for _ in range(STARVED_AFTER_WINDOWS))
    assert sched.starved
    assert sched.plan_piece(20.0, 4, 0.5) and not sched.starved
