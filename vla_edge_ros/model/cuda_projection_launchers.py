"""The launchers of the projection kernels (projection_f32.cu, projection_bf16.cu, projection_staged.cu,
gemv.cu) with their launch-shape rules and the limits they size grids with: a base class of
cuda_kernels.CudaKernels, which supplies the compiled functions (`_function`, `_launch`, `_shared_limits`) and
`num_sms`. The limits mirror #defines of the .cu files; test_kernel_sources.py checks that they agree."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import kernel_constants as kc
from .cuda_launch_common import ceil_div, ptr, split_k
from .cuda_launch_common import check as _check, check_array as _check_array

PROJ_WARPS = 4
# Aim for this many warps per projection launch so enough 16-byte loads are in flight
# to cover HBM latency (Little's law: ~4.5 TB/s x ~1 us needs megabytes in flight).
PROJ_TARGET_WARPS = 2048
# Each K split should still stream at least this many 32-wide steps (one unrolled iteration).
PROJ_MIN_STEPS_PER_SPLIT = 4   # = the unrolled steps of projection_bf16.cu
GEMV_THREADS = 256              # gemv.cu: 8 warps, one weight row each
GEMV_MAX_BLOCKS_PER_SM = 8      # gemv_bf16_items' looped grid, at most (KernelPlan.decode_gemv_blocks_per_sm)
STAGED_MAX_TOKENS = 32          # projection_staged.cu: activation rows staged per block


@dataclass(frozen=True)
class RopeTarget:
    """Where the QKV_ROPE epilogue of gemv.cu writes: call tables, RoPE frequencies and
    one layer's K/V arena (k_layer, v_layer: device addresses of [KVH, capacity, hd] float32)."""
    pos_table: object
    slot_table: object
    ctl: object
    inv_freq: object
    k_layer: int
    v_layer: int
    n_q_heads: int
    n_kv_heads: int
    head_dim: int
    capacity: int

    def weight_rows(self) -> int:
        """Rows of the reordered q|k|v weight (weight_layouts.qkv_rope_row_order)."""
        pairs = (self.n_q_heads + self.n_kv_heads) * (self.head_dim // 2)
        return 16 * (ceil_div(pairs, 8) + ceil_div(self.n_kv_heads * self.head_dim, 16))

    def launch_args(self) -> tuple:
        for name in ("pos_table", "slot_table", "ctl"):
            _check_array(f"rope {name}", getattr(self, name), np.int32)
        _check_array("rope inv_freq", self.inv_freq, np.float32, 1)
        _check(self.head_dim % 2 == 0, f"rope: head_dim {self.head_dim} is odd")
        _check(self.inv_freq.shape[0] == self.head_dim // 2, f"rope inv_freq: {self.inv_freq.shape[0]} != head_dim/2")
        return (ptr(self.pos_table), ptr(self.slot_table), ptr(self.ctl), ptr(self.inv_freq), np.uintp(self.k_layer),
                np.uintp(self.v_layer), np.int32(self.n_q_heads), np.int32(self.n_kv_heads), np.int32(self.head_dim),
                np.int32(self.capacity))


def output_columns(what: str, mode: int, rows: int, out_cols: int | None, out) -> int:
    """out_cols of a STORE / ADD / SWIGLU projection over `rows` weight rows (SWIGLU: interleaved gate/up
    rows, half as many outputs), checked against the output buffer."""
    if mode == kc.MODE_SWIGLU:
        _check(rows % 16 == 0, f"{what} swiglu weight: {rows} rows, expected a multiple of 16 (interleaved gate/up)")
        out_cols = rows // 2 if out_cols is None else out_cols
        _check(out_cols <= rows // 2, f"{what} swiglu: out_cols {out_cols} > {rows // 2}")
    else:
        out_cols = rows if out_cols is None else out_cols
        _check(out_cols <= rows, f"{what}: out_cols {out_cols} > rows {rows}")
    _check(out_cols <= out.shape[1], f"{what} out: {out.shape[1]} columns < {out_cols}")
    return out_cols


def one_row_epilogue(what: str, mode: int, rows: int, K: int, out_cols: int | None, out, norm_w, bias,
                      rope: "RopeTarget | None") -> tuple[int, tuple]:
    """Checks of the folded one-row projection (gemv.cu): the RMSNorm weight, the QKV_ROPE target, the output columns and the bias. -> (out_cols, rope launch arguments)."""
    if norm_w is not None:
        _check_array(f"{what} norm weight", norm_w, np.float32, 1)
        _check(norm_w.shape[0] == K, f"{what} norm weight: {norm_w.shape[0]} values, K is {K}")
    rope_args = (0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
    if mode == kc.MODE_QKV_ROPE:
        _check(rope is not None, f"{what} QKV_ROPE: rope target missing")
        _check(rows == rope.weight_rows(), f"{what} QKV_ROPE weight: {rows} rows, the rope layout of "
               f"{rope.n_q_heads}/{rope.n_kv_heads} heads x {rope.head_dim} has {rope.weight_rows()}")
        _check(out.shape[1] >= rope.n_q_heads * rope.head_dim, f"{what} QKV_ROPE out: {out.shape[1]} columns too few")
        _check(bias is None or bias.shape[0] == (rope.n_q_heads + 2 * rope.n_kv_heads) * rope.head_dim,
               f"{what} QKV_ROPE bias: natural q|k|v float32 vector expected")
        out_cols = 0
        rope_args = rope.launch_args()
    else:
        out_cols = output_columns(what, mode, rows, out_cols, out)
    _check(bias is None or bias.dtype == np.float32, f"{what} bias: float32 expected")
    _check(bias is None or mode in (kc.MODE_STORE, kc.MODE_QKV_ROPE), f"{what} bias: only STORE and QKV_ROPE add one")
    _check(bias is None or mode == kc.MODE_QKV_ROPE or bias.shape[0] >= out_cols, f"{what} bias: shorter than out_cols")
    return out_cols, rope_args


class ProjectionLaunchers:
    """Weight x activation products: many rows (the prefill), one row (decode), with their epilogues."""

    def projection(self, W, x, out, n_tokens: int, mode: int, stream, bias=None, out_cols: int | None = None,
                   w_row0: int = 0, rows: int | None = None, ksplit: int | None = None, x_row0: int = 0):
        """acc = x[x_row0 : x_row0+n_tokens, :K] @ W[w_row0 : w_row0+rows]^T, epilogue by mode (see the .cu)."""
        _check(W.dtype in (np.uint16, np.float32), f"projection weight: dtype {W.dtype}, expected uint16 (bf16) or float32")
        _check_array("projection x", x, np.float32, 2)
        _check_array("projection out", out, np.float32, 2)
        _check(mode in (kc.MODE_STORE, kc.MODE_ADD, kc.MODE_SWIGLU), f"projection: unknown mode {mode}")
        total_rows, K = W.shape
        rows = total_rows - w_row0 if rows is None else rows
        _check(0 < rows and w_row0 + rows <= total_rows, f"projection weight: rows {w_row0}+{rows} > {total_rows}")
        out_cols = output_columns("projection", mode, rows, out_cols, out)
        _check(x.shape[1] >= K, f"projection x: {x.shape[1]} columns < K {K}")
        _check(x.shape[1] % 8 == 0, f"projection x: row stride {x.shape[1]} not a multiple of 8")
        _check(x_row0 + n_tokens <= x.shape[0] and n_tokens <= out.shape[0], f"projection: {n_tokens} tokens exceed x/out rows")
        _check(bias is None or (bias.dtype == np.float32 and bias.shape[0] >= out_cols), "projection bias: float32 [out_cols] expected")
        x_ptr = ptr(x, x_row0 * x.shape[1])
        if W.dtype == np.float32:
            _check(K % 4 == 0, f"projection f32: K {K} not a multiple of 4")
            self._launch("projection_f32", (ceil_div(out_cols, 8), n_tokens), 256, stream, ptr(W, w_row0 * K), x_ptr,
                         ptr(bias), ptr(out), np.int32(rows), np.int32(K), np.int32(n_tokens), np.int32(x.shape[1]),
                         np.int32(out.shape[1]), np.int32(out_cols), np.int32(mode))
            return
        _check(K % 32 == 0, f"projection bf16: K {K} not a multiple of 32")
        n_tiles = ceil_div(rows, 16)
        n_steps = K // 32
        ksplit = split_k("projection", mode, ksplit, n_steps, PROJ_MIN_STEPS_PER_SPLIT, n_tiles, PROJ_TARGET_WARPS)
        nt = 1 if n_tokens <= 8 else (2 if n_tokens <= 16 else 4)
        grid = (ceil_div(n_tiles * ksplit, PROJ_WARPS), ceil_div(n_tokens, 8 * nt))
        self._launch(f"projection_bf16_nt{nt}", grid, PROJ_WARPS * 32, stream, ptr(W, w_row0 * K), x_ptr, ptr(bias),
                     ptr(out), np.int32(rows), np.int32(K), np.int32(n_tokens), np.int32(x.shape[1]),
                     np.int32(out.shape[1]), np.int32(out_cols), np.int32(mode), np.int32(ksplit))

    def projection_staged(self, W, x, out, n_tokens: int, mode: int, stream, bias=None, out_cols: int | None = None,
                          ksplit: int | None = None):
        """projection_staged.cu (KernelPlan.staged_prefill_projections, the default): what projection() computes
        for bf16 W and n_tokens <= 32, with each 128-wide chunk of the activations split into hi/lo once per
        block of 8 tiles in shared memory instead of once per tile."""
        _check_array("projection weight", W, np.uint16, 2)
        _check_array("projection x", x, np.float32, 2)
        _check_array("projection out", out, np.float32, 2)
        _check(mode in (kc.MODE_STORE, kc.MODE_ADD, kc.MODE_SWIGLU), f"projection: unknown mode {mode}")
        rows, K = W.shape
        _check(K % 32 == 0, f"projection bf16: K {K} not a multiple of 32")
        _check(1 <= n_tokens <= STAGED_MAX_TOKENS, f"projection_staged: {n_tokens} tokens outside [1, {STAGED_MAX_TOKENS}]")
        _check(x.shape[1] >= K and x.shape[1] % 4 == 0, f"projection x: row stride {x.shape[1]} must be >= K and % 4 == 0")
        _check(n_tokens <= x.shape[0] and n_tokens <= out.shape[0], f"projection: {n_tokens} tokens exceed x/out rows")
        out_cols = output_columns("projection", mode, rows, out_cols, out)
        _check(bias is None or (bias.dtype == np.float32 and bias.shape[0] >= out_cols and mode == kc.MODE_STORE),
               "projection bias: float32 [out_cols] expected, STORE only")
        n_groups, n_steps = ceil_div(ceil_div(rows, 16), 8), K // 32
        # About two blocks per SM, each at least one staged chunk (4 steps).
        ksplit = split_k("projection", mode, ksplit, n_steps, 4, n_groups, 2 * self.num_sms)
        self._launch("projection_staged", (n_groups * ksplit,), 256, stream, ptr(W), ptr(x), ptr(bias), ptr(out),
                     np.int32(rows), np.int32(K), np.int32(n_tokens), np.int32(x.shape[1]), np.int32(out.shape[1]),
                     np.int32(out_cols), np.int32(mode), np.int32(ksplit))

    def gemv(self, W, x, out, mode: int, stream, norm_w=None, eps: float = 0.0, bias=None, out_cols: int | None = None,
             w_row0: int = 0, rows: int | None = None, x_row0: int = 0, rope: "RopeTarget | None" = None,
             blocks_per_sm: int = 0):
        """gemv.cu, one activation row: acc = v[x_row0, :K] @ W[w_row0 : w_row0+rows]^T with v = x, or x * norm_w
        scaled by the row's RMS (norm_w given); epilogue by mode (kernel_reference.folded_projection_ref).
        blocks_per_sm > 0: where the projection has more 8-row items than that many blocks per SM, a grid of that
        size loops over them (gemv_bf16_items; the same sums)."""
        _check_array("gemv weight", W, np.uint16, 2)
        _check_array("gemv x", x, np.float32, 2)
        _check_array("gemv out", out, np.float32, 2)
        _check(mode in (kc.MODE_STORE, kc.MODE_ADD, kc.MODE_SWIGLU, kc.MODE_QKV_ROPE), f"gemv: unknown mode {mode}")
        total_rows, K = W.shape
        rows = total_rows - w_row0 if rows is None else rows
        _check(0 < rows and w_row0 + rows <= total_rows, f"gemv weight: rows {w_row0}+{rows} > {total_rows}")
        _check(K % 8 == 0 and x.shape[1] >= K and x.shape[1] % 4 == 0,
               f"gemv: K {K} must be a multiple of 8, x's row stride ({x.shape[1]}) >= K and a multiple of 4")
        _check(x_row0 < x.shape[0], f"gemv x: row {x_row0} >= {x.shape[0]} rows")
        limit = self._shared_limits["gemv_bf16"]
        _check(4 * K <= limit, f"gemv: K {K} needs {4 * K} bytes of shared memory > {limit}")
        out_cols, rope_args = one_row_epilogue("gemv", mode, rows, K, out_cols, out, norm_w, bias, rope)
        _check(blocks_per_sm >= 0, f"gemv: blocks_per_sm {blocks_per_sm} < 0")
        items, cap = ceil_div(rows, GEMV_THREADS // 32), blocks_per_sm * self.num_sms
        name, grid = ("gemv_bf16_items", cap) if 0 < cap < items else ("gemv_bf16", items)
        self._launch(name, (grid,), GEMV_THREADS, stream, ptr(W, w_row0 * K),
                     ptr(x, x_row0 * x.shape[1]), ptr(norm_w), np.float32(eps), ptr(bias), ptr(out), np.int32(out_cols),
                     np.int32(rows), np.int32(K), np.int32(mode), *rope_args, shared=4 * K)
