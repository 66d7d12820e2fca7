// kv_slots.cu: moving K/V between arena slots and a packed staging buffer.
//
// kv_gather:  staging[c, l, j, kvh*hd + d] = cache_c[l, kvh, slots[j], d]
// kv_scatter: cache_c[l, kvh, slots[j], d] = staging[c, l, j, kvh*hd + d]
//             c in {0: K, 1: V}, l in [0, L), j in [0, n), kvh in [0, KVH), d in [0, hd)
// copy_slots is gather(src) then scatter(dst): the staging copy makes overlapping src/dst
// sets behave like numpy's k[:, dst] = k[:, src] (right-hand side read first).
// Layouts:   k_cache, v_cache [L, KVH, capacity, hd] kv_t (the whole arena; kv_store.cuh);
//            staging [2, L, n_max, KVH*hd] kv_t (n_max = the staging row capacity): the arena's own
//            type, copied bit for bit (a bf16 arena's swaps move half the bytes);
//            slots [n] int32.
// Launch:    grid (n, L, 2), block 128 over the KVH*hd values of one slot.
// Preconditions: slots in [0, capacity), n <= n_max (checked on the host).
#include "common.cuh"
#include "kv_store.cuh"

__device__ __forceinline__ size_t arena_index(int l, int kvh, int slot, int d, int n_kv_heads, int capacity,
                                              int head_dim) {
    return (((size_t)l * n_kv_heads + kvh) * capacity + slot) * head_dim + d;
}

extern "C" __global__ void kv_gather(const kv_t* k_cache, const kv_t* v_cache, const int* slots, kv_t* staging,
                                     int n_max, int n_layers, int n_kv_heads, int capacity, int head_dim) {
    const int j = blockIdx.x;                                   // range [0, n)
    const int l = blockIdx.y;                                   // range [0, L)
    const int c = blockIdx.z;                                   // range [0, 2): K, V
    const int kv_dim = n_kv_heads * head_dim;
    const kv_t* cache = c == 0 ? k_cache : v_cache;
    kv_t* dst = staging + (((size_t)c * n_layers + l) * n_max + j) * kv_dim;
    const int slot = slots[j];
    for (int e = threadIdx.x; e < kv_dim; e += blockDim.x) {    // e range [0, KVH*hd)
        const int kvh = e / head_dim, d = e - kvh * head_dim;
        dst[e] = cache[arena_index(l, kvh, slot, d, n_kv_heads, capacity, head_dim)];
    }
}

extern "C" __global__ void kv_scatter(kv_t* k_cache, kv_t* v_cache, const int* slots, const kv_t* staging,
                                      int n_max, int n_layers, int n_kv_heads, int capacity, int head_dim) {
    const int j = blockIdx.x;                                   // range [0, n)
    const int l = blockIdx.y;                                   // range [0, L)
    const int c = blockIdx.z;                                   // range [0, 2): K, V
    const int kv_dim = n_kv_heads * head_dim;
    kv_t* cache = c == 0 ? k_cache : v_cache;
    const kv_t* src = staging + (((size_t)c * n_layers + l) * n_max + j) * kv_dim;
    const int slot = slots[j];
    for (int e = threadIdx.x; e < kv_dim; e += blockDim.x) {    // e range [0, KVH*hd)
        const int kvh = e / head_dim, d = e - kvh * head_dim;
        cache[arena_index(l, kvh, slot, d, n_kv_heads, capacity, head_dim)] = src[e];
    }
}

// kv_count_nonfinite: *count += the number of NaN/Inf among values[0, n) (a snapshot buffer's check
// before it is offered: a count, where a sum of the values could overflow to Inf on finite data).
// Launch: any grid of 256-thread blocks (grid-stride); *count zeroed before.
extern "C" __global__ void kv_count_nonfinite(const kv_t* values, long long n, int* count) {
    int bad = 0;
    for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < n; e += (long long)gridDim.x * blockDim.x)
        bad += isfinite(from_kv(values[e])) ? 0 : 1;
    if (bad != 0) atomicAdd(count, bad);                       // rare: finite data makes no atomics
}
