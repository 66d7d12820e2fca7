// attention_decode.cuh: the body of attention_decode.cu's partial kernel as a device function of
// (split, KV head, query row), so that decode_persistent.cu runs the very same arithmetic as one of
// its stages. What it computes, the layouts and the preconditions: attention_decode.cu's header.
//
// q and K/V are loaded with LOAD_GRID_WRITTEN (common.cuh): through L2 only in the persistent kernel,
// where other blocks of the same grid wrote them during the launch.
#pragma once
#include "common.cuh"

#define DEC_THREADS 256
#define DEC_WARPS (DEC_THREADS / 32)
#define DEC_SLOTS_PER_WARP (ATTN_CHUNK / DEC_WARPS)          // 8: a warp's K/V rows all in flight at once

__device__ __forceinline__ float dot4(const float4& a, const float4& b) {
    return a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
}

__device__ __forceinline__ void axpy4(float4& acc, float p, const float4& v) {
    acc.x += p * v.x; acc.y += p * v.y; acc.z += p * v.z; acc.w += p * v.w;
}

__device__ __forceinline__ void scale4(float4& acc, float c) {
    acc.x *= c; acc.y *= c; acc.z *= c; acc.w *= c;
}

// VPL float4s per lane: lane l holds dimensions 4 (l + 32 v) .. +3, v < VPL.
template <int VPL>
__device__ void decode_partial_body(const float* qkv, int qkv_stride, const float* k_cache, const float* v_cache,
                                    const int* attend_list, const int* ctl, float* part_o, float* part_ml,
                                    int n_q_heads, int n_kv_heads, int head_dim, int capacity, int n_splits,
                                    float scale, int split, int kvh, int i) {
    // Slots per warp pass: VPL 2 holds twice the registers per slot, so half as many at a time.
    constexpr int BATCH = DEC_SLOTS_PER_WARP / VPL;
    extern __shared__ float4 dec_smem[];

    const int group = n_q_heads / n_kv_heads;
    const int len = list_length(ctl, i);
    const int j0 = split * ATTN_CHUNK;
    if (j0 >= len) return;                                      // block-uniform
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int vec = head_dim >> 2;                              // float4 per row
    float4* o_s = dec_smem;                                     // [DEC_WARPS][group][vec]
    float* m_s = reinterpret_cast<float*>(o_s + DEC_WARPS * group * vec);   // [DEC_WARPS][group]
    float* l_s = m_s + DEC_WARPS * group;                       // [DEC_WARPS][group]

    // This lane's slice of every query head of the group, pre-scaled.
    float4 q[ATTN_MAX_GROUP][VPL];
    const float* q_row = qkv + (size_t)i * qkv_stride + (size_t)kvh * group * head_dim;
#pragma unroll
    for (int g = 0; g < ATTN_MAX_GROUP; ++g) {
#pragma unroll
        for (int v = 0; v < VPL; ++v) {
            const int c = lane + 32 * v;                        // float4 index, range [0, vec)
            float4 val = make_float4(0.f, 0.f, 0.f, 0.f);
            if (g < group && c < vec) {
                val = LOAD_GRID_WRITTEN(reinterpret_cast<const float4*>(q_row + (size_t)g * head_dim + 4 * c));
                scale4(val, scale);
            }
            q[g][v] = val;
        }
    }
    float m[ATTN_MAX_GROUP], l[ATTN_MAX_GROUP];
    float4 acc[ATTN_MAX_GROUP][VPL];
#pragma unroll
    for (int g = 0; g < ATTN_MAX_GROUP; ++g) {
        m[g] = -INFINITY;
        l[g] = 0.f;
#pragma unroll
        for (int v = 0; v < VPL; ++v) acc[g][v] = make_float4(0.f, 0.f, 0.f, 0.f);
    }

    const float* k_head = k_cache + (size_t)kvh * capacity * head_dim;
    const float* v_head = v_cache + (size_t)kvh * capacity * head_dim;
    const int w0 = j0 + warp * DEC_SLOTS_PER_WARP;              // first list entry of this warp
    for (int b0 = w0; b0 < min(len, w0 + DEC_SLOTS_PER_WARP); b0 += BATCH) {
        const int n_b = min(BATCH, len - b0);                   // warp-uniform, range [1, BATCH]
        const int my_slot = lane < n_b ? attend_list[b0 + lane] : 0;
        float4 kf[BATCH][VPL], vf[BATCH][VPL];
#pragma unroll
        for (int u = 0; u < BATCH; ++u) {                       // every K and V load of the batch in flight
            const int slot = __shfl_sync(0xffffffffu, my_slot, u);
#pragma unroll
            for (int v = 0; v < VPL; ++v) {
                const int c = lane + 32 * v;
                const bool ok = u < n_b && c < vec;
                const size_t off = (size_t)slot * head_dim + 4 * c;
                kf[u][v] = ok ? LOAD_GRID_WRITTEN(reinterpret_cast<const float4*>(k_head + off)) : make_float4(0.f, 0.f, 0.f, 0.f);
                vf[u][v] = ok ? LOAD_GRID_WRITTEN(reinterpret_cast<const float4*>(v_head + off)) : make_float4(0.f, 0.f, 0.f, 0.f);
            }
        }
#pragma unroll
        for (int g = 0; g < ATTN_MAX_GROUP; ++g) {
            if (g >= group) break;                              // warp-uniform: skipped, not predicated
            float sc[BATCH];
            float mx = m[g];
#pragma unroll
            for (int u = 0; u < BATCH; ++u) {
                float d = 0.f;
#pragma unroll
                for (int v = 0; v < VPL; ++v) d += dot4(q[g][v], kf[u][v]);
                d = warp_sum(d);
                sc[u] = u < n_b ? d : -INFINITY;
                mx = fmaxf(mx, sc[u]);
            }
            const float corr = expf(m[g] - mx);                 // 0 on the first batch (m = -inf)
            l[g] *= corr;
#pragma unroll
            for (int v = 0; v < VPL; ++v) scale4(acc[g][v], corr);
#pragma unroll
            for (int u = 0; u < BATCH; ++u) {
                const float p = expf(sc[u] - mx);               // 0 for entries past n_b
                l[g] += p;
#pragma unroll
                for (int v = 0; v < VPL; ++v) axpy4(acc[g][v], p, vf[u][v]);
            }
            m[g] = mx;
        }
    }

    // Combine the warps' states: warps with no entries left carry m = -inf, l = 0, o = 0.
#pragma unroll
    for (int g = 0; g < ATTN_MAX_GROUP; ++g) {
        if (g >= group) break;
        if (lane == 0) {
            m_s[warp * group + g] = m[g];
            l_s[warp * group + g] = l[g];
        }
#pragma unroll
        for (int v = 0; v < VPL; ++v)
            if (lane + 32 * v < vec) o_s[(warp * group + g) * vec + lane + 32 * v] = acc[g][v];
    }
    __syncthreads();
    for (int g = warp; g < group; g += DEC_WARPS) {             // warp w finishes heads w, w+8, ...
        float mx = -INFINITY;
#pragma unroll
        for (int w = 0; w < DEC_WARPS; ++w) mx = fmaxf(mx, m_s[w * group + g]);   // finite: warp 0 saw entry j0
        float wgt[DEC_WARPS], lsum = 0.f;
#pragma unroll
        for (int w = 0; w < DEC_WARPS; ++w) {
            wgt[w] = expf(m_s[w * group + g] - mx);
            lsum += wgt[w] * l_s[w * group + g];
        }
        const size_t h = (size_t)kvh * group + g;
        const size_t base = ((size_t)i * n_q_heads + h) * n_splits + split;
        for (int c = lane; c < vec; c += 32) {                  // c range [0, vec)
            float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
            for (int w = 0; w < DEC_WARPS; ++w) axpy4(o, wgt[w], o_s[(w * group + g) * vec + c]);
            *reinterpret_cast<float4*>(part_o + base * head_dim + 4 * c) = o;
        }
        if (lane == 0) {
            part_ml[base * 2] = mx;
            part_ml[base * 2 + 1] = lsum;
        }
    }
}

