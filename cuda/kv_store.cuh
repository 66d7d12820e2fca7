// kv_store.cuh: the element type of the KV arena, and the only places that read or write one.
//
// kv.dtype: float32 (default) stores K (after RoPE) and V as fp32; bfloat16 stores them as bf16 bits
// (round to nearest even), halving the arena, the attention's K/V bytes and every swap. The choice is
// made when a family is compiled: cuda_kernels.py passes -DKV_BF16 to the families that include this
// header (KV_FAMILIES there), so each compiled module serves one arena type.
//
// Every value is widened to fp32 on load, so the arithmetic after the load is the fp32 arena's: a
// bf16 arena gives bit-identical results to an fp32 arena holding the same (bf16-representable)
// values. That is what test_cuda_kv_bf16.py checks kernel by kernel.
//
// Loads go through LOAD_GRID_WRITTEN (common.cuh): L2 only inside the persistent decode kernel.
#pragma once
#include "common.cuh"

#ifdef KV_BF16
typedef uint16_t kv_t;
#else
typedef float kv_t;
#endif

// One value to the arena's type (bf16: round to nearest even, as HF's .to(bfloat16)).
__device__ __forceinline__ kv_t to_kv(float v) {
#ifdef KV_BF16
    return __bfloat16_as_ushort(__float2bfloat16_rn(v));
#else
    return v;
#endif
}

__device__ __forceinline__ float from_kv(kv_t v) {
#ifdef KV_BF16
    return bf16_bits_to_float(v);
#else
    return v;
#endif
}

// Two bf16 bits packed in a word (the lower index in the low half) -> two floats.
__device__ __forceinline__ float bf16_low(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_high(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }

// Four bf16 values (two words, lower index in the low half) as a float4.
__device__ __forceinline__ float4 widen_bf16x4(uint2 w) {
    return make_float4(bf16_low(w.x), bf16_high(w.x), bf16_low(w.y), bf16_high(w.y));
}

// Four arena values as loaded, before widening: two words of bf16 pairs, or the float4 itself. A kernel that
// keeps the next loads in flight while it computes (attention_decode.cuh's PREFETCH) holds them this way, half
// the registers of the widened values on a bf16 arena.
#ifdef KV_BF16
typedef uint2 kv4_raw_t;
__device__ __forceinline__ float4 widen_kv4(kv4_raw_t r) { return widen_bf16x4(r); }
__device__ __forceinline__ kv4_raw_t zero_kv4_raw() { return make_uint2(0u, 0u); }     // widens to +0.0f
#else
typedef float4 kv4_raw_t;
__device__ __forceinline__ float4 widen_kv4(kv4_raw_t r) { return r; }
__device__ __forceinline__ kv4_raw_t zero_kv4_raw() { return make_float4(0.f, 0.f, 0.f, 0.f); }
#endif

// Arena values p[0..3] as loaded (kv4_raw_t); p is 4-element aligned (8 bytes bf16, 16 bytes fp32).
__device__ __forceinline__ kv4_raw_t load_kv4_raw(const kv_t* p) {
    return LOAD_GRID_WRITTEN(reinterpret_cast<const kv4_raw_t*>(p));
}

// Arena values p[0..3] as a float4.
__device__ __forceinline__ float4 load_kv4(const kv_t* p) { return widen_kv4(load_kv4_raw(p)); }

// As load_kv4, through the read-only data cache: for kernels that only read the arena (it was written
// before their launch).
__device__ __forceinline__ float4 load_kv4_readonly(const kv_t* p) {
#ifdef KV_BF16
    return widen_bf16x4(__ldg(reinterpret_cast<const uint2*>(p)));
#else
    return __ldg(reinterpret_cast<const float4*>(p));
#endif
}
