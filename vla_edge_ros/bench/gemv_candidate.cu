// gemv_candidate.cu: a candidate one-row bf16 GEMV for the decode projections, timed against
// projection_fused.cu by bench/gemv_probe.py. Not part of the engine: it has no epilogues (RMSNorm,
// RoPE, SwiGLU, residual add), only the weight stream, to find out how close plain CUDA-core code
// gets to the copy bandwidth before anything is built on it.
//
// Computes   out[r] = sum_k W[r, k] * x[k]     (W [rows, K] bf16 bits, x [K] float32)
// Launch:    grid ceil(rows / (8 R)), block 256 (8 warps); warp w of block b owns rows
//            (8 b + w) R .. + R - 1; lane l reads the 16-byte chunks l, l + 32, ... of each row,
//            U chunks per row per batch (R U loads of 16 bytes in flight per lane); x is staged in
//            shared memory once per block (4 K bytes of dynamic shared memory).
//            PIPE 1: the next batch's loads are issued before this batch's arithmetic.
#include <stdint.h>

__device__ __forceinline__ uint4 ldg_stream(const uint16_t* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

__device__ __forceinline__ float dot8(const uint4& w, const float* xs) {
    const float4 a = *reinterpret_cast<const float4*>(xs);
    const float4 b = *reinterpret_cast<const float4*>(xs + 4);
    float s = __uint_as_float(w.x << 16) * a.x;
    s += __uint_as_float(w.x & 0xffff0000u) * a.y;
    s += __uint_as_float(w.y << 16) * a.z;
    s += __uint_as_float(w.y & 0xffff0000u) * a.w;
    s += __uint_as_float(w.z << 16) * b.x;
    s += __uint_as_float(w.z & 0xffff0000u) * b.y;
    s += __uint_as_float(w.w << 16) * b.z;
    s += __uint_as_float(w.w & 0xffff0000u) * b.w;
    return s;
}

template <int R, int U, int PIPE>
__device__ void gemv_body(const uint16_t* __restrict__ W, const float* __restrict__ x, float* __restrict__ out,
                          int rows, int K) {
    extern __shared__ float xs[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int row0 = (blockIdx.x * 8 + warp) * R;
    const int chunks = K >> 3;
    const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
    uint4 w[R][U];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int c = lane + 32 * u;
            w[r][u] = (row0 + r < rows && c < chunks) ? ldg_stream(W + (size_t)(row0 + r) * K + 8 * c) : zero;
        }
    for (int i = threadIdx.x; i < (K >> 2); i += blockDim.x)
        reinterpret_cast<float4*>(xs)[i] = reinterpret_cast<const float4*>(x)[i];
    __syncthreads();
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = 0.f;
    for (int c0 = 0; c0 < chunks; c0 += 32 * U) {
        const int c1 = c0 + 32 * U;
        uint4 nw[R][U];
        if (PIPE) {
#pragma unroll
            for (int r = 0; r < R; ++r)
#pragma unroll
                for (int u = 0; u < U; ++u) {
                    const int c = c1 + lane + 32 * u;
                    nw[r][u] = (row0 + r < rows && c < chunks) ? ldg_stream(W + (size_t)(row0 + r) * K + 8 * c) : zero;
                }
        }
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int c = c0 + lane + 32 * u;
                if (c < chunks) acc[r] += dot8(w[r][u], xs + 8 * c);
            }
        if (PIPE) {
#pragma unroll
            for (int r = 0; r < R; ++r)
#pragma unroll
                for (int u = 0; u < U; ++u) w[r][u] = nw[r][u];
        } else if (c1 < chunks) {
#pragma unroll
            for (int r = 0; r < R; ++r)
#pragma unroll
                for (int u = 0; u < U; ++u) {
                    const int c = c1 + lane + 32 * u;
                    w[r][u] = (row0 + r < rows && c < chunks) ? ldg_stream(W + (size_t)(row0 + r) * K + 8 * c) : zero;
                }
        }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
        float v = acc[r];
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
        if (lane == 0 && row0 + r < rows) out[row0 + r] = v;
    }
}

#define GEMV_ENTRY(R, U, P)                                                                                 \
    extern "C" __global__ void __launch_bounds__(256) gemv_r##R##_u##U##_p##P(                              \
            const uint16_t* W, const float* x, float* out, int rows, int K) {                               \
        gemv_body<R, U, P>(W, x, out, rows, K);                                                            \
    }

GEMV_ENTRY(1, 4, 0)
GEMV_ENTRY(1, 8, 0)
GEMV_ENTRY(2, 4, 0)
GEMV_ENTRY(2, 8, 0)
GEMV_ENTRY(4, 4, 0)
GEMV_ENTRY(1, 4, 1)
GEMV_ENTRY(2, 4, 1)
GEMV_ENTRY(4, 2, 1)
