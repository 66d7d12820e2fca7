"""The engine's frame state between cycles: append, rebuild, export and import (the swap).

`FrameState` owns the CSR state itself: the KV slot bookkeeping of the arena
(prefix, frames as chunks, the transient suffix), the frames' vision rows,
their RoPE positions and the state version. Its operations are the ones the
control cycle and the reconciler share: frames appended exactly as chunks
(the reconciler's mirror and chunked prefill), the synchronous rebuild in
place, the snapshot a reconciled swap carries (`export_state` /
`import_state`), RoPE re-basing before positions leave the model's trained
range, and the token accounting. The cycle (core/engine.py, `Engine`) owns
one FrameState; the reconciler (core/reconciliation.py) owns one too, with
its own backend, and no cycle.

Every operation here changes the state only at a cycle boundary
(`SwapTimingError` otherwise), and re-bases positions right after the static
prefix, so the result is the state a from-scratch forward would build.
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass

import numpy as np

from ..model.backend import FINISHED, kv_payload
from ..model.errors import DeviceKVUnavailable
from ..config import VlaConfig
from .frames import Frame
from .kv_slots import KVCapacityError, KVSlotManager, RetainedFrame, make_policy
from .prompt import encode_text, prefix_text
from .released_rows import ReleasedRows
from .sample_window import SampleWindow
from .state_snapshot import SnapshotError, SnapshotFrame, StateChunk, StateSnapshot
from .vision_encoder import VisionEncoder

log = logging.getLogger(__name__)


class SwapTimingError(RuntimeError):
    """A state swap or rebuild was attempted inside a cycle; they happen only at cycle boundaries."""


DEFER_STALE = "stale"          # SwapDeferred.reason: more late frames than asr.max_late_chunks
DEFER_NO_SLACK = "no_slack"    # SwapDeferred.reason: its recompute would not end before the next cycle boundary


class SwapDeferred(Exception):
    """A sound snapshot not applied now: the primary admitted more frames after it than asr.max_late_chunks,
    and recomputing them all would make the boundary as long as the staleness. Nothing changed; the
    reconciler keeps catching up and offers a fresher version, so this is no rejection."""

    def __init__(self, version: int, late: int, limit: int, reason: str = DEFER_STALE):
        why = (f"more than asr.max_late_chunks ({limit})" if reason == DEFER_STALE else
               f"more than the {limit} the time left before the next cycle boundary can recompute")
        super().__init__(f"snapshot v{version}: {late} frames to recompute, {why}; waiting for a fresher one")
        self.version, self.late, self.limit = version, late, limit
        self.reason = reason


@dataclass
class FrameRecord:
    """What the engine remembers about a retained frame beyond its KV slots."""
    frame_id: int
    stamp_s: float
    tokens: np.ndarray | None = None     # [tokens_per_frame, hidden] float32 vision rows (None: not known here)


@dataclass(frozen=True)
class SwapReport:
    """What `import_state` did (also kept as `Engine.last_swap`)."""
    version: int                 # state version now in force
    frames: int                  # frames taken from the snapshot
    dropped: list                # frame ids this engine held that the snapshot left out
    late: list                   # frame ids newer than the snapshot, recomputed over it
    late_lost: list              # late (or unseen) frames without vision rows: could not be recomputed, dropped
    evicted: list                # frames the policy evicted while the late ones were appended
    next_position: int
    unseen: list = ()            # frame ids the snapshot's author never saw: kept, recomputed after its frames
    kv_copy_ms: float = 0.0      # writing the snapshot's KV into the arena (device to device on a GPU); with
                                 # asr.swap_finish next_cycle only queuing it (the next cycle checks it)
    recompute_ms: float = 0.0    # recomputing the late and unseen frames over it (asr.late_frames_per_forward at once)
    check_ms: float = 0.0        # checking it before anything changed (_check_snapshot)
    place_ms: float = 0.0        # the snapshot's frames into the slot bookkeeping (host only, before the KV copy)
    place_off_cpu_ms: float = 0.0  # of place_ms, the thread not running (preempted, or waiting for the interpreter lock)
    queue_off_cpu_ms: float = 0.0  # of queuing the KV copy (in kv_copy_ms), the thread not running: the interpreter
                                   # lock taken back after a driver call, or a blocking wait (a driver's spin is CPU)
    queue_scatter_ms: float | None = None  # of queuing the KV copy, the kv_scatter's launch (a device copy only)
    slot_upload_ms: float | None = None    # of that, its slot list's upload
    unseen_forgotten: list = ()  # never-seen frames beyond asr.max_late_chunks: forgotten (oldest first), in dropped
    in_next_cycle: int = 0       # of late + unseen, frames admitted for the next cycle to write (asr.swap_finish)
    admit_ms: float = 0.0        # their admission (slots, positions, records): part of the swap's rest
    copy_pending: bool = False   # the KV copy is queued, checked by the next cycle (asr.swap_finish next_cycle)


@dataclass(frozen=True)
class _RecomputePlan:
    """What a swap keeps of this engine's own frames (FrameState._plan_recompute)."""
    late: list                   # retained records newer than the snapshot's newest frame
    unseen: list                 # retained records the snapshot's author never saw, kept (within the bound)
    unseen_forgotten: list       # frame ids of never-seen frames beyond the bound
    chunks: list                 # StateChunks to recompute over the snapshot, unseen first, then late
    late_lost: list              # frame ids to recompute that have no vision rows: dropped
    dropped: list                # every frame id this engine holds that the swap leaves out


class FrameStateError(ValueError):
    """A frame state cannot be built with this configuration and model (the prefix leaves no room)."""


class FrameState:
    """The CSR frame state on one backend (see the module docstring).

    Built on a backend whose arena is empty: the static prefix is computed here, once.
    """

    def __init__(self, cfg: VlaConfig, backend, tokenizer, encoder: VisionEncoder | None = None,
                 takes_swaps: bool = True):
        """takes_swaps: False for a reconciler's state, which exports states and imports none (it keeps no
        released rows)."""
        self.cfg = cfg
        self.backend = backend
        self.encoder = encoder or VisionEncoder(cfg.vision, backend.spec.hidden_size, backend)
        self.prefetch = None          # a core/vision_prefetch.VisionPrefetch while the reasoning node runs one
        self.kv = KVSlotManager(cfg.kv.capacity_tokens, cfg.vision.tokens_per_frame,
                                make_policy(cfg.kv.eviction_policy, cfg.kv.window_frames))
        # Transient slots a cycle may need: the longest suffix plus the decoded tokens fed back.
        self.suffix_reserve = cfg.prompt.max_suffix_tokens + cfg.action.num_tokens
        self.frames: dict[int, FrameRecord] = {}
        self.last_frame_id: int | None = None
        self.in_cycle = False                   # set by the cycle around its work: state changes wait for the boundary
        self._unwritten_frame: int | None = None
        # asr.swap_finish next_cycle: the latest swap's late frames, admitted (slots, positions, rows) but their KV
        # not written: the next cycle writes them at its start (write_pending), oldest first.
        self._pending: list[int] = []
        # asr.swap_finish next_cycle: the latest swap's KV copy, queued and not yet checked (version, KvWrite);
        # settle_swap_copy waits for it and checks it was not torn before anything reads the state.
        self._swap_copy: tuple | None = None
        self.torn_after_apply = 0               # swaps whose copy settle_swap_copy found torn (state emptied)
        self.state_version = 0                  # bumped by every applied swap
        self.approximate_evictions = 0          # policy evictions since the state was last exact
        # Rows written to the KV arena per segment since construction (CSR accounting).
        self.computed_tokens = {"prefix": 0, "frames": 0, "suffix": 0, "decode": 0}
        self.last_swap: SwapReport | None = None
        self.last_rebase: dict | None = None    # what the latest re-base kept and forgot
        # Measured ms to recompute one frame over the state (a swap's late frames, the warm-up's re-base step,
        # one frame per forward unless asr.late_frames_per_forward batches a swap's): the median of recent
        # samples (note_recompute); None until measured. A lone frame's forward costs more per token than a
        # cycle's longer prefill (on the CPU model ~2x), so the swap budget needs this, not the cycle's rate.
        self.recompute_ms_per_frame: float | None = None
        self._recompute_samples = SampleWindow(cfg.admission.tail_window)   # per-frame ms, for the median and tail
        self._recompute_tail: float | None = None
        # What a swap costs besides its recompute (checks, placing the frames, the KV copy), measured per swap:
        # the swap budget keeps room for its slow end before it prices late frames (swap_fixed_ms_tail).
        self._swap_fixed_samples = SampleWindow(cfg.admission.tail_window)
        self.swap_fixed_ms_tail = 0.0
        # How export_state packs the KV rows: None reads them to the host (numpy array); a callable
        # (backend, slots) -> KV holder keeps them on the device (model/cuda_state_transfer.DeviceKvExporter).
        self.kv_export = None
        self._prefill_prefix(tokenizer)
        # asr.snapshot_rows false: offers come without vision rows, and a swap takes them from the frames it holds
        # or from here: the rows of the frames its policy evicted, the newest frame_capacity of them. Enough: a
        # round's frames were all held here at its trigger or admitted since, the policy evicts at most one frame
        # per frame admitted, and a round is aborted before more than frame_capacity frames are admitted. In
        # memory reserved now (core/released_rows.py says why).
        self._released_rows: ReleasedRows | None = (
            None if cfg.asr.snapshot_rows or not takes_swaps or self.frame_capacity <= 0
            else ReleasedRows(self.frame_capacity, cfg.vision.tokens_per_frame, backend.spec.hidden_size))

    def append_frame(self, frame: Frame) -> list[int]:
        """Add a frame to the state exactly (no action decode): the reconciler's mirror path.

        Returns the frame ids the eviction policy removed to make room.
        """
        evicted = self.append_chunks([self.encode_chunk(frame)], allow_evict=True)
        self.last_frame_id = frame.frame_id
        return evicted

    def encode_chunk(self, frame: Frame) -> StateChunk:
        """The frame as a state chunk (rows + pooled embedding): its encoding made ahead of the boundary where a
        prefetch has it (vision.encode_ahead, core/vision_prefetch.py: the same encoder, the same bits), else the
        vision encoder run now."""
        encoded = self.prefetch.take(frame) if self.prefetch is not None else None
        if encoded is None:
            encoded = self.encoder.encode(frame.pixels)
        return StateChunk(frame.frame_id, frame.stamp_s, encoded.tokens, encoded.pooled)

    def append_chunks(self, chunks, allow_evict: bool = False) -> list[int]:
        """Append pre-encoded frames after the newest one, with contiguous positions, in one forward.

        allow_evict=False: raise KVCapacityError (state untouched) unless all of
        them fit with one cycle's suffix reserve and no eviction: the
        reconciler's chunked prefill, which must stay exact.
        allow_evict=True: the policy makes room as in a cycle (approximate).
        Returns the frame ids evicted to make room.
        """
        self._require_boundary("append_chunks")
        if self._pending:      # they are the newest and unwritten: a forward here would attend to garbage KV
            raise RuntimeError(f"append_chunks: frames {self._pending} wait for the next cycle (write_pending)")
        chunks = list(chunks)
        if not chunks:
            return []
        tpf, hidden = self.cfg.vision.tokens_per_frame, self.backend.spec.hidden_size
        for c in chunks:
            if c.tokens.shape != (tpf, hidden) or c.tokens.dtype != np.float32:
                raise ValueError(f"chunk {c.frame_id}: tokens must be float32 {(tpf, hidden)}, "
                                 f"got {c.tokens.dtype} {c.tokens.shape}")
        need = len(chunks) * tpf + self.suffix_reserve
        if not allow_evict and self.kv.free_slots < need:
            raise KVCapacityError(f"append_chunks: {len(chunks)} frames + suffix reserve need {need} free slots, "
                                  f"{self.kv.free_slots} free ({len(self.frames)} frames retained)")
        evicted: list[int] = []
        for i, c in enumerate(chunks):
            _slots, out = self.admit_chunk(c, self.next_position + i * tpf)
            evicted += out
        # A policy may evict a frame of this very batch: it was never computed, so it simply is not.
        by_id = {c.frame_id: c for c in chunks}
        kept = [r for r in self.kv.retained() if r.frame_id in by_id]                        # oldest first
        if not kept:
            self.next_position += len(chunks) * tpf
            return evicted
        slots = np.concatenate([r.slots for r in kept])                                      # [k * tpf]
        rows = np.concatenate([by_id[r.frame_id].tokens for r in kept])                      # [k * tpf, hidden]
        positions = np.concatenate([np.arange(r.position_start, r.position_start + tpf) for r in kept]).astype(np.int64)
        done = False
        try:
            self.backend.forward(rows, positions, slots, self.context_without_newest(len(kept)), logits="none")
            done = True
        finally:
            if not done:    # garbage KV: forget these frames rather than attend to them later
                self.kv.evict_frames([r.frame_id for r in kept])
                for r in kept:
                    self.frames.pop(r.frame_id, None)
        self.next_position += len(chunks) * tpf
        self.computed_tokens["frames"] += rows.shape[0]
        return evicted

    def reset_frames(self) -> None:
        """Forget every frame; the static prefix stays (it is never recomputed). The state is exact again."""
        self._require_boundary("reset_frames")
        self.kv.evict_all()
        self.frames.clear()
        self._pending = []
        self.next_position = self.prefix_tokens
        self.approximate_evictions = 0

    def rebuild_in_place(self, keep_ids, tokens_per_step: int | None = None) -> list[int]:
        """Synchronous exact recompute: keep these frames (oldest first), recompute their KV from the
        stored vision rows with re-based positions, chunked `tokens_per_step` rows per forward.

        This is what ASR avoids: the whole recompute happens on the serving engine, between two
        cycles. Returns the frame ids dropped.
        """
        self._require_boundary("rebuild_in_place")
        keep = [int(f) for f in keep_ids]
        missing = [f for f in keep if not self.kv.holds(f)]
        if missing:
            raise KeyError(f"rebuild_in_place: frames {missing} are not retained")
        no_rows = [f for f in keep if self.frames[f].tokens is None]
        if no_rows:
            raise ValueError(f"rebuild_in_place: frames {no_rows} have no stored vision rows to recompute from")
        chunks = [StateChunk(f, self.frames[f].stamp_s, self.frames[f].tokens, self._pooled_of(f)) for f in keep]
        keep_set = set(keep)
        dropped = [r.frame_id for r in self.kv.retained() if r.frame_id not in keep_set]
        last = self.last_frame_id
        self.reset_frames()
        per = max(1, (tokens_per_step or len(chunks) * self.cfg.vision.tokens_per_frame) // self.cfg.vision.tokens_per_frame)
        for i in range(0, len(chunks), per):
            self.append_chunks(chunks[i:i + per], allow_evict=False)
        self.last_frame_id = last
        return dropped

    def export_state(self, version: int = 0, with_rows: bool = True) -> StateSnapshot:
        """The retained frames with their KV rows and, with_rows and where known, their vision rows, oldest
        first (asr.snapshot_rows says when a reconciler leaves them out)."""
        retained = self.kv.retained()
        frames = [SnapshotFrame(r.frame_id, self.frames[r.frame_id].stamp_s, r.position_start, r.pooled)
                  for r in retained]
        slots = np.concatenate([r.slots for r in retained]) if retained else np.zeros(0, np.int32)
        kv = None
        if retained:
            kv = self.backend.read_kv(slots) if self.kv_export is None else self.kv_export(self.backend, slots)
        tokens = [self.frames[r.frame_id].tokens for r in retained] if with_rows else []
        rows = np.stack(tokens) if tokens and all(t is not None for t in tokens) else None
        return StateSnapshot(version=version, frames=frames, kv=kv, next_position=self.next_position,
                             prefix_ids=self.prefix_ids.copy(), rows=rows)

    def import_state(self, snap: StateSnapshot, max_recompute: int | None = None, next_cycle_room: int = 0) -> list[int]:
        """Replace the frame state with `snap` at a cycle boundary (the swap); returns the frame ids dropped.

        The snapshot's frames, KV and positions are taken as they are (a
        reconciled snapshot has them re-based after the prefix) and
        `next_position` becomes the snapshot's. Frames this engine appended
        after the snapshot's newest frame ("late": they arrived between
        "ready" and "applied") are not lost: they are recomputed from their
        stored vision rows over the swapped state, so the result is still the
        from-scratch state. That recompute is what a swap costs beyond the KV
        copy, so it is bounded: asr.late_frames_per_forward frames per
        forward (shapes warm_up prepared: no graph capture at the
        boundary), at most
        asr.max_late_chunks frames. A snapshot with more late frames raises
        SwapDeferred (stale: a fresher one is coming); frames the reconciler
        never saw fill the rest of that bound and any beyond it are forgotten,
        oldest first (the state stays exact, just shorter). Everything is
        checked before anything changes: a snapshot that does not fit raises
        SnapshotError and the state stays. Details, with the time of the KV
        copy and of the recompute, are kept in `last_swap`. `max_recompute`:
        the most frames the time left before the next cycle boundary can
        recompute (None: no bound but asr.max_late_chunks); a swap needing more
        raises SwapDeferred (no_slack) rather than delay the next cycle.
        `next_cycle_room` (asr.swap_finish next_cycle; Engine.next_cycle_late_room):
        how many of those frames, the newest, the next cycle may write at its
        start instead; they are admitted here (slots, positions) and counted
        against no boundary budget. With next_cycle the KV copy is only queued
        here too, and checked by settle_swap_copy before anything reads it.

        Three steps: check (nothing changes yet), place the snapshot's frames and
        queue its KV copy, recompute the late frames over them (queued behind
        the copy: on a GPU the copy runs while the host launches the recompute);
        then wait for the copy alone and check it was not torn.
        """
        self._require_boundary("import_state")
        self.settle_swap_copy()                         # the previous swap's copy, if no cycle has checked it
        t_check = time.perf_counter()
        plan = self._check_snapshot(snap, max_recompute, next_cycle_room)
        check_ms = (time.perf_counter() - t_check) * 1e3
        place_ms, place_off_cpu_ms, queue_ms, queue_off_cpu_ms, copy = self._place_snapshot(snap)
        deferred_copy = False
        try:
            # Queued behind the KV copy on the device's stream: the copy runs while the host launches this.
            evicted, recompute_ms, in_next_cycle, admit_ms = self._recompute_over_snapshot(plan, next_cycle_room)
            deferred_copy = self.cfg.asr.swap_finish == "next_cycle" and copy is not FINISHED
        finally:
            if deferred_copy:                           # the next cycle (or state change) checks it first
                self._swap_copy, kv_copy_ms = (snap.version, copy), queue_ms
            else:
                kv_copy_ms = queue_ms + self._finish_copy(snap, copy)
        self._note_swap_fixed(check_ms + place_ms + kv_copy_ms)
        if self.frames and (self.last_frame_id is None or max(self.frames) > self.last_frame_id):
            self.last_frame_id = max(self.frames)
        self.state_version = snap.version
        unseen_ids = {r.frame_id for r in plan.unseen}
        self.last_swap = SwapReport(version=snap.version, frames=len(snap.frames), dropped=plan.dropped,
                                    late=[c.frame_id for c in plan.chunks if c.frame_id not in unseen_ids],
                                    late_lost=plan.late_lost, evicted=evicted, next_position=self.next_position,
                                    unseen=[c.frame_id for c in plan.chunks if c.frame_id in unseen_ids],
                                    kv_copy_ms=kv_copy_ms, recompute_ms=recompute_ms, check_ms=check_ms,
                                    place_ms=place_ms, place_off_cpu_ms=place_off_cpu_ms,
                                    queue_off_cpu_ms=queue_off_cpu_ms, unseen_forgotten=plan.unseen_forgotten,
                                    in_next_cycle=in_next_cycle, admit_ms=admit_ms, copy_pending=deferred_copy,
                                    queue_scatter_ms=getattr(copy, "scatter_queue_ms", None),
                                    slot_upload_ms=getattr(copy, "slot_upload_ms", None))
        log.debug("state v%d applied: %d frames, %d dropped, %d late recomputed", snap.version, len(snap.frames),
                  len(plan.dropped), len(plan.chunks))
        return plan.dropped

    def _check_snapshot(self, snap: StateSnapshot, max_recompute: int | None,
                        next_cycle_room: int = 0) -> "_RecomputePlan":
        """Everything a swap to `snap` needs, checked before anything changes: SnapshotError when it cannot
        be applied at all, SwapDeferred when a fresher offer or more slack would do; else the recompute plan."""
        if snap.version <= self.state_version:
            raise SnapshotError(f"snapshot v{snap.version} is not newer than the state in force (v{self.state_version})")
        tpf = self.cfg.vision.tokens_per_frame
        self.precheck_snapshot(snap)                    # at once when the loader has run it already
        if snap.kv is not None:
            try:
                kv_payload(snap.kv).check_usable()      # KV left on a device: still the snapshot's
            except DeviceKVUnavailable as exc:
                raise SnapshotError(f"snapshot v{snap.version}: {exc}") from exc
        need = len(snap.frames) * tpf + self.suffix_reserve
        room = self.cfg.kv.capacity_tokens - self.prefix_tokens
        if need > room:
            raise SnapshotError(f"snapshot v{snap.version}: {len(snap.frames)} frames + suffix reserve need {need} slots, "
                                f"{room} exist after the prefix")
        plan = self._plan_recompute(snap)
        if len(plan.late) > self.cfg.asr.max_late_chunks:
            raise SwapDeferred(snap.version, len(plan.late), self.cfg.asr.max_late_chunks)
        at_boundary = len(plan.chunks) - min(len(plan.chunks), max(0, next_cycle_room))
        if max_recompute is not None and at_boundary > max_recompute:
            raise SwapDeferred(snap.version, at_boundary, max_recompute, DEFER_NO_SLACK)
        if plan.late_lost:
            log.warning("swap v%d: late or unseen frames %s have no vision rows and are dropped", snap.version,
                        plan.late_lost)
        if plan.unseen:
            log.warning("swap v%d: %d frames the reconciler never saw (its mirror had a gap) are kept and recomputed",
                        snap.version, len(plan.unseen))
        if plan.unseen_forgotten:
            log.warning("swap v%d: %d more frames the reconciler never saw are forgotten (asr.max_late_chunks %d "
                        "bounds the recompute at the boundary)", snap.version, len(plan.unseen_forgotten),
                        self.cfg.asr.max_late_chunks)
        return plan

    def prepare_swap(self, snap: StateSnapshot) -> None:
        """What a swap to `snap` can do before its boundary, on the swap loader's thread: the snapshot's own
        checks (precheck_snapshot) and the layout of its frames in the slots (KVSlotManager.plan_placement,
        kept in snap.placement), so that the boundary only puts the layout in force. Thread-safe, as both of
        those are. SnapshotError when the checks fail (nothing is planned then)."""
        self.precheck_snapshot(snap)
        snap.placement = self._plan_placement(snap)

    def _plan_placement(self, snap: StateSnapshot):
        return self.kv.plan_placement([(f.frame_id, f.pooled, f.position_start) for f in snap.frames],
                                      units=snap.units)

    def precheck_snapshot(self, snap: StateSnapshot) -> None:
        """The checks of a swap that depend on the snapshot and this engine's fixed dimensions only
        (StateSnapshot.check_against: SnapshotError). Thread-safe: the swap loader runs it before the
        boundary, which then repeats none of the work unless it failed (SwapClient's precheck)."""
        spec = self.backend.spec
        snap.check_against(prefix_ids=self.prefix_ids, tokens_per_frame=self.cfg.vision.tokens_per_frame,
                           num_layers=spec.num_layers, kv_dim=spec.kv_dim, hidden_size=spec.hidden_size)

    def _place_snapshot(self, snap: StateSnapshot) -> tuple:
        """The snapshot's frames into the slots (the layout prepare_swap planned, or planned now) and the copy of
        its KV into the arena queued (a checked snapshot fits: no policy involved); returns the ms the slot
        bookkeeping took, the ms of it this thread did not run (host-only work: what is not CPU time is waiting
        for a core or the interpreter lock), the ms queuing the copy took and the ms of that this thread did not
        run, and the queued copy (KvWrite: _finish_copy waits for it)."""
        t_place, cpu_place = time.perf_counter(), time.thread_time()
        placement = snap.placement
        if placement is None:                           # no loader planned it (a swap applied in process)
            placement = snap.placement = self._plan_placement(snap)
        try:    # one copy of the free stack, not a pass over the frames: the layout was planned before the boundary
            self.kv.install(placement, reserve=self.suffix_reserve)
        except ValueError:                              # planned for another engine's arena: plan it for this one
            placement = snap.placement = self._plan_placement(snap)
            self.kv.install(placement, reserve=self.suffix_reserve)
        # Frames the swap drops are forgotten on purpose: no later offer holds them, so their rows are not kept.
        held, self.frames = self.frames, {}
        self._pending = []                              # frames still waiting for a cycle: in the plan, or dropped
        t_queue, cpu_queue = time.perf_counter(), time.thread_time()
        copy = FINISHED
        if placement.slots.size:
            try:                                        # on a GPU device to device (one kv_scatter), queued
                copy = kv_payload(snap.kv).start_write(self.backend, placement.slots)
            except DeviceKVUnavailable as exc:
                self._forget_torn(snap, exc)
        queue_ms = (time.perf_counter() - t_queue) * 1e3
        queue_cpu_ms = (time.thread_time() - cpu_queue) * 1e3
        self.frames = self._records_after_swap(snap, held)     # host work while the device copies
        place_ms = (time.perf_counter() - t_place) * 1e3 - queue_ms
        # Of place_ms alone: the queuing's wall and CPU time both left out (a wait while the copy was queued, e.g.
        # for the interpreter lock, counted here made the share exceed the whole: 2.07 of 0.17 ms in a CI run).
        place_cpu_ms = (time.thread_time() - cpu_place) * 1e3 - queue_cpu_ms
        place_off_cpu_ms = min(place_ms, max(0.0, place_ms - place_cpu_ms))
        self.next_position = snap.next_position
        self.approximate_evictions = 0
        return place_ms, place_off_cpu_ms, queue_ms, min(queue_ms, max(0.0, queue_ms - queue_cpu_ms)), copy

    def _records_after_swap(self, snap: StateSnapshot, held: dict) -> dict:
        """The frame records of a swapped-in state: with the snapshot's vision rows when it brings them, else the
        records this engine holds for the same frames (a frame id names one frame: same stamp, same rows), built
        anew only for frames it no longer holds (rows from the released ones). Without a Python pass over the
        ~125 frames when all are held: 0.28 ms of a swap's 0.72 ms bookkeeping on the development machine."""
        if snap.rows is not None:
            return {f.frame_id: FrameRecord(f.frame_id, f.stamp_s, snap.rows[i]) for i, f in enumerate(snap.frames)}
        ids = [f.frame_id for f in snap.frames]
        records = dict(zip(ids, map(held.get, ids)))
        missing = [fid for fid, rec in records.items() if rec is None]
        if missing:
            stamps = {f.frame_id: f.stamp_s for f in snap.frames}
            for fid in missing:
                records[fid] = FrameRecord(fid, stamps[fid], self._released_tokens(fid))
        return records

    def _finish_copy(self, snap: StateSnapshot, copy) -> float:
        """Wait for the snapshot's queued KV copy (not for the recompute queued after it); returns the ms waited.
        A device KV found rewritten under the copy leaves an empty, exact state and raises SnapshotError."""
        t_wait = time.perf_counter()
        try:
            copy.finish()
        except DeviceKVUnavailable as exc:
            self._forget_torn(snap, exc)
        return (time.perf_counter() - t_wait) * 1e3

    def _forget_torn(self, snap: StateSnapshot, exc: DeviceKVUnavailable) -> None:
        """The reconciler rewrote the buffer under the copy: this KV is mixed. Forget every frame, the late ones
        recomputed over it too (an exact, empty state), rather than attend to it; the next offer brings them back."""
        log.error("swap v%d: %s; all frames forgotten, the state stays exact", snap.version, exc)
        self.reset_frames()
        raise SnapshotError(f"snapshot v{snap.version}: {exc}") from exc

    def _release(self, record: FrameRecord | None) -> None:
        """A frame the policy evicted: its vision rows are kept (copied) for a swap whose offer comes without them."""
        if self._released_rows is None or record is None or record.tokens is None:
            return
        self._released_rows.keep(record.frame_id, record.tokens)

    def _released_tokens(self, frame_id: int) -> np.ndarray | None:
        """A frame's vision rows from the released ones, lent to the record a swap builds for it (None when not
        kept: the frame keeps its exact KV, but a later re-base cannot recompute it and forgets it,
        recompute_retained)."""
        if self._released_rows is None:
            return None
        tokens = self._released_rows.lend(frame_id)
        if tokens is None:
            log.debug("swap: no vision rows kept for frame %d", frame_id)
        return tokens

    def _recompute_over_snapshot(self, plan: "_RecomputePlan",
                                 next_cycle_room: int = 0) -> tuple[list, float, int, float]:
        """The plan's late and unseen frames over the placed snapshot: the newest next_cycle_room of them admitted
        for the next cycle to write (_admit_pending), the others appended now, asr.late_frames_per_forward
        frames per forward (shapes warm_up prepared); returns (the frames the policy evicted meanwhile, the ms the
        forwards took, how many frames wait for the next cycle, the ms their admission took)."""
        if not plan.chunks:
            return [], 0.0, 0, 0.0
        split = len(plan.chunks) - min(len(plan.chunks), max(0, next_cycle_room))
        now, later = plan.chunks[:split], plan.chunks[split:]
        evicted, per, recompute_ms = [], self.cfg.asr.late_frames_per_forward, 0.0
        if now:
            t_recompute = time.perf_counter()
            for i in range(0, len(now), per):
                evicted += self.append_chunks(now[i:i + per], allow_evict=True)
            recompute_ms = (time.perf_counter() - t_recompute) * 1e3
            self.note_recompute(recompute_ms, len(now))
        t_admit = time.perf_counter()
        evicted += self._admit_pending(later, {r.frame_id: r for r in plan.unseen + plan.late})
        return evicted, recompute_ms, len(later), (time.perf_counter() - t_admit) * 1e3

    def _admit_pending(self, chunks, held_before: dict) -> list[int]:
        """Slots, positions and rows for frames whose KV the next cycle writes at its start (write_pending); returns
        the frames the policy evicted to make room (a frame of this very batch among them stays unwritten and
        simply is not). held_before: the records the slot manager kept for these frames before the swap, by frame
        id: re-admitted as they are (KVSlotManager.readmit: embedding checks and unit vector not redone)."""
        evicted: list[int] = []
        for c in chunks:
            _slots, out = self.admit_chunk(c, self.next_position, held_before.get(c.frame_id))
            evicted += out
            self.next_position += self.cfg.vision.tokens_per_frame
        self._pending = [c.frame_id for c in chunks if self.kv.holds(c.frame_id)]
        return evicted

    @property
    def pending_frames(self) -> int:
        """Frames admitted by the latest swap whose KV waits for the next cycle (write_pending)."""
        return len(self._pending)

    def write_pending(self) -> int:
        """The next cycle's side of asr.swap_finish next_cycle, at its start: the late frames the swap admitted,
        written over the swapped-in state in forwards of asr.late_frames_per_forward frames (shapes the warm-up
        prepared; a forward of 64 rows or more takes the bulk prefill on the GPU). They are the newest frames, so
        each forward attends to the state before them, as at the boundary. A forward that fails forgets the frames
        not yet written (an exact, shorter state) and raises. Returns how many were written; the time goes into
        the recompute samples a swap's budget is planned on."""
        if not self._pending:
            return 0
        self._require_boundary("write_pending")
        ids, self._pending = set(self._pending), []
        todo = [r for r in self.kv.retained() if r.frame_id in ids]
        t_write, per, written = time.perf_counter(), self.cfg.asr.late_frames_per_forward, 0
        tpf = self.cfg.vision.tokens_per_frame
        try:
            for i in range(0, len(todo), per):
                batch = todo[i:i + per]
                rows = np.concatenate([self.frames[r.frame_id].tokens for r in batch])       # [k * tpf, hidden]
                positions = np.concatenate([np.arange(r.position_start, r.position_start + tpf) for r in batch])
                slots = np.concatenate([r.slots for r in batch])
                # The frames after this batch are unwritten too: left out of what it attends to.
                self.backend.forward(rows, positions.astype(np.int64), slots,
                                     self.context_without_newest(len(todo) - i), logits="none")
                written += len(batch)
                self.computed_tokens["frames"] += rows.shape[0]
        finally:
            if written < len(todo):         # garbage KV from here on: forget those frames rather than attend to it
                self._forget_newest([r.frame_id for r in todo[written:]])
                self.last_frame_id = max(self.frames) if self.frames else None
        self.note_recompute((time.perf_counter() - t_write) * 1e3, written)
        return written

    @property
    def swap_copy_pending(self) -> bool:
        """A swap's KV copy is queued and not yet checked (asr.swap_finish next_cycle)."""
        return self._swap_copy is not None

    def settle_swap_copy(self) -> float | None:
        """Wait for the latest swap's queued KV copy and check it (asr.swap_finish next_cycle): the ms waited, or
        None when none was pending. A copy found torn forgets every frame (an exact, empty state, as at the
        boundary) and counts in torn_after_apply; nothing had read that KV yet. Called before anything reads or
        changes the state: the cycle's start, a swap, a state change at a boundary."""
        if self._swap_copy is None:
            return None
        (version, copy), self._swap_copy = self._swap_copy, None
        t_wait = time.perf_counter()
        try:
            copy.finish()
        except DeviceKVUnavailable as exc:
            self.torn_after_apply += 1
            log.error("swap v%d: %s (found by the next cycle's check); all frames forgotten, the state stays exact",
                      version, exc)
            self.reset_frames()
            self.last_frame_id = None
        return (time.perf_counter() - t_wait) * 1e3

    def note_recompute(self, ms: float, frames: int) -> None:
        """Fold a measured recompute of `frames` frames into `recompute_ms_per_frame`, the cost a swap's
        recompute budget and a re-base are planned on (Engine.swap_recompute_budget_frames): the median of the
        last admission.tail_window per-frame samples. Not a moving average: recomputes are measured only when
        one runs, and one slow sample (an 86 ms machine hiccup in a CPU soak) folded into an average priced
        every later swap out of the slack, so no sample ever came to bring it back; a median ignores it."""
        if frames <= 0 or not math.isfinite(ms):
            return
        # A sorted window, not np.median / np.quantile: both run at the swap's boundary (core/sample_window.py).
        self._recompute_samples.append(ms / frames)
        self.recompute_ms_per_frame = self._recompute_samples.median()
        self._recompute_tail = self._recompute_samples.tail(self.cfg.admission.tail_quantile)

    def _note_swap_fixed(self, ms: float) -> None:
        """Fold one swap's cost besides its recompute into swap_fixed_ms_tail: the admission.tail_quantile of
        the recent ones, their largest until TAIL_MIN_SAMPLES are in (a CPU demo: ~2.5 ms at p99, which a
        budget of the slack less the safety margin alone left out, and a boundary was skipped)."""
        if not math.isfinite(ms):
            return
        self._swap_fixed_samples.append(ms)
        tail = self._swap_fixed_samples.tail(self.cfg.admission.tail_quantile)
        self.swap_fixed_ms_tail = self._swap_fixed_samples.max() if tail is None else tail

    @property
    def recompute_ms_per_frame_tail(self) -> float | None:
        """The admission.tail_quantile of the last admission.tail_window measured per-frame recomputes; None
        before TAIL_MIN_SAMPLES of them. A recompute at the boundary varies more than a cycle (10-minute CPU
        soak: p99 2.3x the median, against ~1.4x for cycles), so a swap is planned on its own tail. Kept from
        the latest sample: the swap budget asks for it at every cycle boundary."""
        return self._recompute_tail

    def _plan_recompute(self, snap: StateSnapshot) -> "_RecomputePlan":
        """Which of this engine's frames a swap to `snap` keeps by recomputing them, and which it drops. One pass
        over the ~125 records at the boundary (it was four, and two over the snapshot's frames)."""
        ids = [f.frame_id for f in snap.frames]
        taken, newest = set(ids), max(ids, default=-1)
        late, missing = [], []                   # newer than the snapshot; older and not in it
        for r in self.kv.retained():
            if r.frame_id > newest:
                late.append(r)
            elif r.frame_id not in taken:
                missing.append(r)
        # Frames the author never saw (its mirror had a gap) were not dropped on purpose: keep them too,
        # recomputed over the snapshot like the late ones (after its frames, so out of capture order), as
        # many as the bound leaves room for, the newest of them.
        unseen = [r for r in missing if snap.never_saw(r.frame_id)] if snap.unseen else []
        cut = len(unseen) - min(len(unseen), max(0, self.cfg.asr.max_late_chunks - len(late)))
        forgotten, unseen = unseen[:cut], unseen[cut:]
        recompute = unseen + late
        chunks, late_lost = [], []
        for r in recompute:
            record = self.frames[r.frame_id]
            if record.tokens is None:
                late_lost.append(r.frame_id)
            else:
                chunks.append(StateChunk(r.frame_id, record.stamp_s, record.tokens, r.pooled))
        kept = {r.frame_id for r in recompute}
        dropped = [r.frame_id for r in missing if r.frame_id not in kept] + late_lost
        return _RecomputePlan(late=late, unseen=unseen, unseen_forgotten=[r.frame_id for r in forgotten],
                              chunks=chunks, late_lost=late_lost, dropped=dropped)

    def rebase_positions_if_needed(self, max_frames: int | None = None) -> bool:
        """Keep RoPE positions inside the model's trained range when no swap has re-based them.

        Positions only grow between swaps (about 1000 per second at 30 Hz). A
        reconciler's swap re-bases them; without one (absent, inactive, starved)
        the next frame would eventually pass `max_position_embeddings`, where the
        model was never trained and float32 angles lose precision. Then the
        retained frames are recomputed in place right after the prefix, exactly.
        `max_frames` bounds that recompute: only the newest max_frames frames are
        kept and the older ones are forgotten (an exact, smaller state), so the
        cycle that pays for it still ends on time. Measured on the H200 with the
        1.5B shape at 4096 slots: recomputing all 125 frames took ~400 ms, a
        cycle started 12 boundaries late. The frames are recomputed one per
        forward (recompute_retained, which Engine.warm_up has run once), so that
        each costs what the budget plans (a first forward over several frames
        also captured a CUDA graph for that row count). `last_rebase` says what
        happened.
        """
        limit = self.backend.spec.max_position_embeddings
        if self.next_position + self.cfg.vision.tokens_per_frame + self.suffix_reserve <= limit:
            return False
        keep, dropped, forgotten = self.recompute_retained(max_frames)
        self.last_rebase = {"kept": len(keep), "forgotten": len(dropped), "budget_frames": max_frames}
        log.warning("RoPE positions reached %d of %d: %d frames recomputed from position %d, %d forgotten "
                    "(%d of them to keep the recompute within the cycle's budget)",
                    limit - self.cfg.vision.tokens_per_frame - self.suffix_reserve, limit, len(keep),
                    self.prefix_tokens, len(dropped), forgotten)
        return True

    def recompute_retained(self, max_frames: int | None = None) -> tuple[list[int], list[int], int]:
        """Recompute the retained frames that have stored vision rows in place, right after the prefix,
        exactly, one frame per forward (the re-base's step; Engine.warm_up runs it once so that its first
        live use pays no one-time cost); only the newest max_frames of them when given. Returns (the frame
        ids kept, the frame ids dropped, how many of those were dropped for max_frames)."""
        keep = [r.frame_id for r in self.kv.retained() if self.frames[r.frame_id].tokens is not None]
        forgotten = 0
        if max_frames is not None and len(keep) > max_frames:
            forgotten, keep = len(keep) - max_frames, keep[len(keep) - max_frames:]
        return keep, self.rebuild_in_place(keep, tokens_per_step=self.cfg.vision.tokens_per_frame), forgotten

    @property
    def prefix_tokens(self) -> int:
        return int(self.prefix_slots.size)

    @property
    def frame_capacity(self) -> int:
        """Frames that fit beside the prefix and one cycle's suffix reserve."""
        return (self.cfg.kv.capacity_tokens - self.prefix_tokens - self.suffix_reserve) // self.cfg.vision.tokens_per_frame

    @property
    def state_exact(self) -> bool:
        """True when the frame KV is what a from-scratch forward of the retained frames would give."""
        return self.approximate_evictions == 0

    def state_summary(self, suffix_tokens: int = 0) -> dict:
        """Token accounting of the CSR layout: prefix, chunks (frames) and the transient suffix (of
        `suffix_tokens` tokens, the cycle's), separately."""
        retained = self.kv.retained()
        tpf = self.cfg.vision.tokens_per_frame
        return {
            "prefix_tokens": self.prefix_tokens,
            "frames": len(retained),
            "frame_tokens": len(retained) * tpf,
            "suffix_tokens": int(suffix_tokens),
            "suffix_reserve": self.suffix_reserve,
            "transient_tokens": self.kv.transient_slots,
            "frame_capacity": self.frame_capacity,
            "kv_capacity": self.cfg.kv.capacity_tokens,
            "kv_fill": self.kv.fill_fraction,
            "evictions": self.kv.evictions,
            "approximate_evictions": self.approximate_evictions,
            "state_exact": self.state_exact,
            "state_version": self.state_version,
            "next_position": self.next_position,
            "computed_tokens": dict(self.computed_tokens),
            "memory_bytes": self.backend.memory_bytes(),
        }

    # --------------------------------------------------------------- helpers

    def admit_chunk(self, chunk: StateChunk, position_start: int,
                    held_before: RetainedFrame | None = None) -> tuple[np.ndarray, list[int]]:
        """Slots for a new frame starting at `position_start` (the policy evicts if full); remembers its rows.
        held_before: the slot manager's record of the same frame from before a swap (its pooled embedding is the
        chunk's), re-admitted without redoing its checks."""
        if held_before is not None:
            admission = self.kv.readmit(held_before, position_start, reserve=self.suffix_reserve)
        else:
            admission = self.kv.add_frame(chunk.frame_id, chunk.pooled, position_start, reserve=self.suffix_reserve)
        evicted = [f.frame_id for f in admission.evicted]
        for fid in evicted:
            self._release(self.frames.pop(fid, None))
        # Every policy eviction leaves a hole (and stale context) that a from-scratch forward would not have.
        self.approximate_evictions += len(evicted)
        self.frames[chunk.frame_id] = FrameRecord(chunk.frame_id, chunk.stamp_s, chunk.tokens)
        return admission.slots, evicted

    def drop_unwritten_frame(self) -> None:
        """A frame whose prefill failed has garbage KV: forget it rather than attend to it later."""
        fid, self._unwritten_frame = self._unwritten_frame, None
        if fid is not None:
            self._forget_newest([fid])
            self.last_frame_id = None

    def _forget_newest(self, frame_ids: list) -> None:
        """Forget these frames, the newest retained ones, whose KV was never written (a failed forward): their
        slots and records go, and their positions are given back so the next frame follows without a gap."""
        gone = self.kv.evict_frames(frame_ids)
        for fid in frame_ids:
            self.frames.pop(fid, None)
        self.next_position = min(g.position_start for g in gone)

    def _pooled_of(self, frame_id: int) -> np.ndarray:
        return next(r.pooled for r in self.kv.retained() if r.frame_id == frame_id)

    def _require_boundary(self, what: str) -> None:
        if self.in_cycle:
            raise SwapTimingError(f"{what} called inside a cycle: state changes happen at cycle boundaries")

    def mark_unwritten(self, frame_id: int) -> None:
        """The frame's KV is not written until the cycle's prefill succeeds (drop_unwritten_frame forgets it)."""
        self._unwritten_frame = frame_id

    def mark_written(self) -> None:
        self._unwritten_frame = None

    def _prefill_prefix(self, tokenizer) -> None:
        ids = encode_text(tokenizer, prefix_text(self.cfg.prompt))
        free_after = self.cfg.kv.capacity_tokens - ids.size - self.suffix_reserve
        if free_after < self.cfg.vision.tokens_per_frame:
            raise FrameStateError(
                f"prompt prefix ({ids.size} tokens) leaves no room for one frame in kv.capacity_tokens={self.cfg.kv.capacity_tokens}")
        self.prefix_slots = self.kv.reserve_prefix(int(ids.size))
        self.prefix_ids = ids                                   # [P] int64
        if ids.size:
            self.backend.forward(self.backend.embed(ids), np.arange(ids.size, dtype=np.int64),
                                 self.prefix_slots, np.zeros(0, dtype=np.int32), logits="none")
        self.computed_tokens["prefix"] += int(ids.size)
        self.next_position = int(ids.size)

    def context_without_newest(self, frames: int) -> np.ndarray:
        """Cached slots (prefix + retained frames, in order) without the newest `frames` frames: the ones the
        forward asking is writing (they were just admitted, so they are the newest)."""
        return self.kv.context_slots(without_newest=frames)
