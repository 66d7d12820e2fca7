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
reused first. A swap replaces the whole state at once: its layout is planned
off the cycle thread (plan_placement: the frames in the lowest slots after
the prefix, the rest free, lowest first) and put in force at the boundary
(install), whatever the arena held. Slots of evicted frames leave holes in
the physical order; the logical order the transformer sees is
`context_slots()` (prefix, then frames oldest first), and each slot keeps the
RoPE position it was written with.

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


@dataclass(frozen=True)
class Placement:
    """A whole state laid into the arena (KVSlotManager.plan_placement), for install at a boundary."""
    prefix: np.ndarray          # [P] int32 the prefix slots it was planned around
    frames: tuple               # (RetainedFrame,) oldest first, slots set
    ids: frozenset              # their frame ids
    slots: np.ndarray           # [n * tokens_per_frame] int32 read-only: the frames' slots in order (the KV copy's targets)
    free_stack: np.ndarray      # [free] int32 the free stack after install, the next slot handed out last
    adjacent: tuple | None = None   # the frames' AdjacentCosines values, for a policy that uses them


# ----------------------------------------------------------------------------
# Eviction policies


class EvictionPolicy:
    """Chooses which retained frame to evict next.

    `victim(retained, need_free)` is called before a new frame is added, with
    the frames currently retained (oldest first; the incoming frame is not
    among them) and whether slots must be freed for it. It returns the index
    into `retained` to evict now, or None to stop evicting. The manager calls
    it repeatedly until it returns None and enough slots are free. A policy
    with `uses_adjacent` also takes `adjacent`, the AdjacentCosines of those
    frames kept up to date by the caller (None: it computes them).
    """
    name = "base"
    uses_adjacent = False
    # True when victim() names a frame only for room (need_free): then frames that fit are admitted without one,
    # and admit_all may place them at once. sliding_window also evicts to keep its window.
    evicts_only_for_room = True

    def victim(self, retained: list, need_free: bool, adjacent: "AdjacentCosines | None" = None) -> int | None:
        raise NotImplementedError


class FifoPolicy(EvictionPolicy):
    name = "fifo"

    def victim(self, retained, need_free, adjacent=None):
        return 0 if need_free and retained else None


class SlidingWindowPolicy(EvictionPolicy):
    name = "sliding_window"
    evicts_only_for_room = False

    def __init__(self, window_frames: int):
        if window_frames <= 0:
            raise ValueError(f"sliding_window: window_frames must be > 0, got {window_frames}")
        self.window_frames = window_frames

    def victim(self, retained, need_free, adjacent=None):
        # `>=`: the incoming frame will make one more.
        if retained and (need_free or len(retained) >= self.window_frames):
            return 0
        return None


class SemanticPolicy(EvictionPolicy):
    name = "semantic"
    uses_adjacent = True

    def victim(self, retained, need_free, adjacent=None):
        if not need_free or not retained:
            return None
        if len(retained) < 2:
            return 0
        sims = adjacent.values if adjacent is not None else AdjacentCosines.of(retained).values   # [n-1]
        return int(np.argmax(sims))         # older frame of the most alike pair; ties -> oldest pair


class AdjacentCosines:
    """The cosines of neighbouring retained frames' pooled embeddings (values[i]: frame i vs i + 1), kept as
    frames are appended and removed: the semantic policy then picks its victim from n - 1 numbers instead of
    restacking n unit vectors per choice (0.25 ms a choice for 125 frames of the 1.5B shape on the development
    machine: in every cycle that evicts, in each late frame a swap recomputes, and per frame a reconciler's
    round trims). Each cosine is the one adjacent_cosines gives for the same two rows, bit for bit, so a
    manager that kept them and one that computes them afresh choose alike."""

    __slots__ = ("values",)

    def __init__(self, values: list | None = None):
        self.values: list[float] = [] if values is None else values

    @classmethod
    def of(cls, frames: list) -> "AdjacentCosines":
        """Computed afresh for frames (oldest first) that carry `unit`."""
        if len(frames) < 2:
            return cls()
        return cls(adjacent_cosines(np.stack([f.unit for f in frames])).tolist())

    def appended(self, frames: list, unit: np.ndarray) -> None:
        """A frame with this unit vector goes after `frames` (the list before the append)."""
        if frames:
            self.values.append(pair_cosine(frames[-1].unit, unit))

    def removed(self, frames: list, idx: int) -> None:
        """frames[idx] goes (`frames`: the list before the removal): its two cosines become its neighbours' one."""
        n = len(frames)
        if n <= 1:
            self.values.clear()
        elif idx == 0:
            del self.values[0]
        elif idx == n - 1:
            del self.values[-1]
        else:
            self.values[idx - 1:idx + 1] = [pair_cosine(frames[idx - 1].unit, frames[idx + 1].unit)]


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


# Rows per block of unit_vectors_of: a block's float64 temporaries stay near 1 MiB at the 1.5B's width, under the
# nodes' fixed mmap threshold (memory.malloc_mmap_threshold_mib, 4), so they come from the heap, not fresh pages.
UNIT_BLOCK_BYTES = 1 << 20


def unit_vectors_of(rows) -> np.ndarray:
    """unit_vectors of many pooled rows (a list of [hidden] arrays, or [n, hidden]), computed a block of rows at
    a time into one float64 result: the same bits (each row's norm and quotient are its own), without whole-size
    float64 temporaries. Whole-size ones were fresh mmaps at every swap at 32K slots (730 frames x 1536: three of
    ~9 MB), and their page faults made one placement ~100 ms on the development machine's first touch (an ad-hoc
    timing, not a bench). Finite
    rows of one width only (ValueError)."""
    n = len(rows)
    if n == 0:
        return np.zeros((0, 1), np.float64)
    width = np.asarray(rows[0]).shape[-1]
    out = np.empty((n, width), np.float64)
    step = max(1, UNIT_BLOCK_BYTES // (8 * width))
    for i in range(0, n, step):
        try:
            block = np.asarray(rows[i:i + step], dtype=np.float32)
        except ValueError:                      # rows of different widths
            block = None
        if block is None or block.shape != (min(step, n - i), width) or not np.isfinite(block).all():
            raise ValueError(f"unit_vectors_of: pooled embeddings must be finite vectors of one size (rows {i} to "
                             f"{min(n, i + step) - 1} are not finite, or not all {width} wide)")
        out[i:i + step] = unit_vectors(block)
    return out


def _units_reusing(frames: list, known: dict | None) -> np.ndarray | None:
    """unit_vectors_of the frames' pooled rows, taking the rows `known` has ({frame_id: unit}) as they are and
    computing the others; None when `known` has none of them (plan_placement computes them all)."""
    if not known:
        return None
    rows = [known.get(int(fid)) for fid, _, _ in frames]
    have = [i for i, r in enumerate(rows) if r is not None]
    if not have:
        return None
    width = np.asarray(frames[0][1]).shape[-1]
    if any(rows[i].shape != (width,) for i in have):
        return None                              # not this width's units: computed afresh
    units = np.empty((len(frames), width), np.float64)
    missing = [i for i, r in enumerate(rows) if r is None]
    if not missing:
        return np.stack(rows, out=units)         # straight into the result: no whole-size temporary
    for i in have:
        units[i] = rows[i]
    units[missing] = unit_vectors_of([frames[i][1] for i in missing])
    return units


def adjacent_cosines(units: np.ndarray) -> np.ndarray:
    """[n, hidden] unit vectors (unit_vectors) -> [n-1]: cosine of rows i and i+1."""
    return np.einsum("ij,ij->i", units[:-1], units[1:])


def pair_cosine(a: np.ndarray, b: np.ndarray) -> float:
    """The cosine of two unit vectors exactly as adjacent_cosines computes it for two neighbouring rows (the same
    einsum over a stack of the two: the tests hold the two to the same bits)."""
    return float(adjacent_cosines(np.stack((a, b)))[0])


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
        self._ids: set[int] = set()                     # their frame ids (the duplicate check of every admission)
        # The context in logical order (prefix, then each frame's slots, oldest first) kept as frames come and go:
        # every frame has tokens_per_frame slots, so frame i starts at prefix + i * tokens_per_frame, and a cycle
        # reads it with one copy instead of concatenating ~125 arrays and masking out the frame it writes.
        self._context = np.zeros(self.capacity, dtype=np.int32)
        self._context_len = 0
        # The cosines of neighbouring frames, kept for a policy that chooses by them (semantic), else None.
        self._adjacent = AdjacentCosines() if policy.uses_adjacent else None
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
        self._rebuild_context()
        return slots

    def add_frame(self, frame_id: int, pooled: np.ndarray, position_start: int, reserve: int) -> FrameAdmission:
        """Make room (policy) for a frame plus `reserve` transient slots, then allocate the frame's slots."""
        pooled = np.asarray(pooled)
        if pooled.ndim != 1 or pooled.size == 0 or not np.issubdtype(pooled.dtype, np.floating):
            raise ValueError(f"add_frame({frame_id}): pooled must be a non-empty 1-D float array, got {pooled.dtype} {pooled.shape}")
        if not np.isfinite(pooled).all():
            raise ValueError(f"add_frame({frame_id}): pooled embedding contains NaN or Inf")
        pooled = pooled.astype(np.float32)
        return self._admit(int(frame_id), pooled, unit_vector(pooled), position_start, reserve)

    def readmit(self, frame: RetainedFrame, position_start: int, reserve: int) -> FrameAdmission:
        """add_frame for a frame this manager held before a swap replaced its frames (FrameState's late frames,
        admitted for the next cycle to write): its pooled embedding was checked and its unit vector computed
        when it was first added, and neither is done again; its slots, position and admission order are new.
        On the H200 the swap's admission of its late frames (~1.6 a swap) was 0.33 ms p50 of the boundary's 0.44
        ms "rest" (2026-12-04, fourteenth session)."""
        return self._admit(frame.frame_id, frame.pooled, frame.unit, position_start, reserve)

    def holds(self, frame_id: int) -> bool:
        """Whether the frame is retained (a set lookup, not a pass over the frames)."""
        return frame_id in self._ids

    def _admit(self, frame_id: int, pooled: np.ndarray, unit: np.ndarray, position_start: int,
               reserve: int) -> FrameAdmission:
        if self._frames and pooled.shape != self._frames[0].pooled.shape:
            raise ValueError(f"add_frame({frame_id}): pooled shape {pooled.shape} differs from retained frames' {self._frames[0].pooled.shape}")
        if reserve < 0:
            raise ValueError(f"add_frame({frame_id}): reserve must be >= 0, got {reserve}")
        if frame_id in self._ids:
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
            idx = self.policy.victim(self._frames, need_free=self._top < need, adjacent=self._adjacent)
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
        frame = RetainedFrame.placed(frame_id, slots, pooled, int(position_start), self._added, unit)
        if self._adjacent is not None:
            self._adjacent.appended(self._frames, frame.unit)
        self._frames.append(frame)
        self._ids.add(frame.frame_id)
        self._append_context(slots)
        self._added += 1
        return FrameAdmission(slots=slots, evicted=evicted)

    def plan_placement(self, frames: list, units: np.ndarray | None = None) -> "Placement":
        """Lay a whole state into the arena as a swap will leave it, without changing anything: the frames
        (oldest first) take the lowest slots outside the prefix, tokens_per_frame each, and every other slot
        is free, handed out lowest first. The layout depends only on the capacity and the prefix, never on the
        frames held now, so the swap's loader plans it off the cycle thread while the cycle admits and evicts,
        and the boundary only puts it in force (install). Thread-safe: reads the prefix, the policy's kind and
        the admission count (which numbers the placed frames on from it) only.
        frames: [(frame_id, pooled [hidden], position_start)]; units: their pooled embeddings as unit_vectors
        gives them, when already computed (StateSnapshot.prepare_units)."""
        tpf, prefix = self.tokens_per_frame, self._prefix
        ids = [int(fid) for fid, _, _ in frames]
        if len(set(ids)) != len(ids):
            raise ValueError(f"plan_placement: duplicate frame ids in {ids[:16]}")
        free = np.setdiff1d(np.arange(self.capacity, dtype=np.int32), prefix, assume_unique=True)  # ascending
        if len(frames) * tpf > free.size:
            raise KVCapacityError(f"plan_placement: {len(frames)} frames need {len(frames) * tpf} slots, "
                                  f"{free.size} exist outside the prefix")
        if units is None and frames:
            try:
                units = unit_vectors_of([p for _, p, _ in frames])
            except ValueError as exc:
                raise ValueError(f"plan_placement: {exc}") from None
        elif units is not None and (units.shape[0] != len(frames) or not np.isfinite(units).all()):
            raise ValueError(f"plan_placement: {units.shape} unit vectors for {len(frames)} frames, or not finite")
        slots = free[:len(frames) * tpf]
        slots.flags.writeable = False            # shared with the frames' records; the bookkeeping depends on it
        first_seq = self._added
        placed = tuple(RetainedFrame.placed(frame_id, frame_slots, np.asarray(pooled_row, dtype=np.float32),
                                            int(start), first_seq + i, unit)
                       for i, ((_, pooled_row, start), frame_id, frame_slots, unit)
                       in enumerate(zip(frames, ids, slots.reshape(len(frames), tpf), units if frames else ())))
        # The placed frames' units are the rows of `units`: their cosines from it directly, not a stack of copies.
        adjacent = None
        if self.policy.uses_adjacent:
            adjacent = tuple(adjacent_cosines(units).tolist()) if len(placed) >= 2 else ()
        # Reversed onto the stack (the top last), so the slots after the frames come out lowest first.
        return Placement(prefix=prefix, frames=placed, ids=frozenset(ids), slots=slots,
                         free_stack=free[len(frames) * tpf:][::-1].copy(), adjacent=adjacent)

    def admit_all(self, frames: list, reserve: int, known_units: dict | None = None) -> int:
        """Into an empty manager (no frame, no transient slot), these frames oldest first, as add_frame one by one
        would leave it (slots, order, unit vectors, cosines, admission numbers) and with the same evictions;
        returns how many the policy evicted. The frames that fit without an eviction are placed at once
        (plan_placement + install: one vectorised pass for their unit vectors and cosines) where the policy
        evicts only for room, the rest go through add_frame. Why: the reconciler rebuilds its model of the
        primary's slots after every applied swap, and one by one that cost ~40 us a frame (29 ms for 730 frames
        on the development machine, timed ad hoc: at 32K slots, most of a gap). frames: [(frame_id, pooled,
        position_start)]. known_units: {frame_id: unit vector} of frames whose units were computed before (the
        previous shadow's records: the same bits unit_vectors_of gives), reused instead of computed again; of
        the placement's ~4.4 ms for 728 frames at the 1.5B's width on the development machine (ad hoc), ~3 ms
        were the unit vectors."""
        if self._frames or self._transient:
            raise ValueError(f"admit_all: {len(self._frames)} frames and {len(self._transient)} transient slots "
                             f"are held; it fills an empty manager")
        placeable = 0
        if self.policy.evicts_only_for_room:
            placeable = min(len(frames), max(0, (self._top - reserve) // self.tokens_per_frame))
        if placeable:
            placed = frames[:placeable]
            self.install(self.plan_placement(placed, units=_units_reusing(placed, known_units)), reserve=reserve)
        evicted = 0
        for frame_id, pooled, start in frames[placeable:]:
            evicted += len(self.add_frame(frame_id, pooled, start, reserve).evicted)
        return evicted

    def install(self, placement: "Placement", reserve: int) -> list:
        """Put a planned placement in force (a swap at a cycle boundary): every retained frame is removed
        (counted in `removals`) and the placement's frames and free slots replace them: array and list copies,
        no Python pass over the frames. Refused, with nothing changed, when the placement was
        planned around another prefix (ValueError), when transient slots are held (ValueError: only a boundary
        swaps), or when fewer than `reserve` slots would be left free for a cycle (KVCapacityError). Returns the
        frames removed, oldest first."""
        if placement.prefix is not self._prefix and not np.array_equal(placement.prefix, self._prefix):
            raise ValueError(f"install: the placement was planned around a prefix of {placement.prefix.size} slots, "
                             f"this manager has {self._prefix.size}")
        if placement.prefix.size + placement.slots.size + placement.free_stack.size != self.capacity:
            raise ValueError(f"install: the placement was planned for an arena of "
                             f"{placement.prefix.size + placement.slots.size + placement.free_stack.size} slots, "
                             f"this one has {self.capacity}")
        if self._transient:
            raise ValueError(f"install: {len(self._transient)} transient slots are held; a swap waits for the boundary")
        if placement.free_stack.size < reserve:
            raise KVCapacityError(f"install: {len(placement.frames)} frames leave {placement.free_stack.size} free "
                                  f"slots, {reserve} are reserved for a cycle")
        if self._adjacent is not None and placement.adjacent is None:
            raise ValueError("install: the placement was planned without the cosines this manager's policy uses")
        out = self._take_all_frames()
        self._frames = list(placement.frames)
        self._ids = set(placement.ids)
        if self._adjacent is not None:
            self._adjacent = AdjacentCosines(list(placement.adjacent))
        self._append_context(placement.slots)
        self._set_free_stack(placement.free_stack)
        self.removals += len(out)
        if placement.frames:
            self._added = max(self._added, placement.frames[-1].added_seq + 1)
        return out

    def evict_all(self) -> list:
        """Remove every retained frame (a swap or reset), oldest first, in one pass; counted in `removals`."""
        out = self._take_all_frames()
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

    def context_slots(self, without_newest: int = 0) -> np.ndarray:
        """[prefix + frames * tokens_per_frame] int32 (a copy): prefix slots, then frames oldest first; the
        newest `without_newest` frames left out (a forward that is writing them)."""
        if not 0 <= without_newest <= len(self._frames):
            raise ValueError(f"context_slots: cannot leave out {without_newest} of {len(self._frames)} frames")
        return self._context[:self._context_len - without_newest * self.tokens_per_frame].copy()

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
        if self._adjacent is not None:
            self._adjacent.removed(self._frames, idx)
        frame = self._frames.pop(idx)
        self._ids.discard(frame.frame_id)
        start, end = self._prefix.size + idx * self.tokens_per_frame, self._context_len
        self._context[start:end - self.tokens_per_frame] = self._context[start + self.tokens_per_frame:end].copy()
        self._context_len -= self.tokens_per_frame
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

    def _take_all_frames(self) -> list:
        """Every retained frame out of the frame list, the ids, the context and the cosines (not the free stack:
        the caller frees or replaces their slots); returns them, oldest first."""
        out, self._frames = self._frames, []
        self._ids = set()
        if self._adjacent is not None:
            self._adjacent = AdjacentCosines()
        self._context_len = self._prefix.size
        return out

    def _append_context(self, slots: np.ndarray) -> None:
        """Slots of frames that became the newest, after the context."""
        self._context[self._context_len:self._context_len + slots.size] = slots
        self._context_len += slots.size

    def _rebuild_context(self) -> None:
        """The context array from the prefix and the frames (after the prefix changed)."""
        ctx = np.concatenate([self._prefix] + [f.slots for f in self._frames]).astype(np.int32)
        self._context[:ctx.size] = ctx
        self._context_len = ctx.size

    def _set_free_stack(self, stack: np.ndarray) -> None:
        """The free stack becomes `stack` [n] int32 (the next one handed out last), whatever it held."""
        self._stack[:stack.size] = stack
        self._top = int(stack.size)

    def free_stack(self) -> np.ndarray:
        """[free_slots] int32, a copy: the free slots as the stack holds them, the next one handed out last."""
        return self._stack[:self._top].copy()
