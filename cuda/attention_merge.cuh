// attention_merge.cuh: the body of attention.cu's merge as a device function of (query head, row),
// so that decode_persistent.cu runs the same arithmetic as one of its stages. What it computes and
// the layouts: attention.cu's header. A block calling it more than once must __syncthreads() between
// calls (the shared arrays are reused).
//
// The partial sums are loaded with LOAD_GRID_WRITTEN (common.cuh): through L2 only in the persistent
// kernel, where other blocks of the same grid wrote them during the launch.
#pragma once
#include "common.cuh"

// One block per (query head, row). The splits' weights e^(m_s - M) go to shared memory once; then
// warp w sums splits w, w + 8, ... with each lane holding 4 output dimensions (one coalesced
// 512-byte row of part_o per load, several loads in flight), and the 8 warps' sums are added in
// shared memory. (A thread per dimension looping over all splits left ~65 dependent loads in a
// row: 14 us per layer on the H200.)
#define MERGE_THREADS 256
#define MERGE_WARPS (MERGE_THREADS / 32)
#define MERGE_MAX_SPLITS 4096
// PRE (the template parameter below): splits per warp whose part_o rows are loaded before the weights are
// known, so that their loads wait alongside the m/l reductions instead of after them. 16 covers 128 splits
// (8192 slots) at 64 more registers (119 in all): for the few blocks of a decode row; with 0 the merge keeps
// 40 registers and six blocks per SM for the prefill's 12 x 32. The sums are the same, in the same order.
#define MERGE_PREFETCH 16

template <int PRE>
__device__ void merge_body(const float* part_o, const float* part_ml, const int* ctl, float* out, int out_stride,
                           int n_q_heads, int head_dim, int n_splits, int h, int i, int n_rows) {
    __shared__ float wgt[MERGE_MAX_SPLITS];
    __shared__ float scratch[32];
    __shared__ float4 sums[MERGE_WARPS][ATTN_MAX_HEAD_DIM / 4];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int len = list_length(ctl, i);
    const int span = split_span(ctl, n_rows, n_splits);
    const int active = min(n_splits, (len + span - 1) / span);
    const int vec = head_dim >> 2;
    const float4* po = reinterpret_cast<const float4*>(part_o + ((size_t)i * n_q_heads + h) * n_splits * head_dim);
    float4 pre[PRE > 0 ? PRE : 1];                              // this lane's float4 of splits warp + 8 k
#pragma unroll
    for (int k = 0; k < PRE; ++k) {
        const int s = warp + MERGE_WARPS * k;
        pre[k] = (lane < vec && s < active) ? LOAD_GRID_WRITTEN(po + (size_t)s * vec + lane) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    const float* ml = part_ml + ((size_t)i * n_q_heads + h) * n_splits * 2;
    float mx = -INFINITY;
    for (int s = threadIdx.x; s < active; s += MERGE_THREADS) mx = fmaxf(mx, LOAD_GRID_WRITTEN(ml + 2 * s));   // s range [0, active)
    mx = warp_max(mx);
    if (lane == 0) scratch[warp] = mx;
    __syncthreads();
    mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < MERGE_WARPS; ++w) mx = fmaxf(mx, scratch[w]);
    float denom = 0.f;
    for (int s = threadIdx.x; s < active; s += MERGE_THREADS) {
        const float e = expf(LOAD_GRID_WRITTEN(ml + 2 * s) - mx);
        wgt[s] = e;
        denom += e * LOAD_GRID_WRITTEN(ml + 2 * s + 1);
    }
    denom = block_sum(denom, scratch);                          // its barriers also publish wgt
    for (int c = lane; c < vec; c += 32) {                      // c range [0, vec): this lane's float4
        float4 a = make_float4(0.f, 0.f, 0.f, 0.f);
        int s0 = warp;
        if (PRE > 0 && c == lane) {                             // the prefetched splits first, in the same order
#pragma unroll
            for (int k = 0; k < PRE; ++k) {
                const int s = warp + MERGE_WARPS * k;
                if (s < active) {
                    const float e = wgt[s];
                    a.x += e * pre[k].x; a.y += e * pre[k].y; a.z += e * pre[k].z; a.w += e * pre[k].w;
                }
            }
            s0 = warp + MERGE_WARPS * PRE;
        }
#pragma unroll 4
        for (int s = s0; s < active; s += MERGE_WARPS) {
            const float4 o = LOAD_GRID_WRITTEN(po + (size_t)s * vec + c);
            const float e = wgt[s];
            a.x += e * o.x; a.y += e * o.y; a.z += e * o.z; a.w += e * o.w;
        }
        sums[warp][c] = a;
    }
    __syncthreads();
    const float inv = 1.f / denom;
    for (int c = threadIdx.x; c < vec; c += MERGE_THREADS) {
        float4 a = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int w = 0; w < MERGE_WARPS; ++w) {
            a.x += sums[w][c].x; a.y += sums[w][c].y; a.z += sums[w][c].z; a.w += sums[w][c].w;
        }
        float4 r = make_float4(a.x * inv, a.y * inv, a.z * inv, a.w * inv);
        *reinterpret_cast<float4*>(out + (size_t)i * out_stride + (size_t)h * head_dim + 4 * c) = r;
    }
}
