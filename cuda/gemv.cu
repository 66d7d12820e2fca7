// gemv.cu: the one-row projections of a decode step, y = x @ W^T for bf16 weights and an fp32
// activation row, on the CUDA cores, with the neighbouring small steps of a decoder layer folded in.
//
// Computes   acc[r] = sum_k W[r, k] * v[k]       r in [0, rows)
//            v = x (norm_w == NULL), or v = x * norm_w and acc scaled by s = rsqrt(mean_k x[k]^2 + eps)
//            (the RMSNorm prologue: s * acc[r] = (rmsnorm(x) * norm_w) . W[r]).
//            Epilogue by mode (common.cuh), val = s * acc[r]:
//              STORE    : out[r]  = val + (bias ? bias[r] : 0)
//              ADD      : out[r] += val          (each row has one writer: no atomics)
//              SWIGLU   : W is gate/up interleaved in tiles of 16 rows (kernel_reference.interleave_gate_up):
//                         rows 16t + g and 16t + g + 8 are gate j and up j, j = 8t + g;
//                         out[j] = silu(val_gate) * val_up                 (j < out_cols)
//              QKV_ROPE : W in kernel_reference.qkv_rope_row_order; rows 16t + g and 16t + g + 8 are a
//                         RoPE pair (or two v rows): qkv_rope.cuh's epilogue (q to out, k, v to the arena)
//
// Why not the tensor cores (the removed projection_fused.cu, notes/cuda_notes.md): with one activation row an mma uses 1 of its 8
// columns and the bf16 hi/lo split of the activations costs more instructions than the FMAs it
// replaces; measured on the H200 with one launch per layer on its own weights (bench/gemv_probe.py),
// this plain loop streamed the gate/up weights at ~0.8 of the copy bandwidth against ~0.55.
//
// Layouts:   W [rows, K] row-major bf16 bits; x [K] float32 (the caller offsets the row); norm_w [K];
//            out [out_cols or rows] float32; rope tables as qkv_rope.cuh.
// Launch:    grid ceil(rows / 8), block GEMV_THREADS (8 warps), dynamic shared memory 4 K bytes.
//            Warp w of block b owns one row: b*8 + w (STORE, ADD) or, for the pair modes, row
//            16t + g + 8 (w & 1) of pair p = 4b + (w >> 1) = 8t + g, so a block holds whole pairs.
//            The block stages v in shared memory once; lane l streams the 16-byte chunks l, l + 32,
//            ... of its warp's row, GEMV_LANE_LOADS chunks per batch, the next batch's loads issued
//            before this batch's arithmetic (software pipeline).
//            gemv_bf16_items: the same items and sums with a smaller grid, block b taking items b, b +
//            gridDim.x, ... (gemv_rows.cuh's projection_stage): the activations are staged once per
//            block, and an item's last batch overlaps the next item's first loads.
// PDL:       the first batch of weight loads is issued before griddep_wait, so a programmatic
//            launch streams weights while the kernel before it finishes.
// Preconditions: K % 8 == 0; x and norm_w 16-byte aligned; rows % 16 == 0 for the pair modes.
#include "gemv_rows.cuh"

// The parameters and shared arrays both entries share (the host passes the same arguments to either).
#define GEMV_ENTRY(NAME)                                                                                       \
    extern "C" __global__ void __launch_bounds__(GEMV_THREADS) NAME(                                          \
            const uint16_t* __restrict__ W, const float* __restrict__ x, const float* __restrict__ norm_w,     \
            float eps, const float* bias, float* out, int out_cols, int rows, int K, int mode,                 \
            const int* pos_table, const int* slot_table, const int* ctl, const float* inv_freq,                \
            kv_t* k_cache, kv_t* v_cache, int n_q_heads, int n_kv_heads, int head_dim, int capacity)

GEMV_ENTRY(gemv_bf16) {
    extern __shared__ float4 v_s4[];                            // [K / 4] staged activations
    __shared__ float row_sum[GEMV_WARPS];
    __shared__ float scratch[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int row = gemv_row(mode, blockIdx.x, warp);
    const bool ok = row < rows;
    const uint16_t* w_row = W + (size_t)(ok ? row : 0) * K;
    const int chunks = K >> 3;                                  // 16-byte chunks per row

    uint4 w[GEMV_LANE_LOADS];
    gemv_first_loads(W, row, rows, K, w);
    griddep_wait();                                             // x (and the tables) come from earlier kernels
    griddep_launch_dependents();
    const float scale = gemv_stage_activations(x, norm_w, eps, K, v_s4, scratch);
    const float* v_s = reinterpret_cast<const float*>(v_s4);

    float acc = warp_sum(gemv_stream_row(w, w_row, ok, chunks, v_s)) * scale;
    if (lane == 0) row_sum[warp] = acc;
    __syncthreads();
    const RopeTarget rt{pos_table, slot_table, ctl, inv_freq, k_cache, v_cache, n_q_heads, n_kv_heads, head_dim,
                        capacity};
    gemv_epilogue(mode, blockIdx.x, row_sum, bias, out, out_cols, rows, rt);
}

// gemv_bf16's items looped over a grid of at most a few blocks per SM (the gate/up projection has 2240
// items: ~4 waves of gemv_bf16, each block staging and RMS-normalising the activations again).
GEMV_ENTRY(gemv_bf16_items) {
    extern __shared__ float4 v_s4[];                            // [K / 4] staged activations
    __shared__ float row_sum[GEMV_WARPS];
    __shared__ float scratch[32];
    const int first_row = blockIdx.x < gemv_items(rows) ? gemv_row(mode, blockIdx.x, threadIdx.x >> 5) : rows;
    uint4 w[GEMV_LANE_LOADS];
    gemv_first_loads(W, first_row, rows, K, w);
    griddep_wait();                                             // x (and the tables) come from earlier kernels
    griddep_launch_dependents();
    const Projection p{W, x, norm_w, bias, out, out_cols, rows, K, mode, eps};
    const RopeTarget rt{pos_table, slot_table, ctl, inv_freq, k_cache, v_cache, n_q_heads, n_kv_heads, head_dim,
                        capacity};
    projection_stage(p, rt, w, v_s4, row_sum, scratch);
}
