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
// Status:    compiled for sm_90 by scripts/compile_kernels.py; not yet run on a GPU.
#include "common.cuh"
#include "mma_bf16.cuh"

#define PROJ4_WARPS 4
#define PROJ4_BLOCK_STEPS 4          // 32-column steps per 16-byte load of a row (128 columns)

// Nibbles at bits 0-3 and 16-19 of w as a bf16 pair (low half: bits 0-3) of their q = nibble - 8, exact:
// 0x4300 | n is the bf16 of 128 + n, and 128 + n - 136 = q is a bf16 too.
__device__ __forceinline__ uint32_t nibbles_to_bf16x2(uint32_t w) {
    const uint32_t biased = (w & 0x000F000Fu) | 0x43004300u;
    __nv_bfloat162 v = *reinterpret_cast<const __nv_bfloat162*>(&biased);
    v = __hsub2(v, __float2bfloat162_rn(136.f));
    return *reinterpret_cast<uint32_t*>(&v);
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
// outside the matrix), as four words.
__device__ __forceinline__ void load_block(const uint8_t* q_row, bool ok, int blk, int t, int n_steps,
                                           uint32_t (&m)[4]) {
    const bool in = ok && blk * PROJ4_BLOCK_STEPS + t < n_steps;
    const uint4 v = in ? load_weights16(reinterpret_cast<const uint16_t*>(q_row + 64 * blk + 16 * t))
                       : make_uint4(0u, 0u, 0u, 0u);
    m[0] = v.x; m[1] = v.y; m[2] = v.z; m[3] = v.w;
}

// One 32-column step: rows a, b words wa, wb (8 columns each) against the lane's token columns, into part.
template <int NT>
__device__ __forceinline__ void int4_step(float (&part)[NT][4], uint32_t wa, uint32_t wb, const float* x,
                                          int x_stride, int tok_base, int g, int n_tokens, int k) {
    uint32_t pa[4], pb[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        pa[i] = nibbles_to_bf16x2(wa >> (4 * i));
        pb[i] = nibbles_to_bf16x2(wb >> (4 * i));
    }
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
        const float paired[8] = {v[0], v[4], v[1], v[5], v[2], v[6], v[3], v[7]};   // pair i = (v_i, v_{i+4})
        uint32_t hi[4], lo[4];
        split_activations(paired, hi, lo);
        mma_bf16_16816(part[nt], pa[0], pb[0], pa[1], pb[1], hi[0], hi[1]);
        mma_bf16_16816(part[nt], pa[0], pb[0], pa[1], pb[1], lo[0], lo[1]);
        mma_bf16_16816(part[nt], pa[2], pb[2], pa[3], pb[3], hi[2], hi[3]);
        mma_bf16_16816(part[nt], pa[2], pb[2], pa[3], pb[3], lo[2], lo[3]);
    }
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

template <int NT>
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
    const uint8_t* qa_row = Wq + (size_t)(ok_a ? row_a : 0) * (K >> 1);
    const uint8_t* qb_row = Wq + (size_t)(ok_b ? row_b : 0) * (K >> 1);
    const uint16_t* sa_row = scales + (size_t)(ok_a ? row_a : 0) * groups;
    const uint16_t* sb_row = scales + (size_t)(ok_b ? row_b : 0) * groups;
    const int n_blocks = (n_steps + PROJ4_BLOCK_STEPS - 1) / PROJ4_BLOCK_STEPS;
    const int b_begin = (int)(((long long)part_id * n_blocks) / ksplit);
    const int b_end = (int)(((long long)(part_id + 1) * n_blocks) / ksplit);
    const int s_end = min(b_end * PROJ4_BLOCK_STEPS, n_steps);   // this part's steps: [4 b_begin, s_end)

    float acc[NT][4], part[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[nt][e] = part[nt][e] = 0.f;

    uint32_t ma[4], mb[4];
    load_block(qa_row, ok_a, b_begin, t, n_steps, ma);
    load_block(qb_row, ok_b, b_begin, t, n_steps, mb);
    float sa = 0.f, sb = 0.f;
    for (int blk = b_begin; blk < b_end; ++blk) {
        uint32_t na[4], nb[4];
        load_block(qa_row, ok_a && blk + 1 < b_end, blk + 1, t, n_steps, na);
        load_block(qb_row, ok_b && blk + 1 < b_end, blk + 1, t, n_steps, nb);
        quad_transpose(ma, t);
        quad_transpose(mb, t);
#pragma unroll
        for (int s = 0; s < PROJ4_BLOCK_STEPS; ++s) {
            const int step = blk * PROJ4_BLOCK_STEPS + s;        // range [0, K / 32)
            if (step >= s_end) continue;                         // warp-uniform (the block's tail past K)
            const int grp = step / steps_per_group;
            if (step % steps_per_group == 0 || step == b_begin * PROJ4_BLOCK_STEPS) {   // a group's first step here
                sa = ok_a ? __half2float(__ushort_as_half(__ldg(sa_row + grp))) : 0.f;
                sb = ok_b ? __half2float(__ushort_as_half(__ldg(sb_row + grp))) : 0.f;
            }
            int4_step<NT>(part, ma[s], mb[s], x, x_stride, tok_base, g, n_tokens, step * 32 + t * 8);
            if ((step + 1) % steps_per_group == 0 || step + 1 == s_end) flush_group<NT>(acc, part, sa, sb);
        }
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            ma[u] = na[u];
            mb[u] = nb[u];
        }
    }
    store_mma_tile<NT>(acc, out, out_stride, bias, rows, out_cols, n_tokens, tok_base, tile, g, t, mode, ksplit > 1);
}

#define PROJECTION_INT4_ENTRY(NT)                                                                                \
    extern "C" __global__ void __launch_bounds__(PROJ4_WARPS * 32) projection_int4_nt##NT(                     \
        const uint8_t* Wq, const uint16_t* scales, int group, const float* x, const float* bias, float* out,   \
        int rows, int K, int n_tokens, int x_stride, int out_stride, int out_cols, int mode, int ksplit) {     \
        projection_int4_body<NT>(Wq, scales, group, x, bias, out, rows, K, n_tokens, x_stride, out_stride,      \
                                 out_cols, mode, ksplit);                                                       \
    }

PROJECTION_INT4_ENTRY(1)
PROJECTION_INT4_ENTRY(2)
PROJECTION_INT4_ENTRY(4)
