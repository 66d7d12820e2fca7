// decode_persistent.cu: every decoder layer of one bf16 decode step (one query row) in a single
// persistent kernel, the stages separated by grid-wide barriers instead of kernel boundaries.
//
// Per layer, the same six stages as the launched pipeline (cuda_backend._enqueue_layer_fused),
// with the same device code (gemv_rows.cuh, attention_decode.cuh, attention_merge.cuh), so each
// output is bit-identical to it:
//   1 q|k|v     gemv items, RMSNorm prologue, QKV_ROPE epilogue (q to qkv, k and v to the arena)
//   2 attention decode_partial_body, item = (KV head, split) over the splits the attend list covers
//   3 merge     merge_body, item = query head
//   4 o         gemv items, residual ADD
//   5 gate/up   gemv items, RMSNorm prologue, SwiGLU
//   6 down      gemv items, residual ADD
// Block b runs items b, b + gridDim.x, ... of each stage.
//
// Why: launched one by one, a decode step is ~170 kernels and every boundary pays a drain, a
// launch and a ramp-up (measured: the gemv.cu launches stream at 0.28-0.74 of the copy bandwidth,
// the small ones lowest). Here the next projection's first weight loads are issued before the
// barrier that waits for its activations (weights do not depend on them), and blocks without
// an attention item prefetch the o and gate/up weights into L2 while attention runs (the DRAM is
// nearly idle then: attention reads ~8 MB in ~10 us).
//
// Measured on the H200 (notes/cuda_notes.md): bit-identical to the launches, and slower (1.61 vs
// 1.57 ms per step), so model.persistent_decode is off. One register count serves every stage and
// the attention body needs ~220: at 1 block per SM the projection stages run 8 warps per SM where
// gemv.cu's launches run up to 32; capped at 128 registers (2 blocks per SM) attention spills.
//
// Grid barrier: `arrived` counts block arrivals over the whole launch; barrier n is passed when it
// reaches n * gridDim.x. Thread 0 releases the block's writes (threadfence + atomic) and acquires
// the others' (ld.acquire.gpu) before the block goes on; data written by other blocks is then read
// through L2 (LOAD_GRID_WRITTEN in the shared bodies). Every block must be resident at once: the host
// launches it cooperatively (CU_LAUNCH_ATTRIBUTE_COOPERATIVE, grid <= SMs x occupancy), which the
// driver refuses rather than deadlocks when the grid does not fit. The last block to leave resets
// `arrived` and `departed` to 0 for the next launch (both start at 0 when allocated).
//
// Layouts: as gemv.cu and attention_decode.cu; `layers` is [n_layers] DecodeLayer in device memory.
// Launch:  grid = the co-resident block count, block GEMV_THREADS (= DEC_THREADS = MERGE_THREADS);
//          dynamic shared memory max(4 * max(hidden, inter), DEC_WARPS * group * (8 + 4 hd)) bytes;
//          entry _v1 for hd <= 128, _v2 for hd <= 256 (attention_decode.cu's VPL), _b1 / _b2 below.
// Preconditions (checked on the host): bf16 weights in gemv.cu's layouts; one query row; hidden and
//          inter multiples of 8; the attention preconditions of attention_decode.cu.
#define GRID_WRITTEN_THROUGH_L2      // LOAD_GRID_WRITTEN (common.cuh): the stages read each other's results
#include "gemv_rows.cuh"
#include "attention_decode.cuh"
#include "attention_merge.cuh"

// 16-byte weight chunks per lane in flight (gemv_rows.cuh's U): twice gemv_bf16's, as this grid has
// 8 or 16 warps per SM where the launched gemv runs up to 32 (the weight stream needs ~3 MB in flight).
#define PERSISTENT_UNROLL 8

static_assert(GEMV_THREADS == DEC_THREADS && GEMV_THREADS == MERGE_THREADS,
              "the stages share one block shape");

// One decoder layer's weights and KV arena (uint64 pointers, packed by the host in this order).
struct DecodeLayer {
    const uint16_t* w_qkv;      // [qkv_rows, hidden], kernel_reference.qkv_rope_row_order
    const float* b_qkv;         // [qkv columns] or NULL
    const float* input_norm;    // [hidden]
    const uint16_t* w_o;        // [hidden, hidden]
    const uint16_t* w_gate_up;  // [gate_up_rows, hidden], interleaved in tiles of 16 rows
    const float* post_norm;     // [hidden]
    const uint16_t* w_down;     // [hidden, inter]
    kv_t* k_cache;              // this layer's arena [KVH, capacity, hd] (kv_store.cuh)
    kv_t* v_cache;
};

__device__ __forceinline__ void grid_barrier(unsigned int* arrived, unsigned int& target) {
    __syncthreads();                                            // the block's writes are done
    target += gridDim.x;
    if (threadIdx.x == 0) {
        __threadfence();
        atomicAdd(arrived, 1u);
        unsigned int seen;
        do {
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(seen) : "l"(arrived) : "memory");
        } while (seen < target);
    }
    __syncthreads();
}

// The first weight loads of this block's first item of `p`: issued before the barrier that waits
// for p's activations.
__device__ __forceinline__ void projection_prefetch(const Projection& p, uint4 (&w)[PERSISTENT_UNROLL]) {
    const int row = blockIdx.x < gemv_items(p.rows) ? gemv_row(p.mode, blockIdx.x, threadIdx.x >> 5) : p.rows;
    gemv_first_loads(p.W, row, p.rows, p.K, w);
}

// Ask L2 to fetch bytes [0, n) of `base` (128-byte lines), spread over every thread of the grid.
// Fire and forget: nothing waits for these, and the SM receives no data.
__device__ __forceinline__ void l2_prefetch(const void* base, long long n) {
    if (n <= 0) return;
    const long long threads = (long long)gridDim.x * blockDim.x;
    const long long me = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const char* p = static_cast<const char*>(base);
    for (long long off = me * 128; off < n; off += threads * 128)
        asm volatile("prefetch.global.L2 [%0];\n" :: "l"(p + off));
}

template <int VPL>
__device__ void decode_layers_body(const DecodeLayer* layers, int n_layers, float* resid, float* qkv, int qkv_stride,
                                   float* attn, int attn_stride, float* act, float* part_o, float* part_ml,
                                   const int* attend_list, const int* pos_table, const int* slot_table, const int* ctl,
                                   const float* inv_freq, unsigned int* arrived, unsigned int* departed, int hidden,
                                   int qkv_rows, int inter, int gate_up_rows, int n_q_heads, int n_kv_heads,
                                   int head_dim, int capacity, int n_splits, float eps, float scale,
                                   long long l2_prefetch_bytes) {
    extern __shared__ float4 persistent_smem[];                 // staged activations, or attention's state
    __shared__ float row_sum[GEMV_WARPS];
    __shared__ float scratch[32];
    unsigned int target = 0;
    const int len = list_length(ctl, 0);
    const int active = min(n_splits, (len + ATTN_CHUNK - 1) / ATTN_CHUNK);
    const int attention_items = active * n_kv_heads;
    uint4 w[PERSISTENT_UNROLL];

    for (int li = 0; li < n_layers; ++li) {
        const DecodeLayer L = layers[li];
        const RopeTarget rt{pos_table, slot_table, ctl, inv_freq, L.k_cache, L.v_cache, n_q_heads, n_kv_heads,
                            head_dim, capacity};
        const Projection p_qkv{L.w_qkv, resid, L.input_norm, L.b_qkv, qkv, qkv_rows, qkv_rows, hidden,
                               PMODE_QKV_ROPE, eps};
        const Projection p_o{L.w_o, attn, nullptr, nullptr, resid, hidden, hidden, hidden, PMODE_ADD, eps};
        const Projection p_gate_up{L.w_gate_up, resid, L.post_norm, nullptr, act, inter, gate_up_rows, hidden,
                                   PMODE_SWIGLU, eps};
        const Projection p_down{L.w_down, act, nullptr, nullptr, resid, hidden, hidden, inter, PMODE_ADD, eps};

        if (li == 0) projection_prefetch(p_qkv, w);             // later layers: before the previous barrier
        projection_stage(p_qkv, rt, w, persistent_smem, row_sum, scratch);                 // 1: q|k|v
        grid_barrier(arrived, target);

        // 2: attention partials, then the L2 prefetch of the o and first gate/up weights.
        for (int item = blockIdx.x; item < attention_items; item += gridDim.x) {
            __syncthreads();                                    // the shared state of the previous item is read
            decode_partial_body<VPL, 1>(qkv, qkv_stride, L.k_cache, L.v_cache, attend_list, ctl, part_o, part_ml,
                                     n_q_heads, n_kv_heads, head_dim, capacity, n_splits, scale, item % active,
                                     item / active, 0, 1);
        }
        if (l2_prefetch_bytes > 0) {                           // each block once its attention items are done
            const long long o_bytes = 2LL * hidden * hidden;
            l2_prefetch(L.w_o, min(o_bytes, l2_prefetch_bytes));
            l2_prefetch(L.w_gate_up, min(2LL * gate_up_rows * hidden, l2_prefetch_bytes - o_bytes));
        }
        grid_barrier(arrived, target);

        // 3: merge
        for (int h = blockIdx.x; h < n_q_heads; h += gridDim.x) {
            __syncthreads();
            merge_body<0>(part_o, part_ml, ctl, attn, attn_stride, n_q_heads, head_dim, n_splits, h, 0, 1);
        }
        projection_prefetch(p_o, w);
        grid_barrier(arrived, target);

        projection_stage(p_o, rt, w, persistent_smem, row_sum, scratch);                   // 4: o
        projection_prefetch(p_gate_up, w);
        grid_barrier(arrived, target);

        projection_stage(p_gate_up, rt, w, persistent_smem, row_sum, scratch);             // 5: gate/up
        projection_prefetch(p_down, w);
        grid_barrier(arrived, target);

        projection_stage(p_down, rt, w, persistent_smem, row_sum, scratch);                // 6: down
        if (li + 1 < n_layers) {
            const DecodeLayer N = layers[li + 1];
            const Projection p_next{N.w_qkv, resid, N.input_norm, N.b_qkv, qkv, qkv_rows, qkv_rows, hidden,
                                    PMODE_QKV_ROPE, eps};
            projection_prefetch(p_next, w);
            grid_barrier(arrived, target);
        }
    }
    // The last block out resets the counters for the next launch: every block has passed every
    // barrier by the time it counts itself here, so none still reads `arrived`.
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        if (atomicAdd(departed, 1u) == gridDim.x - 1) {
            *arrived = 0u;
            *departed = 0u;
            __threadfence();
        }
    }
}

// Entries by attention_decode's VPL and blocks per SM: _b1 keeps the attention body in registers
// (228 of them: one block of 8 warps per SM); _b2 caps registers at 128 for two blocks per SM
// (twice the weight loads in flight, some of the attention state spilled to L1).
#define DECODE_LAYERS_ENTRY(VPL, MINB)                                                                         \
    extern "C" __global__ void __launch_bounds__(GEMV_THREADS, MINB) decode_layers_v##VPL##_b##MINB(           \
            const DecodeLayer* layers, int n_layers, float* resid, float* qkv, int qkv_stride, float* attn,    \
            int attn_stride, float* act, float* part_o, float* part_ml, const int* attend_list,                \
            const int* pos_table, const int* slot_table, const int* ctl, const float* inv_freq,                \
            unsigned int* arrived, unsigned int* departed, int hidden, int qkv_rows, int inter,                \
            int gate_up_rows, int n_q_heads, int n_kv_heads, int head_dim, int capacity, int n_splits,         \
            float eps, float scale, long long l2_prefetch_bytes) {                                             \
        decode_layers_body<VPL>(layers, n_layers, resid, qkv, qkv_stride, attn, attn_stride, act, part_o,      \
                                part_ml, attend_list, pos_table, slot_table, ctl, inv_freq, arrived, departed, \
                                hidden, qkv_rows, inter, gate_up_rows, n_q_heads, n_kv_heads, head_dim,        \
                                capacity, n_splits, eps, scale, l2_prefetch_bytes);                            \
    }

DECODE_LAYERS_ENTRY(1, 1)
DECODE_LAYERS_ENTRY(1, 2)
DECODE_LAYERS_ENTRY(2, 1)
DECODE_LAYERS_ENTRY(2, 2)
