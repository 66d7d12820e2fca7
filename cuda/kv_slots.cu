// kv_slots.cu: moving K/V between arena slots and a packed staging buffer.
//
// kv_gather:  staging[c, l, j, kvh*hd + d] = cache_c[l, kvh, slots[j], d]
// kv_scatter: cache_c[l, kvh, slots[j], d] = staging[c, l, j, kvh*hd + d]
//             c in {0: K, 1: V}, l in [0, L), j in [0, n), kvh in [0, KVH), d in [0, hd)
// copy_slots is gather(src) then scatter(dst): the staging copy makes overlapping src/dst
// sets behave like numpy's k[:, dst] = k[:, src] (right-hand side read first).
// Layouts:   k_cache, v_cache [L, KVH, capacity, hd] float32 (the whole arena);
//            staging [2, L, n_max, KVH*hd] float32 (n_max = the staging row capacity);
//            slots [n] int32.
// Launch:    grid (n, L, 2), block 128 over the KVH*hd values of one slot.
// Preconditions: slots in [0, capacity), n <= n_max (checked on the host).
#include "common.cuh"

__device__ __forceinline__ size_t arena_index(int l, int kvh, int slot, int d, int n_kv_heads, int capacity,
                                              int head_dim) {
    return (((size_t)l * n_kv_heads + kvh) * capacity + slot) * head_dim + d;
}

extern "C" __global__ void kv_gather(const float* k_cache, const float* v_cache, const int* slots, float* staging,
                                     int n_max, int n_layers, int n_kv_heads, int capacity, int head_dim) {
    const int j = blockIdx.x;                                   // range [0, n)
    const int l = blockIdx.y;                                   // range [0, L)
    const int c = blockIdx.z;                                   // range [0, 2): K, V
    const int kv_dim = n_kv_heads * head_dim;
    const float* cache = c == 0 ? k_cache : v_cache;
    float* dst = staging + (((size_t)c * n_layers + l) * n_max + j) * kv_dim;
    const int slot = slots[j];
    for (int e = threadIdx.x; e < kv_dim; e += blockDim.x) {    // e range [0, KVH*hd)
        const int kvh = e / head_dim, d = e - kvh * head_dim;
        dst[e] = cache[arena_index(l, kvh, slot, d, n_kv_heads, capacity, head_dim)];
    }
}

extern "C" __global__ void kv_scatter(float* k_cache, float* v_cache, const int* slots, const float* staging,
                                      int n_max, int n_layers, int n_kv_heads, int capacity, int head_dim) {
    const int j = blockIdx.x;                                   // range [0, n)
    const int l = blockIdx.y;                                   // range [0, L)
    const int c = blockIdx.z;                                   // range [0, 2): K, V
    const int kv_dim = n_kv_heads * head_dim;
    float* cache = c == 0 ? k_cache : v_cache;
    const float* src = staging + (((size_t)c * n_layers + l) * n_max + j) * kv_dim;
    const int slot = slots[j];
    for (int e = threadIdx.x; e < kv_dim; e += blockDim.x) {    // e range [0, KVH*hd)
        const int kvh = e / head_dim, d = e - kvh * head_dim;
        cache[arena_index(l, kvh, slot, d, n_kv_heads, capacity, head_dim)] = src[e];
    }
}
