"""The launchers of the bulk prefill's kernels (gemm_bulk.cu, gemm_wgmma.cu, gemm_tma.cu, prefill_bulk.cu) and the
tile constants they size grids and shared memory with: a base class of cuda_kernels.CudaKernels, which supplies the
compiled functions (`_function`, `_launch`, `_check_shared`, `_param_launch`), `num_sms` and `kv_dtype`."""
from __future__ import annotations

import ctypes
from dataclasses import dataclass

import numpy as np

from . import kernel_constants as kc
from .cuda_launch_common import ATTN_MAX_GROUP, ceil_div, ptr
from .cuda_launch_common import check as _check, check_array as _check_array
from .cuda_tensor_map import bf16_tiled

# gemm_bulk.cu: rows x columns per block, K columns per stage, stages, padded shared-memory row (bf16), threads,
# resident blocks per SM.
GEMM_BULK_BM = 128
GEMM_BULK_BN = 128
GEMM_BULK_BK = 32
GEMM_BULK_STAGES = 3
GEMM_BULK_ROW = 40
GEMM_BULK_THREADS = 256
GEMM_BULK_BLOCKS_PER_SM = 2
# The bulk GEMM kernels by name (CudaBackend.bulk_gemm): family, entry prefix, rows x columns per block, K columns per
# stage, stages, bf16 per shared-memory tile row, extra shared bytes, resident blocks per SM, what K must be a
# multiple of (gemm_bulk.cu needs whole stages; the Hopper kernels zero-fill a tail, 16-byte chunks), threads per
# block, stages with one activation part where that differs, shared bytes per stage beyond the tiles (mbarriers), and
# whether the operands go as tensor maps by value (launched through cuda_param_launch.py). "mma": gemm_bulk.cu
# (mma.sync, any sm_80+); "wgmma128": gemm_wgmma.cu (sm_90a only), 128 weight rows per block, cp.async copies;
# "tma" / "tma2": gemm_tma.cu (sm_90a only), the same products fed by TMA copies from a producer warp, one or two
# blocks per SM.
@dataclass(frozen=True)
class BulkGemm:
    family: str
    prefix: str               # entry name without its _p<parts>
    bm: int
    bn: int
    bk: int
    stages: int
    row: int
    extra_shared: int         # bytes beyond the stages (gemm_wgmma.cu aligns its tiles to 1 KB)
    blocks_per_sm: int
    k_multiple: int
    threads: int = 256
    stages_one_part: int = 0      # 0: `stages` for either part count
    barrier_bytes: int = 0        # per stage
    tensor_maps: bool = False

    def stages_for(self, parts: int) -> int:
        return self.stages_one_part if parts == 1 and self.stages_one_part else self.stages

    def shared_bytes(self, parts: int) -> int:
        stages = self.stages_for(parts)
        return stages * ((parts * self.bm + self.bn) * self.row * 2 + self.barrier_bytes) + self.extra_shared


BULK_GEMMS = {
    "mma": BulkGemm("gemm_bulk", "gemm_bulk", GEMM_BULK_BM, GEMM_BULK_BN, GEMM_BULK_BK, GEMM_BULK_STAGES,
                    GEMM_BULK_ROW, 0, GEMM_BULK_BLOCKS_PER_SM, GEMM_BULK_BK),
    "wgmma128": BulkGemm("gemm_wgmma", "gemm_wgmma_n128", 128, 128, 64, 4, 64, 1024, 1, 8),
    # two consumer warpgroups and a producer warp; 4 stages of two parts, 6 of one; a full and an empty mbarrier
    # per stage
    "tma": BulkGemm("gemm_tma", "gemm_tma", 128, 128, 64, 4, 64, 1024, 1, 8, threads=288, stages_one_part=6,
                    barrier_bytes=16, tensor_maps=True),
    # the same kernel with half the stages, two blocks per SM (one block's epilogue overlaps the other's products);
    # for the lab, not yet measured
    "tma2": BulkGemm("gemm_tma", "gemm_tma2", 128, 128, 64, 2, 64, 1024, 2, 8, threads=288, stages_one_part=3,
                     barrier_bytes=16, tensor_maps=True),
}
# Parameter types of a by-value launch (cuda_param_launch.py), by the scalar the launcher built (ptr() gives ints).
_CTYPES = {np.int64: ctypes.c_longlong, np.int32: ctypes.c_int, int: ctypes.c_void_p}
# prefill_bulk.cu: query rows per attention block, list entries per K/V tile, its head_dim entries.
FLASH_ROWS = 16
FLASH_BKV = 32
FLASH_BKV_WIDE = 64             # attention_flash_tiles.cu's _t64 entries: list entries per K/V tile
FLASH_WIDE_MAX_GROUP = 6        # ... bounded to two blocks of at most 192 threads (one warp per query head)
FLASH_HEAD_DIMS = (32, 64, 128)
LOG2_E = 1.4426950408889634     # its scores are in log2 units: q is scaled by scale * log2(e)


class BulkPrefillLaunchers:
    """Checked launchers of the bulk prefill (CudaBackend._enqueue_bulk_layers)."""

    def gemm_bulk(self, W, x, part_stride: int, M: int, mode: int, stream, out=None, out_hl=None,
                  out_part_stride: int = 0, bias=None, out_cols: int | None = None, k_split: int | None = None,
                  parts: int = 2, kernel: str = "mma") -> int:
        """acc = x[:M] @ W^T on the tensor cores by the BULK_GEMMS kernel `kernel` (gemm_bulk.cu's mma.sync,
        gemm_wgmma.cu's or gemm_tma.cu's wgmma), x the activations as bf16 bits in a flat uint16 buffer (hi rows
        [M, K] at element 0, lo rows at part_stride; parts 1 reads hi only). STORE / ADD: out float32 2-D [>= M, >= out_cols];
        SWIGLU: out_hl flat uint16, hi rows [M, out_cols] at 0, lo at out_part_stride. k_split > 1 (ADD only)
        splits K over blocks that add atomically; by default just enough to give a wave of resident blocks.
        Returns k_split."""
        _check(kernel in BULK_GEMMS, f"gemm_bulk: unknown kernel {kernel!r}; choose one of {tuple(BULK_GEMMS)}")
        plan = BULK_GEMMS[kernel]
        _check_array("gemm_bulk weight", W, np.uint16, 2)
        _check_array("gemm_bulk x", x, np.uint16)
        _check(mode in (kc.MODE_STORE, kc.MODE_ADD, kc.MODE_SWIGLU), f"gemm_bulk: unknown mode {mode}")
        _check(parts in (1, 2), f"gemm_bulk: parts {parts} not 1 or 2")
        N, K = W.shape
        _check(K % plan.k_multiple == 0, f"gemm_bulk {kernel}: K {K} not a multiple of {plan.k_multiple}")
        _check(M >= 1 and part_stride % 8 == 0 and (parts == 1 or part_stride >= M * K),
               f"gemm_bulk x: part stride {part_stride} must be a multiple of 8 and hold {M} x {K}")
        _check(x.size >= (parts - 1) * part_stride + M * K, f"gemm_bulk x: {x.size} elements < {M} rows x {K}")
        n_steps = ceil_div(K, plan.bk)
        ldo, out_f, out_cols = _gemm_outputs(mode, N, M, out, out_hl, out_part_stride, bias, out_cols)
        if mode == kc.MODE_SWIGLU:
            k_split = 1
        blocks = ceil_div(M, plan.bm) * ceil_div(N, plan.bn)
        if k_split is None:                 # ADD: split K until the grid holds a wave of resident blocks
            k_split = 1 if mode != kc.MODE_ADD else max(1, min(ceil_div(plan.blocks_per_sm * self.num_sms, blocks),
                                                                n_steps // 4))
        _check(k_split == 1 or mode == kc.MODE_ADD, f"gemm_bulk: k_split {k_split} needs MODE_ADD (atomic adds)")
        _check(1 <= k_split <= n_steps, f"gemm_bulk: k_split {k_split} outside [1, {n_steps}]")
        name = f"{plan.prefix}_p{parts}"
        shared = plan.shared_bytes(parts)
        self._check_shared(name, shared, "gemm_bulk")
        grid = (ceil_div(M, plan.bm), ceil_div(N, plan.bn), k_split)
        tail = (ptr(bias), ptr(out_f), ptr(out_hl), np.int64(out_part_stride), np.int32(ldo), np.int32(M),
                np.int32(N), np.int32(K), np.int32(out_cols), np.int32(mode), np.int32(k_split))
        if plan.tensor_maps:                # the operands as tensor maps: x (K, M, parts), W (K, N)
            self._launch_with_maps(name, plan, grid, stream, x, part_stride, parts, M, W, tail, shared)
        else:
            self._launch(name, grid, plan.threads, stream, ptr(x), np.int64(part_stride), np.int32(K), ptr(W), *tail,
                         shared=shared)
        return k_split

    def _launch_with_maps(self, name: str, plan: BulkGemm, grid, stream, x, part_stride: int, parts: int, M: int, W,
                          tail: tuple, shared: int) -> None:
        """gemm_tma.cu: the activations and the weights as tensor maps (bf16, boxes of bk x bm / bk x bn), passed by
        value with the scalar tail through cuLaunchKernel's parameter array."""
        N, K = W.shape
        item = 2                            # bytes per bf16
        part_bytes = part_stride * item if parts == 2 else ceil_div(M * K * item, 16) * 16   # one part: unused
        map_x = bf16_tiled(ptr(x), (K, M, parts), (K * item, part_bytes), (plan.bk, plan.bm, 1))
        map_w = bf16_tiled(ptr(W), (K, N), (K * item,), (plan.bk, plan.bn))
        params = [ctypes.create_string_buffer(map_x, len(map_x)), ctypes.create_string_buffer(map_w, len(map_w))]
        params += [_CTYPES[type(v)](int(v)) for v in tail]
        self._param_launch(plan.family, name, grid, plan.threads, stream, params, shared)

    def rmsnorm_split(self, x, w, out_hl, part_stride: int, n_rows: int, eps: float, stream, init_dst=None,
                      init_src=None):
        """out_hl (flat uint16): hi rows [n_rows, hidden] at 0, lo at part_stride, of rmsnorm(x[:n_rows]) * w (the
        bulk GEMM's activations); optionally init_dst[i] = init_src (or 0), as rmsnorm()."""
        _check_array("rmsnorm_split x", x, np.float32, 2)
        _check_array("rmsnorm_split weight", w, np.float32, 1)
        _check_array("rmsnorm_split out", out_hl, np.uint16)
        hidden = x.shape[1]
        _check(w.shape[0] == hidden and hidden % 2 == 0, f"rmsnorm_split: weight {w.shape} vs hidden {hidden} (even)")
        _check(n_rows <= x.shape[0] and part_stride % 2 == 0 and part_stride >= n_rows * hidden
               and out_hl.size >= part_stride + n_rows * hidden, f"rmsnorm_split: {n_rows} rows do not fit")
        init_cols = 0
        if init_dst is not None:
            _check_array("rmsnorm_split init_dst", init_dst, np.float32, 2)
            init_cols = init_dst.shape[1]
            _check(n_rows <= init_dst.shape[0], f"rmsnorm_split init_dst: {init_dst.shape[0]} rows < {n_rows}")
            _check(init_src is None or init_src.shape[0] == init_cols, "rmsnorm_split init_src: wrong length")
        self._launch("rmsnorm_split_rows", (n_rows,), 256, stream, ptr(x), ptr(w), ptr(out_hl), np.int64(part_stride),
                     np.int32(hidden), np.float32(eps), ptr(init_dst), ptr(init_src), np.int32(init_cols))

    def kv_stage(self, k_layer: int, v_layer: int, attend_list, ctl, stage, n_rows: int, n_kv_heads: int,
                 capacity: int, head_dim: int, stream):
        """One layer's K/V of the attend list entries this pass's rows see, into stage (uint16 [4, KVH, stage_cap,
        hd]: K hi, K lo, V hi, V lo; a bf16 arena fills the hi parts only)."""
        _check_array("kv_stage list", attend_list, np.int32)
        _check_array("kv_stage ctl", ctl, np.int32)
        _check_array("kv_stage stage", stage, np.uint16, 4)
        _check(stage.shape[0] == 4 and stage.shape[1] == n_kv_heads and stage.shape[3] == head_dim,
               f"kv_stage: stage {stage.shape}, expected [4, {n_kv_heads}, cap, {head_dim}]")
        _check(head_dim % 8 == 0, f"kv_stage: head_dim {head_dim} not a multiple of 8")
        cap = stage.shape[2]
        part = stage[0].size
        self._launch("kv_stage", (ceil_div(cap * (head_dim // 8), 256), n_kv_heads), 256, stream, np.uintp(k_layer),
                     np.uintp(v_layer), ptr(attend_list), ptr(ctl), np.int32(n_rows), np.int32(capacity),
                     np.int32(head_dim), np.int32(cap), ptr(stage), ptr(stage, part), ptr(stage, 2 * part),
                     ptr(stage, 3 * part))

    def attention_flash(self, qkv, stage, ctl, part_o, part_ml, out_hl, out_part_stride: int, n_rows: int,
                        n_q_heads: int, n_kv_heads: int, head_dim: int, n_splits: int, scale: float, stream,
                        stages: int = 1, parts: int = 2, heads_per_warp: int = 1, kv_overlap: bool = False,
                        hoisted_copies: bool = False, tile_entries: int = FLASH_BKV):
        """prefill_bulk.cu: causal attention of n_rows rows (q in qkv, after RoPE) over the staged K/V (kv_stage),
        the list split over n_splits blocks per (16 rows, KV head), then the merge into out_hl (flat uint16: hi
        rows [n_rows, Hq * hd] at 0, lo at out_part_stride), the o projection's activations. part_o / part_ml:
        float32, at least n_splits * n_rows * Hq * hd / * 2 values. stages: K/V tiles in flight per block. parts 2:
        q, K, P and V as bf16 hi + lo pairs in the products (attention_mma.cu's precision); 1: their bf16 hi parts
        alone (a bf16 SDPA's precision; one stage). heads_per_warp 2: each warp holds two query heads of the group, so
        every K/V fragment it loads serves both (one stage; the group must be even). kv_overlap: attention_flash_kvo.cu's
        entries, the block's K/V copies under its own products (one stage; the same values). hoisted_copies (with
        kv_overlap, one head per warp): attention_flash_tiles.cu's entries, each thread's copy addresses computed
        once (the same values); tile_entries 64 (with hoisted_copies, a group of at most 6): its 64-entry tiles
        (other roundings of the online softmax)."""
        _check_array("attention_flash qkv", qkv, np.float32, 2)
        _check_array("attention_flash stage", stage, np.uint16, 4)
        _check_array("attention_flash out", out_hl, np.uint16)
        _check_array("attention_flash part_o", part_o, np.float32)
        _check_array("attention_flash part_ml", part_ml, np.float32)
        _check(n_kv_heads > 0 and n_q_heads % n_kv_heads == 0, f"attention_flash: {n_q_heads} heads not a multiple "
                                                                f"of {n_kv_heads}")
        group = n_q_heads // n_kv_heads
        _check(group <= ATTN_MAX_GROUP, f"attention_flash: group {group} > {ATTN_MAX_GROUP}")
        _check(head_dim in FLASH_HEAD_DIMS, f"attention_flash: head_dim {head_dim} not in {FLASH_HEAD_DIMS}")
        _check(stages in (1, 2), f"attention_flash: stages {stages} not 1 or 2")
        _check(parts == 2 or (parts == 1 and stages == 1), f"attention_flash: parts {parts} with {stages} stages "
                                                           f"(parts 1 has one-stage entries only)")
        _check(heads_per_warp == 1 or (heads_per_warp == 2 and stages == 1 and group % 2 == 0),
               f"attention_flash: {heads_per_warp} heads per warp with {stages} stages and a group of {group} "
               f"(2 needs one stage and an even group)")
        _check(not kv_overlap or stages == 1, f"attention_flash: the K/V overlap runs one stage, got {stages}")
        _check(not hoisted_copies or (kv_overlap and heads_per_warp == 1),
               "attention_flash: hoisted copies are entries of the K/V overlap with one head per warp")
        _check(tile_entries == FLASH_BKV or (tile_entries == FLASH_BKV_WIDE and hoisted_copies
                                             and group <= FLASH_WIDE_MAX_GROUP),
               f"attention_flash: {tile_entries}-entry tiles (group {group}): {FLASH_BKV}, or {FLASH_BKV_WIDE} with "
               f"hoisted copies and a group of at most {FLASH_WIDE_MAX_GROUP} (their two-blocks-per-SM bound)")
        _check(qkv.shape[1] % 4 == 0 and qkv.shape[0] >= n_rows, f"attention_flash qkv: shape {qkv.shape}")
        _check(stage.shape[1] == n_kv_heads and stage.shape[3] == head_dim, f"attention_flash stage: {stage.shape}")
        q_dim = n_q_heads * head_dim
        _check(part_o.size >= n_splits * n_rows * q_dim and part_ml.size >= n_splits * n_rows * n_q_heads * 2,
               f"attention_flash: partial sums too small for {n_splits} splits of {n_rows} rows")
        _check(out_part_stride % 2 == 0 and out_part_stride >= n_rows * q_dim
               and out_hl.size >= out_part_stride + n_rows * q_dim, "attention_flash out: too small")
        kv_parts = 2 if self.kv_dtype == "float32" else 1
        row = head_dim + 8
        shared = 2 * (2 * group * FLASH_ROWS * row + stages * 2 * kv_parts * tile_entries * row)
        name = (f"attention_flash_hd{head_dim}_s{stages}" + ("_w2" if heads_per_warp == 2 else "")
                + ("_p1" if parts == 1 else "") + ("_kvo" if kv_overlap else "")
                + ("" if not hoisted_copies else "_h" if tile_entries == FLASH_BKV else f"_t{tile_entries}"))
        self._check_shared(name, shared, "attention_flash")
        part = stage[0].size
        self._launch(name, (ceil_div(n_rows, FLASH_ROWS), n_kv_heads, n_splits), 32 * group // heads_per_warp, stream,
                     ptr(qkv),
                     np.int32(qkv.shape[1]), ptr(stage), ptr(stage, part), ptr(stage, 2 * part), ptr(stage, 3 * part),
                     np.int32(stage.shape[2]), ptr(ctl), ptr(part_o), ptr(part_ml), np.int32(n_rows),
                     np.int32(n_q_heads), np.int32(n_kv_heads), np.int32(n_splits),
                     np.float32(scale * LOG2_E), shared=shared)
        self._launch("attention_flash_merge", (n_rows, n_q_heads), head_dim // 2, stream, ptr(part_o), ptr(part_ml),
                     ptr(out_hl), np.int64(out_part_stride), np.int32(q_dim), np.int32(n_rows), np.int32(n_q_heads),
                     np.int32(head_dim), np.int32(n_splits))


def _gemm_outputs(mode: int, N: int, M: int, out, out_hl, out_part_stride: int, bias, out_cols):
    """(ldo, out_f, out_cols) of a bulk GEMM's output after checking it: STORE / ADD write float32 rows into out,
    SWIGLU bf16 hi/lo rows into out_hl (N interleaved gate/up rows give N / 2 columns)."""
    if mode == kc.MODE_SWIGLU:
        _check(out_hl is not None, "gemm_bulk SWIGLU: out_hl missing")
        _check_array("gemm_bulk out_hl", out_hl, np.uint16)
        _check(N % 16 == 0, f"gemm_bulk SWIGLU: {N} weight rows, expected a multiple of 16 (interleaved gate/up)")
        out_cols = N // 2 if out_cols is None else out_cols
        _check(out_cols <= N // 2 and out_cols % 2 == 0, f"gemm_bulk SWIGLU: out_cols {out_cols} (even, <= {N // 2})")
        _check(out_part_stride % 8 == 0 and out_part_stride >= M * out_cols
               and out_hl.size >= out_part_stride + M * out_cols, "gemm_bulk SWIGLU: out_hl too small")
        return out_cols, None, out_cols
    _check_array("gemm_bulk out", out, np.float32, 2)
    out_cols = N if out_cols is None else out_cols
    _check(out_cols <= N and out_cols % 2 == 0 and out.shape[1] >= out_cols and out.shape[1] % 2 == 0,
           f"gemm_bulk: out_cols {out_cols} (even, <= {N}) vs out {out.shape}")
    _check(out.shape[0] >= M, f"gemm_bulk out: {out.shape[0]} rows < {M}")
    _check(bias is None or (mode == kc.MODE_STORE and bias.dtype == np.float32 and bias.shape[0] >= out_cols),
           "gemm_bulk bias: float32 [out_cols], STORE only")
    return out.shape[1], out, out_cols
