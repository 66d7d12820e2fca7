"""INT4 weight matrices on the device and the launchers of their kernels (gemv_int4.cu: the one-row decode
projections; projection_int4.cu: the tensor-core projections of many rows; projection_int4_staged.cu: the same for
up to 32 rows with the activations staged once per block, KernelPlan.staged_int4_prefill_projections, the default): a base class of
cuda_kernels.CudaKernels, which supplies `_function`, `_launch`, `_shared_limits` and `num_sms`.

Int4Launchers extends ProjectionLaunchers: its gemv / projection take an Int4Matrix where the bf16 ones take
a weight array, so the layer code launches INT4 and float weights alike. No PyCUDA import: the arrays are
anything with dtype, shape and gpudata.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from . import kernel_constants as kc
from .cuda_launch_common import ceil_div, ptr, split_k
from .cuda_launch_common import check as _check, check_array as _check_array
from .cuda_projection_launchers import GEMV_THREADS, ProjectionLaunchers, one_row_epilogue, output_columns

INT4_CHUNK_COLUMNS = 32          # columns of one 16-byte load of packed nibbles: G and K are multiples of it
PROJ4_WARPS = 4                  # projection_int4.cu: warps per block, one 16-row tile each
PROJ4_BLOCK_COLUMNS = 128        # projection_int4.cu: columns per 16-byte load of a row (its K-split unit)
PROJ4_TARGET_WARPS = 2048        # ADD: split K until about this many warps stream (as projection_bf16's launcher)
PROJ4_MIN_BLOCKS_PER_SPLIT = 2   # ... each split still streaming at least this many 128-column blocks
STG4_WARPS = 8                   # projection_int4_staged.cu: warps per block, one 16-row tile each, one K part
STAGED_INT4_MAX_TOKENS = 32      # projection_int4_staged.cu: activation rows staged per block
STG4_ROW_WORDS = 80              # projection_int4_staged.cu: words per staged token row (STG4_ROW)
GEMV4_MAX_ITEMS_PER_BLOCK = 64   # gemv_int4_items: 8-row items per block asked for, at most (int4_gemv_items_per_block)
GEMV4_ROWS_PER_WARP = (1, 2)     # gemv_int4_items / gemv_int4_items2: items a warp streams at once (int4_gemv_rows_per_warp)
LEAN_SUFFIX = "_lean"            # the INT4 kernels' lean entries (int4_*_lean_loop): the same bits, fewer instructions
GEMV4_ENTRIES = ("gemv_int4", "gemv_int4_items", "gemv_int4_items2")
GEMV4_ALL_ENTRIES = GEMV4_ENTRIES + tuple(name + LEAN_SUFFIX for name in GEMV4_ENTRIES)


def gemv_int4_shared_bytes(K: int, lean: bool) -> int:
    """Dynamic shared memory of a gemv_int4.cu entry: the K staged activations (fp32), with the lean entries' one
    float4 of padding after each 32-column chunk (gemv_rows.cuh STAGE_PADDED)."""
    return 4 * K + (K // 2 if lean else 0)          # 16 bytes of padding per 32 columns


def lean_int4_group(group: int) -> bool:
    """Whether the lean entries (gemv_int4.cu's, projection_int4.cu's, projection_int4_staged.cu's) take INT4 groups
    of `group` columns: 32 x a power of two (they find a 32-column chunk's group by a shift)."""
    chunks = group // INT4_CHUNK_COLUMNS
    return group % INT4_CHUNK_COLUMNS == 0 and chunks > 0 and chunks & (chunks - 1) == 0


def _lean_suffix(what: str, W: "Int4Matrix", lean: bool) -> str:
    """The entry-name suffix of an INT4 launch: LEAN_SUFFIX when asked, KernelError for a group it cannot index."""
    if not lean:
        return ""
    _check(lean_int4_group(W.group), f"{what}: the lean entries find a chunk's group by a shift; group {W.group} "
                                     f"is not {INT4_CHUNK_COLUMNS} x a power of two")
    return LEAN_SUFFIX


def staged_int4_prefetch_shared(parts: int) -> int:
    """Dynamic shared memory of projection_int4_staged.cu's _pf entries: two staged buffers per part, then the raw
    fp32 copy of a chunk (STG4_ITEMS items of 8 floats)."""
    return 4 * (2 * parts * STAGED_INT4_MAX_TOKENS * STG4_ROW_WORDS) + STAGED_INT4_MAX_TOKENS * 16 * 8 * 4


@dataclass(frozen=True)
class Int4Matrix:
    """One INT4 projection on the device (model/int4.py's format): packed uint8 [rows, K / 2] (column 2j in the
    low nibble of byte j, 2j + 1 in the high one, each q + 8) and scales uint16 [rows, K / group] (fp16 bits).
    w_hat[r, k] = (nibble - 8) * scale[r, k // group]."""
    packed: object
    scales: object
    group: int
    dtype: ClassVar[np.dtype] = np.dtype(np.uint8)   # not bf16 bits: the bf16-only kernels (projection_staged) skip it

    @property
    def shape(self) -> tuple[int, int]:
        """(rows, K) of the matrix it stands for."""
        return int(self.packed.shape[0]), 2 * int(self.packed.shape[1])

    @property
    def nbytes(self) -> int:
        """Device bytes: packed nibbles plus scales (int4.device_bytes of its weights)."""
        return int(self.packed.nbytes) + int(self.scales.nbytes)


def check_int4(what: str, W) -> tuple[int, int, int]:
    """(rows, K, groups) of an Int4Matrix, or KernelError naming what its kernels cannot take."""
    _check(isinstance(W, Int4Matrix), f"{what}: an Int4Matrix expected, got {type(W).__name__}")
    _check_array(f"{what} packed", W.packed, np.uint8, 2)
    _check_array(f"{what} scales", W.scales, np.uint16, 2)
    rows, K = W.shape
    group = int(W.group)
    _check(group > 0 and group % INT4_CHUNK_COLUMNS == 0 and K % group == 0,
           f"{what}: group {group} must be a multiple of {INT4_CHUNK_COLUMNS} dividing K {K}")
    _check(tuple(W.scales.shape) == (rows, K // group),
           f"{what} scales: shape {tuple(W.scales.shape)}, expected {(rows, K // group)}")
    return rows, K, K // group


class Int4Launchers(ProjectionLaunchers):
    """Checked launchers of the INT4 projection kernels (see the module docstring)."""

    def gemv(self, W, x, out, mode: int, stream, **kw):
        """ProjectionLaunchers.gemv, or gemv_int4 for an Int4Matrix."""
        if isinstance(W, Int4Matrix):
            return self.gemv_int4(W, x, out, mode, stream, **kw)
        return super().gemv(W, x, out, mode, stream, **kw)

    def projection(self, W, x, out, n_tokens: int, mode: int, stream, **kw):
        """ProjectionLaunchers.projection, or projection_int4 for an Int4Matrix."""
        if isinstance(W, Int4Matrix):
            return self.projection_int4(W, x, out, n_tokens, mode, stream, **kw)
        return super().projection(W, x, out, n_tokens, mode, stream, **kw)

    def gemv_int4(self, W: Int4Matrix, x, out, mode: int, stream, norm_w=None, eps: float = 0.0, bias=None,
                  out_cols: int | None = None, w_row0: int = 0, rows: int | None = None, x_row0: int = 0,
                  rope=None, blocks_per_sm: int = 0, items_per_block: int = 0, rows_per_warp: int = 1,
                  lean: bool = False):
        """gemv_int4.cu: what gemv() computes (every mode, the RMSNorm prologue, rows [w_row0, w_row0 + rows))
        from INT4 weights, the same bits whatever the grid. Grid: a block per 8-row item (gemv_int4), or looped
        (gemv_int4_items) over blocks_per_sm per SM where there are more items than that; items_per_block > 0
        instead loops every projection over ceil(items / items_per_block) blocks (KernelPlan
        .int4_gemv_items_per_block, measured slower: off). rows_per_warp 2: the looped entry with two items in flight
        per warp (gemv_int4_items2; KernelPlan.int4_gemv_rows_per_warp, measured no help: off). lean: the same
        grid's `_lean` entry (KernelPlan.int4_decode_lean_loop; the same bits), for groups lean_int4_group takes."""
        total_rows, K, groups = check_int4("gemv_int4 weight", W)
        _check_array("gemv_int4 x", x, np.float32, 2)
        _check_array("gemv_int4 out", out, np.float32, 2)
        _check(mode in (kc.MODE_STORE, kc.MODE_ADD, kc.MODE_SWIGLU, kc.MODE_QKV_ROPE), f"gemv_int4: unknown mode {mode}")
        rows = total_rows - w_row0 if rows is None else rows
        _check(0 < rows and 0 <= w_row0 and w_row0 + rows <= total_rows,
               f"gemv_int4 weight: rows {w_row0}+{rows} > {total_rows}")
        _check(x.shape[1] >= K and x.shape[1] % 4 == 0, f"gemv_int4: x's row stride {x.shape[1]} must be >= K {K} "
                                                         f"and a multiple of 4")
        _check(0 <= x_row0 < x.shape[0], f"gemv_int4 x: row {x_row0} outside {x.shape[0]} rows")
        _check(blocks_per_sm >= 0, f"gemv_int4: blocks_per_sm {blocks_per_sm} < 0")
        _check(0 <= items_per_block <= GEMV4_MAX_ITEMS_PER_BLOCK,
               f"gemv_int4: items_per_block {items_per_block} outside [0, {GEMV4_MAX_ITEMS_PER_BLOCK}]")
        _check(rows_per_warp in GEMV4_ROWS_PER_WARP, f"gemv_int4: rows_per_warp {rows_per_warp} not in "
                                                     f"{GEMV4_ROWS_PER_WARP}")
        items, cap = ceil_div(rows, GEMV_THREADS // 32), blocks_per_sm * self.num_sms
        if items_per_block > 0:
            cap = ceil_div(items, items_per_block)
        name, grid = ("gemv_int4_items", cap) if 0 < cap < items else ("gemv_int4", items)
        if name == "gemv_int4_items" and rows_per_warp == 2:
            name = "gemv_int4_items2"
        name += _lean_suffix("gemv_int4", W, lean)
        self._function(name)                                 # on demand: loads the family and its shared limits
        limit = self._shared_limits[name]
        shared = gemv_int4_shared_bytes(K, lean)
        _check(shared <= limit, f"gemv_int4: K {K} needs {shared} bytes of shared memory > {limit}")
        out_cols, rope_args = one_row_epilogue("gemv_int4", mode, rows, K, out_cols, out, norm_w, bias, rope)
        self._launch(name, (grid,), GEMV_THREADS, stream, ptr(W.packed, w_row0 * (K // 2)),
                     ptr(W.scales, w_row0 * groups), np.int32(W.group), ptr(x, x_row0 * x.shape[1]), ptr(norm_w),
                     np.float32(eps), ptr(bias), ptr(out), np.int32(out_cols), np.int32(rows), np.int32(K),
                     np.int32(mode), *rope_args, shared=shared)

    def projection_int4(self, W: Int4Matrix, x, out, n_tokens: int, mode: int, stream, bias=None,
                        out_cols: int | None = None, w_row0: int = 0, rows: int | None = None,
                        ksplit: int | None = None, x_row0: int = 0, lean: bool = False):
        """projection_int4.cu: what projection() computes (STORE / ADD / SWIGLU over n_tokens rows of x) from INT4
        weights on the tensor cores. ksplit (ADD only) splits K, in 128-column blocks, over warps that add
        atomically; by default enough for ~PROJ4_TARGET_WARPS warps. lean (KernelPlan.int4_prefill_lean_loop): the
        _lean entry, each step's group by a shift and masks (the same bits), for groups lean_int4_group takes."""
        rows, K, groups, out_cols, ksplit = self._projection_int4_checks(
            "projection_int4", W, x, out, n_tokens, mode, bias, out_cols, w_row0, rows, ksplit, x_row0)
        nt = 1 if n_tokens <= 8 else (2 if n_tokens <= 16 else 4)
        grid = (ceil_div(ceil_div(rows, 16) * ksplit, PROJ4_WARPS), ceil_div(n_tokens, 8 * nt))
        name = f"projection_int4_nt{nt}" + _lean_suffix("projection_int4", W, lean)
        self._launch(name, grid, PROJ4_WARPS * 32, stream,
                     *_projection_int4_args(W, x, bias, out, rows, K, groups, n_tokens, out_cols, mode, ksplit,
                                            w_row0, x_row0))

    def projection_int4_staged(self, W: Int4Matrix, x, out, n_tokens: int, mode: int, stream, bias=None,
                               out_cols: int | None = None, w_row0: int = 0, rows: int | None = None,
                               ksplit: int | None = None, x_row0: int = 0, parts: int = 2, prefetch: bool = False,
                               lean: bool = False):
        """projection_int4_staged.cu (KernelPlan.staged_int4_prefill_projections, the default for INT4
        weights: measured faster): what projection_int4() computes, the same bits (ADD with ksplit > 1: the same parts, added in
        another order), for n_tokens <= STAGED_INT4_MAX_TOKENS, each 128-column chunk of the activations split
        into hi/lo once per block of 8 tiles in shared memory. The default ksplit is projection_int4's: the
        same ~PROJ4_TARGET_WARPS warps (8 per block here), the same parts. parts 1 (KernelPlan
        .int4_prefill_activation_parts): the activations' bf16 hi alone, half the products (not those bits).
        prefetch (KernelPlan.int4_prefill_activation_prefetch): the _pf entries, each chunk's activations copied while
        the chunk before is multiplied (the same bits). lean (KernelPlan.int4_prefill_lean_loop): the _lean entry,
        each step's group by a shift and a mask (the same bits), for two parts without the prefetch and groups
        lean_int4_group takes."""
        rows, K, groups, out_cols, ksplit = self._projection_int4_checks(
            "projection_int4_staged", W, x, out, n_tokens, mode, bias, out_cols, w_row0, rows, ksplit, x_row0)
        _check(n_tokens <= STAGED_INT4_MAX_TOKENS,
               f"projection_int4_staged: {n_tokens} tokens > {STAGED_INT4_MAX_TOKENS} (the rows a block stages)")
        _check(parts in (1, 2), f"projection_int4_staged: parts {parts} not 1 or 2")
        grid = (ceil_div(ceil_div(rows, 16), STG4_WARPS) * ksplit,)
        name = "projection_int4_staged" + ("_p1" if parts == 1 else "") + ("_pf" if prefetch else "")
        _check(not lean or (parts == 2 and not prefetch),
               f"projection_int4_staged: the lean entry takes two parts without the prefetch, not parts {parts}, "
               f"prefetch {prefetch}")
        name += _lean_suffix("projection_int4_staged", W, lean)
        shared = staged_int4_prefetch_shared(parts) if prefetch else 0
        if prefetch:                                         # the _pf entries' shared memory is dynamic
            self._check_shared(name, shared, "projection_int4_staged")
        self._launch(name, grid, STG4_WARPS * 32, stream,
                     *_projection_int4_args(W, x, bias, out, rows, K, groups, n_tokens, out_cols, mode, ksplit,
                                            w_row0, x_row0), shared=shared)

    @staticmethod
    def _projection_int4_checks(what: str, W: Int4Matrix, x, out, n_tokens: int, mode: int, bias,
                                out_cols: int | None, w_row0: int, rows: int | None, ksplit: int | None,
                                x_row0: int) -> tuple[int, int, int, int, int]:
        """(rows, K, groups, out_cols, ksplit) of a tensor-core INT4 projection, checked (KernelError naming `what`);
        ksplit None: 1, or for ADD enough parts for ~PROJ4_TARGET_WARPS warps, each of at least
        PROJ4_MIN_BLOCKS_PER_SPLIT 128-column blocks."""
        total_rows, K, groups = check_int4(f"{what} weight", W)
        _check_array(f"{what} x", x, np.float32, 2)
        _check_array(f"{what} out", out, np.float32, 2)
        _check(mode in (kc.MODE_STORE, kc.MODE_ADD, kc.MODE_SWIGLU), f"{what}: unknown mode {mode}")
        rows = total_rows - w_row0 if rows is None else rows
        _check(0 < rows and 0 <= w_row0 and w_row0 + rows <= total_rows,
               f"{what} weight: rows {w_row0}+{rows} > {total_rows}")
        out_cols = output_columns(what, mode, rows, out_cols, out)
        _check(x.shape[1] >= K and x.shape[1] % 4 == 0,
               f"{what} x: row stride {x.shape[1]} must be >= K {K} and a multiple of 4")
        _check(n_tokens >= 1 and x_row0 + n_tokens <= x.shape[0] and n_tokens <= out.shape[0],
               f"{what}: {n_tokens} tokens exceed x/out rows")
        _check(bias is None or (bias.dtype == np.float32 and bias.shape[0] >= out_cols),
               f"{what} bias: float32 [out_cols] expected")
        n_tiles, n_blocks = ceil_div(rows, 16), ceil_div(K, PROJ4_BLOCK_COLUMNS)
        ksplit = split_k(what, mode, ksplit, n_blocks, PROJ4_MIN_BLOCKS_PER_SPLIT, n_tiles, PROJ4_TARGET_WARPS)
        return rows, K, groups, out_cols, ksplit


def _projection_int4_args(W: Int4Matrix, x, bias, out, rows: int, K: int, groups: int, n_tokens: int, out_cols: int,
                          mode: int, ksplit: int, w_row0: int, x_row0: int) -> tuple:
    """The arguments both tensor-core INT4 kernels take, in their order (rows from w_row0, x from row x_row0)."""
    return (ptr(W.packed, w_row0 * (K // 2)), ptr(W.scales, w_row0 * groups), np.int32(W.group),
            ptr(x, x_row0 * x.shape[1]), ptr(bias), ptr(out), np.int32(rows), np.int32(K), np.int32(n_tokens),
            np.int32(x.shape[1]), np.int32(out.shape[1]), np.int32(out_cols), np.int32(mode), np.int32(ksplit))
