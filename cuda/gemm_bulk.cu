// gemm_bulk.cu: y = x @ W^T over many activation rows (the bulk prefill: a reconciler's multi-frame
// step, a RoPE re-base, a full recompute) as a tiled tensor-core GEMM.
//
// Why:       the prefill projections of projection_staged.cu stream every weight once per call for
//            at most 32 rows; a forward over hundreds of rows re-streamed the 2.6 GB of weights every
//            128 rows and multiplied on far fewer than the chip's tensor cores (the H200 rebuilt at
//            ~0.1 ms per token, 75-135 us per token in a full recompute). Here a block owns a BM x 128
//            output tile and walks K through shared memory, so every weight byte feeds BM rows.
// Computes   acc[m, n] = sum_k x[m, k] W[n, k]   for m < M activation rows and n < N weight rows, in
//            fp32, where x = x_hi + x_lo (PARTS 2: the activations as two bf16 matrices, ~16 mantissa
//            bits, the precision of the other prefill kernels) or x_hi alone (PARTS 1: bf16 activations,
//            as HF runs a bf16 model); W holds the bf16 weights exactly. Epilogue by mode:
//              ADD     out_f[m, n] += acc   (atomicAdd when k_split > 1 blocks share the K range)
//              STORE   out_f[m, n] = acc + (bias ? bias[n] : 0)
//              SWIGLU  W's rows are gate/up interleaved in blocks of 8 (cuda_backend.py); output column
//                      c = 8 q + i (i < 8) is silu(acc[m, 16 q + i]) * acc[m, 16 q + 8 + i], written as
//                      bf16 hi/lo (split_pair) into out_h: the down projection's activations.
// Layouts:   x_hi [M, lda] bf16 bits, x_lo at x_hi + a_part_stride; W [N, K] bf16 bits (HF [out, in]);
//            out_f [M, ldo] float32; out_h [M, ldo] bf16 bits, the lo parts at out_h + o_part_stride.
// Launch:    grid (ceil(M / 128), ceil(N / 128), k_split), block 256 = 2 (m) x 4 (n) warps, each a 64 x 32
//            tile of m16n8k16 mma.sync; dynamic shared memory GB_STAGES * (PARTS * 128 + 128) * GB_ROW * 2
//            bytes. blockIdx.x (the M tile) varies fastest, so the blocks that read one weight tile run at the
//            same time and share it through L2. (The template takes other block shapes; the entries below
//            are the one measured fastest.)
// Pipeline:  32 columns of K per stage, GB_STAGES stages of cp.async copies in flight; each k16 step's
//            fragments are loaded before the previous step's products are issued. Tiles are stored
//            [rows][GB_ROW]: 8 bf16 of padding make a row 80 bytes, so the 8 row addresses of an ldmatrix
//            fall in 8 different 16-byte bank groups (5 groups apart, all distinct mod 8).
// Preconditions (the launcher checks them): K % 32 == 0; lda, ldo and both part strides multiples of 8
//            (16-byte rows); STORE/ADD out_cols even; SWIGLU with k_split 1, N % 16 == 0 and out_cols even.
#include "common.cuh"
#include "mma_bf16.cuh"
#include "mma_tiles.cuh"
#include "gemm_epilogue.cuh"

#define GB_BM 128
#define GB_BN 128
#define GB_BK 32
#define GB_ROW 40
#define GB_STAGES 3
#define GB_THREADS 256

template <int BM, int WM, int WN, int PARTS, int STAGES>
__device__ __forceinline__ void gemm_bulk(const uint16_t* __restrict__ x, long long a_part_stride, int lda,
                                          const uint16_t* __restrict__ W, const float* __restrict__ bias,
                                          float* out_f, uint16_t* out_h, long long o_part_stride, int ldo, int M,
                                          int N, int K, int out_cols, int mode, int k_split) {
    constexpr int THREADS = 32 * WM * WN;
    constexpr int WROWS = BM / WM, WCOLS = GB_BN / WN;         // a warp's tile
    constexpr int MT = WROWS / 16;                             // m16 tiles per warp
    constexpr int NT = WCOLS / 8;                              // n8 tiles per warp (pairs for the SwiGLU epilogue)
    constexpr int A_TILE = BM * GB_ROW;                        // bf16 per part per stage
    constexpr int B_TILE = GB_BN * GB_ROW;
    constexpr int STAGE = PARTS * A_TILE + B_TILE;
    extern __shared__ uint4 smem_gemm[];
    uint16_t* smem = reinterpret_cast<uint16_t*>(smem_gemm);

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;                     // mma fragment coordinates
    const int wm = warp / WN, wn = warp % WN;                  // range [0, WM) x [0, WN)
    const int m0 = blockIdx.x * BM, n0 = blockIdx.y * GB_BN;
    const int n_steps = K / GB_BK;
    const int s_begin = (int)(((long long)blockIdx.z * n_steps) / k_split);
    const int s_end = (int)(((long long)(blockIdx.z + 1) * n_steps) / k_split);
    const int n_k = s_end - s_begin;

    // One stage: the A tiles (BM rows x 32 columns: 4 copies of 16 bytes per row) of each part and the
    // W tile (128 rows x 32). Rows past M or N land as zeros (their products add nothing).
    auto load_stage = [&](int buf, int step) {
        uint16_t* st = smem + buf * STAGE;
        const int k0 = step * GB_BK;
#pragma unroll
        for (int p = 0; p < PARTS; ++p) {
            for (int c = threadIdx.x; c < BM * 4; c += THREADS) {
                const int r = c >> 2, ch = c & 3;
                const bool ok = m0 + r < M;
                const uint16_t* src = x + p * a_part_stride + (size_t)(ok ? m0 + r : 0) * lda + k0 + ch * 8;
                cp_async16(st + p * A_TILE + r * GB_ROW + ch * 8, src, ok ? 16 : 0);
            }
        }
        for (int c = threadIdx.x; c < GB_BN * 4; c += THREADS) {
            const int r = c >> 2, ch = c & 3;
            const bool ok = n0 + r < N;
            const uint16_t* src = W + (size_t)(ok ? n0 + r : 0) * K + k0 + ch * 8;
            cp_async16(st + PARTS * A_TILE + r * GB_ROW + ch * 8, src, ok ? 16 : 0);
        }
    };
    // The fragments of one k16 step of stage `st` for this warp's tile.
    auto load_fragments = [&](const uint16_t* st, int ks, uint32_t (&a)[PARTS][MT][4], uint32_t (&b)[NT / 2][4]) {
#pragma unroll
        for (int p = 0; p < PARTS; ++p)
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
                ldmatrix_x4(a[p][mt], a_fragment_row(st + p * A_TILE + (wm * WROWS + mt * 16) * GB_ROW + ks * 16,
                                                     GB_ROW, lane));
#pragma unroll
        for (int q = 0; q < NT / 2; ++q)
            ldmatrix_x4(b[q], b_fragment_row(st + PARTS * A_TILE + (wn * WCOLS + q * 16) * GB_ROW + ks * 16,
                                             GB_ROW, lane));
    };

    float acc[MT][NT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) acc[mt][nt][0] = acc[mt][nt][1] = acc[mt][nt][2] = acc[mt][nt][3] = 0.f;

#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < n_k) load_stage(s, s_begin + s);
        cp_async_commit();                                     // an empty group keeps the count uniform
    }
    uint32_t a[2][PARTS][MT][4], b[2][NT / 2][4];              // fragments of two k16 steps: one loads, one multiplies
    for (int kt = 0; kt < n_k; ++kt) {
        cp_async_wait<STAGES - 2>();                           // this thread's copies of stage kt landed
        __syncthreads();                                       // everyone's; and stage kt - 1 is read by all
        const int next = kt + STAGES - 1;
        if (next < n_k) load_stage(next % STAGES, s_begin + next);   // into stage kt - 1's buffer
        cp_async_commit();
        const uint16_t* st = smem + (kt % STAGES) * STAGE;
        load_fragments(st, 0, a[0], b[0]);
#pragma unroll
        for (int ks = 0; ks < GB_BK / 16; ++ks) {
            if (ks + 1 < GB_BK / 16) load_fragments(st, ks + 1, a[(ks + 1) & 1], b[(ks + 1) & 1]);
            // parts outermost: consecutive products go to different accumulators
#pragma unroll
            for (int p = 0; p < PARTS; ++p)
#pragma unroll
                for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                    for (int nt = 0; nt < NT; ++nt)
                        mma_bf16_16816(acc[mt][nt], a[ks & 1][p][mt][0], a[ks & 1][p][mt][1], a[ks & 1][p][mt][2],
                                       a[ks & 1][p][mt][3], b[ks & 1][nt >> 1][2 * (nt & 1)],
                                       b[ks & 1][nt >> 1][2 * (nt & 1) + 1]);
        }
    }
    cp_async_wait<0>();                                        // only empty groups can be left: none in flight

    // acc[mt][nt][2 r + e]: row m0 + wm WROWS + 16 mt + g + 8 r, column n0 + wn WCOLS + 8 nt + 2 t + e.
    store_gemm_tile<MT, NT>(acc, m0 + wm * WROWS + g, n0 + wn * WCOLS, t, M, out_cols, mode, k_split, bias, out_f,
                            out_h, o_part_stride, ldo);
}

// Entries by activation parts: 128 rows x 128 columns per block, 2 x 4 warps of 64 x 32, 3 stages (90 KB of
// shared memory with 2 parts), two blocks per SM. Measured on the H200 (notes/cuda_notes.md, issue 20 run 2)
// against 4 stages at one block per SM, 64-row blocks, and 2 x 2 warps of 64 x 64: the fastest forward at every
// row count from 64 to 1024 (the others 3-10% slower), up to 161 TFLOP/s of useful products (2 parts).
#define GEMM_BULK_ENTRY(PARTS)                                                                                \
    extern "C" __global__ void __launch_bounds__(GB_THREADS, 2) gemm_bulk_p##PARTS(                           \
            const uint16_t* x, long long a_part_stride, int lda, const uint16_t* W, const float* bias,         \
            float* out_f, uint16_t* out_h, long long o_part_stride, int ldo, int M, int N, int K, int out_cols, \
            int mode, int k_split) {                                                                          \
        gemm_bulk<GB_BM, 2, 4, PARTS, GB_STAGES>(x, a_part_stride, lda, W, bias, out_f, out_h, o_part_stride,  \
                                                  ldo, M, N, K, out_cols, mode, k_split);                     \
    }
GEMM_BULK_ENTRY(2)
GEMM_BULK_ENTRY(1)
