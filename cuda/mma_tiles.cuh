// mma_tiles.cuh: the shared-memory tile plumbing of the bulk prefill kernels (gemm_bulk.cu,
// prefill_bulk.cu): asynchronous 16-byte copies global -> shared, and ldmatrix fragment loads.
//
// cp_async16:        16 bytes global -> shared without passing through registers (cp.async.cg: L2
//                    only, no L1); src_bytes < 16 fills the rest of the 16 bytes with zeros, so a
//                    row past the end of a matrix lands as zeros (its address must still be valid).
// cp_async_commit / cp_async_wait<N>: close a group of copies / wait until at most N groups are
//                    still in flight (this thread's copies only: a __syncthreads follows).
// ldmatrix_x4:       four 8x8 bf16 matrices from shared memory, one row address per lane (lane l
//                    gives row l & 7 of matrix l >> 3): the A fragment of an m16n8k16 mma from a
//                    row-major [m][k] tile, or the B fragments of two n8 tiles from an [n][k] tile.
// ldmatrix_x4_trans: the same, each matrix transposed: B fragments from a [k][n] tile (V in P.V).
//
// Every source row address must be 16-byte aligned. The memory clobbers keep the compiler from
// moving ordinary shared-memory stores across these loads.
#pragma once
#include <cuda_bf16.h>
#include <stdint.h>

__device__ __forceinline__ uint32_t shared_address(const void* p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void cp_async16(void* smem_dst, const void* gmem_src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 :: "r"(shared_address(smem_dst)), "l"(gmem_src), "r"(src_bytes) : "memory");
}

__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" :: "n"(N) : "memory");
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const uint16_t* smem_row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(shared_address(smem_row)) : "memory");
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const uint16_t* smem_row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(shared_address(smem_row)) : "memory");
}

// The lane's row address inside a 16x16 A tile (rows m0.., columns k0..) for ldmatrix_x4: matrices
// (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 8-15) = a0, a1, a2, a3.
__device__ __forceinline__ const uint16_t* a_fragment_row(const uint16_t* tile, int row_stride, int lane) {
    return tile + (lane & 15) * row_stride + (lane >> 4) * 8;
}

// The lane's row address inside a 16(n) x 16(k) tile stored [n][k] for ldmatrix_x4: matrices
// (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15) = b0, b1 of the first n8 tile,
// then b0, b1 of the second.
__device__ __forceinline__ const uint16_t* b_fragment_row(const uint16_t* tile, int row_stride, int lane) {
    return tile + ((lane & 7) + ((lane >> 4) << 3)) * row_stride + ((lane >> 3) & 1) * 8;
}

// The lane's row address inside a 16(k) x 16(n) tile stored [k][n] for ldmatrix_x4_trans: matrices
// (k 0-7, n 0-7), (k 8-15, n 0-7), (k 0-7, n 8-15), (k 8-15, n 8-15) = b0, b1 of the first n8 tile,
// then b0, b1 of the second.
__device__ __forceinline__ const uint16_t* bt_fragment_row(const uint16_t* tile, int row_stride, int lane) {
    return tile + ((lane & 7) + ((lane >> 3) & 1) * 8) * row_stride + (lane >> 4) * 8;
}

// One fp32 value -> its bf16 hi and lo parts (hi = bf16(v), lo = bf16(v - hi)), as mma_bf16.cuh's
// split_activations does for 8 values: two products through the tensor cores keep ~16 mantissa bits.
__device__ __forceinline__ void split_hi_lo(float v, uint16_t& hi, uint16_t& lo) {
    const __nv_bfloat16 h = __float2bfloat16_rn(v);
    hi = __bfloat16_as_ushort(h);
    lo = __bfloat16_as_ushort(__float2bfloat16_rn(v - __bfloat162float(h)));
}

// Two adjacent fp32 values -> a word of two bf16 hi parts and a word of two lo parts (lower index low).
__device__ __forceinline__ void split_pair(float a, float b, uint32_t& hi, uint32_t& lo) {
    uint16_t ha, la, hb, lb;
    split_hi_lo(a, ha, la);
    split_hi_lo(b, hb, lb);
    hi = (uint32_t)ha | ((uint32_t)hb << 16);
    lo = (uint32_t)la | ((uint32_t)lb << 16);
}
