"""The versioned swap across processes: reasoning node <-> reconciler node, without ROS.

core/reconciliation.py (`StateReconciler`) decides when to reconcile and what
to keep; this module carries its offers between two processes and keeps the
primary side from ever waiting:

Reconciler process, `ReconcilerWorker`:
    on_chunk(frame, primary_version, seq)  each /vla/state_chunk message, in order. The chunk
                                      carries the state version the primary had in force
                                      when it admitted the frame; the first chunk tagged
                                      with an offered version k tells the reconciler that
                                      k was applied (`notify_applied`) before that chunk
                                      is mirrored, so its shadow of the primary stays exact.
                                      A jump in the chunk sequence number (lost messages)
                                      or a restart after stop() is a gap in the mirror
                                      (`StateReconciler.mark_gap`); the numbering back at
                                      1 is a restarted reasoning node: the mirror is
                                      cleared and older offers are void
    a worker thread                   runs the reconciler's steps (bounded chunked-prefill,
                                      on the slack schedule sized by core/slack_scheduler.py)
                                      and, whenever a (fresher) version is offered, takes it
                                      and writes it with `SnapshotStore.publish` (atomic:
                                      temporary name, then rename; by default in /dev/shm);
                                      an offer whose round ended (applied or aborted) is
                                      withdrawn
    answer()                          the answer to a /vla/reconciler/swap request (a SwapAnswer:
                                      an offer, or why there is none)

What the primary may still read is never overwritten: the offer last answered
("handed out") keeps its snapshot file and, on a GPU, its KV export buffer
(DeviceKvExporter.protect) until the primary reports a version at least as new
applied or asks again. Asking again means it is done with the previous answer:
SwapClient sends no request while an offer is loading, waiting for a boundary or
being applied, and ignores an answer to a request it gave up on. So a fresher
re-export never lands in a buffer the primary is copying from.

What an offer carries (SwapOffer): version k, its round r, the snapshot file's path, its
frame count and newest frame id, and on a GPU the CUDA IPC descriptor of its KV
(round: the first version of the reconciliation round; the round's later versions are fresher
re-offers of the same rebuild, moot once any of them is applied). On the wire it is the typed
response of vla_edge_interfaces/srv/Swap (nodes/swap_wire.py); this module never sees a message.

Reasoning process, `SwapClient` (thread-safe; three threads touch it):
    executor timer  `want_request()`: at most one request in flight, one per poll period, none
                    while an offer is loading or waiting to be applied; a request unanswered for
                    `request_timeout_s` is abandoned (reconciler gone), and its answer ignored
    executor        `on_response(answer, request_id)`: an offer newer than the applied,
                    rejected and deferred versions, of a round not applied yet, is read by
                    `load_offer` on a loader thread
    cycle thread    `apply_ready(state, cycle_id)` at a cycle boundary -> FrameState.import_state
                    (which keeps the frames admitted after the snapshot by recomputing them over
                    it): applied, rejected (SnapshotError: never loaded again) or deferred
                    (SwapDeferred: too stale, a fresher version is coming), timed in parts
"""
from __future__ import annotations

import logging
import shutil
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path


from ..model.backend import kv_payload
from ..model.cuda_device import bound
from .frames import Frame
from .gap_ledger import GapLedger
from .gap_steps import GapSteps
from .heap_trim import HeapTrim
from .metrics import percentile
from .slack_scheduler import SlackScheduler
from .stale_snapshots import private_directory, remove_stale_snapshot_dirs
from .state_snapshot import SnapshotError, StateSnapshot
from .state_swap import DEFER_NO_SLACK, DEFER_STALE, SwapDeferred, SwapReport

log = logging.getLogger(__name__)

SHM_DIR = Path("/dev/shm")
TIMING_SAMPLES = 256      # swap timings kept for the diagnostics' percentiles
# A swap at the boundary timed whole and in parts (place_off_cpu_ms is a share of place_ms, queue_off_cpu_ms one of
# kv_copy_ms, not parts of their own).
# bookkeeping_ms: the whole apply without its KV copy and late recompute (the device work on a GPU): the checks,
# the slots and the rest, the host work that issue 20 bounds apart from the copy.
SWAP_TIMINGS = ("apply_ms", "check_ms", "place_ms", "place_off_cpu_ms", "kv_copy_ms", "queue_off_cpu_ms",
                "queue_scatter_ms", "slot_upload_ms", "recompute_ms", "rest_ms", "admit_ms", "bookkeeping_ms",
                "settle_ms", "next_cycle_ms")
# With asr.swap_finish next_cycle, what the swap left to the cycle after it (not parts of apply_ms): settle_ms, that
# cycle's wait for the KV copy's check; next_cycle_ms, the whole of that cycle when it wrote late frames first.
SWAP_PARTS = ("check_ms", "place_ms", "kv_copy_ms", "recompute_ms")   # what apply_ms is made of, besides the rest
STARVED_LOG_PERIOD_S = 30.0   # slack schedule: how often a starved reconciler says so
WINDOW_POLL_S = 0.0005   # slack schedule: how often the worker looks for the primary's next cycle end
IDLE_WAIT_S = 0.01         # worker thread: longest sleep when the reconciler has nothing to do (woken on a chunk)


def snapshot_base() -> Path:
    """Where a reconciler's private directories go: /dev/shm (RAM), else the temporary directory."""
    return SHM_DIR if SHM_DIR.is_dir() else Path(tempfile.gettempdir())


class SwapProtocolError(ValueError):
    """A swap answer or snapshot file does not follow the protocol."""


@dataclass(frozen=True)
class SwapOffer:
    version: int
    path: str
    frames: int
    newest_frame_id: int
    kv: dict | None = None         # CUDA IPC descriptor of KV left on the reconciler's GPU (model/cuda_ipc.py)
    round: int = 0                 # first version of its reconciliation round (0: unknown)

    def __post_init__(self):
        # Offers also arrive from another process: one that breaks the protocol is refused here, by name.
        if self.version < 1 or not self.path or self.frames < 0 or self.round < 0 or self.round > self.version:
            raise SwapProtocolError(f"not a usable offer: version {self.version}, round {self.round}, "
                                    f"{self.frames} frames, path {self.path!r}")


@dataclass(frozen=True)
class SwapAnswer:
    """The reconciler's answer to one swap request: an offer, or why there is none."""
    offer: SwapOffer | None = None
    reason: str = ""


# ----------------------------------------------------------------------------
# Reconciler side


class SnapshotStore:
    """Snapshot files of one reconciler: a private directory, atomic writes; its owner says which to keep."""

    def __init__(self, directory: Path | None = None):
        if directory is None:
            base = snapshot_base()
            remove_stale_snapshot_dirs(base)            # left by reconcilers that were killed
            directory = private_directory(base)
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)

    def publish(self, snap: StateSnapshot) -> SwapOffer:
        """Write the snapshot file; KV left on a GPU goes in the offer as its CUDA IPC descriptor instead."""
        payload = kv_payload(snap.kv)
        descriptor = snap.kv.ipc_descriptor() if payload is not None and payload.on_device else None
        path = snap.save(self.directory / self.file_name(snap.version))
        return SwapOffer(version=snap.version, path=str(path), frames=len(snap.frames),
                         newest_frame_id=snap.newest_frame_id, kv=descriptor, round=snap.round)

    def keep_only(self, versions) -> None:
        """Delete every snapshot file but those of `versions`."""
        keep = {self.file_name(v) for v in versions}
        for old in self.directory.glob("state_v*.npz"):
            if old.name not in keep:
                old.unlink(missing_ok=True)

    @staticmethod
    def file_name(version: int) -> str:
        return f"state_v{version:06d}.npz"

    def close(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)


class ReconcilerWorker:
    """Drives a `StateReconciler` on its own thread and publishes its offers as files."""

    def __init__(self, reconciler, store: SnapshotStore, clock=None):
        """clock: a cycle_clock.CycleClockReader of the primary (slack schedule), or None (free schedule)."""
        self.reconciler = reconciler
        self.store = store
        self.clock = clock
        asr = reconciler.cfg.asr
        self.scheduler = SlackScheduler(reconciler.tpf, max(asr.warmup_tokens_per_step, reconciler.tpf),
                                        asr.slack_margin_ms, follow_context=asr.step_cost_follows_context
                                        ) if clock is not None else None
        self.gaps = GapLedger() if clock is not None else None
        self.gap_steps = GapSteps(reconciler, self.scheduler, asr.step_layer_pieces) if clock is not None else None
        self._window_seq: int | None = None       # the primary's cycle end whose slack was used last
        self._starved_logged = -float("inf")
        self.offer: SwapOffer | None = None       # replaced whole: readers on other threads see old or new
        self._offer_epoch = 0                     # the reconciler's epoch when that offer was made
        self._primary_epoch = 0                   # primary restarts seen here (chunk numbering back at 1)
        self._published_this_epoch = 0            # offers made since the latest primary restart
        # The offer last answered to the primary: it may be loading it or copying its KV, so its file and its
        # export buffer stay until a version at least as new is applied or the primary asks again.
        self._handout_lock = threading.Lock()
        self._handed_out: SwapOffer | None = None
        self.handouts = 0                         # answers that carried an offer
        self.withdrawn = 0                        # published offers withdrawn because their round ended
        self.error: BaseException | None = None
        self._notified = 0                        # newest version reported applied to the reconciler
        self._last_seq: int | None = None         # sequence number of the last chunk received
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # Free heap back to the OS while no round runs (core/heap_trim.py; memory.heap_trim_interval_s): nothing of
        # the reconciler's waits on it then, and the primary's GPU work does not either.
        self.heap_trim = HeapTrim(reconciler.cfg.memory.heap_trim_interval_s, 0.0)

    # -- subscription thread -------------------------------------------------

    def on_chunk(self, frame: Frame, primary_version: int, seq: int | None = None) -> None:
        """One admitted frame, tagged with the primary's state version at admission and (from the
        graph) the chunk sequence number; a jump in it means chunks were lost. Never waits for the worker."""
        rec = self.reconciler
        # Encoded here, on the subscription's thread, not in the worker's inbox drain: the vision encoder took 3.4 ms
        # per frame (p50, H200 machine, 1.5B shape) out of the worker's gaps; here it overlaps the worker's steps
        # (numpy and the CUDA synchronize both release the GIL). The encoder is a pure function of its weights.
        # First, before any protocol state changes: what follows (a restart, an acknowledgement, the chunk itself)
        # then reaches the worker together, as it did when this callback only queued the frame.
        chunk = rec.state.encode_chunk(frame)
        if seq is not None:
            if self._last_seq is not None and seq == 1:
                # A new reasoning process (its numbering starts at 1) holds none of the mirrored frames:
                # an offer built from them would bring back frames it never had.
                with self._handout_lock:
                    self._primary_epoch += 1
                    self._published_this_epoch = 0
                rec.restart_mirror()
                log.warning("chunk numbering restarted: the reasoning node restarted, mirror cleared")
            elif self._last_seq is not None and seq != self._last_seq + 1:
                rec.mark_gap()
            self._last_seq = seq
        if self._notified < primary_version <= rec.k_ready:
            rec.notify_applied(primary_version, None)     # the reconciler's shadow works out the late frames
            self._notified = primary_version
            with self._handout_lock:                      # the primary is done with offers up to it
                if self._handed_out is not None and self._handed_out.version <= primary_version:
                    self._handed_out = None
                    self._protect_handout()
        rec.mirror_encoded(chunk)
        self._wake.set()

    def answer(self) -> SwapAnswer:
        """The answer to a swap request. An offer answered is "handed out" (see the module docstring)."""
        with self._handout_lock:
            offer, epoch = self.offer, self._offer_epoch
            phase = self.reconciler.phase.value
            # Until the first offer after a restart, say so (whether or not the worker has dropped the old offer yet).
            if epoch != self._primary_epoch or (self._primary_epoch and not self._published_this_epoch):
                return SwapAnswer(reason=f"the reasoning node restarted: rebuilding the mirror (phase {phase})")
            if offer is None:
                return SwapAnswer(reason=f"no reconciled state yet (phase {phase})")
            self._handed_out = offer
            self.handouts += 1
            self._protect_handout()
        return SwapAnswer(offer)

    # -- worker thread -------------------------------------------------------

    def start(self) -> None:
        """Start (or restart after stop) the worker thread. Chunks sent while stopped were missed."""
        self.reconciler.mark_gap()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="asr-reconciler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None

    def summary(self) -> dict:
        offer = self.offer
        sched = ({**self.scheduler.summary(), **self.gaps.summary(), **self.gap_steps.summary()}
                 if self.scheduler is not None else {})
        return {**self.reconciler.summary(), "offered_version": offer.version if offer else 0,
                "offered_frames": offer.frames if offer else 0, "offers_handed_out": self.handouts,
                "offers_withdrawn": self.withdrawn, "worker_error": repr(self.error) if self.error else "",
                "heap_trims": self.heap_trim.count,
                "schedule": "slack" if self.scheduler is not None else "free", **sched}

    def _run(self) -> None:
        # This thread's CUDA context (the reconciler engine's), held for its whole life (model/cuda_device.py).
        with bound(self.reconciler.state.backend.device):
            self._work()

    def _work(self) -> None:
        rec = self.reconciler
        while not self._stop.is_set():
            try:
                worked = self._step()
                snap = rec.take_offer()
                if rec.epoch != self._offer_epoch:
                    with self._handout_lock:     # offers of a previous primary are void
                        self.offer, self._offer_epoch = None, rec.epoch
                if snap is not None:
                    self._publish(snap)
                elif self.offer is not None and rec.live_offer_version == 0:
                    self._withdraw()             # its round was applied (or aborted): nothing left to hand out
            except Exception as exc:             # pycuda's errors are not Python's RuntimeError: any of them
                # The reasoning node does not depend on us: stop offering, keep the node up, say why.
                log.exception("reconciler worker failed; no further offers")
                self.error = exc
                self.offer = None
                rec.stop()
                return
            if not worked and not rec.busy:
                self.heap_trim.maybe_trim(slack_ms=float("inf"))
                self._wake.wait(IDLE_WAIT_S)
                self._wake.clear()

    def _publish(self, snap: StateSnapshot) -> None:
        offer = self.store.publish(snap)
        with self._handout_lock:
            # Older files go before the offer is visible: whoever sees the new offer finds only its file (and
            # the handed-out one's) on disk.
            self.store.keep_only({offer.version} | ({self._handed_out.version} if self._handed_out else set()))
            self.offer = offer
            if self.reconciler.epoch == self._primary_epoch:     # built after the latest restart was taken in
                self._published_this_epoch += 1
        log.debug("offering state v%d (round %d, %d frames) at %s", snap.version, snap.round, len(snap.frames),
                  offer.path)

    def _withdraw(self) -> None:
        with self._handout_lock:
            self.offer = None
            self.withdrawn += 1
            self.store.keep_only({self._handed_out.version} if self._handed_out else set())

    def _protect_handout(self) -> None:
        """The export buffer of the offer handed out is not rewritten (call with the handout lock held)."""
        exporter = self.reconciler.state.kv_export
        if exporter is not None:                 # a GPU reconciler: its offers' KV stays in its export buffers
            held = self._handed_out
            exporter.protect(() if held is None or held.kv is None else (int(held.kv["buffer"]),))

    def _step(self) -> int:
        """One bounded piece of reconciler work; on the slack schedule only in the gap after a primary cycle,
        sized to end before its next boundary (core/slack_scheduler.py): steps of the largest size that fits,
        then the offer if one is due and fits. Returns the tokens computed.

        On the slack schedule the inbox is drained after the gap's device work, not before it. The primary's
        chunk arrives as its cycle ends, and a drain that came first took the gap's start: measured on the H200
        machine (45 s demo, 1.5B shape), the worker read each gap 4.3 ms late (p50, of a 12.6 ms gap), its
        drains (then with the vision encoder in them, now in on_chunk) took 4.0 ms, and the steps fitted 1.7
        frames per gap, too few for a round to catch up with the camera (with both changes: 6.6 frames per gap
        that began with a backlog, 140 of 148 rounds applied in a 4-minute soak)."""
        rec = self.reconciler
        if self.scheduler is None:
            return rec.tick()
        window = self.clock.gap_window()
        if window is None:                        # no live primary cycles: nothing to protect
            return rec.tick()
        seq, left_ns, gap_ns = window
        self.gaps.seen(seq, gap_ns / 1e6, left_ns / 1e6, busy=rec.frames_to_compute > 0)
        total, work, used = 0, bool(rec.frames_to_compute or rec.offer_due), False
        if work and seq != self._window_seq:
            self._window_seq = seq                # this gap is used now (a round has work in it)
            total, used = self._use_gap(left_ns, gap_ns), True
        if not work:
            # Never while a round waits for its next gap: that gap's chunk, published just before the cycle
            # ends, would be encoded at the gap's start (a used gap drains after its steps, _use_gap).
            self._drain()                         # may start a round: its steps begin in the next gap
        if not used and rec.busy:                 # a round waits for the next cycle to end
            time.sleep(WINDOW_POLL_S)
        return total

    def _steps_until(self, end_ns: int) -> tuple[int, float, bool]:
        """Steps of the largest size that fits before end_ns (or pieces of a longer one: core/gap_steps.py) while
        the round has frames to compute; returns (tokens computed, seconds spent, whether any step fitted)."""
        return self.gap_steps.run(lambda: (end_ns - time.perf_counter_ns()) / 1e6)

    def _drain(self) -> None:
        """The inbox into the reconciler's state (chunks, swap reports; may start a round), timed for the ledger."""
        t0 = time.perf_counter()
        self.reconciler.receive()
        if self.reconciler.drained_items:
            self.gaps.drained((time.perf_counter() - t0) * 1e3)

    def _use_gap(self, left_ns: int, gap_ns: int) -> int:
        """The gap's device work: steps while the next fits before the boundary, the inbox drained, steps again
        for what it brought while they fit, then the offer if due and fits."""
        rec = self.reconciler
        end_ns = time.perf_counter_ns() + left_ns
        self.scheduler.new_window(gap_ns / 1e6)
        if self.scheduler.starved and time.monotonic() - self._starved_logged > STARVED_LOG_PERIOD_S:
            self._starved_logged = time.monotonic()
            log.warning("the primary's slack (%.1f ms before its next cycle) fits no reconciler step (one frame "
                        "%.1f ms planned): no round can finish on asr.schedule slack; asr.schedule free gives exact "
                        "swaps at the cost of late cycles", left_ns / 1e6, self.scheduler.one_frame_ms() or 0.0)
        backlog = rec.frames_to_compute
        total, step_s, fitted = self._steps_until(end_ns)
        self._drain()                             # the frames that arrived meanwhile (this gap's chunk among them),
        more, more_s, more_fitted = self._steps_until(end_ns)      # computed in what is left of the gap if it fits
        total, step_s, fitted = total + more, step_s + more_s, fitted or more_fitted
        if backlog:
            self.gaps.used(gap_ns / 1e6, step_s * 1e3, total // rec.tpf, fitted, backlog)
        self.gap_steps.offer(lambda: (end_ns - time.perf_counter_ns()) / 1e6)
        return total


# ----------------------------------------------------------------------------
# Reasoning side


@dataclass(frozen=True)
class SwapOutcome:
    """What `SwapClient.apply_ready` did with the offer it found ready at a boundary."""
    version: int
    status: str                    # APPLIED | DEFERRED | REJECTED
    detail: str = ""               # deferred: the SwapDeferred reason; rejected: why
    apply_ms: float = 0.0          # the whole swap at the boundary (applied)
    dropped: int = 0               # frames the swap dropped (applied)
    report: SwapReport | None = None


APPLIED, DEFERRED, REJECTED = "applied", "deferred", "rejected"


class SwapClient:
    """The reasoning node's side; see the module docstring for who calls what."""

    def __init__(self, poll_period_s: float, request_timeout_s: float, open_device_kv=None, precheck=None):
        """open_device_kv(descriptor) -> KV holder: maps an offer's CUDA IPC KV in this process (the
        reasoning node passes one when its backend is on a GPU; None: such offers cannot be taken).
        precheck(snapshot): the applying engine's work that needs no boundary (FrameState.prepare_swap: the
        snapshot's checks and its slot layout; precheck_snapshot: the checks only), run by the loader so that
        the boundary finds it done; None: all of it is done at the boundary."""
        self.open_device_kv = open_device_kv
        self.precheck = precheck
        self.poll_period_s = poll_period_s
        self.request_timeout_s = request_timeout_s
        self._lock = threading.Lock()
        self._in_flight_since: float | None = None
        self._in_flight_id: int | None = None
        self._last_request = -float("inf")
        self._loading_version = 0
        self._ready: StateSnapshot | None = None
        self._applying = 0                    # version taken at a boundary and not yet applied / refused
        self._copy_unchecked = False          # applied, but its KV copy not yet checked (asr.swap_finish next_cycle)
        self._rejected: set = set()
        self._deferred_through = 0            # offers up to this version are too stale by now
        self._applied_round = 0               # the round of the state in force: its other versions are moot
        self.applied_version = 0
        self.applied_at_cycle: int | None = None
        self.requests = 0
        self.timeouts = 0
        self.late_answers = 0                 # answers to requests abandoned after request_timeout_s: ignored
        self.not_ready = 0
        self.load_failures = 0
        self.rejections = 0
        self.deferrals: dict = {DEFER_STALE: 0, DEFER_NO_SLACK: 0}   # SwapDeferred.reason -> offers not applied
        self.waits_no_room = 0        # boundaries where a loaded offer waited: not even a swap fitted the slack
        self.swaps = 0
        self.dropped_frames = 0
        self.late_frames = 0
        self.unseen_frames = 0        # kept at swaps because the reconciler never saw them (gaps in its mirror)
        self.unseen_forgotten = 0     # never-seen frames beyond asr.max_late_chunks, forgotten at swaps
        self.timings = {key: deque(maxlen=TIMING_SAMPLES) for key in SWAP_TIMINGS}
        # of the whole run, beside the newest TIMING_SAMPLES: a 4-minute CPU soak makes ~730 swaps, and a max over
        # the newest 256 was the last ~85 s's
        self.timing_max = {key: None for key in SWAP_TIMINGS}
        self.timing_count = {key: 0 for key in SWAP_TIMINGS}

    # -- executor thread ---------------------------------------------------

    def want_request(self, now: float | None = None) -> bool:
        """True when a request should be sent now; the caller then sends it and calls `request_sent`."""
        now = time.monotonic() if now is None else now
        with self._lock:
            if self._in_flight_since is not None:
                if now - self._in_flight_since < self.request_timeout_s:
                    return False
                self.timeouts += 1            # unanswered: the reconciler is gone or stuck; ask again later
                self._in_flight_since = self._in_flight_id = None
            if self._loading_version or self._ready is not None or self._applying:
                return False                  # a new request tells the reconciler we are done with the last offer
            return now - self._last_request >= self.poll_period_s

    def request_sent(self, now: float | None = None) -> int:
        """Returns the request's number: pass it to on_response with its answer."""
        now = time.monotonic() if now is None else now
        with self._lock:
            self._in_flight_since = now
            self._last_request = now
            self.requests += 1
            self._in_flight_id = self.requests
            return self.requests

    def on_response(self, answer: SwapAnswer, request_id: int | None = None) -> SwapOffer | None:
        """An answer arrived; returns the offer to load, or None.
        request_id (from request_sent): an answer to a request given up on is ignored, so that the offer
        loaded is always the one the reconciler handed out last."""
        with self._lock:
            if request_id is not None and request_id != self._in_flight_id:
                self.late_answers += 1
                return None
            self._in_flight_since = self._in_flight_id = None
            offer = answer.offer
            if offer is None:
                self.not_ready += 1
                return None
            if (offer.version <= max(self.applied_version, self._deferred_through) or offer.version in self._rejected
                    or (offer.round and offer.round <= self._applied_round)
                    or self._loading_version or self._ready is not None or self._applying):
                return None
            self._loading_version = offer.version
            return offer

    def on_request_failed(self, request_id: int | None = None) -> None:
        with self._lock:
            if request_id is None or request_id == self._in_flight_id:
                self._in_flight_since = self._in_flight_id = None

    # -- loader thread -----------------------------------------------------

    def load_offer(self, offer: SwapOffer) -> None:
        """Read the snapshot file (off the cycle thread); it becomes ready for the next boundary."""
        try:
            snap = StateSnapshot.load(offer.path)
            if snap.version != offer.version:
                raise SwapProtocolError(f"{offer.path}: holds version {snap.version}, the offer says {offer.version}")
            snap.prepare_units()                                   # here, not at the boundary
            if offer.kv is not None:
                if self.open_device_kv is None:
                    raise SwapProtocolError("the offer's KV is on the reconciler's GPU (asr.backend pycuda) but this "
                                            "node's backend is not on a GPU: set model.backend pycuda, or asr.backend "
                                            "numpy")
                snap.kv = self.open_device_kv(offer.kv)          # maps it now, off the cycle thread
            self._precheck(snap)
        except (OSError, ValueError, KeyError, RuntimeError) as exc:   # e.g. replaced by a newer version meanwhile
            log.warning("swap v%d not loaded: %s", offer.version, exc)
            with self._lock:
                self.load_failures += 1
                self._loading_version = 0
                if isinstance(exc, SwapProtocolError):
                    self._rejected.add(offer.version)      # it will not load better on a second try
            return
        with self._lock:
            self._ready = snap
            self._loading_version = 0

    def _precheck(self, snap: StateSnapshot) -> None:
        """Check the snapshot now, on the loader thread. One that fails is still handed to the boundary, which
        checks it again and rejects it there with the same SnapshotError, in the order of all its checks."""
        if self.precheck is None:
            return
        try:
            self.precheck(snap)
        except SnapshotError as exc:
            log.debug("swap v%d: fails its checks (rejected at the boundary): %s", snap.version, exc)

    # -- cycle thread --------------------------------------------------------

    def take_ready(self) -> StateSnapshot | None:
        """The loaded snapshot, once; never blocks. Until it is marked applied, rejected or deferred, no
        request is sent (the reconciler must not reuse what it is copied from)."""
        with self._lock:
            snap, self._ready = self._ready, None
            if snap is not None:
                self._applying = snap.version
            return snap

    def wait_for_room(self) -> None:
        """The cycle thread, at a boundary whose slack takes no swap (Engine.swap_recompute_budget_frames said
        NO_SWAP_ROOM): a loaded offer, if any, stays for the next boundary; counted, as a deferral is, so that a
        report can tell an offer that waited from one that never came."""
        with self._lock:
            if self._ready is not None:
                self.waits_no_room += 1

    def apply_ready(self, state, cycle_id: int, max_recompute: int | None = None,
                    next_cycle_room: int = 0) -> SwapOutcome | None:
        """At the boundary after cycle `cycle_id`: apply the loaded offer to `state` (a FrameState), if any,
        and account for it: the swap timed whole and in parts (KV copy, recompute of the late frames, the
        rest). None when no offer was ready. max_recompute, next_cycle_room: FrameState.import_state's bounds
        (from the slack; the late frames the next cycle may write)."""
        snap = self.take_ready()
        if snap is None:
            return None
        t = time.perf_counter()
        try:
            dropped = state.import_state(snap, max_recompute, next_cycle_room)
        except SwapDeferred as exc:
            self.mark_deferred(snap.version, exc.reason)
            return SwapOutcome(snap.version, DEFERRED, detail=exc.reason)
        except SnapshotError as exc:
            self.mark_rejected(snap.version)
            return SwapOutcome(snap.version, REJECTED, detail=str(exc))
        except BaseException:
            with self._lock:               # whatever the caller makes of it, requests must not stay blocked
                self._applying = 0
            raise
        apply_ms = (time.perf_counter() - t) * 1e3
        report = state.last_swap
        self.mark_applied(snap.version, cycle_id, len(dropped), len(report.late), len(report.unseen),
                          apply_ms=apply_ms, kv_copy_ms=report.kv_copy_ms, recompute_ms=report.recompute_ms,
                          check_ms=report.check_ms, place_ms=report.place_ms,
                          place_off_cpu_ms=report.place_off_cpu_ms, queue_off_cpu_ms=report.queue_off_cpu_ms,
                          queue_scatter_ms=report.queue_scatter_ms, slot_upload_ms=report.slot_upload_ms,
                          admit_ms=report.admit_ms,
                          round_id=snap.round, unseen_forgotten=len(report.unseen_forgotten))
        if report.copy_pending:
            with self._lock:               # what the copy reads must stay: no request until it is checked
                self._applying, self._copy_unchecked = snap.version, True
        return SwapOutcome(snap.version, APPLIED, apply_ms=apply_ms, dropped=len(dropped), report=report)

    def mark_applied(self, version: int, cycle_id: int, dropped: int, late: int, unseen: int = 0,
                     apply_ms: float | None = None, kv_copy_ms: float | None = None,
                     recompute_ms: float | None = None, round_id: int = 0, unseen_forgotten: int = 0,
                     check_ms: float | None = None, place_ms: float | None = None,
                     place_off_cpu_ms: float | None = None, queue_off_cpu_ms: float | None = None,
                     queue_scatter_ms: float | None = None, slot_upload_ms: float | None = None,
                     admit_ms: float | None = None) -> None:
        """apply_ms: the whole swap at the boundary; check_ms / place_ms / kv_copy_ms / recompute_ms: its checks
        before anything changed, the slot and frame bookkeeping, its KV copy and the recompute of the late (and
        unseen) frames; the rest is what is left of apply_ms (none of those: the calls around them);
        place_off_cpu_ms: of place_ms, the cycle thread not running; queue_off_cpu_ms: likewise of queuing the KV
        copy (its share of kv_copy_ms); queue_scatter_ms, slot_upload_ms: of queuing a device copy, the kv_scatter's
        launch and, of that, its slot list's upload; admit_ms: of the rest, admitting the late frames the next cycle
        writes (asr.swap_finish next_cycle). bookkeeping_ms (derived): apply_ms less the KV copy and the
        recompute."""
        with self._lock:
            self.applied_version = version
            self.applied_at_cycle = cycle_id
            self._applied_round = max(self._applied_round, round_id)
            self._applying = 0
            self.swaps += 1
            self.dropped_frames += dropped
            self.late_frames += late
            self.unseen_frames += unseen
            self.unseen_forgotten += unseen_forgotten
            parts = {"apply_ms": apply_ms, "check_ms": check_ms, "place_ms": place_ms,
                     "place_off_cpu_ms": place_off_cpu_ms, "kv_copy_ms": kv_copy_ms, "queue_off_cpu_ms": queue_off_cpu_ms,
                     "queue_scatter_ms": queue_scatter_ms, "slot_upload_ms": slot_upload_ms, "admit_ms": admit_ms,
                     "recompute_ms": recompute_ms}
            if apply_ms is not None:
                parts["rest_ms"] = max(0.0, apply_ms - sum(parts[k] or 0.0 for k in SWAP_PARTS))
                parts["bookkeeping_ms"] = max(0.0, apply_ms - (kv_copy_ms or 0.0) - (recompute_ms or 0.0))
            for key, value in parts.items():
                if value is not None:
                    self._note_timing(key, value)

    def after_cycle(self, result) -> None:
        """The cycle thread, after each cycle: what a swap left to it (asr.swap_finish next_cycle). Its check of
        the KV copy is done once the cycle ran (the copy is read no more: requests may go again), and its wait
        and, where it wrote the swap's late frames at its start, its whole time are kept with the swap's timings."""
        settle_ms = result.swap_settle_ms
        with self._lock:
            if self._copy_unchecked:
                self._copy_unchecked, self._applying = False, 0
            if settle_ms is not None:
                self._note_timing("settle_ms", settle_ms)
            if result.swap_frames:
                self._note_timing("next_cycle_ms", result.elapsed_ms)

    def _note_timing(self, key: str, value: float) -> None:
        """One swap's timing of `key` (the lock held)."""
        value = float(value)
        self.timings[key].append(value)
        self.timing_count[key] += 1
        if self.timing_max[key] is None or value > self.timing_max[key]:
            self.timing_max[key] = value

    def mark_rejected(self, version: int) -> None:
        """The engine refused the snapshot (it does not fit): never load this version again."""
        with self._lock:
            self._rejected.add(version)
            self.rejections += 1
            self._applying = 0

    def mark_deferred(self, version: int, reason: str) -> None:
        """The engine did not apply the snapshot now (SwapDeferred: too stale, or too much to recompute before
        the next boundary). It will only be staler later, so this and older versions are not loaded again; a
        fresher version (fewer late frames) is coming."""
        with self._lock:
            self._deferred_through = max(self._deferred_through, version)
            self.deferrals[reason] = self.deferrals.get(reason, 0) + 1
            self._applying = 0

    def counts(self) -> dict:
        """The protocol's counters, without the timings' percentiles: cheap (the swap log line after a boundary)."""
        with self._lock:
            return self._counts()

    def summary(self) -> dict:
        """The counters and the timings' percentiles. The timings are copied under the lock and sorted outside it
        (~30 sorts of up to TIMING_SAMPLES values): sorted under it, a diagnostics call held the lock that the
        swap at the boundary takes to account for itself (mark_applied), for as long as the sorting took."""
        with self._lock:
            counts = self._counts()
            timings = {key: list(values) for key, values in self.timings.items()}
            maxima, totals = dict(self.timing_max), dict(self.timing_count)
        return {**counts, **_timing_summary(timings, maxima, totals)}

    def _counts(self) -> dict:
        return {"state_version": self.applied_version, "swaps": self.swaps,
                "swap_applied_at_cycle": "" if self.applied_at_cycle is None else self.applied_at_cycle,
                "swap_requests": self.requests, "swap_timeouts": self.timeouts,
                "swap_late_answers": self.late_answers, "swap_not_ready": self.not_ready,
                "swap_load_failures": self.load_failures, "swap_rejections": self.rejections,
                **{f"swap_deferred_{reason}": n for reason, n in self.deferrals.items()},
                "swap_deferred": sum(self.deferrals.values()), "swap_waits_no_room": self.waits_no_room,
                "swap_dropped_frames": self.dropped_frames, "swap_late_frames": self.late_frames,
                "swap_unseen_frames": self.unseen_frames, "swap_unseen_forgotten": self.unseen_forgotten}


def _timing_summary(timings: dict, maxima: dict | None = None, totals: dict | None = None) -> dict:
    """swap_<part>_p50 / _p99 over the newest TIMING_SAMPLES swaps, _max and _n over the whole run (maxima, totals;
    without them, over the samples too), for the whole apply and each part, and the latest apply and KV copy
    (_last); timings: part -> its samples, oldest first."""
    out = {}
    for key, values in timings.items():
        for q in (50, 99):
            out[f"swap_{key}_p{q}"] = round(percentile(values, q), 3) if values else ""
        top = maxima.get(key) if maxima is not None else (max(values) if values else None)
        out[f"swap_{key}_max"] = round(top, 3) if top is not None else ""
        out[f"swap_{key}_n"] = totals.get(key, 0) if totals is not None else len(values)
        if key in ("apply_ms", "kv_copy_ms"):
            out[f"swap_{key}_last"] = round(values[-1], 3) if values else ""
    return out


def start_loader(client: SwapClient, offer: SwapOffer) -> threading.Thread:
    """Load `offer` on a daemon thread (file reads never run on the cycle or executor thread)."""
    thread = threading.Thread(target=client.load_offer, args=(offer,), name=f"swap-load-v{offer.version}", daemon=True)
    thread.start()
    return thread
