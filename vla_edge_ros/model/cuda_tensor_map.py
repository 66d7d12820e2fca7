"""Tensor maps (CUtensorMap) for the tensor memory accelerator's bulk copies (gemm_tma.cu), encoded by the CUDA
driver's cuTensorMapEncodeTiled through ctypes: PyCUDA has no binding for it.

A map describes a bf16 tensor in device memory (its address, dimensions innermost first and the byte strides of
the outer ones) and the box one copy moves into shared memory, with the 128-byte swizzle wgmma reads
(cuda/wgmma_ops.cuh); elements outside the dimensions arrive as zeros. The 128 bytes go to the kernel by value
(cuda_param_launch.py), so a captured CUDA graph keeps its own copy and nothing lives in device memory.
"""
from __future__ import annotations

import ctypes
import functools

from .cuda_launch_common import KernelError
from .cuda_param_launch import libcuda

MAP_BYTES = 128                 # sizeof(CUtensorMap)
_BFLOAT16 = 9                   # CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
_INTERLEAVE_NONE = 0
_SWIZZLE_128B = 3               # CU_TENSOR_MAP_SWIZZLE_128B
_L2_PROMOTION_128B = 2          # CU_TENSOR_MAP_L2_PROMOTION_L2_128B
_OOB_FILL_ZEROS = 0             # CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE: out-of-bounds elements read as zero


@functools.lru_cache(maxsize=1)
def _encode_function():
    fn = libcuda().cuTensorMapEncodeTiled
    u32p, u64p = ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint64)
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p, u64p, u64p, u32p, u32p,
                   ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def check_tiled(address: int, dims: tuple, strides_bytes: tuple, box: tuple) -> None:
    """KernelError for a map the driver would refuse (or gemm_tma.cu could not read): rank 2-5, a 16-byte aligned
    address and strides, boxes of 64 bf16 (the 128-byte swizzle's row) and at most 256 elements per dimension."""
    rank = len(dims)
    if not (len(strides_bytes) == rank - 1 and len(box) == rank and 2 <= rank <= 5):
        raise KernelError(f"tensor map: rank {rank}, strides {strides_bytes}, box {box}")
    if address % 16 or any(s % 16 for s in strides_bytes):
        raise KernelError(f"tensor map: address {address:#x} or strides {strides_bytes} not 16-byte multiples")
    if box[0] * 2 != 128 or any(not 1 <= b <= 256 for b in box) or any(d < 1 for d in dims):
        raise KernelError(f"tensor map: box {box} must be 64 bf16 wide and <= 256 per dimension, dims {dims} >= 1")


@functools.lru_cache(maxsize=4096)
def bf16_tiled(address: int, dims: tuple, strides_bytes: tuple, box: tuple) -> bytes:
    """The 128 bytes of a map of the bf16 tensor at `address` with `dims` (innermost first), `strides_bytes` (of
    dims 1.., each a multiple of 16) and copies of `box` elements per dimension (box[0] x 2 bytes = 128 for the
    128-byte swizzle). Cached: a graph capture and the eager path ask for the same maps again and again."""
    check_tiled(address, dims, strides_bytes, box)
    rank = len(dims)
    raw = ctypes.create_string_buffer(MAP_BYTES + 64)            # the map must be 64-byte aligned
    at = (ctypes.addressof(raw) + 63) & ~63
    status = _encode_function()(
        ctypes.c_void_p(at), _BFLOAT16, rank, ctypes.c_void_p(address), (ctypes.c_uint64 * rank)(*dims),
        (ctypes.c_uint64 * max(1, rank - 1))(*strides_bytes), (ctypes.c_uint32 * rank)(*box),
        (ctypes.c_uint32 * rank)(*([1] * rank)), _INTERLEAVE_NONE, _SWIZZLE_128B, _L2_PROMOTION_128B, _OOB_FILL_ZEROS)
    if status != 0:
        raise KernelError(f"cuTensorMapEncodeTiled failed with CUresult {status} (dims {dims}, strides "
                          f"{strides_bytes}, box {box})")
    return ctypes.string_at(at, MAP_BYTES)
