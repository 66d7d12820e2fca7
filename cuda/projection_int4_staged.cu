// projection_int4_staged.cu: y = x @ w_hat^T for INT4 weights (w_hat = q * s) and up to 32 fp32 activation rows
// (the cycle's prefill), on the tensor cores, with the activations split into bf16 hi + lo ONCE per block in
// shared memory: projection_staged.cu's design on projection_int4.cu's arithmetic.
//
// Written because projection_int4.cu follows projection_bf16.cu's unstaged design, and for bf16 staging took the
// 32-row prefill projections from 2.75 to 1.86 ms on the H200; measured faster for INT4 too and serving since the
// fourth session (KernelPlan.staged_int4_prefill_projections; see Status below).
//
// Computes   acc[n, r] = sum_groups s[r, grp] * (sum_{k in grp} q[r, k] * x[n, k]) for r < rows, n < n_tokens
//            <= 32, what projection_int4.cu computes; epilogue by mode (mma_bf16.cuh store_mma_tile): STORE
//            (+ bias), ADD (atomicAdd when ksplit > 1), SWIGLU (gate/up rows interleaved in blocks of 8).
// Numerics:  bit for bit projection_int4.cu's for STORE, SWIGLU and ADD with ksplit 1, and for each K part of
//            ADD with ksplit > 1 (the same parts; their atomicAdds into out may land in another order): the same
//            hi/lo split of x (~2^-16 relative left behind), the same pairing, the same 4 mma per step in the same
//            order, the same fp32 group partials scaled by the fp16 scale at the same steps, all mma_int4.cuh's.
// Why:       projection_int4.cu gives each warp one 16-row tile, and every warp loads its K range of the 32
//            activation rows from L2 and splits them into hi/lo itself: 16 bytes of activations per byte of INT4
//            weights (16 rows x 64 bytes against 32 tokens x 512 bytes per 128 columns; four times bf16's
//            ratio), and the split repeated by every tile. Here the 8 warps of a block own 8 neighbouring tiles
//            (128 rows) and the same K range; the block converts each 128-column chunk of the activations once
//            into shared memory and the 8 warps read their B fragments from there.
// Layouts:   Wq [rows, K / 2] uint8 (column 2j low nibble, 2j + 1 high, each q + 8); scales [rows, K / G] fp16
//            bits; x [n_tokens, x_stride] float32 (first K columns); out [n_tokens, out_stride] float32.
// Launch:    grid (ceil(n_tiles / 8) * ksplit), block 256 (8 warps); blockIdx.x = tile_group * ksplit + part;
//            warp w owns tile 8 tile_group + w; part p covers the 128-column blocks int4_part_blocks gives
//            (projection_int4.cu's split, so a part sums the same steps in both kernels). All 4 token tiles
//            of 8 share every weight fragment; tiles past n_tokens are skipped (warp-uniform).
// Loads:     as projection_int4.cu: per 128-column block lane (g, t) streams 16 bytes of rows g and g + 8
//            (load_int4_block), quad_transpose gives it word 4 s + t of step s. Block blk + 1's loads and block
//            blk's scales are issued before the block stages blk's activations, so they are in flight across the
//            staging and its barrier.
// Shared:    hi_s[b][n * STG4_ROW + w], lo_s likewise, b = chunk parity (double buffer: one barrier per chunk;
//            a buffer is restaged only after every warp passed the next barrier, i.e. finished reading it),
//            n = token < 32, w = word of the chunk: words 4 c8 .. 4 c8 + 3 hold the 8 columns 8 c8 .. 8 c8 + 7
//            as pairs (v_i, v_{i+4}) (split_activations_int4, the pairing of int4_pairs). 2 x 2 x 32 x 80
//            words = 40 KB, static (the one-part entry: hi_s alone, 20 KB). Rows padded to STG4_ROW = 80
//            words: an LDS.128 serves 8 lanes per phase,
//            lanes (g, t), g in {0, 1}, read word (8 nt + g) * 80 + 16 s + 4 t, banks 16 g + 4 t .. + 3
//            (mod 32): distinct; the staging stores of 8 consecutive items (one token, c8 = 0..7 or 8..15) hit
//            banks 4 c8 .. + 3: distinct.
// Preconditions: K % 32 == 0; G % 32 == 0 and K % G == 0; x_stride % 4 == 0 (16-byte aligned float4s); Wq rows
//            16-byte aligned (K % 32 == 0 gives K / 2 % 16 == 0); 1 <= n_tokens <= 32; ksplit > 1 with ADD only;
//            ksplit <= ceil(K / 128) (the launcher checks all of these).
// Status:    compiled for sm_90 by scripts/compile_kernels.py (ptxas: 127 registers, no spills, 40960 bytes of
//            shared memory: 2 blocks per SM by registers); passed its tests on the H200 (bit-identical to
//            projection_int4.cu); measured faster (2026-12-03 fourth session): the INT4 default.
// One part (projection_int4_staged_p1; KernelPlan.int4_prefill_activation_parts 1, off, not yet measured): the
//            activations as their bf16 hi alone (round to nearest even), 2 mma per step instead of 4 and half the
//            staging. The weights' own INT4 error (~2^-4 of a value) is ~100x the one bf16 rounding of the
//            activations (~2^-9), so the lo part buys nothing an INT4 model can keep; HF's bf16 model rounds the
//            same way. Against a reference on bf16-rounded activations it is fp32 rounding apart.
//            Measured on the H200 (2026-12-03, eighth/ninth sessions, 7B): 0.6 ms faster a cycle, but `vla-edge verify`
//            fails it (teacher-forced top-1 96.6% on the 1.5B shape): off.
// Lean (projection_int4_staged_lean; KernelPlan.int4_prefill_lean_loop, off, not yet run on a GPU): each step's
//            scale group by a shift and its flush by a mask (groups of 32 x a power of two) instead of an integer
//            division and remainder by the run-time steps per group: a warp's loop over one 128-column block
//            1070 -> 901 SASS instructions, the same values in the same order (the same bits).
#include "common.cuh"
#include "mma_int4.cuh"
#include "mma_tiles.cuh"

#define STG4_WARPS 8
#define STG4_THREADS (STG4_WARPS * 32)
#define STG4_TOKENS 32
#define STG4_ROW 80                      // words per staged token row: 64 (a 128-column chunk) + 16 of padding
#define STG4_ITEMS (STG4_TOKENS * 16)    // 8-column items of a chunk: 16 per token

// Item (token n, 8-column group c8) of a chunk, its 8 activations v, split into hi / lo (PARTS 1: hi alone) at its
// place in the staged rows.
template <int PARTS>
__device__ __forceinline__ void stage_int4_item(const float (&v)[8], uint32_t* hi, uint32_t* lo, int n, int c8) {
    uint32_t h[4], l[4];
    split_activations_int4(v, h, l);
    *reinterpret_cast<uint4*>(hi + n * STG4_ROW + 4 * c8) = make_uint4(h[0], h[1], h[2], h[3]);
    if (PARTS == 2) *reinterpret_cast<uint4*>(lo + n * STG4_ROW + 4 * c8) = make_uint4(l[0], l[1], l[2], l[3]);
}

// Stage chunk `blk` (columns 128 blk .. + 127) of tokens [0, n_tok8) into hi / lo (PARTS 1: hi alone): item =
// (token n, 8-column group c8), 16 items per token, consecutive threads on consecutive 32-byte pieces of a row
// (coalesced). Tokens past n_tokens and steps past s_end stage zeros (never read past x's rows or K).
template <int PARTS>
__device__ __forceinline__ void stage_int4_chunk(uint32_t* hi, uint32_t* lo, const float* __restrict__ x, int x_stride,
                                                 int n_tokens, int n_tok8, int blk, int s_end) {
    for (int item = threadIdx.x; item < n_tok8 * 16; item += STG4_THREADS) {
        const int n = item >> 4, c8 = item & 15;                 // token [0, n_tok8); column group [0, 16)
        const int step = blk * INT4_BLOCK_STEPS + (c8 >> 2);     // its 32-column step
        float v[8];
        if (n < n_tokens && step < s_end) {
            load_activations8(x + (size_t)n * x_stride + blk * 128 + c8 * 8, v);
        } else {
#pragma unroll
            for (int e = 0; e < 8; ++e) v[e] = 0.f;
        }
        stage_int4_item<PARTS>(v, hi, lo, n, c8);
    }
}

// PREFETCH: chunk `blk` of the items this thread stages, copied as they are (fp32) into raw without passing through
// registers (cp.async), item i's columns 0-3 at raw[i] and 4-7 at raw[STG4_ITEMS + i] (consecutive threads on
// consecutive 16 bytes: no bank conflict when split_int4_chunk reads them). Items past n_tokens or s_end land as
// zeros. The same values stage_int4_chunk loads.
__device__ __forceinline__ void copy_int4_chunk_async(float4* raw, const float* __restrict__ x, int x_stride,
                                                      int n_tokens, int n_tok8, int blk, int s_end) {
    for (int item = threadIdx.x; item < n_tok8 * 16; item += STG4_THREADS) {
        const int n = item >> 4, c8 = item & 15;                 // token [0, n_tok8); column group [0, 16)
        const int step = blk * INT4_BLOCK_STEPS + (c8 >> 2);     // its 32-column step
        const bool ok = n < n_tokens && step < s_end;
        const float* src = ok ? x + (size_t)n * x_stride + blk * 128 + c8 * 8 : x;   // a valid address either way
        cp_async16(raw + item, src, ok ? 16 : 0);
        cp_async16(raw + STG4_ITEMS + item, src + 4, ok ? 16 : 0);
    }
}

// PREFETCH: the items this thread copied (copy_int4_chunk_async, landed) split into hi / lo as stage_int4_chunk
// splits them. Only this thread read or wrote them, so no barrier stands between its copy and this.
template <int PARTS>
__device__ __forceinline__ void split_int4_chunk(const float4* raw, uint32_t* hi, uint32_t* lo, int n_tok8) {
    for (int item = threadIdx.x; item < n_tok8 * 16; item += STG4_THREADS) {
        const int n = item >> 4, c8 = item & 15;
        const float4 a = raw[item], b = raw[STG4_ITEMS + item];
        const float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
        stage_int4_item<PARTS>(v, hi, lo, n, c8);
    }
}

// One 32-column step with the activations' hi parts alone: int4_mma_step less its lo products.
__device__ __forceinline__ void int4_mma_step_hi(float (&part)[4], const uint32_t (&pa)[4], const uint32_t (&pb)[4],
                                                 const uint32_t (&hi)[4]) {
    mma_bf16_16816(part, pa[0], pb[0], pa[1], pb[1], hi[0], hi[1]);
    mma_bf16_16816(part, pa[2], pb[2], pa[3], pb[3], hi[2], hi[3]);
}

// PREFETCH (the _pf entries; KernelPlan.int4_prefill_activation_prefetch, not yet measured): chunk blk + 1's
// activations are copied (cp.async, into a raw buffer) while the warps multiply chunk blk, as its weights already
// are; without it a block loads each chunk's activations from L2 after the barrier that ends the chunk before, so
// every chunk waits that latency once. Dynamic shared memory: the hi / lo buffers, then the raw one (16 KB).
// The same values and order: the same bits as the entries without it.
template <int PARTS, bool PREFETCH, bool LEAN>
__device__ __forceinline__ void projection_int4_staged_body(
        const uint8_t* __restrict__ Wq, const uint16_t* __restrict__ scales, int group, const float* __restrict__ x,
        const float* __restrict__ bias, float* out, int rows, int K, int n_tokens, int x_stride, int out_stride,
        int out_cols, int mode, int ksplit) {
    constexpr int W = STG4_TOKENS * STG4_ROW;                    // words of one staged buffer
    // Without PREFETCH the buffers are static (a PREFETCH entry keeps 32 bytes of them, unused); with it, dynamic:
    // hi 0, hi 1, (lo 0, lo 1,) then the raw copy.
    __shared__ __align__(16) uint32_t hi_s[PREFETCH ? 1 : 2][PREFETCH ? 4 : W];
    __shared__ __align__(16) uint32_t lo_s[PARTS == 2 && !PREFETCH ? 2 : 1][PARTS == 2 && !PREFETCH ? W : 4];
    extern __shared__ __align__(16) uint32_t stg4_dynamic[];
    float4* raw = reinterpret_cast<float4*>(stg4_dynamic + 2 * PARTS * W);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2;                                     // range [0, 8): row in tile / token in tile
    const int t = lane & 3;                                      // range [0, 4): quad lane (k slot / token pair)
    const int tile_group = blockIdx.x / ksplit;                  // range [0, ceil(n_tiles / 8))
    const int part = blockIdx.x - tile_group * ksplit;           // range [0, ksplit)
    const int tile = tile_group * STG4_WARPS + warp;             // may be past the last tile: stages, computes nothing
    const bool active = tile * 16 < rows;                        // warp-uniform
    const int row_a = tile * 16 + g, row_b = row_a + 8;
    const bool ok_a = row_a < rows, ok_b = row_b < rows;
    const int groups = K / group, steps_per_group = group >> 5, n_steps = K >> 5;
    const int spg_shift = 31 - __clz(steps_per_group);           // LEAN: log2(steps per group)
    const uint8_t* qa_row = Wq + (size_t)(ok_a ? row_a : 0) * (K >> 1);
    const uint8_t* qb_row = Wq + (size_t)(ok_b ? row_b : 0) * (K >> 1);
    const uint16_t* sa_row = scales + (size_t)(ok_a ? row_a : 0) * groups;
    const uint16_t* sb_row = scales + (size_t)(ok_b ? row_b : 0) * groups;
    const int n_tok8 = (n_tokens + 7) & ~7;                      // staged tokens: whole token tiles
    int b_begin, b_end, s_end;                                   // block-uniform: this part's blocks and steps
    int4_part_blocks(part, ksplit, n_steps, b_begin, b_end, s_end);

    float acc[4][4], partial[4][4];                              // [token tile][mma accumulator]
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[nt][e] = partial[nt][e] = 0.f;

    uint32_t ma[4], mb[4];
    load_int4_block(qa_row, ok_a, b_begin, t, n_steps, ma);
    load_int4_block(qb_row, ok_b, b_begin, t, n_steps, mb);
    if (PREFETCH && b_begin < b_end) {
        copy_int4_chunk_async(raw, x, x_stride, n_tokens, n_tok8, b_begin, s_end);
        cp_async_commit();
    }
    for (int blk = b_begin; blk < b_end; ++blk) {                // block-uniform
        const int buf = (blk - b_begin) & 1;
        uint32_t na[4], nb[4];                                   // the next block's weights: in flight from here
        load_int4_block(qa_row, ok_a && blk + 1 < b_end, blk + 1, t, n_steps, na);
        load_int4_block(qb_row, ok_b && blk + 1 < b_end, blk + 1, t, n_steps, nb);
        float sa[INT4_BLOCK_STEPS], sb[INT4_BLOCK_STEPS];        // the scale of each step that ends a group here
#pragma unroll
        for (int s = 0; s < INT4_BLOCK_STEPS; ++s) {
            const int step = blk * INT4_BLOCK_STEPS + s;
            const bool flush = step < s_end && int4_step_flushes<LEAN>(step, steps_per_group, s_end);
            const int grp = int4_step_group<LEAN>(step, steps_per_group, spg_shift);
            sa[s] = int4_scale(sa_row, ok_a && flush, grp);
            sb[s] = int4_scale(sb_row, ok_b && flush, grp);
        }
        uint32_t* hi_buf = PREFETCH ? stg4_dynamic + buf * W : hi_s[buf];
        uint32_t* lo_buf = PREFETCH ? stg4_dynamic + (2 + buf) * W : lo_s[PARTS == 2 ? buf : 0];
        if (PREFETCH) {
            cp_async_wait<0>();                                  // this thread's items of chunk blk have landed
            split_int4_chunk<PARTS>(raw, hi_buf, lo_buf, n_tok8);
            if (blk + 1 < b_end) {                               // the next chunk's copy runs under this one's products
                copy_int4_chunk_async(raw, x, x_stride, n_tokens, n_tok8, blk + 1, s_end);
                cp_async_commit();
            }
        } else {
            stage_int4_chunk<PARTS>(hi_buf, lo_buf, x, x_stride, n_tokens, n_tok8, blk, s_end);
        }
        __syncthreads();                                         // chunk blk staged (and buffer buf^1 read by all)
        if (active) {
            quad_transpose(ma, t);
            quad_transpose(mb, t);
#pragma unroll
            for (int s = 0; s < INT4_BLOCK_STEPS; ++s) {
                const int step = blk * INT4_BLOCK_STEPS + s;    // range [0, K / 32)
                if (step >= s_end) break;                        // block-uniform: the last block's tail past K
                uint32_t pa[4], pb[4];
                int4_pairs(ma[s], pa);
                int4_pairs(mb[s], pb);
#pragma unroll
                for (int nt = 0; nt < 4; ++nt) {
                    if (nt * 8 >= n_tokens) break;               // warp-uniform: token tiles holding no token
                    const int word = (nt * 8 + g) * STG4_ROW + s * 16 + 4 * t;   // token 8 nt + g, cols 32 s + 8 t ..
                    const uint4 h = *reinterpret_cast<const uint4*>(hi_buf + word);
                    const uint32_t hi[4] = {h.x, h.y, h.z, h.w};
                    if (PARTS == 2) {
                        const uint4 l = *reinterpret_cast<const uint4*>(lo_buf + word);
                        const uint32_t lo[4] = {l.x, l.y, l.z, l.w};
                        int4_mma_step(partial[nt], pa, pb, hi, lo);
                    } else {
                        int4_mma_step_hi(partial[nt], pa, pb, hi);
                    }
                }
                if (int4_step_flushes<LEAN>(step, steps_per_group, s_end)) flush_group<4>(acc, partial, sa[s], sb[s]);
            }
        }
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            ma[u] = na[u];
            mb[u] = nb[u];
        }
    }

    if (active)
        store_mma_tile<4>(acc, out, out_stride, bias, rows, out_cols, n_tokens, 0, tile, g, t, mode, ksplit > 1);
}

// Entries: bf16 hi + lo activations (the default), hi alone (_p1), each with the next chunk's activations copied
// under the products (_pf); the default's steps grouped by a shift and a mask (_lean, KernelPlan.
// int4_prefill_lean_loop: groups of 32 x a power of two; the same bits).
#define PROJECTION_INT4_STAGED_ENTRY(PARTS, PREFETCH, LEAN, SUFFIX)                                            \
    extern "C" __global__ void __launch_bounds__(STG4_THREADS) projection_int4_staged##SUFFIX(                 \
            const uint8_t* __restrict__ Wq, const uint16_t* __restrict__ scales, int group,                    \
            const float* __restrict__ x, const float* __restrict__ bias, float* out, int rows, int K,          \
            int n_tokens, int x_stride, int out_stride, int out_cols, int mode, int ksplit) {                  \
        projection_int4_staged_body<PARTS, PREFETCH, LEAN>(Wq, scales, group, x, bias, out, rows, K, n_tokens, \
                                                           x_stride, out_stride, out_cols, mode, ksplit);      \
    }
PROJECTION_INT4_STAGED_ENTRY(2, false, false, )
PROJECTION_INT4_STAGED_ENTRY(1, false, false, _p1)
PROJECTION_INT4_STAGED_ENTRY(2, true, false, _pf)
PROJECTION_INT4_STAGED_ENTRY(1, true, false, _p1_pf)
PROJECTION_INT4_STAGED_ENTRY(2, false, true, _lean)
