// rope.cu: rotary position embedding at absolute positions, fused with the K/V store.
//
// Computes, for call row i (table index t = ctl[CTL_ROW_OFFSET] + i, position p = pos_table[t],
// arena slot s = slot_table[t]) and pair j in [0, head_dim/2), angle = float(p) * inv_freq[j]:
//            q[i, h, j]      <- q[j] cos - q[j + half] sin      (in place, every query head h)
//            q[i, h, j+half] <- q[j + half] cos + q[j] sin
//            k_cache[kvh, s, :] = the same rotation of k[i, kvh, :]   (K stored after RoPE)
//            v_cache[kvh, s, :] = v[i, kvh, :]
//            (HF's rotate_half convention; cosf/sinf at full precision, angle in fp32 as HF)
// Layouts:   qkv [n_rows, qkv_stride] float32: q at columns [0, Hq*hd), k at [Hq*hd, +KVH*hd),
//            v after k; each head's hd values contiguous.
//            k_cache, v_cache: one layer's arena [KVH, capacity, hd] kv_t (kv_store.cuh: fp32, or bf16 rounded
//            to nearest even).
//            pos_table, slot_table [>= t+1] int32; ctl: control block (common.cuh).
// Launch:    grid (n_rows), block 128; the threads stride over the (Hq + KVH) * hd/2 pairs,
//            then over the KVH * hd values of v.
// Preconditions: head_dim even; slots in [0, capacity) (checked on the host).
#include "common.cuh"
#include "kv_store.cuh"

extern "C" __global__ void rope_store(float* qkv, int qkv_stride, const int* pos_table, const int* slot_table,
                                      const int* ctl, const float* inv_freq, kv_t* k_cache, kv_t* v_cache,
                                      int n_q_heads, int n_kv_heads, int head_dim, int capacity) {
    const int i = blockIdx.x;                                  // range [0, n_rows)
    const int t = ctl[CTL_ROW_OFFSET] + i;
    const float pos = (float)pos_table[t];
    const int slot = slot_table[t];
    const int half = head_dim >> 1;
    float* row = qkv + (size_t)i * qkv_stride;
    const int n_pairs = (n_q_heads + n_kv_heads) * half;
    for (int p = threadIdx.x; p < n_pairs; p += blockDim.x) {  // p range [0, (Hq+KVH)*half)
        const int h = p / half;                                // range [0, Hq+KVH): q heads, then k heads
        const int j = p - h * half;                            // range [0, half)
        const float angle = pos * inv_freq[j];
        const float c = cosf(angle), s = sinf(angle);
        float* src = row + h * head_dim;                       // k heads follow q heads in qkv
        const float a = src[j], b = src[j + half];
        const float ra = a * c - b * s;
        const float rb = b * c + a * s;
        if (h < n_q_heads) {
            src[j] = ra;
            src[j + half] = rb;
        } else {
            const int kvh = h - n_q_heads;
            kv_t* dst = k_cache + ((size_t)kvh * capacity + slot) * head_dim;
            dst[j] = to_kv(ra);
            dst[j + half] = to_kv(rb);
        }
    }
    const int kv_dim = n_kv_heads * head_dim;
    const float* v = row + (n_q_heads + n_kv_heads) * head_dim;
    for (int e = threadIdx.x; e < kv_dim; e += blockDim.x) {   // e range [0, KVH*hd)
        const int kvh = e / head_dim, d = e - kvh * head_dim;
        v_cache[((size_t)kvh * capacity + slot) * head_dim + d] = to_kv(v[e]);
    }
}
