// attention_tiled.cu: grouped-query attention over a device-side list of KV arena slots,
// split over the sequence (flash-decoding) with a numerically safe softmax merge; scores and the
// weighted V sum as register-tiled fp32 products out of shared memory.
//
// Query row i (table index t = ctl[CTL_ROW_OFFSET] + i) attends to attend_list[0, len_i) with
// len_i = ctl[CTL_CTX_LEN] + t + 1: the cached context first, then the rows of the cycle up to
// and including itself (causal within the call; its own K/V are already in the arena).
// Query head h uses KV head h / group (HF repeat_kv order).
//
// attention_partial_tiled: split s covers list entries [s*ATTN_CHUNK, (s+1)*ATTN_CHUNK) ∩ [0, len_i):
//            m = max_j score_j,  l = sum_j exp(score_j - m),  o[:] = sum_j exp(score_j - m) v_j[:]
//            score_j = (q . k_j) * scale. Splits a row cannot see write nothing (the merge skips them).
// The splits are merged by attention.cu's attention_merge.
//
// Layouts:   q rows in qkv [n_rows, qkv_stride] float32 (head h at columns h*hd .. h*hd+hd-1)
//            k_cache, v_cache: one layer's arena [KVH, capacity, hd] kv_t (kv_store.cuh; widened to fp32
//            as the chunk is gathered)
//            attend_list [>= len] int32 slots (holes in the arena cost nothing)
//            part_o  [n_rows, Hq, n_splits, hd] float32; part_ml [n_rows, Hq, n_splits, 2] float32
//            out [n_rows, out_stride] float32, head h at columns h*hd ..
// Launch:    partial: grid (n_splits, KVH, ceil_div(n_rows, R)), block 256 (8 warps), dynamic shared
//            memory 4 * (CHUNK*(2hd+4) + R*group*(hd+CHUNK)) bytes, R = rows_per_block <= 8.
//            merge: attention.cu's attention_merge, grid (Hq, n_rows), block 256.
// Preconditions: group <= ATTN_MAX_GROUP, hd <= ATTN_MAX_HEAD_DIM, hd % 4 == 0, ATTN_CHUNK == 64,
//            n_splits * ATTN_CHUNK >= the longest len_i (checked on the host).
#include "common.cuh"
#include "kv_store.cuh"

#define AT_THREADS 256
#define AT_WARPS (AT_THREADS / 32)
#define AT_MAX_ROWS 8
#define AT_MAX_QV (ATTN_MAX_GROUP * AT_MAX_ROWS)          // query vectors (row, head) per block
#define AT_SCORE_BLOCKS (AT_THREADS / ATTN_CHUNK)          // 4 threads share a slot in the score phase
#define AT_SCORE_QV (AT_MAX_QV / AT_SCORE_BLOCKS)           // query vectors per thread, scores: 16
#define AT_PV_QV 16                                         // query vectors per thread, V sum (hd <= 256)
#define AT_GATHER_BATCH 8                                   // 16-byte K and V loads in flight per thread

// One block = one chunk of the attend list x one KV head x up to R query rows (R*group query
// vectors qv = rr*group + g). The chunk's K and V rows are gathered into shared memory once and
// reused by every query vector.
// Dynamic shared memory (floats): K_s [CHUNK][hd+4] (row pad: 16-byte reads of consecutive slots
// fall in distinct banks), V_s [CHUNK][hd], Q_s [R*group][hd] (pre-scaled), P_s [R*group][CHUNK].
extern "C" __global__ void __launch_bounds__(AT_THREADS) attention_partial_tiled(
        const float* qkv, int qkv_stride, const kv_t* k_cache, const kv_t* v_cache, const int* attend_list,
        const int* ctl, float* part_o, float* part_ml, int n_q_heads, int n_kv_heads, int head_dim,
        int capacity, int n_splits, float scale, int n_rows, int rows_per_block) {
    extern __shared__ float4 smem4[];
    const int split = blockIdx.x;                               // range [0, n_splits)
    const int kvh = blockIdx.y;                                 // range [0, KVH)
    const int r_begin = blockIdx.z * rows_per_block;            // rows [r_begin, r_end) of the call
    const int r_end = min(n_rows, r_begin + rows_per_block);
    const int group = n_q_heads / n_kv_heads;
    const int j0 = split * ATTN_CHUNK;
    const int n_here = min(ATTN_CHUNK, list_length(ctl, r_end - 1) - j0);   // the last row sees the most
    if (n_here <= 0) return;                                    // block-uniform: no barrier skipped
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int vec = head_dim >> 2;                              // float4 per K/V/q row
    const int ks4 = vec + 1;                                    // K_s row stride in float4
    const int n_q = (r_end - r_begin) * group;                  // query vectors of this block
    float4* K_s = smem4;
    float4* V_s = K_s + ATTN_CHUNK * ks4;
    float4* Q_s = V_s + ATTN_CHUNK * vec;
    float* P_s = reinterpret_cast<float*>(Q_s + rows_per_block * group * vec);

    // Gather the chunk: element e = (slot jl, float4 c), AT_GATHER_BATCH loads of K and V in flight.
    const kv_t* k_head = k_cache + (size_t)kvh * capacity * head_dim;
    const kv_t* v_head = v_cache + (size_t)kvh * capacity * head_dim;
    const int total = n_here * vec;
    for (int base = threadIdx.x; base < total; base += AT_THREADS * AT_GATHER_BATCH) {
        float4 kr[AT_GATHER_BATCH], vr[AT_GATHER_BATCH];
#pragma unroll
        for (int u = 0; u < AT_GATHER_BATCH; ++u) {
            const int e = base + u * AT_THREADS;                // range [0, n_here*vec)
            if (e < total) {
                const int jl = e / vec, c = e - jl * vec;
                const size_t src = 4 * ((size_t)attend_list[j0 + jl] * vec + c);   // element index
                kr[u] = load_kv4_readonly(k_head + src);
                vr[u] = load_kv4_readonly(v_head + src);
            }
        }
#pragma unroll
        for (int u = 0; u < AT_GATHER_BATCH; ++u) {
            const int e = base + u * AT_THREADS;
            if (e < total) {
                const int jl = e / vec, c = e - jl * vec;
                K_s[jl * ks4 + c] = kr[u];
                V_s[jl * vec + c] = vr[u];
            }
        }
    }
    const float4* q_src_base = reinterpret_cast<const float4*>(qkv);
    const int q_stride4 = qkv_stride >> 2;
    for (int e = threadIdx.x; e < n_q * vec; e += AT_THREADS) { // e = (qv, c), qv = rr*group + g
        const int qv = e / vec, c = e - qv * vec;
        const int rr = qv / group, g = qv - rr * group;
        float4 q = q_src_base[(size_t)(r_begin + rr) * q_stride4 + (size_t)(kvh * group + g) * vec + c];
        q.x *= scale; q.y *= scale; q.z *= scale; q.w *= scale;
        Q_s[e] = q;
    }
    __syncthreads();

    // Scores: thread = (slot jl, query block qb); it owns query vectors qv = qb + 4u.
    {
        const int jl = threadIdx.x % ATTN_CHUNK;                // range [0, CHUNK)
        const int qb = threadIdx.x / ATTN_CHUNK;                // range [0, 4), uniform per warp
        float acc[AT_SCORE_QV];
#pragma unroll
        for (int u = 0; u < AT_SCORE_QV; ++u) acc[u] = 0.f;
        if (jl < n_here) {
            for (int c = 0; c < vec; ++c) {                     // c range [0, hd/4)
                const float4 k = K_s[jl * ks4 + c];
#pragma unroll
                for (int u = 0; u < AT_SCORE_QV; ++u) {
                    const int qv = qb + AT_SCORE_BLOCKS * u;
                    if (qv >= n_q) break;                       // warp-uniform: skip, don't predicate
                    const float4 q = Q_s[qv * vec + c];         // same address across the warp
                    acc[u] += q.x * k.x + q.y * k.y + q.z * k.z + q.w * k.w;
                }
            }
        }
#pragma unroll
        for (int u = 0; u < AT_SCORE_QV; ++u) {
            const int qv = qb + AT_SCORE_BLOCKS * u;
            if (qv < n_q) {
                const int i = r_begin + qv / group;             // query row of this vector
                const bool visible = jl < n_here && j0 + jl < list_length(ctl, i);
                P_s[qv * ATTN_CHUNK + jl] = visible ? acc[u] : -INFINITY;
            }
        }
    }
    __syncthreads();

    // Softmax statistics per query vector: warp w owns qv = w, w + 8, ...
    for (int qv = warp; qv < n_q; qv += AT_WARPS) {
        const int rr = qv / group, g = qv - rr * group;
        const int i = r_begin + rr;
        if (list_length(ctl, i) <= j0) continue;                // this row sees nothing of the chunk
        float* p = P_s + qv * ATTN_CHUNK;
        const float s0 = p[lane], s1 = p[lane + 32];
        const float m = warp_max(fmaxf(s0, s1));                // finite: entry 0 is visible
        const float e0 = expf(s0 - m), e1 = expf(s1 - m);       // masked: exp(-inf) = 0
        p[lane] = e0;
        p[lane + 32] = e1;
        const float l = warp_sum(e0 + e1);
        if (lane == 0) {
            float* ml = part_ml + (((size_t)i * n_q_heads + kvh * group + g) * n_splits + split) * 2;
            ml[0] = m;
            ml[1] = l;
        }
    }
    __syncthreads();

    // Weighted V sum: thread = (float4 column dv, query block qvb); it owns qv = qvb + n_qvb*u.
    const int n_qvb = AT_THREADS / vec;                         // >= 4 for hd <= 256
    const int dv = threadIdx.x % vec;                           // range [0, hd/4)
    const int qvb = threadIdx.x / vec;                          // range [0, n_qvb) for active threads
    if (qvb >= n_qvb) return;                                   // no barrier follows
    float4 o[AT_PV_QV];
#pragma unroll
    for (int u = 0; u < AT_PV_QV; ++u) o[u] = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int jl = 0; jl < n_here; ++jl) {
        const float4 v = V_s[jl * vec + dv];
#pragma unroll
        for (int u = 0; u < AT_PV_QV; ++u) {
            const int qv = qvb + n_qvb * u;
            if (qv >= n_q) break;                               // uniform per query block
            const float p = P_s[qv * ATTN_CHUNK + jl];
            o[u].x += p * v.x; o[u].y += p * v.y; o[u].z += p * v.z; o[u].w += p * v.w;
        }
    }
#pragma unroll
    for (int u = 0; u < AT_PV_QV; ++u) {
        const int qv = qvb + n_qvb * u;
        if (qv >= n_q) continue;
        const int rr = qv / group, g = qv - rr * group;
        const int i = r_begin + rr;
        if (list_length(ctl, i) <= j0) continue;                // not written: the merge skips it
        const size_t h = (size_t)kvh * group + g;
        float4* dst = reinterpret_cast<float4*>(part_o + (((size_t)i * n_q_heads + h) * n_splits + split) * head_dim);
        dst[dv] = o[u];
    }
}
