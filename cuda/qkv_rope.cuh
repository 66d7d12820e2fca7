// qkv_rope.cuh: the QKV_ROPE pair epilogue of the one-row projection (gemv.cu) (RoPE, then q to the output row, k and v into
// one layer's KV arena). Row pair (a, b) = rows g and g + 8 of tile `tile` of a q|k|v weight laid
// out by kernel_reference.qkv_rope_row_order: the RoPE pair (j, j + hd/2) of one head, or two v rows.
#pragma once
#include "common.cuh"
#include "kv_store.cuh"

// Where the QKV_ROPE epilogue sends its values (unused by the other modes).
struct RopeTarget {
    const int* pos_table;
    const int* slot_table;
    const int* ctl;
    const float* inv_freq;
    kv_t* k_cache;                 // one layer's arena (kv_store.cuh)
    kv_t* v_cache;
    int n_q_heads, n_kv_heads, head_dim, capacity;
};

// Row pair (a, b) = (tile row g, tile row g + 8) of a QKV_ROPE weight, for tokens n of this lane.
__device__ __forceinline__ void qkv_rope_epilogue(const RopeTarget& rt, const float* bias, float* out, int out_stride,
                                                  int tile, int g, int n, float va, float vb) {
    const int hd = rt.head_dim, half = hd >> 1;
    const int n_pairs = (rt.n_q_heads + rt.n_kv_heads) * half;
    const int pair_tiles = (n_pairs + 7) >> 3;
    const int t = rt.ctl[CTL_ROW_OFFSET] + n;                  // call-table row of token n
    const int slot = rt.slot_table[t];
    if (tile < pair_tiles) {
        const int p = tile * 8 + g;                            // range [0, n_pairs): (head, j)
        if (p >= n_pairs) return;                              // padding rows of the last pair tile
        const int h = p / half, j = p - h * half;              // h range [0, Hq + KVH), j range [0, half)
        const int a = h * hd + j;                              // natural q|k column of row g
        if (bias != nullptr) {
            va += bias[a];
            vb += bias[a + half];
        }
        const float angle = (float)rt.pos_table[t] * rt.inv_freq[j];
        const float c = cosf(angle), s = sinf(angle);
        const float ra = va * c - vb * s;
        const float rb = vb * c + va * s;
        if (h < rt.n_q_heads) {
            float* orow = out + (size_t)n * out_stride;
            orow[a] = ra;
            orow[a + half] = rb;
        } else {
            kv_t* dst = rt.k_cache + ((size_t)(h - rt.n_q_heads) * rt.capacity + slot) * hd;
            dst[j] = to_kv(ra);
            dst[j + half] = to_kv(rb);
        }
        return;
    }
    const int kv_dim = rt.n_kv_heads * hd;
    const int v_col0 = (rt.n_q_heads + rt.n_kv_heads) * hd;    // natural column of v row 0
#pragma unroll
    for (int half_tile = 0; half_tile < 2; ++half_tile) {
        const int vr = (tile - pair_tiles) * 16 + g + 8 * half_tile;   // range [0, kv_dim)
        if (vr >= kv_dim) continue;
        const float val = (half_tile ? vb : va) + (bias != nullptr ? bias[v_col0 + vr] : 0.f);
        const int kvh = vr / hd, d = vr - kvh * hd;
        rt.v_cache[((size_t)kvh * rt.capacity + slot) * hd + d] = to_kv(val);
    }
}
