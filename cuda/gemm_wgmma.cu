// gemm_wgmma.cu: the bulk prefill's GEMM (gemm_bulk.cu's arguments, modes and epilogue) on Hopper's
// warpgroup matrix products (wgmma, sm_90a only).
//
// Why:       gemm_bulk.cu's mma.sync tiles reach ~300 TFLOP/s as executed on the H200, ~40% of what
//            the chip's bf16 products reach; a bulk forward (a reconciler step of many frames, a full
//            recompute) spends most of its time there. wgmma multiplies a 64 x N x 16 product per
//            instruction straight from shared memory, with no ldmatrix fragments in between.
// Computes   acc[m, n] = sum_k x[m, k] W[n, k] in fp32, x = x_hi + x_lo (PARTS 2) or x_hi (PARTS 1),
//            then store_gemm_tile (gemm_epilogue.cuh): ADD / STORE / SWIGLU exactly as gemm_bulk.cu.
// Layouts:   as gemm_bulk.cu: x_hi [M, lda] bf16 bits, x_lo at x_hi + a_part_stride; W [N, K] bf16 bits;
//            out_f [M, ldo] float32; out_h [M, ldo] bf16 bits, lo parts at out_h + o_part_stride.
// Launch:    grid (ceil(M / 128), ceil(N / BN), k_split), block 256 = two warpgroups, warpgroup w the rows
//            64 w .. 64 w + 63 of the block's 128 x BN tile; dynamic shared memory
//            STAGES * (PARTS * 128 + BN) * 64 * 2 + 1024 bytes (the extra KB aligns the tiles to 1 KB).
// Pipeline:  64 columns of K per stage, stored with the 128-byte swizzle (wgmma_ops.cuh) by cp.async
//            copies of all 256 threads; AHEAD = STAGES - 1 - WAIT stages are in flight while one is
//            multiplied, and a warpgroup keeps WAIT batches of products in flight across the barrier
//            (WAIT 1: a buffer is refilled two iterations after its products were issued, WAIT 0: one).
// Preconditions (the launcher checks them): K, lda and both part strides multiples of 8 (16-byte
//            chunks; a K tail inside the last stage lands as zeros); STORE/ADD out_cols even; SWIGLU
//            with k_split 1, N % 16 == 0 and out_cols even.
#include "common.cuh"
#include "mma_tiles.cuh"
#include "gemm_epilogue.cuh"
#include "wgmma_ops.cuh"

#define GW_BM 128
#define GW_BK 64
#define GW_THREADS 256

template <int BN, int PARTS, int STAGES, int WAIT>   // BN: 128 (the one wgmma shape wgmma_ops.cuh wraps)
__device__ __forceinline__ void gemm_wgmma(const uint16_t* __restrict__ x, long long a_part_stride, int lda,
                                           const uint16_t* __restrict__ W, const float* __restrict__ bias,
                                           float* out_f, uint16_t* out_h, long long o_part_stride, int ldo, int M,
                                           int N, int K, int out_cols, int mode, int k_split) {
    constexpr int NT = BN / 8;                                 // n8 column tiles of the accumulator
    constexpr int A_TILE = GW_BM * GW_BK;                      // bf16 per activation part per stage
    constexpr int B_TILE = BN * GW_BK;
    constexpr int STAGE = PARTS * A_TILE + B_TILE;             // bf16 per stage (a multiple of 512: 1 KB)
    constexpr int AHEAD = STAGES - 1 - WAIT;
    static_assert(AHEAD >= 1, "at least one stage must load while one is multiplied");
    static_assert(BN == 128 && GW_BM == 128 && GW_BK == 64, "the stage's products are wgmma_stage_128x128's");
    extern __shared__ uint4 smem_wgmma[];
    const uint32_t raw = shared_address(smem_wgmma);
    const uint32_t base = (raw + 1023u) & ~1023u;              // the swizzle is a function of address bits
    uint16_t* smem = reinterpret_cast<uint16_t*>(reinterpret_cast<char*>(smem_wgmma) + (base - raw));

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int wg = warp >> 2;                                  // range [0, 2): 64-row half of the block tile
    const int g = lane >> 2, t = lane & 3;
    const int m0 = blockIdx.x * GW_BM, n0 = blockIdx.y * BN;
    const int n_steps = (K + GW_BK - 1) / GW_BK;
    const int s_begin = (int)(((long long)blockIdx.z * n_steps) / k_split);
    const int s_end = (int)(((long long)(blockIdx.z + 1) * n_steps) / k_split);
    const int n_k = s_end - s_begin;

    // One stage: 16-byte chunk ch of tile row r goes to chunk ch ^ (r & 7) of the row's 128 bytes. Rows past
    // M or N and columns past K land as zeros (their products add nothing).
    auto load_rows = [&](uint16_t* tile, const uint16_t* src0, long long ld, int rows, int limit, int r0, int k0) {
        for (int c = threadIdx.x; c < rows * 8; c += GW_THREADS) {
            const int r = c >> 3, ch = c & 7;
            const bool ok = r0 + r < limit && k0 + ch * 8 < K;
            const uint16_t* src = src0 + (ok ? (size_t)(r0 + r) * ld + k0 + ch * 8 : 0);
            cp_async16(tile + r * GW_BK + ((ch ^ (r & 7)) << 3), src, ok ? 16 : 0);
        }
    };
    auto load_stage = [&](int buf, int step) {
        uint16_t* st = smem + buf * STAGE;
        const int k0 = step * GW_BK;
#pragma unroll
        for (int p = 0; p < PARTS; ++p) load_rows(st + p * A_TILE, x + p * a_part_stride, lda, GW_BM, M, m0, k0);
        load_rows(st + PARTS * A_TILE, W, K, BN, N, n0, k0);
    };

    float acc[1][NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) acc[0][nt][0] = acc[0][nt][1] = acc[0][nt][2] = acc[0][nt][3] = 0.f;

#pragma unroll
    for (int s = 0; s < AHEAD; ++s) {
        if (s < n_k) load_stage(s, s_begin + s);
        cp_async_commit();                                     // an empty group keeps the count uniform
    }
    for (int kt = 0; kt < n_k; ++kt) {
        cp_async_wait<AHEAD - 1>();                            // this thread's copies of stage kt landed
        fence_async_shared();                                  // ... and are visible to the tensor cores
        __syncthreads();                                       // everyone's; the buffer refilled below is idle
        const int next = kt + AHEAD;
        if (next < n_k) load_stage(next % STAGES, s_begin + next);
        cp_async_commit();
        wgmma_stage_128x128<PARTS>(acc[0], base + (uint32_t)((kt % STAGES) * STAGE * 2), wg);
        wgmma_wait<WAIT>();
        fence_accumulators(acc[0]);
    }
    wgmma_wait<0>();
    fence_accumulators(acc[0]);
    cp_async_wait<0>();                                        // only empty groups can be left: none in flight

    store_gemm_tile<1, NT>(acc, m0 + wg * 64 + (warp & 3) * 16 + g, n0, t, M, out_cols, mode, k_split, bias, out_f,
                           out_h, o_part_stride, ldo);
}

// Entries: 128 x 128 tiles with 4 stages and one batch of products kept in flight, one block per SM. Measured on the
// H200 against 128 x 256 tiles with 3 stages and none in flight (notes/cuda_notes.md, 2026-12-02 fourth): faster in
// every forward from 32 to 1024 rows and in the full recompute, so only this one is built.
#define GEMM_WGMMA_ENTRY(BN, PARTS, STAGES, WAIT)                                                             \
    extern "C" __global__ void __launch_bounds__(GW_THREADS, 1) gemm_wgmma_n##BN##_p##PARTS(                 \
            const uint16_t* x, long long a_part_stride, int lda, const uint16_t* W, const float* bias,         \
            float* out_f, uint16_t* out_h, long long o_part_stride, int ldo, int M, int N, int K, int out_cols, \
            int mode, int k_split) {                                                                          \
        gemm_wgmma<BN, PARTS, STAGES, WAIT>(x, a_part_stride, lda, W, bias, out_f, out_h, o_part_stride, ldo,  \
                                            M, N, K, out_cols, mode, k_split);                                \
    }
GEMM_WGMMA_ENTRY(128, 2, 4, 1)
GEMM_WGMMA_ENTRY(128, 1, 4, 1)
