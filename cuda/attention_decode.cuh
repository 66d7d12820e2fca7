// attention_decode.cuh: the body of attention_decode.cu's partial kernel as a device function of
// (split, KV head, query row), so that decode_persistent.cu runs the very same arithmetic as one of
// its stages. What it computes, the layouts and the preconditions: attention_decode.cu's header.
//
// q and K/V are loaded with LOAD_GRID_WRITTEN (common.cuh): through L2 only in the persistent kernel,
// where other blocks of the same grid wrote them during the launch. K/V come in the arena's type
// (kv_store.cuh) and are widened to fp32 on load.
#pragma once
#include "common.cuh"
#include "kv_store.cuh"

#define DEC_THREADS 256                                      // the warps of one split's 8-slot groups
#define DEC_WARPS (DEC_THREADS / 32)
#define DEC_SLOTS_PER_WARP (ATTN_CHUNK / DEC_WARPS)          // 8: a warp's K/V rows all in flight at once
#define DEC_LOG2E 1.4426950408889634f
#define DEC_LN2 0.6931471805599453f

__device__ __forceinline__ float dot4(const float4& a, const float4& b) {
    return a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
}

__device__ __forceinline__ void axpy4(float4& acc, float p, const float4& v) {
    acc.x += p * v.x; acc.y += p * v.y; acc.z += p * v.z; acc.w += p * v.w;
}

__device__ __forceinline__ void scale4(float4& acc, float c) {
    acc.x *= c; acc.y *= c; acc.z *= c; acc.w *= c;
}

// 2^x in one instruction (MUFU.EX2, a few ulp; subnormal results flush to 0, as does x = -inf). The
// decode body works in log2 units (q pre-scaled by log2 e), so its softmax needs no expf range reduction.
__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// The N per-lane partial sums v[0..N) of N values (N a power of two, 2..32), each summed over the warp's
// 32 lanes: returns, in lane l, the total of value l / (32 / N). Each exchange sends half of the values
// still held and keeps the other half (the upper half where the lane's bit of that offset is set), so
// N sums cost N - 1 + log2(32 / N) shuffles instead of N warp_sums' 5 N.
template <int N>
__device__ __forceinline__ float warp_sum_spread(float (&v)[N]) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int half = N / 2, off = 16; half >= 1; half >>= 1, off >>= 1) {
        const bool upper = (lane & off) != 0;
#pragma unroll
        for (int k = 0; k < half; ++k) {
            const float keep = upper ? v[k + half] : v[k];
            const float send = upper ? v[k] : v[k + half];
            v[k] = keep + __shfl_xor_sync(0xffffffffu, send, off);
        }
    }
    float s = v[0];
#pragma unroll
    for (int off = 16 / N; off >= 1; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
    return s;
}

// VPL float4s per lane: lane l holds dimensions 4 (l + 32 v) .. +3, v < VPL, of each of the warp's
// slots. HEAD_SPLIT warps share each 8-slot group (the block has DEC_WARPS * HEAD_SPLIT warps): warp
// w takes slot group w % DEC_WARPS and query heads p, p + HEAD_SPLIT, ... of the group (p = w /
// DEC_WARPS), so more warps hide the latency of the softmax's dependent steps. Per (head, slot) the
// arithmetic is the same whatever HEAD_SPLIT is, so every split computes bit-identical results.
// MAX_GROUP: the largest group the caller launches it for; each warp holds query and accumulator registers for
// ceil(MAX_GROUP / HEAD_SPLIT) heads. ATTN_MAX_GROUP serves every model; 1 (attention_decode.cu's _g1 entries) a
// model without grouped queries, with the registers of one head (Llama-2-7B: 32 KV heads of one query head each).
// PREFETCH (attention_decode.cu's _pf entries): the next pass's K/V loads are in flight while a pass is computed;
// the same passes in the same order, so the same bits.
// EXACT (attention_decode.cu's _x<G> entries): the model's group is exactly MAX_GROUP (the host checks), so each warp
// folds all of its heads with no test between them. With the test (a group known only at run time, which may stop
// before MAX_GROUP), each head's chain of shuffles and exponentials is a branch of its own and waits for the one
// before it; without, the heads' chains are one straight run of code the compiler interleaves. Each head's
// arithmetic is unchanged, so the same bits.
template <int VPL, int HEAD_SPLIT, int MAX_GROUP = ATTN_MAX_GROUP, bool PREFETCH = false, bool EXACT = false>
__device__ void decode_partial_body(const float* qkv, int qkv_stride, const kv_t* k_cache, const kv_t* v_cache,
                                    const int* attend_list, const int* ctl, float* part_o, float* part_ml,
                                    int n_q_heads, int n_kv_heads, int head_dim, int capacity, int n_splits,
                                    float scale, int split, int kvh, int i, int n_rows) {
    // Slots per warp pass: VPL 2 holds twice the registers per slot, so half as many at a time.
    constexpr int BATCH = DEC_SLOTS_PER_WARP / VPL;
    constexpr int LANES_PER_SLOT = 32 / BATCH;                  // warp_sum_spread leaves slot u in these lanes
    constexpr int HEADS = (MAX_GROUP + HEAD_SPLIT - 1) / HEAD_SPLIT;   // most heads one warp takes
    static_assert(!EXACT || MAX_GROUP % HEAD_SPLIT == 0, "an exact group gives every warp as many heads");
    extern __shared__ float4 dec_smem[];

    const int group = EXACT ? MAX_GROUP : n_q_heads / n_kv_heads;
    const int len = list_length(ctl, i);
    const int span = split_span(ctl, n_rows, n_splits);         // whole chunks, >= ATTN_CHUNK
    const int j0 = split * span;
    if (j0 >= len) return;                                      // block-uniform
    const int j_end = min(len, j0 + span);
    const int lane = threadIdx.x & 31;
    const int warp = (threadIdx.x >> 5) % DEC_WARPS;            // slot group, range [0, DEC_WARPS)
    const int part = (threadIdx.x >> 5) / DEC_WARPS;            // head share, range [0, HEAD_SPLIT)
    const int vec = head_dim >> 2;                              // float4 per row
    const int my_u = lane / LANES_PER_SLOT;                     // the slot of a pass whose score this lane holds
    float4* o_s = dec_smem;                                     // [DEC_WARPS][group][vec]
    float* m_s = reinterpret_cast<float*>(o_s + DEC_WARPS * group * vec);   // [DEC_WARPS][group]
    float* l_s = m_s + DEC_WARPS * group;                       // [DEC_WARPS][group]

    // This lane's slice of each query head the warp takes, pre-scaled into log2 units.
    float4 q[HEADS][VPL];
    const float* q_row = qkv + (size_t)i * qkv_stride + (size_t)kvh * group * head_dim;
#pragma unroll
    for (int j = 0; j < HEADS; ++j) {
        const int g = part + HEAD_SPLIT * j;
#pragma unroll
        for (int v = 0; v < VPL; ++v) {
            const int c = lane + 32 * v;                        // float4 index, range [0, vec)
            float4 val = make_float4(0.f, 0.f, 0.f, 0.f);
            if (g < group && c < vec) {
                val = LOAD_GRID_WRITTEN(reinterpret_cast<const float4*>(q_row + (size_t)g * head_dim + 4 * c));
                scale4(val, scale * DEC_LOG2E);
            }
            q[j][v] = val;
        }
    }
    // Online softmax state per head: m is warp-uniform; l is this lane's slot position's running sum
    // (lanes of one position agree), summed over positions at the end.
    float m[HEADS], l[HEADS];
    float4 acc[HEADS][VPL];
#pragma unroll
    for (int j = 0; j < HEADS; ++j) {
        m[j] = -INFINITY;
        l[j] = 0.f;
#pragma unroll
        for (int v = 0; v < VPL; ++v) acc[j][v] = make_float4(0.f, 0.f, 0.f, 0.f);
    }

    const kv_t* k_head = k_cache + (size_t)kvh * capacity * head_dim;
    const kv_t* v_head = v_cache + (size_t)kvh * capacity * head_dim;

    // One pass: list entries [b0, b0 + n_b) of this warp's slot group, their K and V rows (widened, or zeros
    // past n_b) in kf / vf, folded into every head's online softmax.
    auto fold_pass = [&](const float4 (&kf)[BATCH][VPL], const float4 (&vf)[BATCH][VPL], int n_b) {
#pragma unroll
        for (int j = 0; j < HEADS; ++j) {
            if constexpr (!EXACT) {
                if (part + HEAD_SPLIT * j >= group) break;      // warp-uniform: skipped, not predicated
            }
            float d[BATCH];
#pragma unroll
            for (int u = 0; u < BATCH; ++u) {
                d[u] = 0.f;
#pragma unroll
                for (int v = 0; v < VPL; ++v) d[u] += dot4(q[j][v], kf[u][v]);
            }
            float sc = warp_sum_spread(d);                      // slot my_u's score, log2 units
            sc = my_u < n_b ? sc : -INFINITY;
            float mx = sc;
#pragma unroll
            for (int off = LANES_PER_SLOT; off < 32; off <<= 1)
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
            mx = fmaxf(mx, m[j]);                               // finite: entry b0 is in the pass
            const float corr = fast_exp2(m[j] - mx);            // 0 on the first pass (m = -inf)
            const float p = fast_exp2(sc - mx);                 // 0 for positions past n_b
            l[j] = l[j] * corr + p;
#pragma unroll
            for (int v = 0; v < VPL; ++v) scale4(acc[j][v], corr);
#pragma unroll
            for (int u = 0; u < BATCH; ++u) {
                const float pu = __shfl_sync(0xffffffffu, p, u * LANES_PER_SLOT);
#pragma unroll
                for (int v = 0; v < VPL; ++v) axpy4(acc[j][v], pu, vf[u][v]);
            }
            m[j] = mx;
        }
    };

    if constexpr (!PREFETCH) {
        // The split's chunks in turn; in each, warp w takes the 8-slot group w. The softmax state carries over.
        for (int c0 = j0; c0 < j_end; c0 += ATTN_CHUNK) {
            const int w0 = c0 + warp * DEC_SLOTS_PER_WARP;      // first list entry of this slot group
            for (int b0 = w0; b0 < min(j_end, w0 + DEC_SLOTS_PER_WARP); b0 += BATCH) {
                const int n_b = min(BATCH, j_end - b0);         // warp-uniform, range [1, BATCH]
                const int my_slot = lane < n_b ? attend_list[b0 + lane] : 0;
                float4 kf[BATCH][VPL], vf[BATCH][VPL];
#pragma unroll
                for (int u = 0; u < BATCH; ++u) {               // every K and V load of the pass in flight
                    const int slot = __shfl_sync(0xffffffffu, my_slot, u);
#pragma unroll
                    for (int v = 0; v < VPL; ++v) {
                        const int c = lane + 32 * v;
                        const bool ok = u < n_b && c < vec;
                        const size_t off = (size_t)slot * head_dim + 4 * c;
                        kf[u][v] = ok ? load_kv4(k_head + off) : make_float4(0.f, 0.f, 0.f, 0.f);
                        vf[u][v] = ok ? load_kv4(v_head + off) : make_float4(0.f, 0.f, 0.f, 0.f);
                    }
                }
                fold_pass(kf, vf, n_b);
            }
        }
    } else {
        // The same passes in the same order, software-pipelined: pass p + 1's K/V loads are issued (as loaded,
        // kv4_raw_t) before pass p is folded, and pass p + 2's list entries before that, so a warp keeps a
        // pass of loads in flight while it computes instead of waiting for each pass's after the one before
        // (ncu on the H200: long-scoreboard stalls, 9 cycles per issue, at 21% occupancy on the 7B's decode).
        // Pass p of this warp starts at entry j0 + (p / VPL) ATTN_CHUNK + w DEC_SLOTS_PER_WARP + (p % VPL) BATCH
        // (VPL passes per 8-slot group); these rise with p, so the passes before j_end are the loop above's.
        auto pass_start = [&](int p) {
            return j0 + (p / VPL) * ATTN_CHUNK + warp * DEC_SLOTS_PER_WARP + (p % VPL) * BATCH;
        };
        auto list_entry = [&](int b0) {                         // this lane's slot of the pass at b0 (0: none)
            return b0 < j_end && lane < min(BATCH, j_end - b0) ? attend_list[b0 + lane] : 0;
        };
        kv4_raw_t kr[BATCH][VPL], vr[BATCH][VPL];
        auto issue_pass = [&](int b0, int my_slot) {            // b0 < j_end
            const int n_b = min(BATCH, j_end - b0);
#pragma unroll
            for (int u = 0; u < BATCH; ++u) {
                const int slot = __shfl_sync(0xffffffffu, my_slot, u);
#pragma unroll
                for (int v = 0; v < VPL; ++v) {
                    const int c = lane + 32 * v;
                    const bool ok = u < n_b && c < vec;
                    const size_t off = (size_t)slot * head_dim + 4 * c;
                    kr[u][v] = ok ? load_kv4_raw(k_head + off) : zero_kv4_raw();
                    vr[u][v] = ok ? load_kv4_raw(v_head + off) : zero_kv4_raw();
                }
            }
        };
        int b0 = pass_start(0), b1 = pass_start(1);
        if (b0 < j_end) issue_pass(b0, list_entry(b0));
        int slot1 = list_entry(b1);
        for (int p = 0; b0 < j_end; ++p) {
            float4 kf[BATCH][VPL], vf[BATCH][VPL];
#pragma unroll
            for (int u = 0; u < BATCH; ++u)
#pragma unroll
                for (int v = 0; v < VPL; ++v) {
                    kf[u][v] = widen_kv4(kr[u][v]);
                    vf[u][v] = widen_kv4(vr[u][v]);
                }
            if (b1 < j_end) issue_pass(b1, slot1);              // warp-uniform
            const int b2 = pass_start(p + 2);
            const int slot2 = list_entry(b2);
            fold_pass(kf, vf, min(BATCH, j_end - b0));
            b0 = b1;
            b1 = b2;
            slot1 = slot2;
        }
    }

    // Combine the slot groups' states: groups with no entries left carry m = -inf, l = 0, o = 0.
#pragma unroll
    for (int j = 0; j < HEADS; ++j) {
        const int g = part + HEAD_SPLIT * j;
        if (g >= group) break;
        float lsum = l[j];
#pragma unroll
        for (int off = LANES_PER_SLOT; off < 32; off <<= 1) lsum += __shfl_xor_sync(0xffffffffu, lsum, off);
        if (lane == 0) {
            m_s[warp * group + g] = m[j];
            l_s[warp * group + g] = lsum;
        }
#pragma unroll
        for (int v = 0; v < VPL; ++v)
            if (lane + 32 * v < vec) o_s[(warp * group + g) * vec + lane + 32 * v] = acc[j][v];
    }
    __syncthreads();
    for (int g = threadIdx.x >> 5; g < group; g += DEC_WARPS * HEAD_SPLIT) {   // warp w finishes head w, ...
        float mx = -INFINITY;
#pragma unroll
        for (int w = 0; w < DEC_WARPS; ++w) mx = fmaxf(mx, m_s[w * group + g]);   // finite: group 0 saw entry j0
        float wgt[DEC_WARPS], lsum = 0.f;
#pragma unroll
        for (int w = 0; w < DEC_WARPS; ++w) {
            wgt[w] = fast_exp2(m_s[w * group + g] - mx);
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
            part_ml[base * 2] = mx * DEC_LN2;                   // the merge works in natural units
            part_ml[base * 2 + 1] = lsum;
        }
    }
}
