"""A swap applied to the frame state: a reconciled snapshot put in force at a cycle boundary.

The other half of FrameState (core/engine_state.py), as a mixin it inherits: checking an offered snapshot
before anything changes (the parts that depend on the snapshot alone on the swap loader's thread, ahead of the
boundary: `prepare_swap`), placing its frames into the slots and queuing its KV copy, recomputing the frames
the primary admitted after it (late frames) or letting the next cycle write them (asr.swap_finish
next_cycle: `write_pending`, `settle_swap_copy`), and the measured costs the swap budget plans on
(`note_recompute`, `swap_fixed_ms_tail`). `SwapReport` says what a swap did; `SwapDeferred` is a sound
snapshot left for a fresher one. The attributes these methods use are FrameState's, set in its __init__.
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass

import numpy as np

from ..model.backend import FINISHED, kv_payload
from ..model.errors import DeviceKVUnavailable
from .state_snapshot import FrameRecord, SnapshotError, StateChunk, StateSnapshot

log = logging.getLogger(__name__)


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


class SwapImport:
    """FrameState's swap (see the module docstring)."""

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
            payload = kv_payload(snap.kv)
            try:
                payload.check_usable()                  # KV left on a device: still the snapshot's
                check_fits = getattr(payload, "check_fits", None)
                if check_fits is not None:              # ... and copyable into this arena as it is
                    check_fits(self.backend)
            except (DeviceKVUnavailable, ValueError) as exc:
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
            except Exception as exc:                    # noqa: BLE001 - torn, or any failure to queue the copy:
                self._forget_torn(snap, exc)            # the layout is in force and the records gone, so the
                                                        # state is emptied, never left half swapped
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

    def _forget_torn(self, snap: StateSnapshot, exc: Exception) -> None:
        """The reconciler rewrote the buffer under the copy (DeviceKVUnavailable), or the copy could not even be
        queued: this KV is mixed or missing. Forget every frame, the late ones recomputed over it too (an exact,
        empty state), rather than attend to it; the next offer brings them back."""
        log.error("swap v%d: %s: %s; all frames forgotten, the state stays exact", snap.version,
                  type(exc).__name__, exc)
        self.reset_frames()
        raise SnapshotError(f"snapshot v{snap.version}: {exc}") from exc

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
