"""The reconciliation protocol with both engines in one process: `InProcessAsr`.

The primary Engine serves cycles and a StateReconciler (core/reconciliation.py)
rebuilds on a second engine, in the primary's gaps (interleaved) or on a
thread of its own; swaps are applied at cycle boundaries. `vla-edge bench
asr` and the tests drive the protocol this way; on a robot the reasoning
and reconciler nodes run the same objects in two processes
(core/swap_protocol.py).
"""
from __future__ import annotations

import logging
import os
import threading
import time
from collections import Counter
from dataclasses import dataclass

from .cycle_result import CycleResult
from .engine import NO_SWAP_ROOM, Engine
from .frames import Frame
from .gap_steps import GapSteps
from .offer_loader import OfferLoader
from .reconciliation import Phase, StateReconciler
from .slack_scheduler import SlackScheduler
from .state_snapshot import SnapshotError, StateChunk
from .state_swap import SwapDeferred, SwapReport

log = logging.getLogger(__name__)

RECONCILER_NICE = 10          # thread mode: the reconciler thread's niceness (the CPU's "low-priority stream")
WORK_MODES = ("interleaved", "thread")


@dataclass
class DriverCycle:
    """One primary cycle as the driver saw it."""
    result: CycleResult
    latency_ms: float             # from the cycle's start to its result (a swap before it included)
    phase: str                    # reconciler phase at the start of the cycle
    swap: SwapReport | None       # the swap applied at this cycle's boundary (before or after it), if any
    swap_ms: float | None = None  # a swap after the cycle, whole (FrameState.import_state)


class InProcessAsr:
    """A primary Engine serving cycles and a StateReconciler on a second Engine, in one process.

    work="interleaved": the caller gives the reconciler the idle time after
    each cycle (`work_until`); work="thread": it runs on its own thread at a
    raised niceness (numpy releases the GIL in its matmuls). A ready offer is
    applied at a cycle boundary: by default before the cycle, counted in it;
    given the next boundary, after the cycle, bounded by the slack left
    until then, as the reasoning node does (the frame the cycle admitted is
    late for that offer and recomputed over it; bench asr runs this way). An
    offer too stale to apply, or with too much to recompute in the slack
    (SwapDeferred), is counted in `deferred` and the next, fresher one is
    awaited. With reconciler=None (absent) or after it stopped
    or died, the primary serves and evicts approximately on its own.
    offer_loader=True: offers are checked and laid out (FrameState.prepare_swap) on a loader thread, as the
    reasoning node's swap loader does, and a boundary applies only an offer whose preparation has ended
    (core/offer_loader.py; bench asr); False: inside make_offer, so every offer can be applied at the next
    boundary (the tests' deterministic order).
    """

    def __init__(self, primary: Engine, reconciler: StateReconciler | None, work: str = "interleaved",
                 offer_loader: bool = False):
        if work not in WORK_MODES:
            raise ValueError(f"work must be one of {WORK_MODES}, got {work!r}")
        self.primary = primary
        self.reconciler = reconciler
        self.loader = OfferLoader(primary.state.prepare_swap) if reconciler is not None and offer_loader else None
        if reconciler is not None:      # offers reach the boundary checked and laid out, as in the graph
            reconciler.prepare_offer = primary.state.prepare_swap if self.loader is None else self.loader.submit
        self.work = work
        self.reconciler_error: BaseException | None = None
        self.deferred: Counter = Counter()        # offers not applied because too stale, by SwapDeferred.reason
        # What the latest work_until ran, in order: (what, frames, ms) with what "receive", "step", "piece" (of a
        # step run piece by piece: its frames) or "offer" (frames 0 but for those): when a gap overran its
        # boundary, which of them did (bench asr's timeline).
        self.last_gap: list[tuple[str, int, float]] = []
        asr = primary.cfg.asr
        self.scheduler = SlackScheduler(primary.cfg.vision.tokens_per_frame,
                                        max(asr.warmup_tokens_per_step, primary.cfg.vision.tokens_per_frame),
                                        asr.slack_margin_ms, follow_context=asr.step_cost_follows_context)
        self.gap_steps = (GapSteps(reconciler, self.scheduler, asr.step_layer_pieces) if reconciler is not None
                          else None)
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = None
        if reconciler is not None and work == "thread":
            self._thread = threading.Thread(target=self._thread_main, name="asr-reconciler", daemon=True)
            self._thread.start()

    def cycle(self, frame: Frame | None, now_s: float, start_perf: float | None = None,
              next_boundary_perf: float | None = None) -> DriverCycle:
        """Run one primary cycle and mirror its admitted frame, with a ready swap at a boundary.

        start_perf: when the cycle began (its scheduled boundary: earlier work counts in it); default now.
        next_boundary_perf: None: the swap comes first and counts in the cycle's latency. Else, as the
        reasoning node does: the swap after the cycle, its recompute bounded by the time left until this
        next boundary (Engine.swap_recompute_budget_frames), timed apart (swap_ms).
        """
        t0 = time.perf_counter() if start_perf is None else start_perf
        rec = self.reconciler
        phase = rec.phase.value if rec is not None else "absent"
        after = next_boundary_perf is not None
        swap = None if after else self._apply_ready_swap()
        result = self.primary.run_cycle(frame, now_s, cycle_start_perf=t0)
        latency_ms = (time.perf_counter() - t0) * 1e3
        if rec is not None and result.new_frame and frame.frame_id in self.primary.state.frames:
            rec.mirror_encoded(self.primary_chunk(frame.frame_id))
            self._wake.set()
        swap_ms = None
        if after:
            t_swap = time.perf_counter()
            swap = self._apply_ready_swap(next_boundary_perf)
            swap_ms = (time.perf_counter() - t_swap) * 1e3 if swap is not None else None
        return DriverCycle(result=result, latency_ms=latency_ms, phase=phase, swap=swap, swap_ms=swap_ms)

    def work_until(self, deadline_perf: float, margin_ms: float | None = None) -> int:
        """Interleaved mode: reconciler steps in the gap before `deadline_perf` (the next cycle), sized by
        the same SlackScheduler the reconciler node uses (core/slack_scheduler.py), each step's device
        work finished before the next is planned; when not even one frame fits, the work waits for the
        next gap. margin_ms overrides asr.slack_margin_ms."""
        rec = self.reconciler
        if rec is None or self.work != "interleaved" or rec.phase is Phase.STOPPED:
            return 0
        sched = self.scheduler
        if margin_ms is not None:
            sched.margin_ms = float(margin_ms)
        tokens, gap = 0, []
        self.last_gap = gap
        t = time.perf_counter()
        due = self._guarded(rec.receive)
        gap.append(("receive", 0, (time.perf_counter() - t) * 1e3))
        if not due:
            return 0
        sched.new_window((deadline_perf - t) * 1e3)     # the whole gap, as the node's worker gives it
        def ms_left():
            return (deadline_perf - time.perf_counter()) * 1e3

        def record(kind, frames, ms):
            gap.append((kind, frames, ms))
        tokens, _spent, _fitted = self.gap_steps.run(ms_left, record, guard=self._guarded)
        self.gap_steps.offer(ms_left, record, guard=self._guarded)
        return tokens

    @property
    def worker_alive(self) -> bool:
        """False once the reconciler thread (work="thread") has ended; True in interleaved mode."""
        return self._thread is None or self._thread.is_alive()

    def primary_chunk(self, frame_id: int) -> StateChunk:
        rec = self.primary.state.frames[frame_id]
        pooled = next(r.pooled for r in self.primary.state.kv.retained() if r.frame_id == frame_id)
        return StateChunk(frame_id, rec.stamp_s, rec.tokens, pooled)

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        if self.loader is not None:
            self.loader.close()

    # ------------------------------------------------------------- internals

    def _apply_ready_swap(self, next_boundary_perf: float | None = None) -> SwapReport | None:
        rec = self.reconciler
        if rec is None:
            return None
        budget = None
        if next_boundary_perf is not None:
            budget = self.primary.swap_recompute_budget_frames((next_boundary_perf - time.perf_counter()) * 1e3)
            if budget == NO_SWAP_ROOM:          # the offer waits for the next boundary, as in the graph
                return None
        version = None
        if self.loader is not None:             # only what the loader has prepared, as the node's boundary
            version = rec.offered_version
            if version is None or not self.loader.prepared(version):
                return None
        snap = rec.take_offer(version)          # (not a fresher offer made meanwhile on the reconciler's thread)
        if snap is None:
            return None
        try:
            self.primary.state.import_state(snap, budget, self.primary.next_cycle_late_room())
        except SwapDeferred as exc:          # too stale: the round goes on and offers a fresher version
            log.debug("%s", exc)
            self.deferred[exc.reason] += 1
            return None
        except SnapshotError as exc:
            log.warning("swap v%d rejected: %s", snap.version, exc)
            rec.notify_rejected(snap.version, str(exc))
            return None
        rec.notify_applied(snap.version, self.primary.state.last_swap.late)
        self._wake.set()
        return self.primary.state.last_swap

    def _guarded_tick(self) -> int:
        return self._guarded(self.reconciler.tick)

    def _guarded(self, call):
        try:
            return call()
        except Exception as exc:             # pycuda's errors are not Python's RuntimeError: any of them
            # A dead reconciler must never take the primary down: stop it and serve alone.
            log.exception("reconciler failed; the primary continues with approximate eviction")
            self.reconciler_error = exc
            self.reconciler.stop()
            return 0

    def _thread_main(self) -> None:
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), RECONCILER_NICE)
        except (OSError, AttributeError) as exc:   # not Linux, or not allowed: run at normal priority
            log.info("reconciler thread priority unchanged: %s", exc)
        while not self._stop.is_set() and self.reconciler.phase is not Phase.STOPPED:
            if not self._guarded_tick() and not self.reconciler.busy:
                self._wake.wait(timeout=0.01)
                self._wake.clear()
