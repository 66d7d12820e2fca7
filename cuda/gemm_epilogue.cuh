// gemm_epilogue.cuh: the output side of the bulk prefill's GEMMs (gemm_bulk.cu on mma.sync,
// gemm_wgmma.cu on Hopper's wgmma), written once so both kernels store exactly alike.
//
// store_gemm_tile<MT, NT>: a thread's accumulators acc[mt][nt][2 r + e] hold row
//   row_base + 16 mt + 8 r and column col_base + 8 nt + 2 t + e (the m16n8 fragment layout, which
//   a wgmma m64nN accumulator also has: its warp w owns rows 16 w .. 16 w + 15, nt runs over N / 8).
//   mode STORE: out_f[m, n] = acc + bias[n]; ADD: out_f[m, n] += acc (atomicAdd when k_split > 1
//   blocks share the tile); SWIGLU: n8 tiles 2 pp (gate) and 2 pp + 1 (up) give output column
//   8 ((col_base >> 4) + pp) + 2 t + e = silu(gate) * up, written as bf16 hi/lo pairs into out_h
//   (the lo parts o_part_stride elements on). Rows >= M and columns >= out_cols are not written.
#pragma once
#include <stdint.h>
#include "common.cuh"
#include "mma_tiles.cuh"

template <int MT, int NT>
__device__ __forceinline__ void store_gemm_tile(const float (&acc)[MT][NT][4], int row_base, int col_base, int t,
                                                int M, int out_cols, int mode, int k_split, const float* bias,
                                                float* out_f, uint16_t* out_h, long long o_part_stride, int ldo) {
    if (mode == PMODE_SWIGLU) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int pp = 0; pp < NT / 2; ++pp) {
                const int c = ((col_base >> 4) + pp) * 8 + 2 * t;
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    const int m = row_base + mt * 16 + 8 * r;
                    if (m >= M || c >= out_cols) continue;
                    const float v0 = silu(acc[mt][2 * pp][2 * r]) * acc[mt][2 * pp + 1][2 * r];
                    const float v1 = silu(acc[mt][2 * pp][2 * r + 1]) * acc[mt][2 * pp + 1][2 * r + 1];
                    uint32_t hi, lo;
                    split_pair(v0, v1, hi, lo);
                    uint16_t* dst = out_h + (size_t)m * ldo + c;
                    *reinterpret_cast<uint32_t*>(dst) = hi;
                    *reinterpret_cast<uint32_t*>(dst + o_part_stride) = lo;
                }
            }
        return;
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const int m = row_base + mt * 16 + 8 * r;
                const int n = col_base + nt * 8 + 2 * t;
                if (m >= M || n >= out_cols) continue;
                float* o = out_f + (size_t)m * ldo + n;
                const float v0 = acc[mt][nt][2 * r], v1 = acc[mt][nt][2 * r + 1];
                if (mode == PMODE_STORE) {
                    *reinterpret_cast<float2*>(o) = make_float2(v0 + (bias ? bias[n] : 0.f),
                                                                v1 + (bias ? bias[n + 1] : 0.f));
                } else if (k_split > 1) {
                    atomicAdd(o, v0);
                    atomicAdd(o + 1, v1);
                } else {
                    float2 cur = *reinterpret_cast<const float2*>(o);
                    cur.x += v0;
                    cur.y += v1;
                    *reinterpret_cast<float2*>(o) = cur;
                }
            }
}
