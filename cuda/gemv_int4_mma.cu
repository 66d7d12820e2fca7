// gemv_int4_mma.cu: gemv_int4.cu's one-row INT4 projections (every mode, the RMSNorm prologue, gemv_rows.cuh's
// epilogues, the same parameters) with the products on the tensor cores instead of the CUDA cores.
//
// Why: ncu on the 7B decode (2026-12-03, ninth session) found gemv_int4 bound by its instruction issue, not by the
// weights' bytes: DRAM at 19-26% of its peak, SM throughput 53-62%, warps stalled mostly "not selected" and on the
// math pipe, ~4 instructions a weight (a LOP3, a subtraction and an FMA per nibble). Here a lane turns 8 nibbles
// into 4 bf16 pairs with 3 shifts and 4 LOP3 and leaves the 64 products of its share of two mma to the tensor
// cores: under 1 instruction a weight.
//
// Computes   what gemv_int4.cu does, to bf16 hi + lo activations (16 significant bits) instead of fp32 ones:
//            within ~1e-5 of it relative, not bit for bit.
// Layout:    the weights and scales as gemv_int4.cu takes them (model/int4.py's format, no second copy); groups
//            of exactly 128 columns (I4MMA_GROUP; the launcher refuses others), K % 128 == 0.
// The mma:   m16n8k16 with the activations as A and the weights as B: A's rows 0 and 1 are the hi and lo parts of
//            the one activation row (rows 2-15 zero), B's 8 columns are the item's 8 weight rows (gemv_row), so
//            D[0][n] + D[1][n] is row n's sum. A dot product allows any order of its columns that both operands
//            share: lane t (quad lane j = t % 4) loads the 16 bytes 16 j .. 16 j + 15 of its row's 64-byte group
//            block, word u = columns 32 j + 8 u .. + 7 (nibble e = column + e). Its B pairs for mma (u, h) are
//            the nibbles (2h, 2h + 4) and (2h + 1, 2h + 5) of word u, read in place by one LOP3 each
//            (mma_int4.cuh's biased_nibbles_to_bf16x2: the bf16 of 128 + nibble); the staged A pairs hold the
//            same columns' activations (i4mma_stage). Each group's 8 mma therefore sum (nibble + 128) v over its 128
//            columns; the group's correction subtracts 136 * sum(v) (q = nibble - 8), then the scale multiplies.
// Grid:      a block per 8-row item, as gemv_int4; its 8 warps split the item's K by groups (warp w: groups w,
//            w + 8, ...), I4MMA_LOADS groups of loads in flight per lane, then the block adds the 8 partials per
//            row in a fixed order. Dynamic shared memory: K / 128 x (128 words + 4 floats).
// PDL:       the first batch of weight and scale loads is issued before griddep_wait (they depend on nothing).
// Status:    written 2026-12-03 (ninth session) after the device time; compiled for sm_90 here, not yet run on a
//            GPU. KernelPlan.int4_decode_tensor_cores (off).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include "gemv_rows.cuh"
#include "gemv_int4_params.cuh"
#include "mma_int4.cuh"

#define I4MMA_GROUP 128          // columns per scale group: 4 quad lanes x 32 columns
#define I4MMA_GROUP_WORDS 128    // staged 32-bit words per group: 2 activation rows (hi, lo) x 64 bf16 pairs
#define I4MMA_LOADS 4            // groups a lane has in flight per batch
#define I4MMA_BIAS 136.f         // a staged weight is nibble + 128 = q + 136

// Stage v = x (or x * norm_w) as bf16 hi / lo pairs, row 0 (hi) then row 1 (lo) of each group, and
// per half group the fp32 sums of the hi and of the lo values (sums[(g 2 + half) 2 + row]). Returns the RMSNorm
// factor rsqrt(mean(x^2) + eps), or 1 without norm_w; ends with a barrier that publishes both arrays.
__device__ __forceinline__ float i4mma_stage(const float* x, const float* norm_w, float eps, int K, uint32_t* pairs,
                                            float* sums, float* scratch) {
    float ss = 0.f;
    // Word w = ((j 4 + u) 2 + h) 2 + p of a group's row holds columns (c, c + 4), c = 32 j + 8 u + 2 h + p: the pair
    // quad lane j reads as A register p of mma (u, h), matching its B pairs. One word a thread; a warp: half a group
    // (K % 128 == 0, so the loop's bound is warp-uniform and warp_sum below sees whole warps).
    for (int i = threadIdx.x; i < (K >> 1); i += GEMV_THREADS) {
        const int g = i >> 6, w = i & 63;
        const int c = g * I4MMA_GROUP + 32 * (w >> 4) + 8 * ((w >> 2) & 3) + 2 * ((w >> 1) & 1) + (w & 1);
        float a = LOAD_GRID_WRITTEN(x + c), b = LOAD_GRID_WRITTEN(x + c + 4);
        if (norm_w != nullptr) {
            ss += a * a + b * b;
            a *= norm_w[c];
            b *= norm_w[c + 4];
        }
        const float ha = __bfloat162float(__float2bfloat16_rn(a)), hb = __bfloat162float(__float2bfloat16_rn(b));
        const float la = a - ha, lb = b - hb;
        pairs[g * I4MMA_GROUP_WORDS + w] = pack_bf16x2(ha, hb);
        pairs[g * I4MMA_GROUP_WORDS + 64 + w] = pack_bf16x2(la, lb);
        // the sums of the values the mma multiplies: the lo part as bf16 rounds it
        const float hi_sum = warp_sum(ha + hb);
        const float lo_sum = warp_sum(__bfloat162float(__float2bfloat16_rn(la)) +
                                      __bfloat162float(__float2bfloat16_rn(lb)));
        if ((threadIdx.x & 31) == 0) {
            const int half = (w >> 5);
            sums[(g * 2 + half) * 2] = hi_sum;
            sums[(g * 2 + half) * 2 + 1] = lo_sum;
        }
    }
    if (norm_w != nullptr) return rsqrtf(block_sum(ss, scratch) / (float)K + eps);   // barriers publish the arrays
    __syncthreads();
    return 1.f;
}

// What a lane streams: its B row's packed bytes (quad lane j's 16 of each group block), and the scales of the two
// rows whose sums its D entries hold (rows 2 j and 2 j + 1 of the item).
struct I4MmaLane {
    const uint8_t* q;
    const uint16_t* s0;
    const uint16_t* s1;
    bool q_ok, s0_ok, s1_ok;
};

// Batch `first` (groups first + 8 u, u < I4MMA_LOADS) of a lane: its weight words and its two scales (zeros past
// K or the matrix).
__device__ __forceinline__ void i4mma_loads(const I4MmaLane& L, int first, int groups, uint4 (&w)[I4MMA_LOADS],
                                            float (&s0)[I4MMA_LOADS], float (&s1)[I4MMA_LOADS]) {
    const int j = threadIdx.x & 3;
#pragma unroll
    for (int u = 0; u < I4MMA_LOADS; ++u) {
        const int g = first + 8 * u;
        const bool in = g < groups;
        w[u] = (in && L.q_ok) ? load_weights16(reinterpret_cast<const uint16_t*>(L.q + 64 * g + 16 * j))
                              : make_uint4(0u, 0u, 0u, 0u);
        s0[u] = (in && L.s0_ok) ? __half2float(__ushort_as_half(__ldg(L.s0 + g))) : 0.f;
        s1[u] = (in && L.s1_ok) ? __half2float(__ushort_as_half(__ldg(L.s1 + g))) : 0.f;
    }
}

// One group: 8 mma of the lane's 16-byte weight block against the staged pairs (A rows 0 and 1; other lanes give
// zero rows), then acc += s (D - 136 sum(v)) for the lane's two D columns.
__device__ __forceinline__ void i4mma_group(const uint4& wq, float s0, float s1, const uint32_t* pairs,
                                            const float* sums, int g, float& acc0, float& acc1) {
    const int lane = threadIdx.x & 31, m = lane >> 2, j = lane & 3;
    uint32_t a[16];
    if (m < 2) {
        const uint4* src = reinterpret_cast<const uint4*>(pairs + g * I4MMA_GROUP_WORDS + m * 64 + j * 16);
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            const uint4 v = src[q];
            a[4 * q] = v.x; a[4 * q + 1] = v.y; a[4 * q + 2] = v.z; a[4 * q + 3] = v.w;
        }
    } else {
#pragma unroll
        for (int q = 0; q < 16; ++q) a[q] = 0u;
    }
    const uint32_t words[4] = {wq.x, wq.y, wq.z, wq.w};
    float d[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int u = 0; u < 4; ++u) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const uint32_t b0 = biased_nibbles_to_bf16x2(words[u] >> (8 * h));             // nibbles 2h, 2h + 4
            const uint32_t b1 = biased_nibbles_to_bf16x2(words[u] >> (8 * h + 4));         // 2h + 1, 2h + 5
            mma_bf16_16816(d, a[(u * 2 + h) * 2], 0u, a[(u * 2 + h) * 2 + 1], 0u, b0, b1);
        }
    }
    const float v_sum = m < 2 ? sums[g * 4 + m] + sums[g * 4 + 2 + m] : 0.f;
    acc0 = fmaf(s0, fmaf(-I4MMA_BIAS, v_sum, d[0]), acc0);
    acc1 = fmaf(s1, fmaf(-I4MMA_BIAS, v_sum, d[1]), acc1);
}

// uint4: the staged pairs are read 16 bytes at a time, so the array is declared with that alignment.
extern __shared__ uint4 i4mma_smem[];

GEMV_INT4_ENTRY(gemv_int4_mma) {
    __shared__ float part[GEMV_WARPS][GEMV_WARPS];
    __shared__ float row_sum[GEMV_WARPS];
    __shared__ float scratch[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, j = lane & 3, item = blockIdx.x;
    const int groups = K / I4MMA_GROUP;
    auto row_of = [&](int r) { return gemv_row(mode, item, r); };
    const int rb = row_of(lane >> 2), r0 = row_of(2 * j), r1 = row_of(2 * j + 1);
    const I4MmaLane L{Wq + (size_t)(rb < rows ? rb : 0) * (K >> 1),
                      scales + (size_t)(r0 < rows ? r0 : 0) * groups, scales + (size_t)(r1 < rows ? r1 : 0) * groups,
                      rb < rows, r0 < rows, r1 < rows};
    uint4 w[I4MMA_LOADS];
    float s0[I4MMA_LOADS], s1[I4MMA_LOADS];
    i4mma_loads(L, warp, groups, w, s0, s1);
    griddep_wait();                                             // x (and the tables) come from earlier kernels
    griddep_launch_dependents();
    uint32_t* pairs = reinterpret_cast<uint32_t*>(i4mma_smem);
    float* sums = reinterpret_cast<float*>(pairs + groups * I4MMA_GROUP_WORDS);
    const float scale = i4mma_stage(x, norm_w, eps, K, pairs, sums, scratch);
    float acc0 = 0.f, acc1 = 0.f;
    for (int first = warp; first < groups; first += 8 * I4MMA_LOADS) {   // warp-uniform: every lane runs each mma
        uint4 w_next[I4MMA_LOADS];
        float s0_next[I4MMA_LOADS], s1_next[I4MMA_LOADS];
        i4mma_loads(L, first + 8 * I4MMA_LOADS, groups, w_next, s0_next, s1_next);
#pragma unroll
        for (int u = 0; u < I4MMA_LOADS; ++u) {
            if (first + 8 * u < groups) i4mma_group(w[u], s0[u], s1[u], pairs, sums, first + 8 * u, acc0, acc1);
        }
#pragma unroll
        for (int u = 0; u < I4MMA_LOADS; ++u) {
            w[u] = w_next[u];
            s0[u] = s0_next[u];
            s1[u] = s1_next[u];
        }
    }
    acc0 += __shfl_down_sync(0xffffffffu, acc0, 4);             // D row 1 (the lo part) onto row 0's lanes
    acc1 += __shfl_down_sync(0xffffffffu, acc1, 4);
    if (lane < 4) {
        part[warp][2 * j] = acc0;
        part[warp][2 * j + 1] = acc1;
    }
    __syncthreads();
    if (threadIdx.x < GEMV_WARPS) {                             // the warps' K shares in a fixed order
        float t = 0.f;
#pragma unroll
        for (int v = 0; v < GEMV_WARPS; ++v) t += part[v][threadIdx.x];
        row_sum[threadIdx.x] = t * scale;
    }
    __syncthreads();
    const RopeTarget rt{pos_table, slot_table, ctl, inv_freq, k_cache, v_cache, n_q_heads, n_kv_heads, head_dim,
                        capacity};
    gemv_epilogue(mode, item, row_sum, bias, out, out_cols, rows, rt);
}
