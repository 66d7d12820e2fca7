"""Which KV arena slot holds which token: prefix, retained frames, one cycle's suffix.

The arena has `capacity` physical slots, allocated once by the backend. This
manager only hands out slot numbers:

    prefix      permanent (system prompt + embodiment), reserved once
    frames      tokens_per_frame slots each, retained in arrival order and
                evicted one frame at a time by an `EvictionPolicy`
    transient   the current cycle's suffix and decoded tokens, released at
                the end of every cycle

Free slots sit on a LIFO stack: the most recently freed slot is the next one
handed out, so an evicted frame's slots (likely still warm in cache) are
reused first. Slots of evicted frames leave holes in the physical order; the
logical order the transformer sees is `context_slots()` (prefix, then frames
oldest first), and each slot keeps the RoPE position it was written with.

Policies (picked by name with `make_policy`):
    fifo            evict the oldest frame when space is needed
    sliding_window  like fifo, and also keep at most `window_frames` frames
    semantic        evict the older frame of the adjacent pair (in retention
                    order) whose pooled embeddings are most alike (cosine);
                    oldest when fewer than 2 frames are retained
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np

log = logging.getLogger(__name__)


class KVCapacityError(RuntimeError):
    """The request cannot fit in the arena even after every evictable frame is gone."""


@dataclass(frozen=True)
class RetainedFrame:
    frame_id: int
    slots: np.ndarray           # [tokens_per_frame] int32 physical arena slots
    pooled: np.ndarray          # [hidden] float32 pooled embedding (semantic eviction)
    position_start: int         # RoPE position of the frame's first token
    added_seq: int              # 0, 1, 2, ... in order of add_frame calls
    # [hidden] float64 pooled / |pooled| (zeros for a zero vector), computed once here: semantic eviction widened
    # and normalised all 125 x 1536 pooled vectors on every call; with this the "slots" phase of a cycle in the
    # H200 soak's phase table went 2.26 -> 0.38 ms p50 (and the same work ran in the reconciler's shadow).
    unit: np.ndarray = field(default=None, repr=False, compare=False)

    def __post_init__(self):
        if self.unit is None:
            object.__setattr__(self, "unit", unit_vector(self.pooled))

    @classmethod
    def placed(cls, frame_id: int, slots: np.ndarray, pooled: np.ndarray, position_start: int, added_seq: int,
               unit: np.ndarray) -> "RetainedFrame":
        """The same frame as the constructor builds from these (already converted) fields, at a third of its
        cost: a frozen dataclass sets each field through object.__setattr__ (2.4 us a frame, 0.3 ms for the
        ~125 frames a swap places at a cycle boundary); here the fields go in with one dict update."""
        frame = object.__new__(cls)
        frame.__dict__.update(frame_id=frame_id, slots=slots, pooled=pooled, position_start=position_start,
                              added_seq=added_seq, unit=unit)
        return frame


@dataclass(frozen=True)
class FrameAdmission:
    slots: np.ndarray           # [tokens_per_frame] int32 slots for the new frame
    evicted: list               # [RetainedFrame] removed to make room, in eviction order


# ----------------------------------------------------------------------------
# Eviction policies


class EvictionPolicy:
    """Chooses which retained frame to evict next.

    `victim(retained, need_free)` is called before a new frame is added, with
    the frames currently retained (oldest first; the incoming frame is not
    among them) and whether slots must be freed for it. It returns the index
    into `retained` to evict now, or None to stop evicting. The manager calls
    it repeatedly until it returns None and enough slots are free.
    """
    name = "base"

    def victim(self, retained: list, need_free: bool) -> int | None:
        raise NotImplementedError


class FifoPolicy(EvictionPolicy):
    name = "fifo"

    def victim(self, retained, need_free):
        return 0 if need_free and retained else None


class SlidingWindowPolicy(EvictionPolicy):
    name = "sliding_window"

    def __init__(self, window_frames: int):
        if window_frames <= 0:
            raise ValueError(f"sliding_window: window_frames must be > 0, got {window_frames}")
        self.window_frames = window_frames

    def victim(self, retained, need_free):
        # `>=`: the incoming frame will make one more.
        if retained and (need_free or len(retained) >= self.window_frames):
            return 0
        return None


class SemanticPolicy(EvictionPolicy):
    name = "semantic"

    def victim(self, retained, need_free):
        if not need_free or not retained:
            return None
        if len(retained) < 2:
            return 0
        sims = adjacent_cosines(np.stack([f.unit for f in retained]))         # [n-1] cosines of adjacent frames
        return int(np.argmax(sims))         # older frame of the most alike pair; ties -> oldest pair


POLICIES = {
    "fifo": lambda window_frames: FifoPolicy(),
    "sliding_window": lambda window_frames: SlidingWindowPolicy(window_frames),
    "semantic": lambda window_frames: SemanticPolicy(),
}


def make_policy(name: str, window_frames: int) -> EvictionPolicy:
    try:
        factory = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown eviction policy {name!r}; valid: {sorted(POLICIES)}") from None
    return factory(window_frames)


def unit_vector(pooled: np.ndarray) -> np.ndarray:
    """[hidden] -> [hidden] float64 of norm 1 (a zero vector stays zero, so its cosine with anything is 0)."""
    return unit_vectors(np.asarray(pooled)[None])[0]


def unit_vectors(pooled: np.ndarray) -> np.ndarray:
    """[n, hidden] -> [n, hidden] float64, each row of norm 1 (zero rows stay zero)."""
    v = np.asarray(pooled, dtype=np.float64)
    norms = np.linalg.norm(v, axis=-1, keepdims=True)
    return np.divide(v, norms, out=np.zeros_like(v), where=norms > 0)


def adjacent_cosines(units: np.ndarray) -> np.ndarray:
    """[n, hidden] unit vectors (unit_vectors) -> [n-1]: cosine of rows i and i+1."""
    return np.einsum("ij,ij->i", units[:-1], units[1:])


def adjacent_cosine_similarities(pooled: np.ndarray) -> np.ndarray:
    """[n, hidden] -> [n-1]: cosine of rows i and i+1 (a zero vector counts as similarity 0), computed as the
    semantic policy computes it."""
    return adjacent_cosines(unit_vectors(pooled))


# ----------------------------------------------------------------------------
# The manager


class KVSlotManager:
    def __init__(self, capacity: int, tokens_per_frame: int, policy: EvictionPolicy):
        if capacity <= 0 or tokens_per_frame <= 0:
            raise ValueError(f"KVSlotManager: capacity ({capacity}) and tokens_per_frame ({tokens_per_frame}) must be > 0")
        if tokens_per_frame > capacity:
            raise ValueError(f"KVSlotManager: one frame ({tokens_per_frame} slots) does not fit in capacity {capacity}")
        self.capacity = int(capacity)
        self.tokens_per_frame = int(tokens_per_frame)
        self.policy = policy
        # LIFO stack of free slots: _stack[:_top], the top last; filled reversed so the first allocations come
        # out 0, 1, 2, ... An array, not a list of ints: a swap frees and takes ~4000 slots at a cycle boundary.
        self._stack = np.arange(self.capacity - 1, -1, -1, dtype=np.int32)     # [capacity] int32
        self._top = self.capacity
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
        if n > self._top:
            raise KVCapacityError(f"reserve_prefix({n}): only {self._top} free slots; evict frames first")
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
            idx = self.policy.victim(self._frames, need_free=self._top < need)
            if idx is None:
                break
            if not 0 <= idx < len(self._frames):
                raise RuntimeError(f"policy {self.policy.name!r} chose index {idx} of {len(self._frames)} retained frames")
            evicted.append(self._remove_at(idx))
            self.evictions += 1
        if self._top < need:
            raise RuntimeError(f"policy {self.policy.name!r} stopped evicting with {self._top} free slots < {need} needed")

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
        if need > self._top:
            raise KVCapacityError(f"place_frames: {len(frames)} frames + reserve {reserve} need {need} slots, "
                                  f"{self._top} are free")
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
        out = list(slots.reshape(len(frames), tpf))         # [tpf] read-only views, one per frame
        for (_, pooled_row, start), frame_id, frame_slots, unit in zip(frames, ids, out, units):
            self._frames.append(RetainedFrame.placed(frame_id, frame_slots, np.asarray(pooled_row, dtype=np.float32),
                                                     int(start), self._added, unit))
            self._added += 1
        return out

    def evict_all(self) -> list:
        """Remove every retained frame (a swap or reset), oldest first, in one pass; counted in `removals`."""
        out, self._frames = self._frames, []
        if out:
            # One write for all: what a _push per frame, oldest first, would leave on the stack.
            self._push_in_order(np.concatenate([frame.slots[::-1] for frame in out]))
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
        if n > self._top:
            raise KVCapacityError(f"alloc_transient({n}): only {self._top} free slots "
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
        return self._top

    @property
    def used_slots(self) -> int:
        return self.capacity - self._top

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
        self._push(frame.slots)
        log.debug("frame %d out (policy %s), %d free slots", frame.frame_id, self.policy.name, self._top)
        return frame

    def _pop(self, n: int) -> np.ndarray:
        if n == 0:
            return np.zeros(0, dtype=np.int32)
        taken = self._stack[self._top - n:self._top][::-1].copy()     # [n] top of the stack first
        self._top -= n
        return taken

    def _push(self, slots: np.ndarray) -> None:
        # Reversed, so the next _pop hands these slots back in their original order.
        self._push_in_order(np.asarray(slots, dtype=np.int32)[::-1])

    def _push_in_order(self, slots: np.ndarray) -> None:
        """slots [n] int32 onto the stack as they are (the last one on top)."""
        if self._top + slots.size > self.capacity:
            raise RuntimeError(f"freeing {slots.size} slots with {self._top} of {self.capacity} free: a slot freed twice")
        self._stack[self._top:self._top + slots.size] = slots
        self._top += slots.size

    def free_stack(self) -> np.ndarray:
        """[free_slots] int32, a copy: the free slots as the stack holds them, the next one handed out last."""
        return self._stack[:self._top].copy()
