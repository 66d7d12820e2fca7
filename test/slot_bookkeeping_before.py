"""The swap's host bookkeeping as it was at commit 7bcc3f0, kept as the oracle of the tests that the faster one
hands out the very same slots and frames (test_kv_slots.py, test_bench_swap_host.py): the slot manager with its
free list of Python ints and a RetainedFrame built per frame through the dataclass constructor, every snapshot
check at the boundary, and the swap statistics folded with np.median / np.quantile. Copied, not maintained: only
tests use it (bench/swap_host.py's figures of before and after are in notes/cuda_notes.md).
"""
from __future__ import annotations

import logging
import math
from collections import deque

import numpy as np

from vla_edge_ros.core.sample_window import TAIL_MIN_SAMPLES
from vla_edge_ros.core.engine_state import DEFER_NO_SLACK, FrameState, SwapDeferred, _RecomputePlan
from vla_edge_ros.core.kv_slots import EvictionPolicy, FrameAdmission, KVCapacityError, RetainedFrame, unit_vectors
from vla_edge_ros.core.state_snapshot import SnapshotError, StateSnapshot
from vla_edge_ros.model.backend import kv_payload
from vla_edge_ros.model.errors import DeviceKVUnavailable

log = logging.getLogger(__name__)


def window_quantile(samples, q: float) -> float | None:
    """The statistics' quantile as it was: np.quantile over the window; None before TAIL_MIN_SAMPLES samples."""
    if len(samples) < TAIL_MIN_SAMPLES:
        return None
    return float(np.quantile(np.fromiter(samples, float), q))


class BaselineFrameState(FrameState):
    """FrameState with the old slot manager (same prefix slots) and the old checks and statistics."""

    def __init__(self, cfg, backend, tokenizer, encoder=None):
        super().__init__(cfg, backend, tokenizer, encoder)
        old = BaselineKVSlotManager(self.kv.capacity, self.kv.tokens_per_frame, self.kv.policy)
        old.reserve_prefix(int(self.prefix_slots.size))
        assert np.array_equal(old.prefix_slots, self.prefix_slots), "the baseline's prefix slots differ"
        self.kv = old
        self._recompute_samples = deque(maxlen=cfg.admission.tail_window)
        self._swap_fixed_samples = deque(maxlen=cfg.admission.tail_window)

    def _check_snapshot(self, snap: StateSnapshot, max_recompute: int | None) -> "_RecomputePlan":
        """Everything a swap to `snap` needs, checked before anything changes: SnapshotError when it cannot
        be applied at all, SwapDeferred when a fresher offer or more slack would do; else the recompute plan."""
        if snap.version <= self.state_version:
            raise SnapshotError(f"snapshot v{snap.version} is not newer than the state in force (v{self.state_version})")
        spec, tpf = self.backend.spec, self.cfg.vision.tokens_per_frame
        check_against_then(snap, prefix_ids=self.prefix_ids, tokens_per_frame=tpf, num_layers=spec.num_layers,
                           kv_dim=spec.kv_dim, hidden_size=spec.hidden_size)
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
        if max_recompute is not None and len(plan.chunks) > max_recompute:
            raise SwapDeferred(snap.version, len(plan.chunks), max_recompute, DEFER_NO_SLACK)
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

    def note_recompute(self, ms: float, frames: int) -> None:
        """Fold a measured recompute of `frames` frames into `recompute_ms_per_frame`, the cost a swap's
        recompute budget and a re-base are planned on (Engine.swap_recompute_budget_frames): the median of the
        last admission.tail_window per-frame samples. Not a moving average: recomputes are measured only when
        one runs, and one slow sample (an 86 ms machine hiccup in a CPU soak) folded into an average priced
        every later swap out of the slack, so no sample ever came to bring it back; a median ignores it."""
        if frames <= 0 or not math.isfinite(ms):
            return
        self._recompute_samples.append(ms / frames)
        self.recompute_ms_per_frame = float(np.median(np.fromiter(self._recompute_samples, float)))
        self._recompute_tail = window_quantile(self._recompute_samples, self.cfg.admission.tail_quantile)
    def _note_swap_fixed(self, ms: float) -> None:
        """Fold one swap's cost besides its recompute into swap_fixed_ms_tail: the admission.tail_quantile of
        the recent ones, their largest until TAIL_MIN_SAMPLES are in (a CPU demo: ~2.5 ms at p99, which a
        budget of the slack less the safety margin alone left out, and a boundary was skipped)."""
        if not math.isfinite(ms):
            return
        self._swap_fixed_samples.append(ms)
        tail = window_quantile(self._swap_fixed_samples, self.cfg.admission.tail_quantile)
        self.swap_fixed_ms_tail = max(self._swap_fixed_samples) if tail is None else tail


def check_against_then(self, *, prefix_ids: np.ndarray, tokens_per_frame: int, num_layers: int, kv_dim: int,
                  hidden_size: int) -> None:
    """Raise SnapshotError naming the first field that does not fit an engine of these dimensions."""
    n = len(self.frames)
    ids = self.frame_ids
    if len(set(ids)) != n:
        raise SnapshotError(f"snapshot v{self.version}: frame ids must be unique, got {ids[:16]}")
    starts = [f.position_start for f in self.frames]
    if any(b < a + tokens_per_frame for a, b in zip(starts, starts[1:])):
        raise SnapshotError(f"snapshot v{self.version}: frame positions must increase by at least "
                            f"{tokens_per_frame}, got starts {starts[:16]}")
    if self.prefix_ids is not None and not np.array_equal(self.prefix_ids, prefix_ids):
        raise SnapshotError(f"snapshot v{self.version}: computed after a different static prefix "
                            f"({self.prefix_ids.size} tokens) than this engine's ({len(prefix_ids)} tokens)")
    expected = (2, num_layers, n * tokens_per_frame, kv_dim)
    if n and (self.kv is None or self.kv.shape != expected or self.kv.dtype != np.float32):
        got = None if self.kv is None else f"{self.kv.dtype} {self.kv.shape}"
        raise SnapshotError(f"snapshot v{self.version}: kv must be float32 {expected}, got {got}")
    if n and not kv_payload(self.kv).all_finite():
        raise SnapshotError(f"snapshot v{self.version}: kv contains NaN or Inf")
    if self.rows is not None and self.rows.shape != (n, tokens_per_frame, hidden_size):
        raise SnapshotError(f"snapshot v{self.version}: rows must be {(n, tokens_per_frame, hidden_size)}, "
                            f"got {self.rows.shape}")
    if n and self.next_position < self.frames[-1].position_start + tokens_per_frame:
        raise SnapshotError(f"snapshot v{self.version}: next_position {self.next_position} is inside its newest "
                            f"frame (starts at {self.frames[-1].position_start})")


class BaselineKVSlotManager:
    def __init__(self, capacity: int, tokens_per_frame: int, policy: EvictionPolicy):
        if capacity <= 0 or tokens_per_frame <= 0:
            raise ValueError(f"KVSlotManager: capacity ({capacity}) and tokens_per_frame ({tokens_per_frame}) must be > 0")
        if tokens_per_frame > capacity:
            raise ValueError(f"KVSlotManager: one frame ({tokens_per_frame} slots) does not fit in capacity {capacity}")
        self.capacity = int(capacity)
        self.tokens_per_frame = int(tokens_per_frame)
        self.policy = policy
        # LIFO stack; stored reversed so the first allocations come out 0, 1, 2, ...
        self._free: list[int] = list(range(self.capacity - 1, -1, -1))
        self._prefix = np.zeros(0, dtype=np.int32)
        self._frames: list[RetainedFrame] = []          # oldest first
        self._transient: list[int] = []
        self._added = 0
        self.evictions = 0              # frames the policy evicted to make room
        self.removals = 0               # frames removed on request (evict_frames): swaps, failed prefills

    ##### Public API #####

    def reserve_prefix(self, n: int) -> np.ndarray:
        """Permanently take n slots for the static prefix; appended to any earlier prefix."""
        if n < 0:
            raise ValueError(f"reserve_prefix: n must be >= 0, got {n}")
        if n + self.tokens_per_frame > self._evictable_limit():
            raise KVCapacityError(
                f"reserve_prefix({n}): prefix {self._prefix.size} + {n} leaves no room for one frame "
                f"({self.tokens_per_frame} slots) in capacity {self.capacity} (transient in use: {len(self._transient)})")
        if n > len(self._free):
            raise KVCapacityError(f"reserve_prefix({n}): only {len(self._free)} free slots; evict frames first")
        slots = self._pop(n)
        self._prefix = np.concatenate([self._prefix, slots])
        return slots

    def add_frame(self, frame_id: int, pooled: np.ndarray, position_start: int, reserve: int) -> FrameAdmission:
        """Make room (policy) for a frame plus `reserve` transient slots, then allocate the frame's slots."""
        pooled = np.asarray(pooled)
        if pooled.ndim != 1 or pooled.size == 0 or not np.issubdtype(pooled.dtype, np.floating):
            raise ValueError(f"add_frame({frame_id}): pooled must be a non-empty 1-D float array, got {pooled.dtype} {pooled.shape}")
        if not np.isfinite(pooled).all():
            raise ValueError(f"add_frame({frame_id}): pooled embedding contains NaN or Inf")
        if self._frames and pooled.shape != self._frames[0].pooled.shape:
            raise ValueError(f"add_frame({frame_id}): pooled shape {pooled.shape} differs from retained frames' {self._frames[0].pooled.shape}")
        if reserve < 0:
            raise ValueError(f"add_frame({frame_id}): reserve must be >= 0, got {reserve}")
        if any(f.frame_id == frame_id for f in self._frames):
            raise ValueError(f"add_frame: frame {frame_id} is already retained")
        need = self.tokens_per_frame + reserve
        limit = self._evictable_limit()
        if need > limit:
            raise KVCapacityError(
                f"add_frame({frame_id}): frame {self.tokens_per_frame} + reserve {reserve} = {need} slots, but only {limit} "
                f"are available with every frame evicted (capacity {self.capacity}, prefix {self._prefix.size}, "
                f"transient {len(self._transient)})")

        evicted = []
        while True:
            idx = self.policy.victim(self._frames, need_free=len(self._free) < need)
            if idx is None:
                break
            if not 0 <= idx < len(self._frames):
                raise RuntimeError(f"policy {self.policy.name!r} chose index {idx} of {len(self._frames)} retained frames")
            evicted.append(self._remove_at(idx))
            self.evictions += 1
        if len(self._free) < need:
            raise RuntimeError(f"policy {self.policy.name!r} stopped evicting with {len(self._free)} free slots < {need} needed")

        slots = self._pop(self.tokens_per_frame)
        slots.flags.writeable = False            # shared with the caller; the bookkeeping depends on it
        self._frames.append(RetainedFrame(frame_id=int(frame_id), slots=slots, pooled=pooled.astype(np.float32),
                                          position_start=int(position_start), added_seq=self._added))
        self._added += 1
        return FrameAdmission(slots=slots, evicted=evicted)

    def place_frames(self, frames: list, reserve: int, units: np.ndarray | None = None) -> list:
        """Allocate slots for a whole state at once (a swap: the manager holds no frames), oldest first,
        with no policy call: the caller has checked that they fit beside `reserve` transient slots.
        frames: [(frame_id, pooled [hidden], position_start)]; units: their pooled embeddings as unit_vectors
        gives them, when already computed (a swap's loader does, off the cycle thread). Returns the slot
        arrays in that order."""
        if self._frames:
            raise ValueError(f"place_frames: {len(self._frames)} frames are still retained; evict them first")
        tpf = self.tokens_per_frame
        need = len(frames) * tpf + reserve
        if need > len(self._free):
            raise KVCapacityError(f"place_frames: {len(frames)} frames + reserve {reserve} need {need} slots, "
                                  f"{len(self._free)} are free")
        ids = [int(fid) for fid, _, _ in frames]
        if len(set(ids)) != len(ids):
            raise ValueError(f"place_frames: duplicate frame ids in {ids[:16]}")
        if not frames:
            return []
        if units is None:
            pooled = np.asarray([p for _, p, _ in frames], dtype=np.float32)
            if pooled.ndim != 2 or not np.isfinite(pooled).all():
                raise ValueError(f"place_frames: pooled embeddings must be finite vectors of one size, got {pooled.shape}")
            units = unit_vectors(pooled)         # all at once: a swap places ~125 frames at a cycle boundary
        elif units.shape[0] != len(frames) or not np.isfinite(units).all():
            raise ValueError(f"place_frames: {units.shape} unit vectors for {len(frames)} frames, or not finite")
        # All the slots in one pop, cut per frame: the same slots, in the same order, as a pop per frame.
        slots = self._pop(len(frames) * tpf)
        slots.flags.writeable = False
        out = [slots[i * tpf:(i + 1) * tpf] for i in range(len(frames))]
        for (fid, pooled_row, start), frame_slots, unit in zip(frames, out, units):
            self._frames.append(RetainedFrame(frame_id=int(fid), slots=frame_slots,
                                              pooled=np.asarray(pooled_row, dtype=np.float32),
                                              position_start=int(start), added_seq=self._added, unit=unit))
            self._added += 1
        return out

    def evict_all(self) -> list:
        """Remove every retained frame (a swap or reset), oldest first, in one pass; counted in `removals`."""
        out, self._frames = self._frames, []
        for frame in out:
            self._push(frame.slots.tolist())
        self.removals += len(out)
        return out

    def evict_frames(self, frame_ids) -> list:
        """Remove these frames now (state reconciliation, failed prefills); unknown ids raise KeyError.

        Counted in `removals`, not in `evictions` (which counts the policy's choices only).
        """
        wanted = [int(f) for f in frame_ids]
        index = {f.frame_id: i for i, f in enumerate(self._frames)}
        missing = [f for f in wanted if f not in index]
        if missing:
            raise KeyError(f"evict_frames: frames {missing} are not retained")
        if len(set(wanted)) != len(wanted):
            raise ValueError(f"evict_frames: duplicate frame ids in {wanted}")
        out = []
        for fid in wanted:
            idx = next(i for i, f in enumerate(self._frames) if f.frame_id == fid)
            out.append(self._remove_at(idx))
            self.removals += 1
        return out

    def context_slots(self) -> np.ndarray:
        """[prefix + frames * tokens_per_frame] int32: prefix slots, then frames oldest first."""
        return np.concatenate([self._prefix] + [f.slots for f in self._frames]).astype(np.int32, copy=False)

    def alloc_transient(self, n: int) -> np.ndarray:
        """n slots for this cycle's suffix / decoded tokens; released by release_transient()."""
        if n < 0:
            raise ValueError(f"alloc_transient: n must be >= 0, got {n}")
        if n > len(self._free):
            raise KVCapacityError(f"alloc_transient({n}): only {len(self._free)} free slots "
                                  f"({len(self._frames)} frames, prefix {self._prefix.size}, transient {len(self._transient)})")
        slots = self._pop(n)
        self._transient.extend(slots.tolist())
        return slots

    def release_transient(self) -> None:
        """Free every transient slot (a no-op when none are held)."""
        self._push(self._transient)
        self._transient = []

    def retained(self) -> list:
        """[RetainedFrame], oldest first."""
        return list(self._frames)

    @property
    def free_slots(self) -> int:
        return len(self._free)

    @property
    def used_slots(self) -> int:
        return self.capacity - len(self._free)

    @property
    def fill_fraction(self) -> float:
        return self.used_slots / self.capacity

    @property
    def prefix_slots(self) -> np.ndarray:
        return self._prefix.copy()

    @property
    def transient_slots(self) -> int:
        return len(self._transient)

    ##### Internal Helper Functions #####

    def _evictable_limit(self) -> int:
        """Slots a frame could get if every retained frame were evicted."""
        return self.capacity - self._prefix.size - len(self._transient)

    def _remove_at(self, idx: int) -> RetainedFrame:
        frame = self._frames.pop(idx)
        self._push(frame.slots.tolist())
        log.debug("frame %d out (policy %s), %d free slots", frame.frame_id, self.policy.name, len(self._free))
        return frame

    def _pop(self, n: int) -> np.ndarray:
        if n == 0:
            return np.zeros(0, dtype=np.int32)
        taken = self._free[-n:][::-1]            # top of the stack first
        del self._free[-n:]
        return np.asarray(taken, dtype=np.int32)

    def _push(self, slots: list) -> None:
        # Reversed, so the next _pop hands these slots back in their original order.
        self._free.extend(reversed(slots))

    def free_stack(self) -> np.ndarray:
        """As KVSlotManager.free_stack: the free slots, the next one handed out last."""
        return np.asarray(self._free, dtype=np.int32)
