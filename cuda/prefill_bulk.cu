// prefill_bulk.cu: the steps of the bulk prefill (cuda_backend.py, model.bulk_prefill_min_rows) that are
// not projections (those are gemm_bulk.cu). Per layer of a forward over many rows:
//   rmsnorm_split_rows     RMSNorm of the residual rows, written as bf16 hi/lo (the GEMM's activations),
//                          and the q|k|v accumulator initialised to the bias
//   (gemm_bulk q|k|v, rope.cu's rope_store: q rotated in place, K/V into the arena)
//   kv_stage               the layer's K/V of the attend list gathered into contiguous bf16 hi/lo rows
//   attention_flash_*      causal attention of the rows over the staged K/V on the tensor cores, online
//                          softmax; the list split over S blocks when the rows alone give too few blocks
//                          (the template: attention_flash.cuh; its K/V-overlap entries: attention_flash_kvo.cu)
//   attention_flash_merge  the S partial sums -> the attention output as bf16 hi/lo (the o GEMM's input)
//
// Precision: as attention_mma.cu. q (pre-scaled), K, V and the softmax weights P are fp32 values fed to
// the mma as bf16 hi + lo; a product x.y is hi_x.hi_y + lo_x.hi_y + hi_x.lo_y (lo.lo dropped, ~2^-16 of
// the product). A bf16 arena (-DKV_BF16) holds K and V in bf16: their lo parts are zero, neither staged
// nor multiplied. The _p1 entries (KernelPlan.bulk_activation_parts 1) multiply the hi parts alone, q,
// K, P and V each rounded to bf16 once (~2^-9 relative, what a bf16 SDPA computes), for a third of the
// products of an fp32 arena's and half of a bf16 arena's. Scores are kept in log2 units (q scaled by
// scale * log2 e) so every weight is one exp2.
//
// Layouts (one layer): qkv [n_rows, qkv_stride] float32, q head h at columns [h hd, (h+1) hd), after RoPE;
//            the arena k/v [KVH, capacity, hd] kv_t; attend_list int32 (cached context, then the call's
//            rows); ctl: control block (common.cuh) with this pass's row offset and the context length.
//            Staged K/V: k_hi, k_lo, v_hi, v_lo each [KVH, stage_cap, hd] bf16 bits, entry j = list entry j.
//            Partial sums: part_o [S, n_rows, Hq, hd] float32 (unnormalised), part_ml [S, n_rows, Hq, 2]
//            (running max in log2 units, sum of weights). Output: [n_rows, out_stride] bf16 hi, lo parts at
//            + out_part_stride.
#include "common.cuh"
#include "kv_store.cuh"
#include "mma_bf16.cuh"
#include "mma_tiles.cuh"
#include "attention_flash.cuh"

// ---------------------------------------------------------------- RMSNorm -> bf16 hi/lo

// out[row, d] / out[part_stride + row, d] = hi / lo of rmsnorm(x[row]) * w  (rmsnorm.cu's formula), and
// init_dst[row, c] = init_src ? init_src[c] : 0 for c < init_cols when init_dst is given.
// Launch: grid (n_rows), block 256; hidden even.
extern "C" __global__ void rmsnorm_split_rows(const float* x, const float* w, uint16_t* out, long long part_stride,
                                              int hidden, float eps, float* init_dst, const float* init_src,
                                              int init_cols) {
    __shared__ float scratch[32];
    const int row = blockIdx.x;                                // range [0, n_rows)
    const float* xr = x + (size_t)row * hidden;
    const float inv = row_inv_rms(xr, hidden, eps, scratch);
    uint16_t* orow = out + (size_t)row * hidden;
    for (int d = 2 * threadIdx.x; d < hidden; d += 2 * blockDim.x) {
        uint32_t hi, lo;
        split_pair(w[d] * (xr[d] * inv), w[d + 1] * (xr[d + 1] * inv), hi, lo);
        *reinterpret_cast<uint32_t*>(orow + d) = hi;
        *reinterpret_cast<uint32_t*>(orow + part_stride + d) = lo;
    }
    if (init_dst != nullptr) {
        float* irow = init_dst + (size_t)row * init_cols;
        for (int c = threadIdx.x; c < init_cols; c += blockDim.x)   // c range [0, init_cols)
            irow[c] = init_src ? init_src[c] : 0.f;
    }
}

// ---------------------------------------------------------------- K/V staging

// Entries j < ctl[CTL_CTX_LEN] + ctl[CTL_ROW_OFFSET] + n_rows (all that this pass's rows can see) of one
// layer's K and V, from their arena slots attend_list[j] into the contiguous staged rows, split into hi/lo
// (a bf16 arena: copied as they are). Launch: grid (ceil(stage_cap * hd / 8 / 256), KVH), block 256:
// thread = (entry, 8 dimensions); threads past the visible entries return at once.
extern "C" __global__ void kv_stage(const kv_t* k_layer, const kv_t* v_layer, const int* attend_list, const int* ctl,
                                    int n_rows, int capacity, int head_dim, int stage_cap, uint16_t* k_hi,
                                    uint16_t* k_lo, uint16_t* v_hi, uint16_t* v_lo) {
    const int per_entry = head_dim >> 3;
    const int e = blockIdx.x * blockDim.x + threadIdx.x;      // range [0, stage_cap * per_entry) and beyond
    const int j = e / per_entry, c = e - j * per_entry;
    const int visible = ctl[CTL_CTX_LEN] + ctl[CTL_ROW_OFFSET] + n_rows;
    if (j >= visible || j >= stage_cap) return;
    const int kvh = blockIdx.y;                                // range [0, KVH)
    const size_t src = ((size_t)kvh * capacity + attend_list[j]) * head_dim + 8 * c;
    const size_t dst = ((size_t)kvh * stage_cap + j) * head_dim + 8 * c;
#ifdef KV_BF16
    *reinterpret_cast<uint4*>(k_hi + dst) = __ldg(reinterpret_cast<const uint4*>(k_layer + src));
    *reinterpret_cast<uint4*>(v_hi + dst) = __ldg(reinterpret_cast<const uint4*>(v_layer + src));
#else
    const kv_t* srcs[2] = {k_layer + src, v_layer + src};
    uint16_t* his[2] = {k_hi + dst, v_hi + dst};
    uint16_t* los[2] = {k_lo + dst, v_lo + dst};
#pragma unroll
    for (int kv = 0; kv < 2; ++kv) {
        const float4 a = load_kv4_readonly(srcs[kv]), b = load_kv4_readonly(srcs[kv] + 4);
        uint4 hi, lo;
        split_pair(a.x, a.y, hi.x, lo.x);
        split_pair(a.z, a.w, hi.y, lo.y);
        split_pair(b.x, b.y, hi.z, lo.z);
        split_pair(b.z, b.w, hi.w, lo.w);
        *reinterpret_cast<uint4*>(his[kv]) = hi;
        *reinterpret_cast<uint4*>(los[kv]) = lo;
    }
#endif
}

// ---------------------------------------------------------------- flash attention (attention_flash.cuh)

// Entries by head_dim, K/V stages (1: a block waits for each tile, two blocks per SM overlap; 2: the next
// tile's copy overlaps this one's products), parts (_p1: bf16 products only, above) and heads per warp (_w2: two,
// at most 4 warps of 32 threads for ATTN_MAX_GROUP 8; two blocks per SM: every accumulator in registers, where
// three spilled ~600 bytes per thread).
ATTENTION_FLASH_ENTRY(32, 1, 2, 1, false, , (256))
ATTENTION_FLASH_ENTRY(32, 2, 2, 1, false, , (256))
ATTENTION_FLASH_ENTRY(64, 1, 2, 1, false, , (256))
ATTENTION_FLASH_ENTRY(64, 2, 2, 1, false, , (256))
ATTENTION_FLASH_ENTRY(128, 1, 2, 1, false, , (256))
ATTENTION_FLASH_ENTRY(128, 2, 2, 1, false, , (256))
ATTENTION_FLASH_ENTRY(32, 1, 1, 1, false, _p1, (256))
ATTENTION_FLASH_ENTRY(64, 1, 1, 1, false, _p1, (256))
ATTENTION_FLASH_ENTRY(128, 1, 1, 1, false, _p1, (256))
ATTENTION_FLASH_ENTRY(32, 1, 2, 2, false, _w2, (128, 2))
ATTENTION_FLASH_ENTRY(64, 1, 2, 2, false, _w2, (128, 2))
ATTENTION_FLASH_ENTRY(128, 1, 2, 2, false, _w2, (128, 2))
ATTENTION_FLASH_ENTRY(32, 1, 1, 2, false, _w2_p1, (128, 2))
ATTENTION_FLASH_ENTRY(64, 1, 1, 2, false, _w2_p1, (128, 2))
ATTENTION_FLASH_ENTRY(128, 1, 1, 2, false, _w2_p1, (128, 2))

// ---------------------------------------------------------------- merge

// out[row, h hd + d] (hi) and out[out_part_stride + ...] (lo) = sum_s w_s o_s[d] / sum_s w_s l_s with
// w_s = exp2(m_s - max_s m_s), over the n_splits partial sums of (row, head h).
// Launch: grid (n_rows, Hq), block hd / 2 (each thread two adjacent dimensions).
extern "C" __global__ void attention_flash_merge(const float* part_o, const float* part_ml, uint16_t* out,
                                                 long long out_part_stride, int out_stride, int n_rows,
                                                 int n_q_heads, int head_dim, int n_splits) {
    const int row = blockIdx.x, h = blockIdx.y;                // range [0, n_rows) x [0, Hq)
    const int d = 2 * threadIdx.x;                             // range [0, hd), even
    const size_t stride = (size_t)n_rows * n_q_heads;          // between splits, in (row, head) entries
    const size_t base = (size_t)row * n_q_heads + h;
    float mx = -INFINITY;
    for (int s = 0; s < n_splits; ++s) mx = fmaxf(mx, part_ml[2 * (s * stride + base)]);
    float denom = 0.f, a = 0.f, b = 0.f;
    for (int s = 0; s < n_splits; ++s) {
        const size_t e = s * stride + base;
        const float ms = part_ml[2 * e];
        if (ms == -INFINITY) continue;                         // the split saw nothing of this row
        const float w = exp2f(ms - mx);
        denom += w * part_ml[2 * e + 1];
        const float2 v = *reinterpret_cast<const float2*>(part_o + e * head_dim + d);
        a += w * v.x;
        b += w * v.y;
    }
    const float inv = 1.f / denom;                             // every row sees at least itself: denom > 0
    uint32_t hi, lo;
    split_pair(a * inv, b * inv, hi, lo);
    uint16_t* dst = out + (size_t)row * out_stride + h * head_dim + d;
    *reinterpret_cast<uint32_t*>(dst) = hi;
    *reinterpret_cast<uint32_t*>(dst + out_part_stride) = lo;
}
