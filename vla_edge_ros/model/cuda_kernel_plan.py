"""Which kernel a CudaBackend launches for each step that has more than one: one frozen plan.

The defaults are the measured-best choices on the H200 (bench/pycuda_cycle.py, notes/cuda_notes.md); the serving
backend runs MEASURED_BEST and nothing else. Other plans are built by the lab (bench/kernel_lab.py) to time or
compare a variant, and handed to CudaBackend.use_kernel_plan between cycles. A plan is what was asked for: where the
device or the model cannot run a choice (fp32 weights, a head_dim without a tensor-core entry, no sm_90a),
use_kernel_plan falls back and returns the plan in effect.

INT4 weights (an INT4 snapshot, model.weights: int4) have their own projection kernels, gemv_int4.cu (decode:
every mode of gemv.cu, the looped items of decode_gemv_blocks_per_sm, programmatic launch) and
projection_int4.cu (prefill, and long forwards). The choices below that name a bf16-only kernel are forced off
for them by use_kernel_plan, said in the log: staged_prefill_projections (projection_staged.cu multiplies bf16
weights), persistent_decode (decode_persistent.cu streams bf16 rows through its stage bodies) and the bulk
prefill with bulk_gemm (its GEMMs stage bf16 weight tiles; an INT4 model's long forwards take
projection_int4.cu in passes of max_rows, cuda_backend._bulk_rows). The attention choices apply unchanged, and
MEASURED_BEST runs INT4 with staged_int4_prefill_projections, the INT4 counterpart of the staged projections
(projection_int4_staged.cu), forced off for float weights; so are int4_gemv_items_per_block and
int4_gemv_rows_per_warp (gemv_int4.cu's looped grid for every INT4 decode projection, measured slower: off), and
int4_decode_lean_loop and int4_prefill_lean_loop (the lean entries of gemv_int4.cu, and of projection_int4_staged.cu
and projection_int4.cu: fewer instructions per weight, the same bits; not yet measured, off).

This module imports no pycuda: a plan can be built and checked on a machine without a GPU.
"""
from __future__ import annotations

from dataclasses import dataclass

from .cuda_attention_launchers import ATTN_DECODE_HEAD_SPLITS
from .cuda_int4_launchers import GEMV4_MAX_ITEMS_PER_BLOCK, GEMV4_ROWS_PER_WARP
from .cuda_bulk_launchers import BULK_GEMMS
from .cuda_projection_launchers import GEMV_MAX_BLOCKS_PER_SM


@dataclass(frozen=True)
class KernelPlan:
    # ---- prefill (rows > 1, and every fp32 call)
    # projection_staged.cu (activations split once per block of 8 tiles) for bf16 prefill projections of up to
    # 32 rows; off: projection_bf16.cu. 2.75 -> 1.86 ms of projections per 32-row prefill.
    staged_prefill_projections: bool = True
    # projection_int4_staged.cu for an INT4 model's prefill projections of up to 32 rows (the activations split into
    # bf16 hi/lo once per block of 8 tiles in shared memory, each block's next weights streaming meanwhile); off:
    # projection_int4.cu, where every warp loads and splits all 32 activation rows itself. The same bits (ADD split
    # over K: the same parts, atomically added in another order; test_cuda_projection_int4_staged.py). INT4 backends
    # only: use_kernel_plan turns it off for float weights. Measured on the H200 (2026-12-03, fourth session, lab
    # "plain+int4staged", 1.5B shape at 4064 cached): prefill projections 2.640 -> 2.376 ms, cycle p50/p99
    # 15.70/15.93 -> 15.47/15.78 ms (bf16's staged projections: 1.87 ms). Lab "+int4unstaged" turns it off.
    staged_int4_prefill_projections: bool = True
    # Parts of the activations in those staged INT4 projections: 2 (bf16 hi + lo, the bf16 model's cycle precision)
    # or 1 (bf16 alone: half the products and staging; the INT4 weights' own error is ~100x that rounding). The
    # 7B INT4 prefill's projections took 8.6 of its 14.1 ms (2026-12-03, fifth session). Needs the staged
    # projections. Measured on the H200 (2026-12-03, eighth session, 7B INT4 at 4064 cached, lab "+i4p1"): prefill
    # projections 8.64 -> 8.03 ms, cycle p50 55.87 -> 55.31 ms (ninth session: 8.59 -> 7.99). Faster, but `vla-edge
    # verify --kernel-variants i4p1` on the 1.5B INT4 shape FAILED on the H200 (2026-12-03, ninth session): logits
    # cosine 0.99989 (passes), teacher-forced top-1 96.64% against the 99% required (HF's activations are fp32).
    # Off: 2 serves.
    int4_prefill_activation_parts: int = 2
    # Those staged INT4 projections with each 128-column chunk's activations copied (cp.async) while the chunk before
    # is multiplied, as its weights are; without it every chunk waits for its activations from L2 after the barrier
    # that ends the one before (7B gate/up: 172 blocks, each walking 32 chunks in turn). The same bits. Needs the
    # staged projections. Measured slower on the H200 (2026-12-03, eighth session, 7B INT4 at 4064 cached, lab
    # "+i4pf"): prefill projections 8.64 -> 9.46 ms (its 56 KB of dynamic shared memory leave fewer blocks per SM
    # than the wait it hides). Off; kept for the lab.
    int4_prefill_activation_prefetch: bool = False
    # An INT4 model's projections of many rows (the staged ones above, two parts without the prefetch, and
    # projection_int4.cu's: the unstaged prefill, long forwards such as the reconciler's steps) through their _lean
    # entries: each 32-column step's scale group found by a shift and its flush by a mask instead of integer divisions
    # and remainders by the run-time steps per group (groups of 32 x a power of two; use_kernel_plan keeps the other
    # entries for the rest). The same bits (test_cuda_projection_int4_staged.py, test_cuda_projection_int4.py). SASS
    # (sm_90, cuobjdump 13.5, scripts/sass_loops.py) of a warp's loop over one 128-column block: staged 1070 -> 901
    # instructions (123 registers, 127 before; no spills), projection_int4_nt1 659 -> 520, _nt4 1468 -> 1324; the
    # entries without it compile to the same SASS as before. The 7B INT4 prefill's projections ran at ~0.4 TB/s (8.59
    # ms, ninth session).
    # The staged projections' one-part and prefetch entries have no lean form. Off: not yet measured on the GPU; lab
    # "+i4plean".
    int4_prefill_lean_loop: bool = False
    # attention_mma.cu (K, V, q and the softmax weights as bf16 hi/lo pairs, ~1e-5 relative) for bf16 prefill
    # attention; off: attention_tiled.cu's fp32 products. 2.28 -> 0.71 ms per 32-row prefill at 4064 cached.
    tensor_core_attention: bool = True
    # attention_mma.cu's head_dim-128 entry: 2 blocks per SM (capped at 128 registers, a little spilled) took
    # 0.71 ms where 1 (every accumulator in registers) took 0.82. Other head_dims have the 1-block entry only.
    attention_blocks_per_sm: int = 2
    # attention_mma.cu's _ma entries (head_dim 128): a slot a row does not see enters the softmax as -inf (its
    # exponential +0 exactly) instead of being skipped by a test, which nvcc compiles to a branch around each of the
    # 32 exponentials a thread takes per chunk (SASS of the bf16 arena's _b2 entry: 86 BRA against 22 with the
    # mask; its spill loads 60 against 85). The same bits (test_cuda_attention_mma.py). The 32-row prefill's
    # attention over 32000 cached runs ~4x under its tensor-core work (100 us a layer on the bf16 arena; most of
    # the CSR M=32 row at 32K, issue 20's 80x), and the softmax is the part of each chunk that is neither products
    # nor copies. Off: not yet measured on the GPU; lab "+ma".
    attention_masked_softmax: bool = False
    # attention_mma.cu's _hs entry (head_dim 128, 2 blocks per SM, not with the masked softmax): two warps per 16-row
    # tile, each keeping the P.V sums of half of the head's dimensions; both compute the tile's scores and softmax
    # (1.5x the products), every sum in the same order (the same bits: test_cuda_attention_mma.py). Why: the
    # serving _b2 entry spills under its 128-register cap (ptxas: 292 bytes on the bf16 arena; ncu on the H200, 32
    # rows over 32000 slots: 1.0 M local-memory requests a launch, warps stalled on long scoreboard and barriers,
    # tensor pipe 20%), and _hs spills 12 bytes. Off: written 2026-12-05 (nineteenth session), not yet run on a
    # GPU; lab "+hs".
    attention_head_halves: bool = False

    # Blocks per SM of the cycle's long-context attention launches (attention_decode.cu, attention_mma.cu):
    # long_context_splits gives each KV head this many x SMs / KV heads splits, each walking its share of the
    # context's 64-entry chunks. 1 measured best on the 1.5B shape (2 KV heads: 66 splits each, one chunk apiece at
    # 4064 cached; 128 splits lost at 16K).
    long_context_blocks_per_sm: int = 1
    # ... and at least this many splits per KV head: a model with many KV heads (the 7B shape's 32: 4 splits each
    # at one block per SM, every block walking ~16 chunks one pass of loads at a time) fills the SMs with shorter
    # walks. Measured on the H200 (2026-12-03, eighth session, 7B INT4 at 4064 cached, lab "+lcs4" = 16 splits):
    # prefill attention 4.04 -> 2.64 ms; decode attention with the one-head entry 1.87 -> 1.31 ms per step (without
    # it 2.28 -> 2.67: the two-warp entry's 128 registers leave no room for more blocks); cycle p50 52.5 -> 46.7 ms.
    # The 1.5B shape keeps its 66. Lab "+lcm1": the old rule (no floor).
    long_context_min_splits_per_kv_head: int = 16

    # ---- bf16 decode (one row)
    # The decode row's attention through attention_mma.cu as well (one 16-row tile holds the group's query heads;
    # at most long_context_splits splits, each walking its chunks) instead of attention_decode.cu. Measured slower
    # (2026-12-03, third session, bench/long_context_probe.py): 70.6 us per layer at 32000 slots (2 blocks per SM:
    # 92.1) against attention_decode.cu's 51.3, 13.5 against 11.7 at 4064; the cycle at 4064 cached 15.88 against
    # 15.18 ms p50. A 16-row tile holding 6 query rows wastes most of each product, and the hi/lo split of K and V
    # costs as much per slot as for 32 rows. Off; kept for the lab (+mmadec).
    decode_attention_tensor_cores: bool = False
    # Warps per 8-slot group of an attention_decode.cu block (each takes that share of the query heads):
    # bit-identical, 2 took 0.319 ms per step at 4064 cached where 1 took 0.348.
    decode_attention_head_split: int = 2
    # For a model without grouped queries (group 1: Llama-2-7B, OpenVLA's language model), attention_decode.cu's _g1
    # entries: one warp per 8-slot group (head_split 1) holding the registers of one query head, not of
    # ATTN_MAX_GROUP / head_split (128 registers a thread at head_split 2, whose second warp per slot group has no
    # head at group 1 and loads the same K/V), so several blocks share an SM and more K/V loads are in flight. The
    # same bits. Other groups ignore it (use_kernel_plan). Measured on the H200 (2026-12-03, eighth session, 7B INT4
    # at 4064 cached, lab "+g1"): decode attention 2.28 -> 1.87 ms per step, cycle p50 55.9 -> 52.5 ms. Lab "+nog1"
    # turns it off.
    decode_attention_one_head_entry: bool = True
    # attention_decode.cu's _pf entries: a warp issues its next pass's K/V loads before it computes the current one
    # (attention_decode.cuh's PREFETCH), for the one-warp-per-group entries only (head_split 1: a model without
    # grouped queries through the one-head entry, or the lab's "+h1"; the two-warp entries' 128-register bound
    # would spill, so a model with grouped queries keeps its two warps per group and no prefetch). The same bits
    # (test_cuda_attention_decode.py). Written from ncu's reading of the 7B's decode attention (long-scoreboard
    # stalls, 9 cycles per issue, at 21% occupancy). Measured on the H200 (2026-12-04, eleventh session, lab
    # "+dpf"): 7B INT4 at 4064 cached, decode attention 1.320 -> 1.058 ms per step, cycle p50 46.39 -> 44.14 ms; the
    # 1.5B (lab "+h1+dpf") 14.87 ms p50 against 14.71 with two warps per group and no prefetch (long_context_probe,
    # bf16 arena, 32000 cached: 47.3 us a layer against 49.1). On; lab "+nodpf" turns it off.
    decode_attention_prefetch: bool = True
    # attention_decode.cu's _x<G> entries, compiled for a group of exactly G query heads per KV head
    # (cuda_attention_launchers.ATTN_DECODE_EXACT_GROUPS: two warps per slot group for G in 2, 4, 6; one warp with
    # the prefetch for 2, 3, 4, 6; head_dim <= 128), where this model's group and the choices above have one. The
    # entry for any group tests, before each of a warp's heads, whether the group has it, so each head's chain of
    # shuffles and exponentials (the decode attention's latency at long context: 49 us a layer at 32000 cached on
    # the 1.5B's bf16 arena, 6.3x its K/V floor) waits for the one before; for an exact group there is no test and
    # the compiler interleaves the heads. The same bits (test_cuda_attention_decode.py). ptxas (sm_90, bf16 / fp32
    # arena): _v1_h2_x6 128 / 128 registers (16 bytes spilled on fp32), _v1_pf_x6 220 / 255; the entries for any
    # group 128 / 128 and 206 / 240. Measured on the H200 (2026-12-05, eighteenth session; bit tests 102 passed;
    # long_context_probe, the 1.5B's 12 / 2 heads, us a layer for one decode row at <= 66 splits): two warps per
    # group 11.32 -> 9.27 at 4064 and 48.31 -> 32.69 at 32000 cached on the bf16 arena, 11.72 -> 10.02 and
    # 51.35 -> 36.94 on the fp32 one; with one warp and the prefetch (head_split 1) 9.24 / 26.83 bf16 and
    # 10.12 / 34.15 fp32. On (head_split stays 2); lab "+noxg" turns it off.
    decode_attention_exact_group: bool = True
    # A decode projection with more 8-row items than this many blocks per SM (gate/up: 2240 items) loops them
    # over a grid of that size, staging the activations once (gemv_bf16_items); 0: a block per item.
    # Bit-identical; decode projections 1.100 -> 1.029 ms per step at 4 (2: 1.165).
    decode_gemv_blocks_per_sm: int = 4
    # INT4 decode projections only (use_kernel_plan: 0 for float weights): N > 0 loops EVERY one of them over
    # ceil(items / N) blocks (gemv_int4_items; each block stages, and RMS-normalises, its activations once for its
    # ~N items) in place of the rule above (1: a block per item, gate/up too); 0: the rule above. Bit-identical.
    # Measured slower on the H200 (2026-12-03, fourth session, lab "plain+i4ipb4", 1.5B shape at 4064 cached): decode
    # projections 1.046 -> 1.833 ms per step, cycle p50 15.70 -> 22.07 ms. The idea was that INT4 decode projections
    # (1.046 ms, bf16's 1.023, for a quarter of the bytes: INT4 floor 0.16 ms) are bound by fixed costs that fewer
    # blocks staging the activations would cut; with ~4 items per block the grid leaves most SMs idle and each
    # block's items run one after the other. Off; kept for the lab.
    int4_gemv_items_per_block: int = 0
    # INT4 decode projections only, with int4_gemv_items_per_block >= 2: 2 has each warp of the looped entry stream
    # two items' rows at once (gemv_int4_items2), 1: one. Bit-identical. Measured no help (lab "plain+i4ipb4+i4x2":
    # decode projections 1.866 ms against i4ipb4's 1.833). Off; kept for the lab.
    int4_gemv_rows_per_warp: int = 1
    # INT4 decode projections only: gemv_int4.cu's _lean entries, the same loads and arithmetic (so the same bits,
    # test_cuda_gemv_int4.py) in fewer instructions per weight: each chunk's scale indexed by a shift instead of an
    # integer division by the run-time group (~30 SASS instructions per 32 columns; groups of 32 x a power of two
    # only, use_kernel_plan keeps the other entries for the rest), each nibble made a float by one LOP3 instead
    # of an AND and an OR, and the activations staged with a float4 of padding per 32 columns instead of swizzled
    # (their reads need no address instruction each; 4.5 K bytes of shared memory instead of 4 K). SASS (sm_90,
    # cuobjdump 13.5, scripts/sass_loops.py) of gemv_int4's inner loop, 128 weights a lane: 862 -> 578 instructions
    # (LOP3 300 -> 128, the division's IMAD/ISETP/I2F/MUFU gone); the entries without it compile to the same SASS as
    # before. The ninth
    # session's ncu found these projections issue-bound (7B decode projections 2.80 ms a token, 3.5x their byte
    # floor; warps stalled "not selected"). Off: not yet measured on the GPU; lab "+i4lean".
    int4_decode_lean_loop: bool = False
    # Programmatic dependent launch of the decode kernels (sm_90+, cuda_pdl.py): each starts streaming its
    # weights while the one before finishes. Measured 0.1 ms per decode step slower with gemv.cu: off.
    programmatic_launch: bool = False
    # Every layer of a decode step in one cooperative launch of decode_persistent.cu (grid barriers between
    # stages) instead of six launches per layer. Bit-identical, but 1.61 vs 1.57 ms per step: off.
    persistent_decode: bool = False
    # Its grid: 2 blocks per SM (16 warps, the attention state partly spilled) beat 1 (8 warps, all in
    # registers); bytes of the o and gate/up weights each block prefetches into L2 (24 MiB measured no faster).
    persistent_blocks_per_sm: int = 2
    persistent_l2_prefetch_bytes: int = 0

    # ---- bulk prefill (model.bulk_prefill_min_rows: long forwards on tensor-core GEMMs + flash attention)
    # gemm_tma.cu (sm_90a; elsewhere "mma", gemm_bulk.cu): the 128 x 128 wgmma tiles of gemm_wgmma.cu fed by TMA
    # copies from a producer warp. Measured on the H200 (bench/bulk_probe.py, notes/cuda_notes.md 2026-12-03 sixth):
    # gate/up at 1024 rows 310 against wgmma128's 196 TFLOP/s; a forward of 256 rows after 2048 cached 6.76 against
    # 8.41 ms, the full recompute of 4096 tokens 70.2 against 91.2 ms. "wgmma128" (cp.async) stays for the lab.
    bulk_gemm: str = "tma"
    # Parts of the activations in its GEMMs and of q, K, P, V in its attention's products: 2 (bf16 hi + lo) keeps
    # the cycle prefill's precision, which the swaps' KV must match; 1 (bf16 alone, as HF's bf16 SDPA computes) was
    # 1.33x faster at 1024 rows (GEMMs only) but is not that precision. The attention of parts 1 runs one K/V stage.
    bulk_activation_parts: int = 2
    # K/V tiles in flight per flash-attention block: 1 leaves room for two blocks per SM; 2 was 3-7% slower (fp32
    # arena). With the bf16 arena 2 was 1.5% faster than 1 at 16K (2026-12-03, eighth session) but slower than the
    # K/V overlap below, which takes one stage.
    bulk_attention_stages: int = 1
    # Query heads per warp of the flash attention: 2 has each K/V fragment a warp loads from shared memory serve two
    # heads' products (half the ldmatrix traffic per block, twice the accumulators: 255 registers, two blocks of
    # group / 2 warps per SM). One K/V stage only; a model with an odd head group keeps 1 (use_kernel_plan).
    # Measured slower on the H200 (2026-12-03, eighth session, bf16 arena): the recompute of 16384 tokens 429.3
    # against 366.1 ms (p1: 323.8 against 289.0); ncu 1.30 against 0.97 ms per pass (half the warps per SM, the
    # same waits). Off; bench/bulk_probe.py times it ("w2" rows).
    bulk_attention_heads_per_warp: int = 1
    # The flash attention's copies under its own products (attention_flash_kvo.cu): one K and one V buffer per
    # block, V(t) copied while the warps form q K(t)^T, K(t + 1) while they add P V(t), and no causal mask on the
    # tiles every row sees whole; the same values as the one-stage entries (test_cuda_bulk_prefill.py). Measured on
    # the H200 (2026-12-03, eighth session, bench/bulk_probe.py --kv-dtype bfloat16): the full recompute of 16384
    # tokens 366.1 -> 352.4 ms (parts 1: 289.0 -> 263.5); ncu, 1024 rows after 15360: 967 -> 860 us (parts 1: 818
    # -> 672). One K/V stage.
    bulk_attention_kv_overlap: bool = True
    # Those overlapped entries with each thread's copy addresses computed once per tile (attention_flash_tiles.cu's
    # _h entries: ~9 PTX instructions per 16-byte copy instead of ~40); the same values. ncu on the hd128 p1 entry
    # (2026-12-03, eighth session): issue slots busy 37%, the tensor pipe mostly idle, ~670 PTX instructions per
    # warp and 32-entry tile of which 64 mma and ~250 the copies' index arithmetic. Needs the K/V overlap and one
    # head per warp. Measured on the H200 (2026-12-03, ninth session, bulk_probe --kv-dtype bfloat16; its tests
    # bit-identical to attention_flash_kvo.cu): the recompute of 16384 tokens 351.6 -> 343.2 ms (parts 1: 263.8 ->
    # 246.3), 4096 tokens 58.8 -> 58.5. On; lab "+nofah": the copies before.
    bulk_attention_hoisted_copies: bool = True
    # List entries per K/V tile of the flash attention: 32, or 64 (attention_flash_tiles.cu's _t64 entries, with the
    # hoisted copies): a tile's fixed costs (two barriers, the softmax's row reductions, the rescale of all 64
    # accumulators a thread holds, the Q fragments' loads) then serve twice the entries. Other roundings (the
    # online softmax rescales per tile), within the reference bound. Models with more than 6 query heads per KV
    # head keep 32 (the entries' two-blocks-per-SM bound). Measured on the H200 (2026-12-03, ninth session,
    # bulk_probe --kv-dtype bfloat16): the recompute of 16384 tokens 343.2 -> 323.9 ms (parts 1: 246.3 -> 232.9),
    # its tests within the reference bound. `vla-edge verify --kernel-variants fat64 --bulk-prefill-min-rows 1` on
    # the 1.5B bf16 shape (2026-12-04, tenth session): logits cosine 0.9999999996, teacher-forced top-1 100%, PASS.
    # 64; lab "+fat64" / "+fah" (32 entries with the hoisted copies).
    bulk_attention_tile_entries: int = 64

    def __post_init__(self):
        if not isinstance(self.staged_int4_prefill_projections, bool):
            raise ValueError(f"staged_int4_prefill_projections must be True or False, got "
                             f"{self.staged_int4_prefill_projections!r}")
        if self.decode_attention_head_split not in ATTN_DECODE_HEAD_SPLITS:
            raise ValueError(f"decode_attention_head_split must be one of {ATTN_DECODE_HEAD_SPLITS}, got "
                             f"{self.decode_attention_head_split!r}")
        if not 0 <= self.decode_gemv_blocks_per_sm <= GEMV_MAX_BLOCKS_PER_SM:
            raise ValueError(f"decode_gemv_blocks_per_sm must be in [0, {GEMV_MAX_BLOCKS_PER_SM}], got "
                             f"{self.decode_gemv_blocks_per_sm!r}")
        if not (type(self.int4_gemv_items_per_block) is int          # not a bool: an item count
                and 0 <= self.int4_gemv_items_per_block <= GEMV4_MAX_ITEMS_PER_BLOCK):
            raise ValueError(f"int4_gemv_items_per_block must be in [0, {GEMV4_MAX_ITEMS_PER_BLOCK}], got "
                             f"{self.int4_gemv_items_per_block!r}")
        if type(self.int4_gemv_rows_per_warp) is not int or self.int4_gemv_rows_per_warp not in GEMV4_ROWS_PER_WARP:
            raise ValueError(f"int4_gemv_rows_per_warp must be one of {GEMV4_ROWS_PER_WARP}, got "
                             f"{self.int4_gemv_rows_per_warp!r}")
        if self.int4_gemv_rows_per_warp > 1 and self.int4_gemv_items_per_block < 2:
            raise ValueError(f"int4_gemv_rows_per_warp {self.int4_gemv_rows_per_warp} needs "
                             f"int4_gemv_items_per_block >= 2 (a block of one item has no second row to stream), "
                             f"got {self.int4_gemv_items_per_block!r}")
        for name in ("attention_blocks_per_sm", "persistent_blocks_per_sm", "bulk_activation_parts",
                     "int4_prefill_activation_parts",
                     "bulk_attention_stages", "bulk_attention_heads_per_warp"):
            if getattr(self, name) not in (1, 2):
                raise ValueError(f"{name} must be 1 or 2, got {getattr(self, name)!r}")
        if type(self.long_context_blocks_per_sm) is not int or not 1 <= self.long_context_blocks_per_sm <= 8:
            raise ValueError(f"long_context_blocks_per_sm must be in [1, 8], got {self.long_context_blocks_per_sm!r}")
        if (type(self.long_context_min_splits_per_kv_head) is not int
                or not 1 <= self.long_context_min_splits_per_kv_head <= 256):
            raise ValueError(f"long_context_min_splits_per_kv_head must be in [1, 256], got "
                             f"{self.long_context_min_splits_per_kv_head!r}")
        if self.persistent_l2_prefetch_bytes < 0:
            raise ValueError(f"persistent_l2_prefetch_bytes must be >= 0, got {self.persistent_l2_prefetch_bytes}")
        if self.int4_prefill_activation_parts == 1 and not self.staged_int4_prefill_projections:
            raise ValueError("int4_prefill_activation_parts 1 is an entry of the staged INT4 projections; "
                             "staged_int4_prefill_projections is off")
        if self.bulk_attention_heads_per_warp == 2 and self.bulk_attention_stages != 1:
            raise ValueError(f"bulk_attention_heads_per_warp 2 runs one K/V stage, got bulk_attention_stages "
                             f"{self.bulk_attention_stages}")
        if not isinstance(self.int4_prefill_activation_prefetch, bool):
            raise ValueError(f"int4_prefill_activation_prefetch must be True or False, got "
                             f"{self.int4_prefill_activation_prefetch!r}")
        if self.int4_prefill_activation_prefetch and not self.staged_int4_prefill_projections:
            raise ValueError("int4_prefill_activation_prefetch is an entry of the staged INT4 projections; "
                             "staged_int4_prefill_projections is off")
        if not isinstance(self.decode_attention_one_head_entry, bool):
            raise ValueError(f"decode_attention_one_head_entry must be True or False, got "
                             f"{self.decode_attention_one_head_entry!r}")
        if not isinstance(self.decode_attention_prefetch, bool):
            raise ValueError(f"decode_attention_prefetch must be True or False, got {self.decode_attention_prefetch!r}")
        if not isinstance(self.int4_prefill_lean_loop, bool):
            raise ValueError(f"int4_prefill_lean_loop must be True or False, got {self.int4_prefill_lean_loop!r}")
        if self.int4_prefill_lean_loop and self.staged_int4_prefill_projections and (
                self.int4_prefill_activation_parts != 2 or self.int4_prefill_activation_prefetch):
            raise ValueError("int4_prefill_lean_loop: the staged INT4 projections have a lean entry for two activation "
                             "parts without the prefetch only")
        if not isinstance(self.int4_decode_lean_loop, bool):
            raise ValueError(f"int4_decode_lean_loop must be True or False, got {self.int4_decode_lean_loop!r}")
        if not isinstance(self.attention_masked_softmax, bool):
            raise ValueError(f"attention_masked_softmax must be True or False, got {self.attention_masked_softmax!r}")
        if not isinstance(self.attention_head_halves, bool):
            raise ValueError(f"attention_head_halves must be True or False, got {self.attention_head_halves!r}")
        if not isinstance(self.decode_attention_exact_group, bool):
            raise ValueError(f"decode_attention_exact_group must be True or False, got "
                             f"{self.decode_attention_exact_group!r}")
        if not isinstance(self.bulk_attention_kv_overlap, bool):
            raise ValueError(f"bulk_attention_kv_overlap must be True or False, got {self.bulk_attention_kv_overlap!r}")
        if self.bulk_attention_kv_overlap and self.bulk_attention_stages != 1:
            raise ValueError(f"bulk_attention_kv_overlap runs one K/V stage, got bulk_attention_stages "
                             f"{self.bulk_attention_stages}")
        if not isinstance(self.bulk_attention_hoisted_copies, bool):
            raise ValueError(f"bulk_attention_hoisted_copies must be True or False, got "
                             f"{self.bulk_attention_hoisted_copies!r}")
        if self.bulk_attention_hoisted_copies and not (self.bulk_attention_kv_overlap
                                                       and self.bulk_attention_heads_per_warp == 1):
            raise ValueError("bulk_attention_hoisted_copies are entries of the K/V overlap with one head per warp "
                             "(bulk_attention_kv_overlap on, bulk_attention_heads_per_warp 1)")
        if type(self.bulk_attention_tile_entries) is not int or self.bulk_attention_tile_entries not in (32, 64):
            raise ValueError(f"bulk_attention_tile_entries must be 32 or 64, got {self.bulk_attention_tile_entries!r}")
        if self.bulk_attention_tile_entries == 64 and not self.bulk_attention_hoisted_copies:
            raise ValueError("bulk_attention_tile_entries 64 are entries with the hoisted copies "
                             "(bulk_attention_hoisted_copies off)")
        if self.bulk_gemm not in BULK_GEMMS:
            raise ValueError(f"bulk_gemm must be one of {sorted(BULK_GEMMS)}, got {self.bulk_gemm!r}")


MEASURED_BEST = KernelPlan()
