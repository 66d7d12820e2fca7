// mma_bf16.cuh: the tensor-core building blocks of the bf16 kernels (projection_bf16.cu,
// projection_staged.cu, attention_mma.cu, prefill_bulk.cu, gemm_bulk.cu) and of the INT4 projections
// (through mma_int4.cuh), written once so all of them multiply and round exactly alike.
//
// mma_bf16_16816:    one mma.sync m16n8k16, bf16 inputs, fp32 accumulators c[0..3] (in place).
// load_weights16:    one streaming 16-byte load of 8 bf16 weights, kept out of L1.
// pack_bf16x2:       two floats -> one register of two bf16 (round to nearest even).
// split_activations: 8 fp32 activations -> bf16 halves hi + lo with hi + lo ~ x to ~16 mantissa
//                    bits (hi = bf16(x), lo = bf16(x - hi)); feeding both halves through the
//                    tensor cores keeps close to fp32 accuracy where bf16(x) alone keeps 8 bits.
// load_activations8: 8 consecutive fp32 activations (32-byte aligned) through the read-only path.
// store_mma_tile:    the STORE / ADD / SWIGLU epilogue of a warp's 16-row tile x 8 NT tokens
//                    (projection_bf16.cu, projection_staged.cu).
// store_partial_row: one query row of an attention split's partial sums (m, l, unnormalised o) from the
//                    accumulators of a warp's P.V tile (attention_mma.cu, prefill_bulk.cu).
//
// cuda_kernels.py pastes this text in place of `#include "mma_bf16.cuh"` (as it does common.cuh).
#pragma once
#include <cuda_bf16.h>
#include <stdint.h>
#include "common.cuh"

__device__ __forceinline__ void mma_bf16_16816(float* c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                               uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Streaming 16-byte weight load: read once per forward pass, so keep it out of L1.
__device__ __forceinline__ uint4 load_weights16(const uint16_t* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

__device__ __forceinline__ uint32_t pack_bf16x2(float lo_k, float hi_k) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo_k, hi_k);   // .x (low 16 bits) = lower k
    return *reinterpret_cast<uint32_t*>(&v);
}

__device__ __forceinline__ void load_activations8(const float* p, float* v) {
    const float4* src = reinterpret_cast<const float4*>(p);
    const float4 p0 = __ldg(src), p1 = __ldg(src + 1);
    v[0] = p0.x; v[1] = p0.y; v[2] = p0.z; v[3] = p0.w;
    v[4] = p1.x; v[5] = p1.y; v[6] = p1.z; v[7] = p1.w;
}

// 8 activations -> hi and lo bf16 pairs (pairs (0,1) (2,3) (4,5) (6,7)).
__device__ __forceinline__ void split_activations(const float* v, uint32_t* hi, uint32_t* lo) {
#pragma unroll
    for (int p = 0; p < 4; ++p) {
        const float a = v[2 * p], b = v[2 * p + 1];
        const float ha = __bfloat162float(__float2bfloat16_rn(a));
        const float hb = __bfloat162float(__float2bfloat16_rn(b));
        hi[p] = pack_bf16x2(ha, hb);
        lo[p] = pack_bf16x2(a - ha, b - hb);
    }
}

// acc[nt][0..1]: row_a = 16 tile + g, tokens n0, n0 + 1 (n0 = tok_base + 8 nt + 2t); acc[nt][2..3]:
// row_b = row_a + 8, the same tokens. SWIGLU: rows a and b are gate j and up j, j = 8 tile + g.
// atomic: ADD with the K range split over several warps or blocks (atomicAdd into out).
template <int NT>
__device__ __forceinline__ void store_mma_tile(const float (&acc)[NT][4], float* out, int out_stride,
                                               const float* bias, int rows, int out_cols, int n_tokens,
                                               int tok_base, int tile, int g, int t, int mode, bool atomic) {
    const int row_a = tile * 16 + g, row_b = row_a + 8;
    const bool ok_a = row_a < rows, ok_b = row_b < rows;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
        const int n0 = tok_base + nt * 8 + 2 * t;
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            const int n = n0 + j;
            if (n >= n_tokens) continue;
            float* orow = out + (size_t)n * out_stride;
            if (mode == PMODE_SWIGLU) {
                const int col = tile * 8 + g;
                if (col < out_cols) orow[col] = silu(acc[nt][j]) * acc[nt][2 + j];
            } else if (mode == PMODE_STORE) {
                if (ok_a && row_a < out_cols) orow[row_a] = acc[nt][j] + (bias ? bias[row_a] : 0.f);
                if (ok_b && row_b < out_cols) orow[row_b] = acc[nt][2 + j] + (bias ? bias[row_b] : 0.f);
            } else if (atomic) {
                if (ok_a && row_a < out_cols) atomicAdd(orow + row_a, acc[nt][j]);
                if (ok_b && row_b < out_cols) atomicAdd(orow + row_b, acc[nt][2 + j]);
            } else {
                if (ok_a && row_a < out_cols) orow[row_a] += acc[nt][j];
                if (ok_b && row_b < out_cols) orow[row_b] += acc[nt][2 + j];
            }
        }
    }
}

// Row r (0: g, 1: g + 8) of a 16-row P.V accumulator tile o[HD / 8][4] as one entry of the split partial sums:
// part_ml[2 base] = m, [2 base + 1] = l (written by the quad's t == 0 lane), part_o[base * HD + d] = o's row.
template <int HD>
__device__ __forceinline__ void store_partial_row(const float (&o)[HD / 8][4], int r, float m, float l,
                                                  float* part_o, float* part_ml, size_t base, int t) {
    if (t == 0) {
        part_ml[2 * base] = m;
        part_ml[2 * base + 1] = l;
    }
    float* dst = part_o + base * HD;
#pragma unroll
    for (int nd = 0; nd < HD / 8; ++nd)
        *reinterpret_cast<float2*>(dst + nd * 8 + 2 * t) = make_float2(o[nd][2 * r], o[nd][2 * r + 1]);
}
