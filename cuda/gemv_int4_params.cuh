// gemv_int4_params.cuh: the kernel parameters every one-row INT4 projection entry takes (gemv_int4.cu's entries),
// so the host launches any of them with the same arguments (cuda_int4_launchers.py), and their names for the
// entries that forward them.
//
// cuda_kernels.py pastes this text in place of `#include "gemv_int4_params.cuh"`.
#pragma once
#include "gemv_rows.cuh"

// The parameters every entry takes (the host passes the same arguments to each), and their names.
#define GEMV_INT4_PARAMS                                                                                       \
    const uint8_t* __restrict__ Wq, const uint16_t* __restrict__ scales, int group, const float* __restrict__ x, \
    const float* __restrict__ norm_w, float eps, const float* bias, float* out, int out_cols, int rows, int K,   \
    int mode, const int* pos_table, const int* slot_table, const int* ctl, const float* inv_freq,               \
    kv_t* k_cache, kv_t* v_cache, int n_q_heads, int n_kv_heads, int head_dim, int capacity
#define GEMV_INT4_ARGS                                                                                         \
    Wq, scales, group, x, norm_w, eps, bias, out, out_cols, rows, K, mode, pos_table, slot_table, ctl, inv_freq, \
    k_cache, v_cache, n_q_heads, n_kv_heads, head_dim, capacity
#define GEMV_INT4_ENTRY(NAME) extern "C" __global__ void __launch_bounds__(GEMV_THREADS) NAME(GEMV_INT4_PARAMS)
