// wgmma_ops.cuh: Hopper's warpgroup matrix product (wgmma, sm_90a) as the bulk prefill's GEMM uses it
// (gemm_wgmma.cu): bf16 A and B from shared memory, fp32 accumulators in registers.
//
// wgmma_desc:        the 64-bit shared-memory matrix descriptor of a K-major tile stored with the
//                    128-byte swizzle (rows of 64 bf16 = 128 bytes; 16-byte chunk c of row r at chunk
//                    c ^ (r & 7); tile base 1024-byte aligned): start address >> 4 in bits 0-13, the
//                    stride between 8-row groups (1024 bytes >> 4) in bits 32-45, swizzle mode 1
//                    (128 B) in bits 62-63; the leading offset is unused for this layout (1 by
//                    convention). A k16 step inside the 64-wide row is the start address + 32 bytes.
// wgmma_m64n128k16: d += A (64 x 16) . B^T (B: 128 x 16), both K-major (no transpose), scale 1.
//                    d is the issuing warp's share of the 64 x N product: warp w of the warpgroup
//                    holds rows 16 w .. 16 w + 15 in the m16n8 fragment layout (d[j][2 r + e]: row
//                    16 w + g + 8 r, column 8 j + 2 t + e; g = lane / 4, t = lane % 4).
// wgmma_fence / wgmma_commit / wgmma_wait<N>: order register use before the first product of a
//                    batch, close a batch, wait until at most N batches of this warpgroup are in flight.
// fence_accumulators: an empty asm that "writes" every accumulator, so the compiler neither reads
//                    them before a wait nor moves their initialisation past the first product.
// fence_async_shared: ordinary (and cp.async) writes to shared memory made visible to the tensor
//                    cores' async proxy; each writing thread runs it before the barrier.
// wgmma_stage_128x128<PARTS>: the products of one 64-column K stage of a 128 x 128 block tile (gemm_wgmma.cu,
//                    gemm_tma.cu), issued and committed as one batch by warpgroup wg (rows 64 wg .. 64 wg + 63):
//                    the stage at shared address st holds PARTS activation tiles of 128 x 64 bf16, then the
//                    128 x 64 weight tile, each 1 KB aligned and stored as wgmma_desc describes.
#pragma once
#include <stdint.h>

__device__ __forceinline__ uint64_t wgmma_desc(uint32_t smem_addr) {
    return (uint64_t)((smem_addr & 0x3FFFF) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) |
           ((uint64_t)1 << 62);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" :: "n"(N) : "memory");
}
__device__ __forceinline__ void fence_async_shared() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

template <int NT>
__device__ __forceinline__ void fence_accumulators(float (&d)[NT][4]) {
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[j][e]) :: "memory");
}

__device__ __forceinline__ void wgmma_m64n128k16(float (&d)[16][4], uint64_t da, uint64_t db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, "
        "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, "
        "%41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, "
        "%61, %62, %63}, "
        " %64, %65, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
          "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
          "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
          "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]),
          "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]),
          "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]),
          "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]),
          "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
        : "l"(da), "l"(db), "r"(1));
}

template <int PARTS>
__device__ __forceinline__ void wgmma_stage_128x128(float (&acc)[16][4], uint32_t st, int wg) {
    constexpr uint32_t TILE_BYTES = 128 * 64 * 2;              // one 128-row x 64-column bf16 tile
    fence_accumulators(acc);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {                           // k16 steps of the stage: 32 bytes each
        const uint64_t db = wgmma_desc(st + PARTS * TILE_BYTES + ks * 32);
#pragma unroll
        for (int p = 0; p < PARTS; ++p)
            wgmma_m64n128k16(acc, wgmma_desc(st + p * TILE_BYTES + wg * (TILE_BYTES / 2) + ks * 32), db);
    }
    wgmma_commit();
}
