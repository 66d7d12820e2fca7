// projection_bf16.cu: y = x @ W^T for bf16 weights, fp32 activations, fp32 accumulation,
// on the tensor cores (mma.sync m16n8k16) with activations split into two bf16 halves.
//
// Computes   acc[n, r] = sum_k W[r, k] * x[n, k]          r in [0, rows), n in [0, n_tokens)
//            x is split exactly-ish as x = hi + lo (hi = bf16(x), lo = bf16(x - hi)) and both
//            halves go through the tensor cores, so the product keeps ~16 mantissa bits of
//            x (bf16 x alone keeps 8): accuracy close to fp32 FFMA at tensor-core speed.
//            Epilogue by `mode` (PMODE_* of common.cuh):
//              PMODE_STORE  (0): out[n, r]  = acc + (bias ? bias[r] : 0)      ksplit must be 1
//              PMODE_ADD    (1): out[n, r] += acc   (atomicAdd when ksplit > 1; used to add into
//                                the residual stream, or into a bias-initialised q/k/v buffer)
//              PMODE_SWIGLU (2): W rows are gate/up interleaved in blocks of 8 (tile t = rows
//                                16t..16t+7 gate[8t..8t+7], rows 16t+8..16t+15 up[8t..8t+7]);
//                                out[n, j] = silu(gate_j) * up_j, j = 8t + g    ksplit must be 1
//
// Layouts:   W   [rows, K] row-major bf16 bits (HF nn.Linear layout [out, in])
//            x   [n_tokens, x_stride] float32, the first K columns used
//            out [n_tokens, out_stride] float32; columns [0, out_cols) written
// Launch:    block 128 threads = 4 warps; one warp owns a 16-row tile of W and one of `ksplit`
//            contiguous K ranges (multiples of 32): warp_id = blockIdx.x*4 + warp in
//            [0, n_tiles*ksplit); grid.x = ceil_div(n_tiles*ksplit, 4).
//            blockIdx.y = token group: tokens [blockIdx.y*8*NT, +8*NT); NT (1, 2 or 4) token
//            tiles of 8 share every weight fragment, so a 32-token prefill streams W once.
// Loads:     each lane loads 16 bytes (8 bf16) of row g and of row g+8 per 32-wide K step,
//            4 steps unrolled (8 x 16 B in flight per lane). The K order inside a step is
//            permuted identically for A (weights) and B (activations), which a dot product
//            allows: lane (g, t) holds physical k = k0 + 8t .. k0 + 8t + 7, feeding logical
//            k {2t, 2t+1, 2t+8, 2t+9} of two consecutive mma instructions.
// Preconditions: K % 32 == 0; x_stride % 8 == 0 (32-byte aligned float4 pairs); W rows
//            beyond `rows` are never read (their fragments are zero).
#include "common.cuh"
#include "mma_bf16.cuh"

#define PROJ_WARPS 4

template <int NT>
__device__ __forceinline__ void k_step(float (&acc)[NT][4], const uint4& wa, const uint4& wb,
                                       const float* x, int x_stride, int tok_base, int g, int n_tokens, int k) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
        const int n = tok_base + nt * 8 + g;          // token of this lane's B column
        float v[8];
        if (n < n_tokens) {
            load_activations8(x + (size_t)n * x_stride + k, v);
        } else {
#pragma unroll
            for (int e = 0; e < 8; ++e) v[e] = 0.f;
        }
        uint32_t hi[4], lo[4];
        split_activations(v, hi, lo);
        mma_bf16_16816(acc[nt], wa.x, wb.x, wa.y, wb.y, hi[0], hi[1]);
        mma_bf16_16816(acc[nt], wa.x, wb.x, wa.y, wb.y, lo[0], lo[1]);
        mma_bf16_16816(acc[nt], wa.z, wb.z, wa.w, wb.w, hi[2], hi[3]);
        mma_bf16_16816(acc[nt], wa.z, wb.z, wa.w, wb.w, lo[2], lo[3]);
    }
}

template <int NT>
__device__ void projection_body(const uint16_t* __restrict__ W, const float* __restrict__ x, const float* __restrict__ bias,
                                float* out, int rows, int K, int n_tokens, int x_stride, int out_stride,
                                int out_cols, int mode, int ksplit) {
    const int lane = threadIdx.x & 31;                            // range [0, 32)
    const int warp_id = blockIdx.x * PROJ_WARPS + (threadIdx.x >> 5);   // range [0, n_tiles*ksplit)
    const int n_tiles = (rows + 15) >> 4;
    const int tile = warp_id / ksplit;                            // range [0, n_tiles)
    const int part = warp_id - tile * ksplit;                     // range [0, ksplit)
    if (tile >= n_tiles) return;
    const int g = lane >> 2;                                      // range [0, 8): row in tile / token in tile
    const int t = lane & 3;                                       // range [0, 4): k group / token pair
    const int tok_base = blockIdx.y * 8 * NT;                     // first token of this group
    const int row_a = tile * 16 + g, row_b = row_a + 8;
    const bool ok_a = row_a < rows, ok_b = row_b < rows;
    const uint16_t* wa_row = W + (size_t)(ok_a ? row_a : 0) * K;
    const uint16_t* wb_row = W + (size_t)(ok_b ? row_b : 0) * K;
    const int n_steps = K >> 5;                                   // 32-wide K steps
    const int s_begin = (int)(((long long)part * n_steps) / ksplit);
    const int s_end = (int)(((long long)(part + 1) * n_steps) / ksplit);
    const uint4 zero = make_uint4(0u, 0u, 0u, 0u);

    float acc[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;

    int s = s_begin;
    for (; s + 4 <= s_end; s += 4) {
        uint4 wa[4], wb[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const int k = (s + u) * 32 + t * 8;
            wa[u] = ok_a ? load_weights16(wa_row + k) : zero;
            wb[u] = ok_b ? load_weights16(wb_row + k) : zero;
        }
#pragma unroll
        for (int u = 0; u < 4; ++u) k_step<NT>(acc, wa[u], wb[u], x, x_stride, tok_base, g, n_tokens, (s + u) * 32 + t * 8);
    }
    for (; s < s_end; ++s) {
        const int k = s * 32 + t * 8;
        const uint4 wa = ok_a ? load_weights16(wa_row + k) : zero;
        const uint4 wb = ok_b ? load_weights16(wb_row + k) : zero;
        k_step<NT>(acc, wa, wb, x, x_stride, tok_base, g, n_tokens, k);
    }

    store_mma_tile<NT>(acc, out, out_stride, bias, rows, out_cols, n_tokens, tok_base, tile, g, t, mode, ksplit > 1);
}

#define PROJECTION_ENTRY(NT)                                                                                  \
    extern "C" __global__ void __launch_bounds__(PROJ_WARPS * 32) projection_bf16_nt##NT(                   \
        const uint16_t* W, const float* x, const float* bias, float* out, int rows, int K, int n_tokens,     \
        int x_stride, int out_stride, int out_cols, int mode, int ksplit) {                                 \
        projection_body<NT>(W, x, bias, out, rows, K, n_tokens, x_stride, out_stride, out_cols, mode, ksplit); \
    }

PROJECTION_ENTRY(1)
PROJECTION_ENTRY(2)
PROJECTION_ENTRY(4)
