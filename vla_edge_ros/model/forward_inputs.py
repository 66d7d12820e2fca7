"""Checks every backend applies to `embed` / `forward` arguments before touching its KV arena.

One place, so the numpy reference and the PyCUDA backend refuse exactly the
same inputs with the same messages (see model/backend.py for the contract).
"""
from __future__ import annotations

import numpy as np

LOGITS_MODES = ("last", "all", "none")
MAX_POSITION = np.iinfo(np.int32).max      # device kernels hold positions as int32


def token_id_array(token_ids, vocab_size: int) -> np.ndarray:
    """`token_ids` as a 1-D integer array of vocabulary ids in [0, vocab_size) (the `embed` argument)."""
    ids = np.asarray(token_ids)
    if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"token_ids must be a 1-D integer array, got {ids.dtype} {ids.shape}")
    if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
        raise ValueError(f"token_ids out of range [0, {vocab_size}): min {ids.min()}, max {ids.max()}")
    return ids


def slot_array(slots, name: str, capacity: int) -> np.ndarray:
    """`slots` as a 1-D int64 array of arena indices in [0, capacity)."""
    arr = np.asarray(slots)
    if arr.ndim != 1 or not (np.issubdtype(arr.dtype, np.integer) or arr.size == 0):
        raise ValueError(f"{name} must be a 1-D integer array, got {arr.dtype} {arr.shape}")
    arr = arr.astype(np.int64, copy=False)
    if arr.size and (arr.min() < 0 or arr.max() >= capacity):
        raise ValueError(f"{name} out of range [0, {capacity}): min {arr.min()}, max {arr.max()}")
    return arr


def check_forward_inputs(hidden: int, marks: np.ndarray, x, positions, write_slots, context_slots, logits):
    """Validated (x [N, hidden] f32, positions [N] int, write_slots [N] int64, context_slots [C] int64).

    marks: the caller's all-False bool scratch of one entry per arena slot, allocated once; the duplicate
    and overlap checks mark slots in it (O(N + C), no sort: this runs on every decode step) and clear it.
    """
    capacity = marks.size
    x = np.asarray(x)
    if x.ndim != 2 or x.shape[1] != hidden or x.shape[0] == 0:
        raise ValueError(f"x must be [N > 0, hidden={hidden}], got shape {x.shape}")
    if x.dtype != np.float32:
        raise ValueError(f"x must be float32, got {x.dtype}")
    n = x.shape[0]
    positions = np.asarray(positions)
    if positions.shape != (n,) or not np.issubdtype(positions.dtype, np.integer):
        raise ValueError(f"positions must be an integer array of shape ({n},), got {positions.dtype} {positions.shape}")
    if positions.min() < 0 or positions.max() > MAX_POSITION:
        raise ValueError(f"positions must be in [0, 2^31), got [{positions.min()}, {positions.max()}]")
    write_slots = slot_array(write_slots, "write_slots", capacity)
    context_slots = slot_array(context_slots, "context_slots", capacity)
    if write_slots.shape != (n,):
        raise ValueError(f"write_slots must have shape ({n},) (one per row of x), got {write_slots.shape}")
    if logits not in LOGITS_MODES:
        raise ValueError(f"logits must be one of {LOGITS_MODES}, got {logits!r}")
    check_slot_sets(marks, write_slots, context_slots)
    return x, positions, write_slots, context_slots


def check_slot_sets(marks: np.ndarray, write_slots: np.ndarray, context_slots: np.ndarray) -> None:
    """Every slot at most once (a duplicate would be attended twice or written twice) and no write slot
    among the context. marks: the all-False scratch of check_forward_inputs; cleared again on return."""
    n = write_slots.size
    try:
        marks[context_slots] = True
        if np.count_nonzero(marks) != context_slots.size:
            raise ValueError(f"context_slots contains duplicates ({context_slots.size} entries)")
        if marks[write_slots].any():
            raise ValueError(f"write_slots overlap context_slots: {np.intersect1d(write_slots, context_slots)[:8]}")
        marks[write_slots] = True
        if np.count_nonzero(marks) != context_slots.size + n:
            raise ValueError(f"write_slots contains duplicates: {write_slots}")
    finally:
        marks[context_slots] = False
        marks[write_slots] = False
