// common.cuh: definitions shared by every kernel family in cuda/*.cu.
//
// cuda_kernels.py pastes this text in place of `#include "common.cuh"` before
// compiling a family, so each family is one self-contained translation unit.
//
// It is also the one place where the numbers shared with the host are written: the control
// block indices and the projection modes below are read from here by
// vla_edge_ros/model/kernel_constants.py, so keep each as `#define NAME <integer>`.
// (The attention limits are mirrored in cuda_kernels.py; test_kernel_sources.py checks them.)
//
// Control block: a small int32 array in device memory that the host writes
// before a call and that the argmax kernel advances on the device. Kernels
// read their per-call numbers from it (never from kernel arguments), so one
// captured CUDA graph serves every decode step.
#pragma once
#include <cuda_bf16.h>
#include <stdint.h>

#define CTL_ROW_OFFSET 0   // table index (positions, write slots, attend list) of this call's row 0
#define CTL_CTX_LEN    1   // attend-list entries before the first row of the cycle (cached context)
#define CTL_N_OUT      2   // action tokens emitted so far in this cycle
#define CTL_TOKEN      3   // last emitted token id: the next decode step's input
#define CTL_INTS       4

// Projection epilogue modes: the `mode` argument of projection_f32, projection_bf16, projection_staged,
// the INT4 projections and the GEMVs (each .cu header says what its modes compute).
#define PMODE_STORE    0   // out = acc (+ bias)
#define PMODE_ADD      1   // out += acc (residual stream, or a bias-initialised accumulator)
#define PMODE_SWIGLU   2   // out = silu(gate) * up, gate/up rows interleaved in blocks of 8
#define PMODE_QKV_ROPE 3   // gemv only: q out, k/v into the arena, RoPE applied

// Entries of the attend list that query row i of a call sees: the cached context, then the call's
// rows up to and including its own (table index ctl[CTL_ROW_OFFSET] + i); shared by the attention kernels.
__device__ __forceinline__ int list_length(const int* ctl, int i) {
    return ctl[CTL_CTX_LEN] + ctl[CTL_ROW_OFFSET] + i + 1;
}

// Attention splits the attend list into chunks of this many slots (flash-decoding).
#define ATTN_CHUNK 64

// Entries of the attend list each of a call's n_splits splits covers: whole chunks, as few as cover the
// call's longest list (its last row's) with n_splits splits, the same for every row of the call so that
// a block of several rows shares one K/V range. A launch whose splits cover the arena (n_splits =
// capacity / ATTN_CHUNK: attention_tiled.cu) gets one chunk per split; launched with fewer splits, each
// walks several chunks and the merge reads fewer partial sums (long context). The partial kernels and
// the merge compute it alike from the same (ctl, n_rows, n_splits).
__device__ __forceinline__ int split_span(const int* ctl, int n_rows, int n_splits) {
    const int chunks = (list_length(ctl, n_rows - 1) + ATTN_CHUNK - 1) / ATTN_CHUNK;
    return ATTN_CHUNK * ((chunks + n_splits - 1) / n_splits);
}

// Largest query-heads-per-KV-head group and head_dim the attention kernels hold in shared memory.
#define ATTN_MAX_GROUP 8
#define ATTN_MAX_HEAD_DIM 256

// Loads of values that other blocks of the same grid may have written during this kernel. In
// decode_persistent.cu (which defines GRID_WRITTEN_THROUGH_L2 before its includes) they go through
// L2 only, as L1 is not coherent within a kernel; in the launched kernels those values were written
// before the launch, and an ordinary load keeps their code as it was measured.
#ifdef GRID_WRITTEN_THROUGH_L2
#define LOAD_GRID_WRITTEN(p) __ldcg(p)
#else
#define LOAD_GRID_WRITTEN(p) (*(p))
#endif

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
    return v;
}

// Sum over a block whose size is a multiple of 32 (<= 1024); every thread gets the result.
// `scratch` holds at least 32 floats of shared memory.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
    const int lane = threadIdx.x & 31;   // range [0, 32)
    const int warp = threadIdx.x >> 5;   // range [0, blockDim.x / 32)
    v = warp_sum(v);
    __syncthreads();                      // scratch may still be read by a previous call
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    const int n_warps = blockDim.x >> 5;
    float total = 0.f;
    for (int w = 0; w < n_warps; ++w) total += scratch[w];
    return total;
}

// 1 / RMS of one row of x (rsqrt(mean(x^2) + eps)), summed over the block (blockDim.x a multiple of 32):
// the RMSNorm scale rmsnorm.cu and prefill_bulk.cu apply. `scratch` holds at least 32 floats of shared memory.
__device__ __forceinline__ float row_inv_rms(const float* xr, int hidden, float eps, float* scratch) {
    float ss = 0.f;
    for (int d = threadIdx.x; d < hidden; d += blockDim.x) {   // d range [0, hidden)
        const float v = xr[d];
        ss += v * v;
    }
    return rsqrtf(block_sum(ss, scratch) / (float)hidden + eps);
}

// SwiGLU's gate activation, the one definition every kernel family uses.
__device__ __forceinline__ float silu(float v) { return v / (1.f + expf(-v)); }

__device__ __forceinline__ float bf16_bits_to_float(uint16_t bits) {
    return __uint_as_float(((uint32_t)bits) << 16);
}

// Programmatic dependent launch (sm_90+). A kernel launched with the programmatic-serialization
// attribute may start while the kernel before it on the stream is still running; it must call
// griddep_wait() before touching anything that kernel (or any earlier one) writes or reads, and
// may call griddep_launch_dependents() to let the next kernel start early in turn. Both are
// no-ops for an ordinary launch and compile to nothing before sm_90.
__device__ __forceinline__ void griddep_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void griddep_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
