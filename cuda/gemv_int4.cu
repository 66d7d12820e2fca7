// gemv_int4.cu: the one-row projection of a decode step from INT4 weights (model/int4.py's format),
// dequantized in registers: acc[r] = sum_k (q[r, k] * s[r, k / G]) * x[k], then the STORE / ADD
// epilogue of common.cuh (out[r] = acc + bias[r], or out[r] += acc).
//
// Why: a decode step streams every weight once, so its time is the weight bytes over the copy
// bandwidth. INT4 groups of 128 with an fp16 scale are 4.125 bits per weight against bf16's 16:
// ~3.9x fewer bytes (issue 23: the 7B shape streams ~3.4 GB per token instead of ~13 GB).
//
// Layouts:   Wq [rows, K / 2] uint8: byte j of a row holds column 2j in its low nibble and 2j + 1 in
//            its high one, each as q + 8 (0..15). Read as little-endian 32-bit words, word w of a row
//            holds columns 8w .. 8w + 7 in nibbles 0..7 (nibble i = column 8w + i).
//            scales [rows, K / G] fp16 bits; x [K] float32 (16-byte aligned); out, bias [rows] float32.
// Launch:    grid ceil(rows / 8), block GEMV4_THREADS (8 warps), dynamic shared memory 4 K bytes.
//            Warp w of block b owns row 8b + w. The block stages x in shared memory; lane l streams
//            the 16-byte chunks l, l + 32, ... of its row (32 columns each, coalesced across the warp),
//            each chunk inside one scale group, so its 32 products are summed first and scaled once.
// Preconditions: K % 32 == 0; G % 32 == 0 and K % G == 0; Wq rows 16-byte aligned (K / 2 % 16 == 0).
// Status:    compiled for sm_90 by scripts/compile_kernels.py; not yet run on a GPU (its test,
//            test/test_cuda_gemv_int4.py, waits for device time), and no backend path launches it yet.
// Numerics:  each product q * x in fp32 (q is exact), the 8 of a word added in column order, the four
//            words of a chunk added, scaled by s (fp16 widened exactly), chunks accumulated per lane in
//            order, then a warp sum: another order than numpy's, so within fp32 rounding of
//            kernel_reference / int4.dequantize(...) @ x, not bit for bit.
#include <cuda_fp16.h>
#include "common.cuh"

#define GEMV4_THREADS 256
#define GEMV4_WARPS (GEMV4_THREADS / 32)

// The 8 columns of one 32-bit word of nibbles against 8 staged activations.
__device__ __forceinline__ float dot8_int4(uint32_t w, const float* v) {
    const float4 a = *reinterpret_cast<const float4*>(v);
    const float4 b = *reinterpret_cast<const float4*>(v + 4);
    float s = (float)((int)(w & 0xFu) - 8) * a.x;
    s = fmaf((float)((int)((w >> 4) & 0xFu) - 8), a.y, s);
    s = fmaf((float)((int)((w >> 8) & 0xFu) - 8), a.z, s);
    s = fmaf((float)((int)((w >> 12) & 0xFu) - 8), a.w, s);
    s = fmaf((float)((int)((w >> 16) & 0xFu) - 8), b.x, s);
    s = fmaf((float)((int)((w >> 20) & 0xFu) - 8), b.y, s);
    s = fmaf((float)((int)((w >> 24) & 0xFu) - 8), b.z, s);
    s = fmaf((float)((int)(w >> 28) - 8), b.w, s);
    return s;
}

extern "C" __global__ void __launch_bounds__(GEMV4_THREADS) gemv_int4(
        const uint8_t* __restrict__ Wq, const uint16_t* __restrict__ scales, const float* __restrict__ x,
        const float* bias, float* out, int rows, int K, int group, int mode) {
    extern __shared__ float4 v_s4[];                            // [K / 4] staged activations
    const float4* x4 = reinterpret_cast<const float4*>(x);
    for (int i = threadIdx.x; i < (K >> 2); i += GEMV4_THREADS) v_s4[i] = x4[i];   // i range [0, K/4)
    __syncthreads();
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * GEMV4_WARPS + (threadIdx.x >> 5);   // range [0, rows)
    if (row >= rows) return;
    const float* v = reinterpret_cast<const float*>(v_s4);
    const uint4* w_row = reinterpret_cast<const uint4*>(Wq + (size_t)row * (K >> 1));
    const uint16_t* s_row = scales + (size_t)row * (K / group);
    const int chunks = K >> 5;                                  // 32 columns (16 bytes) per chunk
    float acc = 0.f;
#pragma unroll 4
    for (int c = lane; c < chunks; c += 32) {                   // c range [0, K/32)
        const uint4 w = __ldg(w_row + c);
        const float* vc = v + 32 * c;
        const float part = dot8_int4(w.x, vc) + dot8_int4(w.y, vc + 8) + dot8_int4(w.z, vc + 16)
                         + dot8_int4(w.w, vc + 24);
        const float s = __half2float(__ushort_as_half(s_row[(32 * c) / group]));
        acc = fmaf(s, part, acc);
    }
    acc = warp_sum(acc);
    if (lane == 0) {
        if (mode == PMODE_ADD) out[row] += acc;
        else out[row] = acc + (bias != nullptr ? bias[row] : 0.f);
    }
}
