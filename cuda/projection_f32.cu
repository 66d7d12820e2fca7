// projection_f32.cu: y = x @ W^T for float32 weights with plain FFMA (the exact path used
// to verify against HuggingFace in fp32; speed is secondary here).
//
// Computes   acc[n, c] = sum_k W[r(c), k] * x[n, k]          fp32, fixed summation order
//            with the same epilogue modes (PMODE_* of common.cuh) and W layouts as projection_bf16.cu:
//              PMODE_STORE (0): out[n, c] = acc + bias[c];  PMODE_ADD (1): out[n, c] += acc
//              PMODE_SWIGLU(2): out[n, j] = silu(W[gate row of j] . x) * (W[up row of j] . x),
//                               gate row of j = 16*(j/8) + j%8, up row = that + 8
// Layouts:   W [rows, K] float32 row-major; x [n_tokens, x_stride]; out [n_tokens, out_stride].
// Launch:    block 256 = 8 warps, one warp per output column c = blockIdx.x*8 + warp in
//            [0, out_cols); blockIdx.y = token n in [0, n_tokens). Deterministic (no atomics).
// Preconditions: K % 4 == 0, x_stride % 4 == 0 (float4 loads).
#include "common.cuh"

__device__ __forceinline__ float row_dot(const float* __restrict__ w, const float* __restrict__ x, int K, int lane) {
    float s = 0.f;
    for (int k = lane * 4; k < K; k += 128) {         // k range [0, K), 16 bytes per lane
        const float4 a = *reinterpret_cast<const float4*>(w + k);
        const float4 b = *reinterpret_cast<const float4*>(x + k);
        s += a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
    }
    return warp_sum(s);
}

extern "C" __global__ void projection_f32(const float* W, const float* x, const float* bias, float* out, int rows,
                                          int K, int n_tokens, int x_stride, int out_stride, int out_cols, int mode) {
    const int lane = threadIdx.x & 31;                        // range [0, 32)
    const int c = blockIdx.x * 8 + (threadIdx.x >> 5);        // range [0, out_cols)
    const int n = blockIdx.y;                                 // range [0, n_tokens)
    if (c >= out_cols || n >= n_tokens) return;
    const float* xr = x + (size_t)n * x_stride;
    float* orow = out + (size_t)n * out_stride;
    if (mode == PMODE_SWIGLU) {
        const int gate_row = 16 * (c >> 3) + (c & 7);
        const float gate = row_dot(W + (size_t)gate_row * K, xr, K, lane);
        const float up = row_dot(W + (size_t)(gate_row + 8) * K, xr, K, lane);
        if (lane == 0) orow[c] = silu(gate) * up;
        return;
    }
    if (c >= rows) return;
    const float acc = row_dot(W + (size_t)c * K, xr, K, lane);
    if (lane == 0) {
        if (mode == PMODE_STORE) orow[c] = acc + (bias ? bias[c] : 0.f);
        else orow[c] += acc;
    }
}
