// gemm_tma.cu: the bulk prefill's GEMM (gemm_bulk.cu's modes and epilogue) on Hopper's wgmma, its tiles
// brought into shared memory by the tensor memory accelerator (TMA) and handed over through mbarriers
// (sm_90a only).
//
// Why:       gemm_wgmma.cu (cp.async copies by the same threads that multiply, a block-wide barrier per
//            K stage) keeps the SM ~40% busy on the H200 (ncu, notes/cuda_notes.md 2026-12-02 fourth):
//            every warp spends issue slots on copy addresses, then waits at the barrier for the slowest.
//            Here one producer thread issues the bulk copies of a stage and the two consumer warpgroups
//            only wait for the stage they multiply next: the copy engine fills stages s + 1 .. while the
//            tensor cores work on stage s.
// Computes   acc[m, n] = sum_k x[m, k] W[n, k] in fp32, x = x_hi + x_lo (PARTS 2) or x_hi (PARTS 1), then
//            store_gemm_tile (gemm_epilogue.cuh): ADD / STORE / SWIGLU exactly as gemm_bulk.cu.
// Operands:  two tensor maps (CUtensorMap, encoded on the host by cuda_tensor_map.py) passed by value
//            (__grid_constant__): tm_x, 3-D (K, M, PARTS; x_lo one part stride after x_hi), and tm_w, 2-D
//            (K, N) of W [N, K]; both bf16, boxes of 64 (K) x 128 rows stored with the 128-byte swizzle
//            wgmma_desc describes; whatever lies outside M, N or K arrives as zeros. Launched through
//            cuda_param_launch.py (cuLaunchKernel with an array of parameter pointers, so the driver lays out
//            each parameter itself): PyCUDA's packed argument buffer did not reach this kernel, which then
//            read every scalar as 0 (notes/cuda_notes.md, 2026-12-02 fourth).
//            out_f [M, ldo] float32; out_h [M, ldo] bf16 bits with the lo parts o_part_stride elements on.
// Launch:    grid (ceil(M / 128), ceil(N / 128), k_split), block 288: warps 0-7 are two consumer warpgroups
//            (warpgroup w: rows 64 w .. 64 w + 63 of the 128 x 128 tile), warp 8 the producer; dynamic shared
//            memory STAGES * ((PARTS * 128 + 128) * 64 * 2 + 16) + 1024 bytes (tiles aligned to 1 KB, then a
//            full and an empty mbarrier per stage).
// Handover:  full[s] completes when the stage's expected bytes have landed (the producer's one arrive with
//            the byte count, then the copies' transaction bytes); empty[s] when each of the 8 consumer warps
//            has seen the products that read stage s complete (one arrive per warp, after wgmma.wait_group
//            1 one iteration later). Use u of a stage waits for phase parity u & 1.
#include "common.cuh"
#include "mma_tiles.cuh"
#include "gemm_epilogue.cuh"
#include "wgmma_ops.cuh"

#define GT_BM 128
#define GT_BN 128
#define GT_BK 64
#define GT_THREADS 288
#define GT_CONSUMER_WARPS 8

struct __align__(64) TensorMap {
    unsigned long long words[16];          // CUtensorMap: opaque, 128 bytes
};

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" :: "r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" :: "r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" :: "r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    uint32_t done = 0;
    while (!done) {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     "selp.u32 %0, 1, 0, p;\n}\n" : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    }
}
// One box of a tensor map into shared memory at dst; its bytes count toward bar's transaction.
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const TensorMap* map, int c0, int c1, int c2,
                                            uint32_t bar) {
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
                 "[%0], [%1, {%2, %3, %4}], [%5];\n"
                 :: "r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar) : "memory");
}
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const TensorMap* map, int c0, int c1, uint32_t bar) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
                 "[%0], [%1, {%2, %3}], [%4];\n"
                 :: "r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar) : "memory");
}

template <int PARTS, int STAGES>
__device__ __forceinline__ void gemm_tma(const TensorMap* tm_x, const TensorMap* tm_w, const float* __restrict__ bias,
                                         float* out_f, uint16_t* out_h, long long o_part_stride, int ldo, int M,
                                         int N, int K, int out_cols, int mode, int k_split) {
    constexpr int NT = GT_BN / 8;
    constexpr int A_TILE = GT_BM * GT_BK;                      // bf16 per activation part per stage
    constexpr int STAGE = PARTS * A_TILE + GT_BN * GT_BK;      // bf16 per stage (a multiple of 512: 1 KB)
    constexpr uint32_t STAGE_BYTES = STAGE * 2;
    static_assert(GT_BM == 128 && GT_BN == 128 && GT_BK == 64, "the stage's products are wgmma_stage_128x128's");
    extern __shared__ uint4 smem_tma[];
    const uint32_t raw = shared_address(smem_tma);
    const uint32_t base = (raw + 1023u) & ~1023u;              // the swizzle is a function of address bits
    const uint32_t bars = base + STAGES * STAGE_BYTES;         // full[s] at bars + 8 s, empty[s] after them
    auto full = [&](int s) { return bars + 8u * s; };
    auto empty = [&](int s) { return bars + 8u * (STAGES + s); };

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int m0 = blockIdx.x * GT_BM, n0 = blockIdx.y * GT_BN;
    const int n_steps = (K + GT_BK - 1) / GT_BK;
    const int s_begin = (int)(((long long)blockIdx.z * n_steps) / k_split);
    const int n_k = (int)(((long long)(blockIdx.z + 1) * n_steps) / k_split) - s_begin;

    if (threadIdx.x == 0) {
#pragma unroll
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(full(s), 1);
            mbar_init(empty(s), GT_CONSUMER_WARPS);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();                                           // the last block-wide barrier of the kernel

    if (warp == GT_CONSUMER_WARPS) {                           // the producer: one thread issues every copy
        if (lane == 0) {
            for (int kt = 0; kt < n_k; ++kt) {
                const int s = kt % STAGES;
                if (kt >= STAGES) mbar_wait(empty(s), ((kt / STAGES) & 1) ^ 1);   // use kt / STAGES - 1 released
                mbar_expect_tx(full(s), STAGE_BYTES);
                const uint32_t st = base + s * STAGE_BYTES;
                const int k0 = (s_begin + kt) * GT_BK;
#pragma unroll
                for (int p = 0; p < PARTS; ++p) tma_load_3d(st + p * A_TILE * 2, tm_x, k0, m0, p, full(s));
                tma_load_2d(st + PARTS * A_TILE * 2, tm_w, k0, n0, full(s));
            }
        }
        return;
    }

    const int wg = warp >> 2;                                  // range [0, 2): 64-row half of the block tile
    const int g = lane >> 2, t = lane & 3;
    float acc[1][NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) acc[0][nt][0] = acc[0][nt][1] = acc[0][nt][2] = acc[0][nt][3] = 0.f;
    for (int kt = 0; kt < n_k; ++kt) {
        const int s = kt % STAGES;
        mbar_wait(full(s), (kt / STAGES) & 1);
        wgmma_stage_128x128<PARTS>(acc[0], base + s * STAGE_BYTES, wg);
        wgmma_wait<1>();                                       // this warp's products of stage kt - 1 are done
        fence_accumulators(acc[0]);
        if (kt > 0 && lane == 0) mbar_arrive(empty((kt - 1) % STAGES));
    }
    wgmma_wait<0>();
    fence_accumulators(acc[0]);
    store_gemm_tile<1, NT>(acc, m0 + wg * 64 + (warp & 3) * 16 + g, n0, t, M, out_cols, mode, k_split, bias, out_f,
                           out_h, o_part_stride, ldo);
}

// Entries by activation parts. gemm_tma_p*: 4 stages of two parts or 6 of one (192 KB of tiles either way), one
// block per SM. gemm_tma2_p*: 2 stages of two parts or 3 of one (96 KB), two blocks per SM, so one block's epilogue
// (an ADD reads and writes its 128 x 128 fp32 tile) overlaps the other's products; not yet measured.
#define GEMM_TMA_ENTRY(NAME, PARTS, STAGES, BLOCKS)                                                          \
    extern "C" __global__ void __launch_bounds__(GT_THREADS, BLOCKS) NAME##_p##PARTS(                         \
            const __grid_constant__ TensorMap tm_x, const __grid_constant__ TensorMap tm_w, const float* bias, \
            float* out_f, uint16_t* out_h, long long o_part_stride, int ldo, int M, int N, int K, int out_cols, \
            int mode, int k_split) {                                                                          \
        gemm_tma<PARTS, STAGES>(&tm_x, &tm_w, bias, out_f, out_h, o_part_stride, ldo, M, N, K, out_cols, mode, \
                                k_split);                                                                     \
    }
GEMM_TMA_ENTRY(gemm_tma, 2, 4, 1)
GEMM_TMA_ENTRY(gemm_tma, 1, 6, 1)
GEMM_TMA_ENTRY(gemm_tma2, 2, 2, 2)
GEMM_TMA_ENTRY(gemm_tma2, 1, 3, 2)
