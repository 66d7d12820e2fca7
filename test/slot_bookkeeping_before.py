"""The swap's host bookkeeping as it was at commit 7bcc3f0, where it differs from today's: the oracle of the tests
that the faster one hands out the very same slots and frames (test_kv_slots.py, test_bench_swap_host.py). Only
what changed is kept here, over today's classes: the free slots as a list of Python ints, freed frame by frame,
and the swap statistics folded with np.median / np.quantile. (Every snapshot check at the boundary, as then, is
today's FrameState with no loader pre-check.) Only tests use it; bench/swap_host.py's figures of before and after
are in notes/cuda_notes.md.
"""
from __future__ import annotations

import math
from collections import deque

import numpy as np

from vla_edge_ros.core.engine_state import FrameState
from vla_edge_ros.core.kv_slots import EvictionPolicy, KVSlotManager
from vla_edge_ros.core.sample_window import TAIL_MIN_SAMPLES


def window_quantile(samples, q: float) -> float | None:
    """The statistics' quantile as it was: np.quantile over the window; None before TAIL_MIN_SAMPLES samples."""
    if len(samples) < TAIL_MIN_SAMPLES:
        return None
    return float(np.quantile(np.fromiter(samples, float), q))


class BaselineFrameState(FrameState):
    """FrameState with the old slot manager (same prefix slots) and the old statistics."""

    def __init__(self, cfg, backend, tokenizer, encoder=None):
        super().__init__(cfg, backend, tokenizer, encoder)
        old = BaselineKVSlotManager(self.kv.capacity, self.kv.tokens_per_frame, self.kv.policy)
        old.reserve_prefix(int(self.prefix_slots.size))
        assert np.array_equal(old.prefix_slots, self.prefix_slots), "the baseline's prefix slots differ"
        self.kv = old
        self._recompute_samples = deque(maxlen=cfg.admission.tail_window)
        self._swap_fixed_samples = deque(maxlen=cfg.admission.tail_window)

    def note_recompute(self, ms: float, frames: int) -> None:
        if frames <= 0 or not math.isfinite(ms):
            return
        self._recompute_samples.append(ms / frames)
        self.recompute_ms_per_frame = float(np.median(np.fromiter(self._recompute_samples, float)))
        self._recompute_tail = window_quantile(self._recompute_samples, self.cfg.admission.tail_quantile)

    def _note_swap_fixed(self, ms: float) -> None:
        if not math.isfinite(ms):
            return
        self._swap_fixed_samples.append(ms)
        tail = window_quantile(self._swap_fixed_samples, self.cfg.admission.tail_quantile)
        self.swap_fixed_ms_tail = max(self._swap_fixed_samples) if tail is None else tail


class BaselineKVSlotManager(KVSlotManager):
    """The slot manager with its free slots as they were held: a list of Python ints, the top last, each frame's
    slots pushed back one frame at a time (today: an int32 array stack, a swap's frames freed in one write)."""

    def __init__(self, capacity: int, tokens_per_frame: int, policy: EvictionPolicy):
        self._free: list[int] = []
        super().__init__(capacity, tokens_per_frame, policy)
        self._free = list(range(self.capacity - 1, -1, -1))

    @property
    def _top(self) -> int:
        return len(self._free)

    @_top.setter
    def _top(self, value: int) -> None:
        """The list's length is the top: only KVSlotManager.__init__ sets it (the list is filled after it)."""

    def evict_all(self) -> list:
        out = self._take_all_frames()
        for frame in out:
            self._push(frame.slots)
        self.removals += len(out)
        return out

    def _pop(self, n: int) -> np.ndarray:
        if n == 0:
            return np.zeros(0, dtype=np.int32)
        taken = self._free[-n:][::-1]            # top of the stack first
        del self._free[-n:]
        return np.asarray(taken, dtype=np.int32)

    def _push_in_order(self, slots: np.ndarray) -> None:
        self._free.extend(int(x) for x in slots)

    def _set_free_stack(self, stack: np.ndarray) -> None:
        self._free = [int(x) for x in stack]

    def free_stack(self) -> np.ndarray:
        return np.asarray(self._free, dtype=np.int32)
