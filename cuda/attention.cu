// attention.cu: the merge of split attention (flash-decoding): the partial sums of
// attention_tiled.cu (prefill rows) and attention_decode.cu (decode rows) over chunks of the attend
// list are combined with a numerically safe softmax.
//
// Query row i (table index t = ctl[CTL_ROW_OFFSET] + i) attends to attend_list[0, len_i) with
// len_i = ctl[CTL_CTX_LEN] + t + 1; split s holds the entries [s*ATTN_CHUNK, (s+1)*ATTN_CHUNK) ∩
// [0, len_i) as m_s = max score, l_s = sum exp(score - m_s), o_s[:] = sum exp(score - m_s) v[:].
// attention_merge: M = max_s m_s;  out[i, h, :] = sum_s e^(m_s - M) o_s[:] / sum_s e^(m_s - M) l_s
//
// Layouts:   part_o  [n_rows, Hq, n_splits, hd] float32; part_ml [n_rows, Hq, n_splits, 2] float32
//            out [n_rows, out_stride] float32, head h at columns h*hd ..
// Launch:    grid (Hq, n_rows), block 256; may be launched programmatically (waits first).
// Preconditions: hd <= ATTN_MAX_HEAD_DIM, hd % 4 == 0, n_splits <= 4096 (checked on the host);
//            out_stride % 4 == 0 and 16-byte aligned rows (float4 stores).
// (The shared-memory partial kernel that lived here, attention_partial, was dropped when
// attention_decode.cu took the decode rows: notes/cuda_notes.md, issue 10.)
#include "common.cuh"

// One block per (query head, row). The splits' weights e^(m_s - M) go to shared memory once; then
// warp w sums splits w, w + 8, ... with each lane holding 4 output dimensions (one coalesced
// 512-byte row of part_o per load, several loads in flight), and the 8 warps' sums are added in
// shared memory. (A thread per dimension looping over all splits left ~65 dependent loads in a
// row: 14 us per layer on the H200.)
#define MERGE_THREADS 256
#define MERGE_WARPS (MERGE_THREADS / 32)
#define MERGE_MAX_SPLITS 4096

extern "C" __global__ void __launch_bounds__(MERGE_THREADS) attention_merge(
        const float* part_o, const float* part_ml, const int* ctl, float* out, int out_stride, int n_q_heads,
        int head_dim, int n_splits) {
    __shared__ float wgt[MERGE_MAX_SPLITS];
    __shared__ float scratch[32];
    __shared__ float4 sums[MERGE_WARPS][ATTN_MAX_HEAD_DIM / 4];
    griddep_wait();                                             // the partial sums come from the kernel before
    griddep_launch_dependents();
    const int h = blockIdx.x;                                   // range [0, Hq)
    const int i = blockIdx.y;                                   // range [0, n_rows)
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int len = list_length(ctl, i);
    const int active = min(n_splits, (len + ATTN_CHUNK - 1) / ATTN_CHUNK);
    const float* ml = part_ml + ((size_t)i * n_q_heads + h) * n_splits * 2;
    float mx = -INFINITY;
    for (int s = threadIdx.x; s < active; s += MERGE_THREADS) mx = fmaxf(mx, ml[2 * s]);   // s range [0, active)
    mx = warp_max(mx);
    if (lane == 0) scratch[warp] = mx;
    __syncthreads();
    mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < MERGE_WARPS; ++w) mx = fmaxf(mx, scratch[w]);
    float denom = 0.f;
    for (int s = threadIdx.x; s < active; s += MERGE_THREADS) {
        const float e = expf(ml[2 * s] - mx);
        wgt[s] = e;
        denom += e * ml[2 * s + 1];
    }
    denom = block_sum(denom, scratch);                          // its barriers also publish wgt
    const int vec = head_dim >> 2;
    const float4* po = reinterpret_cast<const float4*>(part_o + ((size_t)i * n_q_heads + h) * n_splits * head_dim);
    for (int c = lane; c < vec; c += 32) {                      // c range [0, vec): this lane's float4
        float4 a = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 4
        for (int s = warp; s < active; s += MERGE_WARPS) {
            const float4 o = po[(size_t)s * vec + c];
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
