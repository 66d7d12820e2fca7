"""The launchers of the attention kernels (attention_tiled.cu, attention_mma.cu, attention_decode.cu, attention.cu's
merge) and the limits they size grids and shared memory with: a base class of cuda_kernels.CudaKernels, which
supplies the compiled functions (`_function`, `_launch`, `_shared_limits`, `attention_mma_entries`), `num_sms`,
`max_shared` and `kv_dtype`. The limits mirror #defines of the .cu files; test_kernel_sources.py checks that they
agree."""
from __future__ import annotations

import numpy as np

from .cuda_launch_common import ATTN_MAX_GROUP, ceil_div, ptr
from .cuda_launch_common import check as _check, check_array as _check_array

ATTN_CHUNK = 64                 # list entries per chunk (common.cuh); a split walks one or more
ATTN_MAX_HEAD_DIM = 256
# Query rows one attention_tiled.cu block serves (its K/V chunk is loaded once for all of them).
ATTN_MAX_ROWS_PER_BLOCK = 8
ATTN_TILED_THREADS = 256
# attention.cu's merge keeps one weight per split in shared memory.
ATTN_MERGE_MAX_SPLITS = 4096
ATTN_DECODE_THREADS = 256       # attention_decode.cu: 8 warps x 8 list entries = one ATTN_CHUNK
ATTN_DECODE_HEAD_SPLITS = (1, 2)   # ... times this many warps per 8-entry group: its entries _v1, _v1_h2
# attention_decode.cu's _x<G> entries for a group of exactly G (head_dim <= 128), by (warps per 8-entry group, prefetch):
# two warps per group for even groups, one warp with the prefetch (KernelPlan.decode_attention_exact_group)
ATTN_DECODE_EXACT_GROUPS = {(2, False): (2, 4, 6), (1, True): (2, 3, 4, 6)}


# Every entry of attention_decode.cu: by float4s a lane (1: head_dim <= 128, 2: <= 256) and the choices above, and the
# exact groups' (head_dim <= 128); the kernel table and the programmatic-launch list both take this one.
ATTN_DECODE_ENTRIES = (
    *(f"attention_decode_partial_v{vpl}{suffix}" for vpl in (1, 2) for suffix in ("", "_h2", "_g1", "_pf", "_g1_pf")),
    *(f"attention_decode_partial_v1{'_h2' if head_split == 2 else '_pf'}_x{group}"
      for (head_split, _prefetch), groups in ATTN_DECODE_EXACT_GROUPS.items() for group in groups))


def exact_group_entry(group: int, head_dim: int, head_split: int, prefetch: bool) -> bool:
    """Whether attention_decode.cu has an entry for exactly this group with this head_split and prefetch."""
    return head_dim <= 128 and group in ATTN_DECODE_EXACT_GROUPS.get((head_split, bool(prefetch)), ())
# attention_mma.cu: the head_dims with an entry point; the query vectors (row x head) one block serves by
# default (one 16-row mma tile per warp), and at most (the warps loop over the tiles).
ATTN_MMA_HEAD_DIMS = (32, 64, 128)
ATTN_MMA_TARGET_QV = 128
ATTN_MMA_MAX_QV = 256
# The _hs entry (head_halves): two warps per 16-row tile, so one round of a block's 8 warps serves 4 tiles; a block
# gets at most this many query vectors by default, so that a split walking several chunks gathers each once (a
# second round gathers them again; a one-chunk split keeps its chunk). The price: more row blocks, so each chunk is
# gathered by more blocks (the cycle's 32 rows at a group of 6: 4 blocks of 8 rows, against _b2's 2 of 16); the
# long-context probe's "hs r16" row has _b2's blocks, to tell the two apart.
ATTN_MMA_HS_TARGET_QV = 64


def long_context_splits(num_sms: int, n_kv_heads: int, blocks_per_sm: int = 1, min_splits: int = 1) -> int:
    """Splits per KV head the cycle's attention launches (attention / attention_decode's max_splits): blocks_per_sm
    blocks per SM over the KV heads (KernelPlan.long_context_blocks_per_sm), and at least min_splits
    (KernelPlan.long_context_min_splits_per_kv_head: a model with many KV heads would otherwise get a few long
    walks each), each walking as many 64-entry chunks as the context needs. Where the splits
    instead cover the arena (one chunk each), a long context means thousands of short blocks and partial sums
    larger than the K/V they summarise. Measured on the H200 (bench/long_context_probe.py, 1.5B shape, fp32
    arena of 32040 slots, us per layer, splits covering the arena -> at most 66): decode 14.3 -> 11.8 at 4064
    cached, 36.0 -> 29.0 at 16384, 71.5 -> 52.1 at 32000; prefill (32 rows) 27.7 -> 25.7, 97.0 -> 75.7,
    181.7 -> 141.2 (notes/cuda_notes.md, session of 2026-12-02, fifth)."""
    return max(1, min_splits, blocks_per_sm * num_sms // n_kv_heads)


class AttentionLaunchers:
    """Split attention (flash-decoding): partial sums per split, then the merge."""

    def attention(self, qkv, k_layer: int, v_layer: int, attend_list, ctl, part_o, part_ml, out, n_rows: int,
                  n_q_heads: int, n_kv_heads: int, head_dim: int, capacity: int, n_splits: int, scale: float, stream,
                  tensor_cores: bool = False, blocks_per_sm: int = 1, rows_per_block: int | None = None,
                  max_splits: int | None = None, masked_softmax: bool = False, head_halves: bool = False):
        """out[i, h*hd:(h+1)*hd] = softmax(q k^T * scale) v over attend_list[:len_i]: the partial sums of each
        ATTN_CHUNK-slot split, then the merge. Partial sums by attention_tiled.cu (fp32, K/V chunk in shared
        memory, shared by up to 8 rows), or with tensor_cores by attention_mma.cu (bf16 hi/lo products, ~1e-5
        relative; head_dim in ATTN_MMA_HEAD_DIMS; blocks_per_sm 1 or 2 (hd 128) picks its entry;
        rows_per_block defaults to the fewest blocks of at most ATTN_MMA_TARGET_QV query vectors). max_splits
        (tensor cores only): launch at most this many splits per KV head, each walking several chunks
        (attention_decode's max_splits). masked_softmax (tensor cores, head_dim 128): attention_mma.cu's _ma entry,
        the softmax's unseen slots masked in its arguments instead of tested (the same bits; KernelPlan.
        attention_masked_softmax). head_halves (tensor cores, head_dim 128, 2 blocks per SM): attention_mma.cu's _hs
        entry, two warps per tile each keeping half of the head's P.V sums (the same bits; KernelPlan.
        attention_head_halves); rows_per_block then defaults to at most ATTN_MMA_HS_TARGET_QV query vectors."""
        _check(n_splits * ATTN_CHUNK >= capacity, f"attention: {n_splits} splits do not cover {capacity} slots")
        if max_splits is not None:
            _check(tensor_cores, "attention: max_splits needs tensor_cores (attention_tiled.cu takes one chunk per split)")
            _check(max_splits >= 1, f"attention: max_splits {max_splits} < 1")
            n_splits = min(n_splits, int(max_splits))
        group = self._attention_checks("attention", qkv, attend_list, out, part_o, part_ml, n_rows, n_q_heads,
                                       n_kv_heads, head_dim, n_splits)
        _check(head_dim <= ATTN_MAX_HEAD_DIM, f"attention: head_dim {head_dim} > {ATTN_MAX_HEAD_DIM}")
        args = (ptr(qkv), np.int32(qkv.shape[1]), np.uintp(k_layer), np.uintp(v_layer), ptr(attend_list), ptr(ctl),
                ptr(part_o), ptr(part_ml), np.int32(n_q_heads), np.int32(n_kv_heads))
        _check(not masked_softmax or tensor_cores, "attention: masked_softmax is an entry of attention_mma.cu "
                                                    "(tensor_cores)")
        _check(not head_halves or tensor_cores, "attention: head_halves is an entry of attention_mma.cu (tensor_cores)")
        _check(not (head_halves and masked_softmax), "attention: no entry has both head_halves and masked_softmax")
        if tensor_cores:
            name = (f"attention_partial_mma_hd{head_dim}_b{blocks_per_sm}" + ("_ma" if masked_softmax else "")
                    + ("_hs" if head_halves else ""))
            _check(head_dim in ATTN_MMA_HEAD_DIMS, f"attention (tensor cores): head_dim {head_dim} not in "
                                                   f"{ATTN_MMA_HEAD_DIMS}")
            _check(name in self.attention_mma_entries(), f"attention (tensor cores): no entry {name}")
            if rows_per_block is None and head_halves:        # whole rows of at most ATTN_MMA_HS_TARGET_QV, balanced
                rows_per_block = ceil_div(n_rows, ceil_div(n_rows, max(1, ATTN_MMA_HS_TARGET_QV // group)))
            elif rows_per_block is None:
                rows_per_block = ceil_div(n_rows, ceil_div(n_rows * group, ATTN_MMA_TARGET_QV))
            rows = max(1, min(int(rows_per_block), n_rows))
            _check(rows * group <= ATTN_MMA_MAX_QV, f"attention (tensor cores): {rows} rows x group {group} > "
                                                    f"{ATTN_MMA_MAX_QV} query vectors per block")
            # bf16 K/V chunk as hi and lo halves (fp32 arena) or hi only (bf16 arena: lo is zero)
            parts = 2 if self.kv_dtype == "float32" else 1
            shared = 2 * parts * (ATTN_CHUNK * (head_dim + 8) + head_dim * (ATTN_CHUNK + 8))
            self._check_shared(name, shared, "attention (tensor cores)")
            self._launch(name, (ceil_div(n_rows, rows), n_splits, n_kv_heads), ATTN_TILED_THREADS, stream, *args,
                         np.int32(capacity), np.int32(n_splits), np.float32(scale), np.int32(n_rows), np.int32(rows),
                         shared=shared)
        else:
            def smem(rows):
                return 4 * (ATTN_CHUNK * (2 * head_dim + 4) + rows * group * (head_dim + ATTN_CHUNK))
            rows = min(n_rows, ATTN_MAX_ROWS_PER_BLOCK)
            while rows > 1 and smem(rows) > self.max_shared:
                rows -= 1
            _check(smem(rows) <= self.max_shared, f"attention: {smem(rows)} bytes of shared memory > {self.max_shared}")
            self._launch("attention_partial_tiled", (n_splits, n_kv_heads, ceil_div(n_rows, rows)),
                         ATTN_TILED_THREADS, stream, *args, np.int32(head_dim), np.int32(capacity), np.int32(n_splits),
                         np.float32(scale), np.int32(n_rows), np.int32(rows), shared=smem(rows))
        self._merge(part_o, part_ml, ctl, out, n_rows, n_q_heads, head_dim, n_splits, stream)

    @staticmethod
    def _attention_checks(what: str, qkv, attend_list, out, part_o, part_ml, n_rows: int, n_q_heads: int,
                          n_kv_heads: int, head_dim: int, n_splits: int) -> int:
        """The preconditions every attention kernel shares (dtypes, grouping, float4 strides, partial-sum sizes);
        returns the group (query heads per KV head)."""
        _check_array(f"{what} qkv", qkv, np.float32, 2)
        _check_array(f"{what} list", attend_list, np.int32)
        _check_array(f"{what} out", out, np.float32, 2)
        _check_array(f"{what} part_o", part_o, np.float32)
        _check_array(f"{what} part_ml", part_ml, np.float32)
        _check(n_kv_heads > 0 and n_q_heads % n_kv_heads == 0,
               f"{what}: {n_q_heads} heads not a multiple of {n_kv_heads} KV heads")
        group = n_q_heads // n_kv_heads
        _check(group <= ATTN_MAX_GROUP, f"{what}: group {group} > {ATTN_MAX_GROUP}")
        _check(head_dim % 4 == 0, f"{what}: head_dim {head_dim} not a multiple of 4 (float4 loads)")
        _check(qkv.shape[1] % 4 == 0, f"{what} qkv: row stride {qkv.shape[1]} not a multiple of 4 (float4 loads)")
        _check(part_o.size >= n_rows * n_q_heads * n_splits * head_dim, f"{what} part_o: too small for the split count")
        _check(part_ml.size >= n_rows * n_q_heads * n_splits * 2, f"{what} part_ml: too small for the split count")
        _check(out.shape[1] >= n_q_heads * head_dim and out.shape[0] >= n_rows, f"{what} out: shape {out.shape} too small")
        return group

    def _merge(self, part_o, part_ml, ctl, out, n_rows, n_q_heads, head_dim, n_splits, stream):
        _check(n_splits <= ATTN_MERGE_MAX_SPLITS, f"attention: {n_splits} splits > {ATTN_MERGE_MAX_SPLITS} (merge)")
        _check(out.shape[1] % 4 == 0, f"attention out: row stride {out.shape[1]} not a multiple of 4 (float4 stores)")
        # The prefetching entry holds 119 registers (2 blocks per SM): where its grid fits in one wave of those
        # (decode rows), its loads overlap the weights' reductions; a prefill's grid keeps the 40-register one.
        name = "attention_merge_prefetch" if n_q_heads * n_rows <= 2 * self.num_sms else "attention_merge"
        self._launch(name, (n_q_heads, n_rows), 256, stream, ptr(part_o), ptr(part_ml), ptr(ctl), ptr(out),
                     np.int32(out.shape[1]), np.int32(n_q_heads), np.int32(head_dim), np.int32(n_splits))

    def attention_decode(self, qkv, k_layer: int, v_layer: int, attend_list, ctl, part_o, part_ml, out, n_rows: int,
                         n_q_heads: int, n_kv_heads: int, head_dim: int, capacity: int, n_splits: int, scale: float,
                         stream, head_split: int = 1, max_splits: int | None = None, one_head: bool = False,
                         prefetch: bool = False, exact_group: bool = False):
        """attention_decode.cu: the same function as attention() for a few query rows (decode), partial sums
        from registers, same split layout and merge. head_split: warps sharing each 8-entry group of a block,
        each taking that share of the query heads (1 or 2; same results). max_splits: launch at most this many
        splits per KV head (None: n_splits, one ATTN_CHUNK each over the arena); fewer splits each walk several
        chunks (common.cuh's split_span), so the merge reads fewer partial sums at long context. The sums are
        the same up to the order of the softmax's additions. one_head: the _g1 entry, registers for one query head
        per warp (a model without grouped queries: group 1, head_split 1; the same bits). prefetch: the _pf entry of
        the one chosen (head_split 1 only), the next pass's K/V loads in flight while a pass is computed (the same
        bits; KernelPlan.decode_attention_prefetch). exact_group: the _x<group> entry of that head_split and prefetch,
        compiled for exactly this group (ATTN_DECODE_EXACT_GROUPS; the same bits; KernelPlan.
        decode_attention_exact_group)."""
        _check(n_splits * ATTN_CHUNK >= capacity, f"attention decode: {n_splits} splits do not cover {capacity} slots")
        if max_splits is not None:
            _check(max_splits >= 1, f"attention decode: max_splits {max_splits} < 1")
            n_splits = min(n_splits, int(max_splits))
        group = self._attention_checks("attention decode", qkv, attend_list, out, part_o, part_ml, n_rows, n_q_heads,
                                       n_kv_heads, head_dim, n_splits)
        _check(head_dim <= 256, f"attention decode: head_dim {head_dim} must be <= 256")
        _check(head_split in ATTN_DECODE_HEAD_SPLITS,
               f"attention decode: head_split {head_split} not in {ATTN_DECODE_HEAD_SPLITS}")
        _check(not one_head or (group == 1 and head_split == 1),
               f"attention decode: the one-head entry serves a group of 1 with head_split 1, got group {group} and "
               f"head_split {head_split}")
        _check(not prefetch or head_split == 1,
               f"attention decode: the prefetching entries have one warp per 8-entry group (head_split 1), got "
               f"head_split {head_split}")
        _check(not exact_group or not one_head, "attention decode: the one-head entry already serves its group exactly")
        _check(not exact_group or exact_group_entry(group, head_dim, head_split, prefetch),
               f"attention decode: no entry for exactly group {group} with head_dim {head_dim}, head_split "
               f"{head_split}, prefetch {prefetch} (those compiled: {ATTN_DECODE_EXACT_GROUPS}, head_dim <= 128)")
        shared = (ATTN_DECODE_THREADS // 32) * group * (8 + 4 * head_dim)   # per 8-entry group: m, l, o of each head
        _check(shared <= self.max_shared, f"attention decode: {shared} bytes of shared memory > {self.max_shared}")
        name = ("attention_decode_partial_v" + ("1" if head_dim <= 128 else "2") + ("_h2" if head_split == 2 else "")
                + ("_g1" if one_head else "") + ("_pf" if prefetch else "") + (f"_x{group}" if exact_group else ""))
        self._launch(name, (n_splits, n_kv_heads, n_rows), ATTN_DECODE_THREADS * head_split, stream, ptr(qkv),
                     np.int32(qkv.shape[1]), np.uintp(k_layer), np.uintp(v_layer), ptr(attend_list), ptr(ctl),
                     ptr(part_o), ptr(part_ml), np.int32(n_q_heads), np.int32(n_kv_heads), np.int32(head_dim),
                     np.int32(capacity), np.int32(n_splits), np.float32(scale), shared=shared)
        self._merge(part_o, part_ml, ctl, out, n_rows, n_q_heads, head_dim, n_splits, stream)
