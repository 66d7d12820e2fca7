// mma_int4.cuh: the INT4 side of the tensor-core projections (projection_int4.cu, each warp splitting its own
// activations; projection_int4_staged.cu, the block splitting them once into shared memory), written once so both
// kernels walk K, pair columns, multiply and scale exactly alike and give the same bits.
//
// Weights (model/int4.py's format): packed uint8 [rows, K / 2], column 2j in the low nibble of byte j and 2j + 1 in
// the high one, each q + 8 (q in -8..7); one fp16 scale per row and group of G columns (G % 32 == 0).
//
// int4_block_loads / load_int4_block: a quad lane's 16 bytes of a row's 128-column block (one streaming load).
// quad_transpose:    those four words across the quad, so that lane t holds word 4 s + t of each 32-column step
//                    s: physical columns 32 s + 8 t .. + 7, projection_bf16.cu's k mapping, so every mma's 16
//                    columns lie inside one 32-column step and hence inside one scale group.
// int4_pairs:        a word's 8 columns as 4 exact bf16 pairs (nibbles_to_bf16x2): pair i = columns (i, i + 4).
// split_activations_int4: 8 fp32 activations as bf16 hi / lo pairs in that same order (v_i, v_{i+4}); a dot
//                    product allows any pairing that both operands share.
// int4_mma_step:     one 32-column step of a 16-row x 8-token tile: 4 mma (hi and lo of each 16-column half).
// int4_part_blocks / int4_flush_here: a K part's 128-column blocks, and the steps where a group's partial is
//                    scaled into the accumulator (a group's last step, or the part's last).
// int4_step_group / int4_group_starts / int4_step_flushes: a step's group, whether it starts one, whether it
//                    flushes one; LEAN (the _lean entries) by shifts and masks for groups of 32 x a power of two.
// flush_group:       acc += s * part per row, part = 0.
//
// cuda_kernels.py pastes this text in place of `#include "mma_int4.cuh"` (as it does mma_bf16.cuh).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#include "mma_bf16.cuh"

#define INT4_BLOCK_STEPS 4          // 32-column steps per 16-byte load of a row (a 128-column block)

// Nibbles at bits 0-3 and 16-19 of w as a bf16 pair (low half: bits 0-3) of 128 + nibble, exact: 0x4300 | n is
// the bf16 of 128 + n.
__device__ __forceinline__ uint32_t biased_nibbles_to_bf16x2(uint32_t w) { return (w & 0x000F000Fu) | 0x43004300u; }

// The same pair as q = nibble - 8, exact: 128 + n - 136 = q is a bf16 too.
__device__ __forceinline__ uint32_t nibbles_to_bf16x2(uint32_t w) {
    const uint32_t biased = biased_nibbles_to_bf16x2(w);
    __nv_bfloat162 v = *reinterpret_cast<const __nv_bfloat162*>(&biased);
    v = __hsub2(v, __float2bfloat162_rn(136.f));
    return *reinterpret_cast<uint32_t*>(&v);
}

// A word's 8 columns (byte j: columns 2j, 2j + 1) as bf16 pairs: nibble i (bits 4i) is column i and nibble
// i + 4 (bits 16 + 4i) column i + 4, so p[i] = (q_i, q_{i+4}).
__device__ __forceinline__ void int4_pairs(uint32_t w, uint32_t (&p)[4]) {
#pragma unroll
    for (int i = 0; i < 4; ++i) p[i] = nibbles_to_bf16x2(w >> (4 * i));
}

// 8 activations of 8 consecutive columns -> hi / lo pairs matching int4_pairs: pair i = (v_i, v_{i+4}), each
// split as mma_bf16.cuh's split_activations does (hi = bf16(v), lo = bf16(v - hi)).
__device__ __forceinline__ void split_activations_int4(const float (&v)[8], uint32_t (&hi)[4], uint32_t (&lo)[4]) {
    const float paired[8] = {v[0], v[4], v[1], v[5], v[2], v[6], v[3], v[7]};
    split_activations(paired, hi, lo);
}

// m[u] of quad lane t = word 4 t + u of a 128-column block on entry; word 4 u + t on return (a 4 x 4 transpose
// over the quad in two exchanges: the off-diagonal 2 x 2 blocks across lanes t ^ 2, then the off-diagonal
// entries of each 2 x 2 block across lanes t ^ 1). Every lane of the warp takes part.
__device__ __forceinline__ void quad_transpose(uint32_t (&m)[4], int t) {
    const bool up = t & 2, odd = t & 1;
    uint32_t a = up ? m[0] : m[2], b = up ? m[1] : m[3];
    a = __shfl_xor_sync(0xffffffffu, a, 2);
    b = __shfl_xor_sync(0xffffffffu, b, 2);
    if (up) { m[0] = a; m[1] = b; } else { m[2] = a; m[3] = b; }
    a = odd ? m[0] : m[1];
    b = odd ? m[2] : m[3];
    a = __shfl_xor_sync(0xffffffffu, a, 1);
    b = __shfl_xor_sync(0xffffffffu, b, 1);
    if (odd) { m[0] = a; m[2] = b; } else { m[1] = a; m[3] = b; }
}

// Lane t's 16 bytes of block `blk` of a packed row (zeros where the block's step t lies past K or the row is
// outside the matrix), as four words. Streaming (load_weights16): read once per pass, kept out of L1.
__device__ __forceinline__ void load_int4_block(const uint8_t* q_row, bool ok, int blk, int t, int n_steps,
                                                uint32_t (&m)[4]) {
    const bool in = ok && blk * INT4_BLOCK_STEPS + t < n_steps;
    const uint4 v = in ? load_weights16(reinterpret_cast<const uint16_t*>(q_row + 64 * blk + 16 * t))
                       : make_uint4(0u, 0u, 0u, 0u);
    m[0] = v.x; m[1] = v.y; m[2] = v.z; m[3] = v.w;
}

// One 32-column step of a 16-row x 8-token tile into part: rows a (g) and b (g + 8) as pairs pa, pb; the lane's
// token column as hi / lo pairs. Pairs 0, 1 are logical k (2t, 2t + 1) and (2t + 8, 2t + 9) of the first mma,
// pairs 2, 3 of the second; the hi product before the lo one, so every caller sums in the same order.
__device__ __forceinline__ void int4_mma_step(float (&part)[4], const uint32_t (&pa)[4], const uint32_t (&pb)[4],
                                              const uint32_t (&hi)[4], const uint32_t (&lo)[4]) {
    mma_bf16_16816(part, pa[0], pb[0], pa[1], pb[1], hi[0], hi[1]);
    mma_bf16_16816(part, pa[0], pb[0], pa[1], pb[1], lo[0], lo[1]);
    mma_bf16_16816(part, pa[2], pb[2], pa[3], pb[3], hi[2], hi[3]);
    mma_bf16_16816(part, pa[2], pb[2], pa[3], pb[3], lo[2], lo[3]);
}

// Part `part` of ksplit parts of a K of n_steps 32-column steps: 128-column blocks [b_begin, b_end) (whole
// blocks, so a part's loads never straddle another part's) and its steps [4 b_begin, s_end).
__device__ __forceinline__ void int4_part_blocks(int part, int ksplit, int n_steps, int& b_begin, int& b_end,
                                                 int& s_end) {
    const int n_blocks = (n_steps + INT4_BLOCK_STEPS - 1) / INT4_BLOCK_STEPS;
    b_begin = (int)(((long long)part * n_blocks) / ksplit);
    b_end = (int)(((long long)(part + 1) * n_blocks) / ksplit);
    s_end = min(b_end * INT4_BLOCK_STEPS, n_steps);
}

// Whether the group partial is scaled into the accumulator after `step`: the group's last step, or the part's.
__device__ __forceinline__ bool int4_flush_here(int step, int steps_per_group, int s_end) {
    return (step + 1) % steps_per_group == 0 || step + 1 == s_end;
}

// The group of a 32-column step, whether it is a group's first and whether the group's partial is flushed after
// it. LEAN: a shift and masks, for groups of 32 x a power of two; otherwise integer divisions and remainders by
// the run-time steps per group (~20 SASS instructions each, several per 128-column block of a warp's loop: why
// the _lean entries exist).
template <bool LEAN>
__device__ __forceinline__ int int4_step_group(int step, int steps_per_group, int spg_shift) {
    return LEAN ? step >> spg_shift : step / steps_per_group;
}

template <bool LEAN>
__device__ __forceinline__ bool int4_group_starts(int step, int steps_per_group) {
    return LEAN ? (step & (steps_per_group - 1)) == 0 : step % steps_per_group == 0;
}

template <bool LEAN>
__device__ __forceinline__ bool int4_step_flushes(int step, int steps_per_group, int s_end) {
    return LEAN ? ((step + 1) & (steps_per_group - 1)) == 0 || step + 1 == s_end
                : int4_flush_here(step, steps_per_group, s_end);
}

// The fp16 scale (as fp32, exact) of row `row_scales` for group grp, 0 outside the matrix.
__device__ __forceinline__ float int4_scale(const uint16_t* row_scales, bool ok, int grp) {
    return ok ? __half2float(__ushort_as_half(__ldg(row_scales + grp))) : 0.f;
}

// acc += s * part (rows a: entries 0, 1; rows b: 2, 3), part = 0.
template <int NT>
__device__ __forceinline__ void flush_group(float (&acc)[NT][4], float (&part)[NT][4], float sa, float sb) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
        acc[nt][0] = fmaf(sa, part[nt][0], acc[nt][0]);
        acc[nt][1] = fmaf(sa, part[nt][1], acc[nt][1]);
        acc[nt][2] = fmaf(sb, part[nt][2], acc[nt][2]);
        acc[nt][3] = fmaf(sb, part[nt][3], acc[nt][3]);
        part[nt][0] = part[nt][1] = part[nt][2] = part[nt][3] = 0.f;
    }
}
