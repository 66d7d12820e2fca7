// attention.cu: grouped-query attention over a device-side list of KV arena slots,
// split over the sequence (flash-decoding) with a numerically safe softmax merge.
//
// Query row i (table index t = ctl[CTL_ROW_OFFSET] + i) attends to attend_list[0, len_i) with
// len_i = ctl[CTL_CTX_LEN] + t + 1: the cached context first, then the rows of the cycle up to
// and including itself (causal within the call; its own K/V are already in the arena).
// Query head h uses KV head h / group (HF repeat_kv order).
//
// attention_partial: split s covers list entries [s*ATTN_CHUNK, (s+1)*ATTN_CHUNK) ∩ [0, len_i):
//            m = max_j score_j,  l = sum_j exp(score_j - m),  o[:] = sum_j exp(score_j - m) v_j[:]
//            score_j = (q . k_j) * scale. Empty splits write nothing (the merge skips them).
// attention_merge: M = max_s m_s;  out[i, h, :] = sum_s e^(m_s - M) o_s[:] / sum_s e^(m_s - M) l_s
//
// Layouts:   q rows in qkv [n_rows, qkv_stride] float32 (head h at columns h*hd .. h*hd+hd-1)
//            k_cache, v_cache: one layer's arena [KVH, capacity, hd] float32
//            attend_list [>= len] int32 slots (holes in the arena cost nothing)
//            part_o  [n_rows, Hq, n_splits, hd] float32; part_ml [n_rows, Hq, n_splits, 2] float32
//            out [n_rows, out_stride] float32, head h at columns h*hd ..
// Launch:    partial: grid (n_splits, KVH, ceil_div(n_rows, R)), block 128 (4 warps), dynamic shared
//            memory 4 * (CHUNK*(2hd+1) + R*group*(hd+CHUNK)) bytes (R = rows_per_block).
//            merge: grid (Hq, n_rows), block 256; may be launched programmatically (waits first).
// Preconditions: group <= ATTN_MAX_GROUP, hd <= ATTN_MAX_HEAD_DIM, hd % 4 == 0,
//            n_splits * ATTN_CHUNK >= the longest len_i, n_splits <= 4096 (checked on the host);
//            out_stride % 4 == 0 and 16-byte aligned rows (float4 stores).
#include "common.cuh"

#define ATTN_THREADS 128
#define ATTN_WARPS (ATTN_THREADS / 32)

__device__ __forceinline__ int list_length(const int* ctl, int i) {
    return ctl[CTL_CTX_LEN] + ctl[CTL_ROW_OFFSET] + i + 1;
}

// One block = one chunk of the attend list x one KV head x up to `rows_per_block` query rows.
// The chunk's K and V rows are gathered into shared memory once (16-byte loads, all in flight
// together) and reused by every query row and every head of the group, so a 32-row prefill reads
// the cached K/V once per block instead of once per row.
// Dynamic shared memory (floats): K_s [CHUNK][hd+1] (padded: conflict-free per-slot reads),
// V_s [CHUNK][hd], q_s [R][group][hd] (pre-scaled), p_s [R][group][CHUNK].
extern "C" __global__ void __launch_bounds__(ATTN_THREADS) attention_partial(
        const float* qkv, int qkv_stride, const float* k_cache, const float* v_cache, const int* attend_list,
        const int* ctl, float* part_o, float* part_ml, int n_q_heads, int n_kv_heads, int head_dim,
        int capacity, int n_splits, float scale, int n_rows, int rows_per_block) {
    extern __shared__ float smem[];
    const int split = blockIdx.x;                               // range [0, n_splits)
    const int kvh = blockIdx.y;                                 // range [0, KVH)
    const int r_begin = blockIdx.z * rows_per_block;            // rows [r_begin, r_end) of the call
    const int r_end = min(n_rows, r_begin + rows_per_block);
    const int group = n_q_heads / n_kv_heads;
    const int j0 = split * ATTN_CHUNK;
    const int n_here = min(ATTN_CHUNK, list_length(ctl, r_end - 1) - j0);   // the last row sees the most
    if (n_here <= 0) return;                                    // block-uniform: no barrier skipped
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int ks = head_dim + 1;
    float* K_s = smem;
    float* V_s = K_s + ATTN_CHUNK * ks;
    float* q_s = V_s + ATTN_CHUNK * head_dim;
    float* p_s = q_s + rows_per_block * group * head_dim;

    // Gather the chunk: element e = (slot jl, dims 4c..4c+3), float4 loads.
    const int vec_per_row = head_dim >> 2;
    const float* k_head = k_cache + (size_t)kvh * capacity * head_dim;
    const float* v_head = v_cache + (size_t)kvh * capacity * head_dim;
    for (int e = threadIdx.x; e < n_here * vec_per_row; e += ATTN_THREADS) {   // e range [0, n_here*hd/4)
        const int jl = e / vec_per_row, c = e - jl * vec_per_row;
        const size_t src = (size_t)attend_list[j0 + jl] * head_dim + 4 * c;
        const float4 kv = *reinterpret_cast<const float4*>(k_head + src);
        const float4 vv = *reinterpret_cast<const float4*>(v_head + src);
        float* kd = K_s + jl * ks + 4 * c;
        kd[0] = kv.x; kd[1] = kv.y; kd[2] = kv.z; kd[3] = kv.w;
        *reinterpret_cast<float4*>(V_s + jl * head_dim + 4 * c) = vv;
    }
    const int n_r_rows = r_end - r_begin;
    for (int e = threadIdx.x; e < n_r_rows * group * head_dim; e += ATTN_THREADS) {
        const int rr = e / (group * head_dim), rest = e - rr * group * head_dim;
        q_s[e] = qkv[(size_t)(r_begin + rr) * qkv_stride + (size_t)kvh * group * head_dim + rest] * scale;
    }
    __syncthreads();

    for (int rr = 0; rr < n_r_rows; ++rr) {
        const int i = r_begin + rr;                             // query row, range [0, n_rows)
        const int n_i = min(ATTN_CHUNK, list_length(ctl, i) - j0);   // entries this row may see
        if (n_i <= 0) continue;                                 // block-uniform
        const float* q_r = q_s + rr * group * head_dim;
        float* p_r = p_s + rr * group * ATTN_CHUNK;
        // Scores: pair p = (head g, entry jl), consecutive threads on consecutive entries.
        for (int p = threadIdx.x; p < group * n_i; p += ATTN_THREADS) {   // p range [0, group*n_i)
            const int g = p / n_i, jl = p - g * n_i;
            const float* qg = q_r + g * head_dim;
            const float* kj = K_s + jl * ks;
            float dot = 0.f;
            for (int d = 0; d < head_dim; ++d) dot += qg[d] * kj[d];
            p_r[g * ATTN_CHUNK + jl] = dot;
        }
        __syncthreads();
        float* ml_base = part_ml + (((size_t)i * n_q_heads + (size_t)kvh * group) * n_splits + split) * 2;
        for (int g = warp; g < group; g += ATTN_WARPS) {        // warp w: heads w, w+4, ...
            float m = -INFINITY;
            for (int jl = lane; jl < n_i; jl += 32) m = fmaxf(m, p_r[g * ATTN_CHUNK + jl]);
            m = warp_max(m);
            float l = 0.f;
            for (int jl = lane; jl < n_i; jl += 32) {
                const float e = expf(p_r[g * ATTN_CHUNK + jl] - m);
                p_r[g * ATTN_CHUNK + jl] = e;
                l += e;
            }
            l = warp_sum(l);
            if (lane == 0) {
                float* ml = ml_base + (size_t)g * n_splits * 2;
                ml[0] = m;
                ml[1] = l;
            }
        }
        __syncthreads();
        // Weighted V sum: thread d accumulates every head of the group for dimension d.
        for (int d = threadIdx.x; d < head_dim; d += ATTN_THREADS) {   // d range [0, hd)
            float acc[ATTN_MAX_GROUP];
#pragma unroll
            for (int g = 0; g < ATTN_MAX_GROUP; ++g) acc[g] = 0.f;
            for (int jl = 0; jl < n_i; ++jl) {
                const float vd = V_s[jl * head_dim + d];
#pragma unroll
                for (int g = 0; g < ATTN_MAX_GROUP; ++g)
                    if (g < group) acc[g] += p_r[g * ATTN_CHUNK + jl] * vd;
            }
#pragma unroll
            for (int g = 0; g < ATTN_MAX_GROUP; ++g) {
                if (g < group) {
                    const size_t h = (size_t)kvh * group + g;
                    part_o[(((size_t)i * n_q_heads + h) * n_splits + split) * head_dim + d] = acc[g];
                }
            }
        }
        // p_r of this row is not reused: the next row writes its own p_s slice, no barrier needed.
    }
}

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
