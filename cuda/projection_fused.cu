// projection_fused.cu: y = x @ W^T for bf16 weights (fp32 activations, fp32 accumulation) with the
// neighbouring small steps of a decoder layer folded into the same launch.
//
// Not launched by the engine since gemv.cu took the one-row projections (1.4x faster on the H200,
// notes/cuda_notes.md, issue 10 runs 5-7); compiled on demand (cuda_kernels.ON_DEMAND_FAMILIES) for
// bench/gemv_probe.py's comparison and its tests.
//
// Computes   acc[n, r] = sum_k W[r, k] * v[n, k]      r in [0, rows), n in [0, n_tokens)
//            v = x                         when norm_w == NULL
//            v = x * norm_w, s[n] = rsqrt(mean_k x[n,k]^2 + eps)   otherwise (RMSNorm prologue:
//            the block computes s for its own tokens, the epilogue scales by it, so
//            s[n] * acc[n, r] = (rmsnorm(x[n]) * norm_w) . W[r]).
//            Tensor cores (mma.sync m16n8k16) with v split into bf16 halves hi + lo, as
//            projection_bf16 did: ~16 mantissa bits of the activations survive.
//            Epilogue by `mode` (val = s[n] * acc[n, r]):
//              STORE    (0): out[n, r]  = val + (bias ? bias[r] : 0)                  kb == 1
//              ADD      (1): out[n, r] += val   (atomicAdd when kb > 1: residual stream)
//              SWIGLU   (2): W rows gate/up interleaved in blocks of 8 (tile t: rows 16t..16t+7 =
//                            gate 8t..8t+7, rows 16t+8..16t+15 = up 8t..8t+7):
//                            out[n, 8t + g] = silu(val_gate) * val_up                  kb == 1
//              QKV_ROPE (3): W is the q/k/v weight with its rows reordered by
//                            kernel_reference.qkv_rope_row_order so that rows g and g+8 of a
//                            tile are the RoPE pair (j, j + hd/2) of one head; then, with
//                            call-table row t = ctl[CTL_ROW_OFFSET] + n, p = pos_table[t],
//                            slot = slot_table[t], bias in natural q|k|v column order:
//                              q head: out[n, h*hd + j], out[n, h*hd + j + hd/2] = RoPE(val + bias)
//                              k head: k_cache[kvh, slot, j], [.., j + hd/2]    = RoPE(val + bias)
//                              v rows: v_cache[kvh, slot, d]                    = val + bias
//                            (HF rotate_half; angle = float(p) * inv_freq[j] in fp32)      kb == 1
//
// Layouts:   W [rows, K] row-major bf16 bits; x [n_tokens, x_stride] float32; norm_w [K] float32;
//            out [n_tokens, out_stride] float32; k_cache, v_cache: one layer's [KVH, capacity, hd] kv_t (kv_store.cuh).
// Launch:    grid (n_tiles = ceil(rows / 16), kb, ceil(n_tokens / (8 NT))), block 32 * WK threads,
//            WK in [1, 16]. Block (tile, kpart, token group) owns 16 rows of W and the K steps
//            [kpart * n_steps / kb, (kpart + 1) * n_steps / kb) (n_steps = K / 32); its WK warps
//            split that range again and add their partial tiles in shared memory, so only
//            MODE_ADD with kb > 1 needs atomics. NT (1, 2, 4) token tiles of 8 share every weight
//            fragment: a 32-token prefill streams W once.
// Loads:     lane (g, t) loads 16 bytes (8 bf16) of rows g and g+8 per 32-wide K step, in batches
//            of 4 steps (8 x 16 B in flight). The K order inside a step is permuted identically for weights and
//            activations (a dot product allows it): lane (g, t) holds physical
//            k = k0 + 8t .. k0 + 8t + 7, feeding logical k {2t, 2t+1, 2t+8, 2t+9} of two mma.
// PDL:       the first batch of weight loads is issued before griddep_wait (common.cuh), so a
//            programmatic launch streams weights while the kernel before it finishes.
// Preconditions: K % 32 == 0; x_stride % 8 == 0; WK <= 16; head_dim even (QKV_ROPE); norm_w
//            only with n_tokens <= 8 * NT per block (the prologue reads each token's whole row).
#include "common.cuh"
#include "qkv_rope.cuh"
#include "mma_bf16.cuh"

#define FUSED_MAX_WARPS 16
#define FUSED_UNROLL 4

template <int NT>
__device__ __forceinline__ void k_step(float (&acc)[NT][4], const uint4& wa, const uint4& wb, const float* x,
                                       const float* norm_w, int x_stride, int tok_base, int g, int n_tokens, int k) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
        const int n = tok_base + nt * 8 + g;          // token of this lane's B column
        float v[8];
        if (n < n_tokens) {
            load_activations8(x + (size_t)n * x_stride + k, v);
            if (norm_w != nullptr) {
                const float4* ws = reinterpret_cast<const float4*>(norm_w + k);
                const float4 q0 = __ldg(ws), q1 = __ldg(ws + 1);
                v[0] *= q0.x; v[1] *= q0.y; v[2] *= q0.z; v[3] *= q0.w;
                v[4] *= q1.x; v[5] *= q1.y; v[6] *= q1.z; v[7] *= q1.w;
            }
        } else {
#pragma unroll
            for (int e = 0; e < 8; ++e) v[e] = 0.f;
        }
        uint32_t hi[4], lo[4];
        split_activations(v, hi, lo);
        mma_bf16_16816(acc[nt], wa.x, wb.x, wa.y, wb.y, hi[0], hi[1]);
        mma_bf16_16816(acc[nt], wa.x, wb.x, wa.y, wb.y, lo[0], lo[1]);
        mma_bf16_16816(acc[nt], wa.z, wb.z, wa.w, wb.w, hi[2], hi[3]);
        mma_bf16_16816(acc[nt], wa.z, wb.z, wa.w, wb.w, lo[2], lo[3]);
    }
}

template <int NT>
__device__ void fused_body(const uint16_t* __restrict__ W, const float* __restrict__ x, int x_stride,
                           const float* __restrict__ norm_w, float eps, const float* __restrict__ bias, float* out,
                           int out_stride, int out_cols, int rows, int K, int n_tokens, int mode, const RopeTarget& rt) {
    __shared__ float red[FUSED_MAX_WARPS - 1][NT * 4][32];     // partial tiles of warps 1 .. WK-1
    __shared__ float sumsq[FUSED_MAX_WARPS][8 * NT];            // RMSNorm: each warp's share of sum x^2 per token
    const int lane = threadIdx.x & 31;                          // range [0, 32)
    const int warp = threadIdx.x >> 5;                          // range [0, WK)
    const int n_warps = blockDim.x >> 5;
    const int tile = blockIdx.x;                                // range [0, ceil(rows / 16))
    const int kpart = blockIdx.y;                               // range [0, kb)
    const int kb = gridDim.y;
    const int tok_base = blockIdx.z * 8 * NT;                   // first token of this block
    const int g = lane >> 2;                                    // range [0, 8): row in tile / token in tile
    const int t = lane & 3;                                     // range [0, 4): k group / token pair

    const int row_a = tile * 16 + g, row_b = row_a + 8;
    const bool ok_a = row_a < rows, ok_b = row_b < rows;
    const uint16_t* wa_row = W + (size_t)(ok_a ? row_a : 0) * K;
    const uint16_t* wb_row = W + (size_t)(ok_b ? row_b : 0) * K;
    const int n_steps = K >> 5;                                 // 32-wide K steps
    const int blk_begin = (int)(((long long)kpart * n_steps) / kb);
    const int blk_len = (int)(((long long)(kpart + 1) * n_steps) / kb) - blk_begin;
    const int s_begin = blk_begin + (warp * blk_len) / n_warps;
    const int s_end = blk_begin + ((warp + 1) * blk_len) / n_warps;
    const uint4 zero = make_uint4(0u, 0u, 0u, 0u);

    // Weights never depend on an earlier kernel: load this warp's first batch before waiting for
    // the kernel that writes x (programmatic dependent launch), so the weight stream of this launch
    // overlaps the tail of the previous one. An ordinary launch waits for nothing here.
    const int n_first = min(FUSED_UNROLL, s_end - s_begin);
    uint4 wa0[FUSED_UNROLL], wb0[FUSED_UNROLL];
#pragma unroll
    for (int u = 0; u < FUSED_UNROLL; ++u) {
        const int k = (s_begin + u) * 32 + t * 8;
        wa0[u] = (u < n_first && ok_a) ? load_weights16(wa_row + k) : zero;
        wb0[u] = (u < n_first && ok_b) ? load_weights16(wb_row + k) : zero;
    }
    griddep_wait();
    griddep_launch_dependents();

    // Every warp sums x^2 over its own slice of K for each token (a 1-row decode call would otherwise
    // leave one warp walking the whole row while the rest wait at the barrier below).
    const int n_here = min(8 * NT, n_tokens - tok_base);
    if (norm_w != nullptr) {
        const int k4 = K >> 2;
        const int per_warp = (k4 + n_warps - 1) / n_warps;
        const int c_end = min(k4, (warp + 1) * per_warp);
        for (int tk = 0; tk < n_here; ++tk) {
            const float4* xr = reinterpret_cast<const float4*>(x + (size_t)(tok_base + tk) * x_stride);
            float ss = 0.f;
            for (int c = warp * per_warp + lane; c < c_end; c += 32) {   // c range [0, K/4)
                const float4 v = xr[c];
                ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
            }
            ss = warp_sum(ss);
            if (lane == 0) sumsq[warp][tk] = ss;
        }
    }

    float acc[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;

    // The first batch (loaded before griddep_wait), then load-and-use batches. (Keeping the next batch's
    // loads in flight during this batch's mma, a software pipeline, measured 1.4x slower on the H200:
    // notes/cuda_notes.md, issue 10 run 3.)
#pragma unroll
    for (int u = 0; u < FUSED_UNROLL; ++u)
        if (u < n_first)
            k_step<NT>(acc, wa0[u], wb0[u], x, norm_w, x_stride, tok_base, g, n_tokens, (s_begin + u) * 32 + t * 8);
    int s = s_begin + n_first;
    for (; s + FUSED_UNROLL <= s_end; s += FUSED_UNROLL) {
        uint4 wa[FUSED_UNROLL], wb[FUSED_UNROLL];
#pragma unroll
        for (int u = 0; u < FUSED_UNROLL; ++u) {
            const int k = (s + u) * 32 + t * 8;
            wa[u] = ok_a ? load_weights16(wa_row + k) : zero;
            wb[u] = ok_b ? load_weights16(wb_row + k) : zero;
        }
#pragma unroll
        for (int u = 0; u < FUSED_UNROLL; ++u)
            k_step<NT>(acc, wa[u], wb[u], x, norm_w, x_stride, tok_base, g, n_tokens, (s + u) * 32 + t * 8);
    }
    for (; s < s_end; ++s) {
        const int k = s * 32 + t * 8;
        const uint4 wa = ok_a ? load_weights16(wa_row + k) : zero;
        const uint4 wb = ok_b ? load_weights16(wb_row + k) : zero;
        k_step<NT>(acc, wa, wb, x, norm_w, x_stride, tok_base, g, n_tokens, k);
    }

    // Add the warps' partial tiles: warps 1.. park theirs in shared memory, warp 0 sums and stores.
    if (warp > 0) {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) red[warp - 1][nt * 4 + e][lane] = acc[nt][e];
    }
    __syncthreads();                                            // also publishes sumsq
    if (warp != 0) return;
    for (int w = 1; w < n_warps; ++w) {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[nt][e] += red[w - 1][nt * 4 + e][lane];
    }

    // acc[nt][0..1]: row_a, tokens n0, n0+1; acc[nt][2..3]: row_b, same tokens.
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
        const int n0 = tok_base + nt * 8 + 2 * t;
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            const int n = n0 + j;
            if (n >= n_tokens) continue;
            float scale = 1.f;                                  // RMSNorm scale of token n
            if (norm_w != nullptr) {
                float ss = 0.f;
                for (int w = 0; w < n_warps; ++w) ss += sumsq[w][n - tok_base];
                scale = rsqrtf(ss / (float)K + eps);
            }
            const float va = acc[nt][j] * scale, vb = acc[nt][2 + j] * scale;
            float* orow = out + (size_t)n * out_stride;
            if (mode == PMODE_QKV_ROPE) {
                qkv_rope_epilogue(rt, bias, out, out_stride, tile, g, n, va, vb);
            } else if (mode == PMODE_SWIGLU) {
                const int col = tile * 8 + g;
                if (col < out_cols) orow[col] = silu(va) * vb;
            } else if (mode == PMODE_STORE) {
                if (ok_a && row_a < out_cols) orow[row_a] = va + (bias ? bias[row_a] : 0.f);
                if (ok_b && row_b < out_cols) orow[row_b] = vb + (bias ? bias[row_b] : 0.f);
            } else if (kb > 1) {
                if (ok_a && row_a < out_cols) atomicAdd(orow + row_a, va);
                if (ok_b && row_b < out_cols) atomicAdd(orow + row_b, vb);
            } else {
                if (ok_a && row_a < out_cols) orow[row_a] += va;
                if (ok_b && row_b < out_cols) orow[row_b] += vb;
            }
        }
    }
}

#define FUSED_ENTRY(NT)                                                                                        \
    extern "C" __global__ void __launch_bounds__(FUSED_MAX_WARPS * 32) projection_fused_nt##NT(              \
        const uint16_t* W, const float* x, int x_stride, const float* norm_w, float eps, const float* bias,    \
        float* out, int out_stride, int out_cols, int rows, int K, int n_tokens, int mode,                     \
        const int* pos_table, const int* slot_table, const int* ctl, const float* inv_freq, kv_t* k_cache,     \
        kv_t* v_cache, int n_q_heads, int n_kv_heads, int head_dim, int capacity) {                           \
        const RopeTarget rt{pos_table, slot_table, ctl, inv_freq, k_cache, v_cache,                            \
                            n_q_heads, n_kv_heads, head_dim, capacity};                                        \
        fused_body<NT>(W, x, x_stride, norm_w, eps, bias, out, out_stride, out_cols, rows, K, n_tokens, mode, rt); \
    }

FUSED_ENTRY(1)
FUSED_ENTRY(2)
FUSED_ENTRY(4)
