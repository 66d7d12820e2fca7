// gemv_rows.cuh: the pieces of gemv.cu's one-row projection that decode_persistent.cu runs as its
// projection stages, so both compute every output with the same arithmetic in the same order.
//
// An "item" is what one gemv.cu block does: 8 weight rows, one per warp (STORE, ADD), or 4 row
// pairs (SWIGLU, QKV_ROPE: warps 2p and 2p + 1 hold pair p's two rows). gemv.cu runs item
// blockIdx.x; the persistent kernel runs items blockIdx.x, blockIdx.x + gridDim.x, ...
//
// Activations and the residual row are loaded with LOAD_GRID_WRITTEN (common.cuh): through L2 only
// in the persistent kernel, where other blocks of the same grid wrote them during the launch.
#pragma once
#include "common.cuh"
// mma_bf16.cuh for load_weights16, the streaming weight load (its mma helpers go unused here).
#include "mma_bf16.cuh"
#include "qkv_rope.cuh"

#define GEMV_THREADS 256
#define GEMV_WARPS (GEMV_THREADS / 32)
// 16-byte weight chunks per lane per batch of the launched kernels (gemv.cu; the U below). 8
// measured no faster on the H200 (decode projections 1.125 vs 1.105 ms per step, with 8 only for the grids of
// at most 2 blocks per SM).
#define GEMV_LANE_LOADS 4
// U, the template parameter of the pieces below: 16-byte chunks per lane per batch (a batch's loads
// are all in flight together). Each lane adds its chunks in the same order (lane, lane + 32, ...)
// whatever U is, so every U gives bit-identical sums; U only sets how many loads wait at once.

// 8 bf16 weights (low half of each word = the lower k) against 8 staged activations.
__device__ __forceinline__ float dot8_bf16(const uint4& w, const float* v) {
    const float4 a = *reinterpret_cast<const float4*>(v);
    const float4 b = *reinterpret_cast<const float4*>(v + 4);
    float s = __uint_as_float(w.x << 16) * a.x;
    s = fmaf(__uint_as_float(w.x & 0xffff0000u), a.y, s);
    s = fmaf(__uint_as_float(w.y << 16), a.z, s);
    s = fmaf(__uint_as_float(w.y & 0xffff0000u), a.w, s);
    s = fmaf(__uint_as_float(w.z << 16), b.x, s);
    s = fmaf(__uint_as_float(w.z & 0xffff0000u), b.y, s);
    s = fmaf(__uint_as_float(w.w << 16), b.z, s);
    s = fmaf(__uint_as_float(w.w & 0xffff0000u), b.w, s);
    return s;
}

__device__ __forceinline__ bool gemv_pair_mode(int mode) {
    return mode == PMODE_SWIGLU || mode == PMODE_QKV_ROPE;
}

// Items of a projection with `rows` weight rows (the grid of gemv.cu).
__device__ __forceinline__ int gemv_items(int rows) { return (rows + GEMV_WARPS - 1) / GEMV_WARPS; }

// The weight row warp `warp` streams in item `item`.
__device__ __forceinline__ int gemv_row(int mode, int item, int warp) {
    if (!gemv_pair_mode(mode)) return item * GEMV_WARPS + warp;
    const int pair = item * (GEMV_WARPS / 2) + (warp >> 1);          // range [0, rows / 2)
    return 16 * (pair >> 3) + (pair & 7) + 8 * (warp & 1);
}

// Lane `lane`'s first U 16-byte chunks of weight row `row` (zeros past the row or the matrix).
template <int U>
__device__ __forceinline__ void gemv_first_loads(const uint16_t* W, int row, int rows, int K, uint4 (&w)[U]) {
    const int lane = threadIdx.x & 31, chunks = K >> 3;
    const bool ok = row < rows;
    const uint16_t* w_row = W + (size_t)(ok ? row : 0) * K;
#pragma unroll
    for (int u = 0; u < U; ++u) {
        const int c = lane + 32 * u;
        w[u] = (ok && c < chunks) ? load_weights16(w_row + 8 * c) : make_uint4(0u, 0u, 0u, 0u);
    }
}

// Where float4 i of the activations is staged: i itself (STAGE_PLAIN), or for gemv_int4.cu's lanes, which read
// 32-column chunks c0 + l, 128 bytes apart (the 8 lanes of one LDS.128 phase would all hit the same four banks),
// float4 j of each chunk c (i = 8c + j) at 8c + (j ^ (c & 7)) (STAGE_SWIZZLE: the XOR spreads a phase's 8 chunks
// over the 8 four-bank groups) or at 9c + j (STAGE_PADDED: one float4 of padding after each chunk does the same, and
// the reader's 8 addresses of a chunk are one register plus constants, where the XOR costs an instruction each;
// 4.5 K bytes of shared memory instead of 4 K). Needs K % 32 == 0 (whole chunks).
#define STAGE_PLAIN 0
#define STAGE_SWIZZLE 1
#define STAGE_PADDED 2
template <int LAYOUT>
__device__ __forceinline__ int staged_index(int i) {
    return LAYOUT == STAGE_SWIZZLE ? ((i & ~7) | ((i ^ (i >> 3)) & 7)) : LAYOUT == STAGE_PADDED ? i + (i >> 3) : i;
}

// Stage v = x (or x * norm_w) in shared memory for the whole block (at staged_index<LAYOUT>); returns the
// RMSNorm factor rsqrt(mean(x^2) + eps), or 1 without norm_w. Ends with a barrier that publishes v_s4.
template <int LAYOUT = STAGE_PLAIN>
__device__ __forceinline__ float gemv_stage_activations(const float* x, const float* norm_w, float eps, int K,
                                                        float4* v_s4, float* scratch) {
    const float4* x4 = reinterpret_cast<const float4*>(x);
    const float4* n4 = reinterpret_cast<const float4*>(norm_w);
    float ss = 0.f;
    for (int i = threadIdx.x; i < (K >> 2); i += GEMV_THREADS) {   // i range [0, K/4)
        float4 v = LOAD_GRID_WRITTEN(x4 + i);
        if (norm_w != nullptr) {
            ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
            const float4 g = n4[i];
            v.x *= g.x; v.y *= g.y; v.z *= g.z; v.w *= g.w;
        }
        v_s4[staged_index<LAYOUT>(i)] = v;
    }
    if (norm_w != nullptr) return rsqrtf(block_sum(ss, scratch) / (float)K + eps);   // barriers publish v_s4
    __syncthreads();
    return 1.f;
}

// This lane's share of batch c0 (chunks c0 + lane + 32 u) of a row against the staged activations.
template <int U>
__device__ __forceinline__ float gemv_batch(const uint4 (&w)[U], const float* v_s, int c0, int chunks, float acc) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int u = 0; u < U; ++u) {
        const int c = c0 + lane + 32 * u;
        if (c < chunks) acc += dot8_bf16(w[u], v_s + 8 * c);
    }
    return acc;
}

// One warp's `chunks` 16-byte weight chunks from w_row against the staged activations v_s: the lane's partial
// sum (before the warp reduction). w holds the first U chunks on entry; each batch's arithmetic runs while the
// next batch's loads are in flight. gemv_item without its hand-over to a next row: gemv.cu calling gemv_item
// measured 11% slower on the H200 (decode projections 1.215 vs 1.105 ms per step) for the same sums.
template <int U>
__device__ __forceinline__ float gemv_stream_row(uint4 (&w)[U], const uint16_t* w_row, bool ok, int chunks,
                                                 const float* v_s) {
    const int lane = threadIdx.x & 31;
    float acc = 0.f;
    for (int c0 = 0; c0 < chunks; c0 += 32 * U) {
        const int c1 = c0 + 32 * U;
        uint4 w_next[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int c = c1 + lane + 32 * u;
            w_next[u] = (ok && c < chunks) ? load_weights16(w_row + 8 * c) : make_uint4(0u, 0u, 0u, 0u);
        }
        acc = gemv_batch(w, v_s, c0, chunks, acc);
#pragma unroll
        for (int u = 0; u < U; ++u) w[u] = w_next[u];
    }
    return acc;
}

// One warp's weight row against the staged activations: the lane's partial sum (before the warp
// reduction). w holds the row's first U chunks on entry (gemv_first_loads); each batch's arithmetic
// runs while the next batch's loads are in flight. After the last batch come the first loads of
// `next_row` (gemv.cu: none, next_ok false; the persistent kernel: its next item's row), so w holds
// them on return and the pipeline runs on across items.
template <int U>
__device__ __forceinline__ float gemv_item(uint4 (&w)[U], const uint16_t* w_row, bool ok, int K, const float* v_s,
                                           const uint16_t* next_row, bool next_ok) {
    const int lane = threadIdx.x & 31, chunks = K >> 3;
    float acc = 0.f;
    for (int c0 = 0; c0 < chunks; c0 += 32 * U) {
        const int c1 = c0 + 32 * U;
        uint4 w_next[U];
        if (c1 < chunks) {                                      // warp-uniform
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int c = c1 + lane + 32 * u;
                w_next[u] = (ok && c < chunks) ? load_weights16(w_row + 8 * c) : make_uint4(0u, 0u, 0u, 0u);
            }
        } else {
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int c = lane + 32 * u;
                w_next[u] = (next_ok && c < chunks) ? load_weights16(next_row + 8 * c) : make_uint4(0u, 0u, 0u, 0u);
            }
        }
        acc = gemv_batch(w, v_s, c0, chunks, acc);
#pragma unroll
        for (int u = 0; u < U; ++u) w[u] = w_next[u];
    }
    return acc;
}

// Epilogue of item `item` once row_sum[warp] holds each warp's scaled row sum (after a barrier).
// STORE/ADD: threads [0, 8) write a row each; pair modes: threads [0, 4) a pair each.
__device__ __forceinline__ void gemv_epilogue(int mode, int item, const float* row_sum, const float* bias, float* out,
                                              int out_cols, int rows, const RopeTarget& rt) {
    if (gemv_pair_mode(mode)) {
        if (threadIdx.x >= GEMV_WARPS / 2) return;
        const int p = item * (GEMV_WARPS / 2) + threadIdx.x;       // this thread's pair
        if (16 * (p >> 3) + (p & 7) + 8 >= rows) return;
        const float va = row_sum[2 * threadIdx.x], vb = row_sum[2 * threadIdx.x + 1];
        if (mode == PMODE_SWIGLU) {
            if (p < out_cols) out[p] = silu(va) * vb;
        } else {
            qkv_rope_epilogue(rt, bias, out, 0, p >> 3, p & 7, 0, va, vb);
        }
        return;
    }
    if (threadIdx.x >= GEMV_WARPS) return;
    const int r = item * GEMV_WARPS + threadIdx.x;
    if (r >= rows || r >= out_cols) return;
    if (mode == PMODE_ADD) out[r] = LOAD_GRID_WRITTEN(out + r) + row_sum[threadIdx.x];   // one writer per row: no atomics
    else out[r] = row_sum[threadIdx.x] + (bias != nullptr ? bias[r] : 0.f);
}

// One projection: y = (x or rmsnorm(x) * norm_w) @ W^T with gemv.cu's epilogue `mode`.
struct Projection {
    const uint16_t* W;
    const float* x;
    const float* norm_w;
    const float* bias;
    float* out;
    int out_cols, rows, K, mode;
    float eps;                  // RMSNorm epsilon (with norm_w)
};

// Items blockIdx.x, blockIdx.x + gridDim.x, ... of projection `p`, w holding the first item's first
// loads (gemv_first_loads). The activations are staged once for all of the block's items, and the
// software pipeline runs across items: after an item's last batch come the next item's first loads.
template <int U>
__device__ void projection_stage(const Projection& p, const RopeTarget& rt, uint4 (&w)[U], float4* v_s4,
                                 float* row_sum, float* scratch) {
    const int n_items = gemv_items(p.rows);
    if (blockIdx.x >= n_items) return;                          // block-uniform
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const float scale = gemv_stage_activations(p.x, p.norm_w, p.eps, p.K, v_s4, scratch);
    const float* v_s = reinterpret_cast<const float*>(v_s4);
    for (int item = blockIdx.x; item < n_items; item += gridDim.x) {
        const int row = gemv_row(p.mode, item, warp);
        const bool ok = row < p.rows;
        const uint16_t* w_row = p.W + (size_t)(ok ? row : 0) * p.K;
        const int next = item + gridDim.x;
        const int next_row = next < n_items ? gemv_row(p.mode, next, warp) : p.rows;
        const bool next_ok = next_row < p.rows;
        float acc = gemv_item(w, w_row, ok, p.K, v_s, p.W + (size_t)(next_ok ? next_row : 0) * p.K, next_ok);
        acc = warp_sum(acc) * scale;
        if (lane == 0) row_sum[warp] = acc;
        __syncthreads();
        gemv_epilogue(p.mode, item, row_sum, p.bias, p.out, p.out_cols, p.rows, rt);
        __syncthreads();                                        // row_sum is reused by the next item
    }
}
