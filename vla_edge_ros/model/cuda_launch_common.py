"""What every kernel launcher (cuda_kernels.py, cuda_bulk_launchers.py) checks its arguments with, and the
limits they share. No PyCUDA import: the arrays are anything with dtype, shape and gpudata."""
from __future__ import annotations

import numpy as np

from . import kernel_constants as kc

ATTN_MAX_GROUP = 8              # query heads per KV head the attention kernels hold (common.cuh's ATTN_MAX_GROUP)


class KernelError(ValueError):
    """A launcher was given arrays of the wrong dtype, shape or alignment (names the argument)."""


def ceil_div(a: int, b: int) -> int:
    return -(-int(a) // int(b))


def check(cond: bool, msg: str):
    if not cond:
        raise KernelError(msg)


def check_array(name: str, a, dtype, ndim: int | None = None):
    # The messages are formatted only on failure. Formatted on every call (a dtype's name is built anew each
    # time), they were most of queuing a swap's KV copy: on the H200 one kv_move took 0.088 ms p50 to check its
    # arguments and launch, and under cProfile two thirds of that was its four check_array calls (thirteenth
    # session of 2026-12-04). Here: ~0.2 us a call against ~6.7 us on the development machine.
    if a is None:
        raise KernelError(f"{name}: missing array")
    if a.dtype != dtype:
        raise KernelError(f"{name}: dtype {a.dtype}, expected {np.dtype(dtype)}")
    if ndim is not None and len(a.shape) != ndim:
        raise KernelError(f"{name}: shape {a.shape}, expected {ndim} dimensions")


def split_k(what: str, mode: int, ksplit: int | None, n_units: int, min_units_per_split: int, n_parallel: int,
            target: int) -> int:
    """The K parts of a tensor-core projection (projection_bf16.cu, projection_staged.cu, the INT4 ones), checked.
    None: 1, or for MODE_ADD (parts add atomically) enough parts that n_parallel tiles or blocks reach about
    `target` of them, each part at least min_units_per_split of the n_units K units (steps or blocks)."""
    if ksplit is None:
        ksplit = 1
        if mode == kc.MODE_ADD:
            ksplit = max(1, min(n_units // min_units_per_split, ceil_div(target, n_parallel)))
    check(ksplit == 1 or mode == kc.MODE_ADD, f"{what}: ksplit {ksplit} needs MODE_ADD (atomic adds)")
    check(1 <= ksplit <= n_units, f"{what}: ksplit {ksplit} outside [1, {n_units}]")
    return ksplit


def ptr(a, elem_offset: int = 0) -> int:
    """Device address of element `elem_offset` of a GPUArray (0 for None)."""
    if a is None:
        return 0
    return int(a.gpudata) + int(elem_offset) * a.dtype.itemsize
