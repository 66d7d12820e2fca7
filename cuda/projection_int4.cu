// projection_int4.cu: y = x @ w_hat^T for INT4 weights (model/int4.py's format, w_hat = q * s), fp32
// activations, on the tensor cores (mma.sync m16n8k16): the prefill projections of an INT4 model, and its
// long forwards in passes of rows.
//
// Computes   acc[n, r] = sum_groups s[r, grp] * (sum_{k in grp} q[r, k] * x[n, k])   r < rows, n < n_tokens
//            q (-8..7) is exact in bf16, so the mma takes it as it is; x goes in as two bf16 halves
//            hi = bf16(x), lo = bf16(x - hi) (mma_bf16.cuh split_activations), as projection_bf16.cu does;
//            each group's products accumulate in fp32 (a per-group partial), and the partial is scaled by
//            the group's fp16 scale (exact in fp32) into the accumulator. Epilogue by mode as
//            projection_bf16.cu (mma_bf16.cuh store_mma_tile): STORE (+ bias; ksplit 1), ADD (atomicAdd when
//            ksplit > 1), SWIGLU (gate/up rows interleaved in blocks of 8; ksplit 1).
//
// Layouts:   Wq [rows, K / 2] uint8 (column 2j low nibble, 2j + 1 high, each q + 8); scales [rows, K / G] fp16
//            bits; x [n_tokens, x_stride] float32 (first K columns); out [n_tokens, out_stride] float32.
// Launch:    block 128 threads = 4 warps; warp_id = blockIdx.x * 4 + warp in [0, n_tiles * ksplit) owns a
//            16-row tile of W and part `part` of its 128-column blocks (ksplit parts); grid.x =
//            ceil_div(n_tiles * ksplit, 4); blockIdx.y = token group [blockIdx.y * 8 NT, + 8 NT), NT (1, 2,
//            4) token tiles of 8 sharing every weight fragment.
// Loads:     per 128-column block, lane (g, t) loads 16 bytes of row g and of row g + 8 at byte 16 t of the
//            block: the four 32-column steps' words of lane slot 0..3 of step t. A 4 x 4 transpose across
//            the quad (quad_transpose) gives lane t word 4 s + t of each step s: physical columns
//            32 s + 8 t .. + 7, projection_bf16.cu's k mapping, so each mma's 16 columns lie inside one
//            32-column step, hence inside one scale group (G % 32 == 0). The next block's loads are issued
//            before this block's arithmetic.
// Pairs:     a word's nibbles (w >> 4 i) & 0x000F000F are columns i and i + 4: bf16 pair i of a row
//            (nibbles_to_bf16x2); the activations are paired alike (v_i, v_{i+4}), which a dot product
//            allows: the same physical columns meet in A and B. Pairs 0, 1 feed the first mma of a step
//            (logical k 2t, 2t + 1 and 2t + 8, 2t + 9), pairs 2, 3 the second.
// Preconditions: K % 32 == 0; G % 32 == 0 and K % G == 0; x_stride % 4 == 0 (16-byte aligned float4s);
//            Wq rows 16-byte aligned (K % 32 == 0 gives K / 2 % 16 == 0).
// Helpers:   the loads, the quad transpose, the pairings, the 4-mma step, the K parts and the group flushes are
//            mma_int4.cuh's, shared with projection_int4_staged.cu (the same sums with the activations split
//            once per block in shared memory; KernelPlan.staged_int4_prefill_projections).
// Status:    passed its tests on the H200 (2026-12-03, third session); at 1.5B the 32-row prefill's projections
//            take 2.66 ms against the staged bf16 kernel's 1.88 (notes/cuda_notes.md).
#include "common.cuh"
#include "mma_int4.cuh"

#define PROJ4_WARPS 4

// One 32-column step: rows a, b words wa, wb (8 columns each) against the lane's token columns, into part.
template <int NT>
__device__ __forceinline__ void int4_step(float (&part)[NT][4], uint32_t wa, uint32_t wb, const float* x,
                                          int x_stride, int tok_base, int g, int n_tokens, int k) {
    uint32_t pa[4], pb[4];
    int4_pairs(wa, pa);
    int4_pairs(wb, pb);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
        const int n = tok_base + nt * 8 + g;                    // token of this lane's B column
        float v[8];
        if (n < n_tokens) {
            load_activations8(x + (size_t)n * x_stride + k, v);
        } else {
#pragma unroll
            for (int e = 0; e < 8; ++e) v[e] = 0.f;
        }
        uint32_t hi[4], lo[4];
        split_activations_int4(v, hi, lo);
        int4_mma_step(part[nt], pa, pb, hi, lo);
    }
}

template <int NT, bool LEAN>
__device__ void projection_int4_body(const uint8_t* __restrict__ Wq, const uint16_t* __restrict__ scales, int group,
                                     const float* __restrict__ x, const float* __restrict__ bias, float* out,
                                     int rows, int K, int n_tokens, int x_stride, int out_stride, int out_cols,
                                     int mode, int ksplit) {
    const int lane = threadIdx.x & 31;
    const int warp_id = blockIdx.x * PROJ4_WARPS + (threadIdx.x >> 5);   // range [0, n_tiles * ksplit)
    const int n_tiles = (rows + 15) >> 4;
    const int tile = warp_id / ksplit, part_id = warp_id - tile * ksplit;
    if (tile >= n_tiles) return;                                 // warp-uniform: the quads stay whole
    const int g = lane >> 2, t = lane & 3;                       // row in tile / token; quad lane
    const int tok_base = blockIdx.y * 8 * NT;
    const int row_a = tile * 16 + g, row_b = row_a + 8;
    const bool ok_a = row_a < rows, ok_b = row_b < rows;
    const int groups = K / group, steps_per_group = group >> 5, n_steps = K >> 5;
    const int spg_shift = 31 - __clz(steps_per_group);           // LEAN: log2(steps per group)
    const uint8_t* qa_row = Wq + (size_t)(ok_a ? row_a : 0) * (K >> 1);
    const uint8_t* qb_row = Wq + (size_t)(ok_b ? row_b : 0) * (K >> 1);
    const uint16_t* sa_row = scales + (size_t)(ok_a ? row_a : 0) * groups;
    const uint16_t* sb_row = scales + (size_t)(ok_b ? row_b : 0) * groups;
    int b_begin, b_end, s_end;                                   // this part's blocks, and steps [4 b_begin, s_end)
    int4_part_blocks(part_id, ksplit, n_steps, b_begin, b_end, s_end);

    float acc[NT][4], part[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[nt][e] = part[nt][e] = 0.f;

    uint32_t ma[4], mb[4];
    load_int4_block(qa_row, ok_a, b_begin, t, n_steps, ma);
    load_int4_block(qb_row, ok_b, b_begin, t, n_steps, mb);
    float sa = 0.f, sb = 0.f;
    for (int blk = b_begin; blk < b_end; ++blk) {
        uint32_t na[4], nb[4];
        load_int4_block(qa_row, ok_a && blk + 1 < b_end, blk + 1, t, n_steps, na);
        load_int4_block(qb_row, ok_b && blk + 1 < b_end, blk + 1, t, n_steps, nb);
        quad_transpose(ma, t);
        quad_transpose(mb, t);
#pragma unroll
        for (int s = 0; s < INT4_BLOCK_STEPS; ++s) {
            const int step = blk * INT4_BLOCK_STEPS + s;        // range [0, K / 32)
            if (step >= s_end) continue;                         // warp-uniform (the block's tail past K)
            const int grp = int4_step_group<LEAN>(step, steps_per_group, spg_shift);
            // A group's first step here: where the group starts, or where this part starts.
            if (int4_group_starts<LEAN>(step, steps_per_group) || step == b_begin * INT4_BLOCK_STEPS) {
                sa = int4_scale(sa_row, ok_a, grp);
                sb = int4_scale(sb_row, ok_b, grp);
            }
            int4_step<NT>(part, ma[s], mb[s], x, x_stride, tok_base, g, n_tokens, step * 32 + t * 8);
            if (int4_step_flushes<LEAN>(step, steps_per_group, s_end)) flush_group<NT>(acc, part, sa, sb);
        }
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            ma[u] = na[u];
            mb[u] = nb[u];
        }
    }
    store_mma_tile<NT>(acc, out, out_stride, bias, rows, out_cols, n_tokens, tok_base, tile, g, t, mode, ksplit > 1);
}

// Entries: 8, 16 or 32 tokens per block column; _lean (KernelPlan.int4_prefill_lean_loop: groups of 32 x a power
// of two) finds each step's group by a shift and masks, the same values in the same order (the same bits).
#define PROJECTION_INT4_ENTRY(NT, LEAN, SUFFIX)                                                                  \
    extern "C" __global__ void __launch_bounds__(PROJ4_WARPS * 32) projection_int4_nt##NT##SUFFIX(             \
        const uint8_t* Wq, const uint16_t* scales, int group, const float* x, const float* bias, float* out,   \
        int rows, int K, int n_tokens, int x_stride, int out_stride, int out_cols, int mode, int ksplit) {     \
        projection_int4_body<NT, LEAN>(Wq, scales, group, x, bias, out, rows, K, n_tokens, x_stride,            \
                                       out_stride, out_cols, mode, ksplit);                                     \
    }

PROJECTION_INT4_ENTRY(1, false, )
PROJECTION_INT4_ENTRY(2, false, )
PROJECTION_INT4_ENTRY(4, false, )
PROJECTION_INT4_ENTRY(1, true, _lean)
PROJECTION_INT4_ENTRY(2, true, _lean)
PROJECTION_INT4_ENTRY(4, true, _lean)
