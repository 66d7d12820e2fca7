// gemv_int4.cu: the one-row projections of a decode step from INT4 weights (model/int4.py's format),
// dequantized in registers, with every mode of gemv.cu: the same items, activation staging, RMSNorm
// prologue and epilogues (gemv_rows.cuh), only the weight stream differs.
//
// Computes   acc[r] = sum_k (q[r, k] * s[r, k / G]) * v[k]      r in [0, rows)
//            v = x (norm_w == NULL), or v = x * norm_w and acc scaled by rsqrt(mean_k x[k]^2 + eps);
//            epilogue by mode as gemv.cu (STORE + bias, ADD, SWIGLU on gate/up interleaved rows, QKV_ROPE on
//            the rows of kernel_reference.qkv_rope_row_order with qkv_rope.cuh's epilogue). The row
//            permutations commute with per-row quantization: the host permutes packed rows and scale rows
//            together (weight_layouts.py; padding rows are q = 0 with scale 0).
//
// Why: a decode step streams every weight once, so its time is the weight bytes over the copy
// bandwidth. INT4 groups of 128 with an fp16 scale are 4.125 bits per weight against bf16's 16.
//
// Layouts:   Wq [rows, K / 2] uint8: byte j of a row holds column 2j in its low nibble and 2j + 1 in
//            its high one, each as q + 8 (0..15). Read as little-endian 32-bit words, word m of a row
//            holds columns 8m .. 8m + 7 in nibbles 0..7 (nibble e = column 8m + e).
//            scales [rows, K / G] fp16 bits; x [K] float32 (16-byte aligned; the caller offsets the row);
//            norm_w [K]; out [out_cols or rows] float32; rope tables as qkv_rope.cuh.
// Launch:    as gemv.cu: grid ceil(rows / 8) (gemv_int4) or a smaller grid looping over the items
//            (gemv_int4_items; gemv_int4_items2: two items in flight per warp), block GEMV_THREADS (8 warps),
//            dynamic shared memory 4 K bytes (the _lean entries 4.5 K: padded). Warp w of an item streams row
//            gemv_row(mode, item, w). Lane l streams the 16-byte chunks (32 columns) l, l + 32, ... of its row,
//            GEMV4_LANE_LOADS per batch with their scales, the next batch's loads issued before this batch's
//            arithmetic. The activations are staged swizzled (padded for the _lean entries)
//            (gemv_rows.cuh staged_index) so the lanes' 128-byte-apart reads do not collide in banks.
// PDL:       the first batch of weight loads is issued before griddep_wait (the weights depend on nothing).
// Preconditions: K % 32 == 0; G % 32 == 0 and K % G == 0 (a chunk lies in one scale group, so its 32
//            products are summed first and scaled once); rows % 16 == 0 for the pair modes.
// Numerics:  q * v in fp32 (q exact), a chunk's products summed in two fp32 partials (even and odd
//            columns), scaled by s (fp16 widened exactly) into the lane's sum, then a warp sum: another
//            order than numpy's, so within fp32 rounding of (int4.dequantize(...) @ v), not bit for bit.
// Status:    every entry passed its tests on the H200 (2026-12-03, third session: every mode against numpy,
//            the looped entries bit-identical to a block per item). Correct, not yet fast: at 1.5B the decode
//            projections take 1.03 ms per step, as bf16's do, for a quarter of the bytes (notes/cuda_notes.md);
//            the looped variants were measured slower (KernelPlan, off).
// Lean:      the _lean entries (KernelPlan.int4_decode_lean_loop; off, not yet run on a GPU): ncu found these
//            projections issue-bound (ninth session), and the SASS of gemv_int4's loop spent 862 instructions on a
//            lane's 128 weights: an integer division by the run-time group per chunk for its scale (~30) and an
//            AND and an OR per nibble, and a LOP3 per activation read for the swizzle. The lean entries index the
//            scale by a shift (groups of 32 x a power of two, the launcher checks), make each nibble a float with
//            one LOP3 and stage the activations padded instead of swizzled (gemv_rows.cuh STAGE_PADDED: a chunk's
//            8 reads are one register plus constants): 578 instructions, the same values in the same order, so
//            the same bits. The other entries compile to the SASS they had.
#include <cuda_fp16.h>
#include "gemv_rows.cuh"
#include "gemv_int4_params.cuh"

// 16-byte chunks per lane per batch: 4 puts a 1536-wide row's (48 chunks) loads in flight at once.
#define GEMV4_LANE_LOADS 4
// (MAGIC | n) read as a float is 2^23 + n for n < 2^23: a nibble becomes a float with one LOP3, and
// subtracting 2^23 + 8 (or 2^23 + 128 for a nibble left in bits 4-7, which reads as 16 n) leaves q exactly.
#define INT4_MAGIC_BITS 0x4B000000u
#define INT4_MAGIC_LOW 8388616.0f      // 2^23 + 8
#define INT4_MAGIC_HIGH 8388736.0f     // 2^23 + 128

// (w & MASK) | INT4_MAGIC_BITS read as a float. LEAN: one LOP3 with the magic in a register (inline PTX): nvcc
// otherwise emits an AND and an OR, both constants being immediates. The same bits either way.
template <bool LEAN, uint32_t MASK>
__device__ __forceinline__ float int4_magic(uint32_t w) {
    if (!LEAN) return __uint_as_float((w & MASK) | INT4_MAGIC_BITS);
    uint32_t r;                                                 // 0xEA: (a & b) | c
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(r) : "r"(w), "n"(MASK), "r"(INT4_MAGIC_BITS));
    return __uint_as_float(r);
}

// One 32-bit word (8 columns) against its 8 staged activations a (columns 0-3), b (4-7): even columns into
// lo, odd columns (read as 16 q) into hi16.
template <bool LEAN>
__device__ __forceinline__ void word_int4(uint32_t w, const float4& a, const float4& b, float& lo, float& hi16) {
    const uint32_t w8 = w >> 8, w16 = w >> 16, w24 = w >> 24;
    lo = fmaf(int4_magic<LEAN, 0xFu>(w) - INT4_MAGIC_LOW, a.x, lo);
    hi16 = fmaf(int4_magic<LEAN, 0xF0u>(w) - INT4_MAGIC_HIGH, a.y, hi16);
    lo = fmaf(int4_magic<LEAN, 0xFu>(w8) - INT4_MAGIC_LOW, a.z, lo);
    hi16 = fmaf(int4_magic<LEAN, 0xF0u>(w8) - INT4_MAGIC_HIGH, a.w, hi16);
    lo = fmaf(int4_magic<LEAN, 0xFu>(w16) - INT4_MAGIC_LOW, b.x, lo);
    hi16 = fmaf(int4_magic<LEAN, 0xF0u>(w16) - INT4_MAGIC_HIGH, b.y, hi16);
    lo = fmaf(int4_magic<LEAN, 0xFu>(w24) - INT4_MAGIC_LOW, b.z, lo);
    hi16 = fmaf(int4_magic<LEAN, 0xF0u>(w24) - INT4_MAGIC_HIGH, b.w, hi16);
}

// sum_e q[e] * v[32 c + e] over the 32 columns of chunk c (w: its 16 bytes), the activations read from their
// staged places (gemv_rows.cuh staged_index): float4 j of chunk c at 8c + (j ^ (c & 7)), or for LEAN at 9c + j.
template <bool LEAN>
__device__ __forceinline__ float dot32_int4(const uint4& w, const float4* v_s4, int c) {
    const float4* vc = v_s4 + (LEAN ? 9 : 8) * c;
    const int x = LEAN ? 0 : c & 7;
    float lo = 0.f, hi16 = 0.f;
    word_int4<LEAN>(w.x, vc[0 ^ x], vc[1 ^ x], lo, hi16);
    word_int4<LEAN>(w.y, vc[2 ^ x], vc[3 ^ x], lo, hi16);
    word_int4<LEAN>(w.z, vc[4 ^ x], vc[5 ^ x], lo, hi16);
    word_int4<LEAN>(w.w, vc[6 ^ x], vc[7 ^ x], lo, hi16);
    return fmaf(hi16, 0.0625f, lo);                             // hi16 / 16 is exact
}

// One INT4 weight row of a projection: its packed bytes and its scales.
struct Int4Row {
    const uint8_t* q;
    const uint16_t* s;
    bool ok;                                                    // false past the matrix: loads give zeros
    int group_shift;                                            // log2(group / 32): the LEAN entries' scale index
};

__device__ __forceinline__ Int4Row int4_row(const uint8_t* Wq, const uint16_t* scales, int row, int rows, int K,
                                            int group) {
    const bool ok = row < rows;
    const size_t r = ok ? (size_t)row : 0;
    return Int4Row{Wq + r * (K >> 1), scales + r * (K / group), ok, 31 - __clz(group >> 5)};
}

// The scale of chunk c (32 columns, inside one group). LEAN: a shift, for a group of 32 x a power of two (the
// launcher's condition); otherwise an integer division by the run-time group, ~30 instructions per chunk in
// SASS (nvcc cannot strength-reduce a division by a kernel argument).
template <bool LEAN>
__device__ __forceinline__ int int4_scale_index(const Int4Row& row, int c, int group) {
    return LEAN ? c >> row.group_shift : (32 * c) / group;
}

// Batch c0 of a row: chunks c0 + lane + 32 u and the fp16 bits of their scales (zeros past the row).
template <bool LEAN, int U>
__device__ __forceinline__ void int4_batch_loads(const Int4Row& row, int c0, int chunks, int group, uint4 (&w)[U],
                                                 uint16_t (&s)[U]) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int u = 0; u < U; ++u) {
        const int c = c0 + lane + 32 * u;                       // range [0, K / 32)
        const bool in = row.ok && c < chunks;
        w[u] = in ? load_weights16(reinterpret_cast<const uint16_t*>(row.q + 16 * c)) : make_uint4(0u, 0u, 0u, 0u);
        s[u] = in ? __ldg(row.s + int4_scale_index<LEAN>(row, c, group)) : (uint16_t)0;
    }
}

// One warp's INT4 row against the staged activations: the lane's partial sum (before the warp reduction).
// w, s hold batch 0 on entry (int4_batch_loads); each batch's arithmetic runs while the next one's loads fly.
template <bool LEAN, int U>
__device__ __forceinline__ float gemv_int4_row(uint4 (&w)[U], uint16_t (&s)[U], const Int4Row& row, int K, int group,
                                               const float4* v_s4) {
    const int lane = threadIdx.x & 31, chunks = K >> 5;
    float acc = 0.f;
    for (int c0 = 0; c0 < chunks; c0 += 32 * U) {
        uint4 w_next[U];
        uint16_t s_next[U];
        int4_batch_loads<LEAN>(row, c0 + 32 * U, chunks, group, w_next, s_next);
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int c = c0 + lane + 32 * u;
            if (c < chunks) acc = fmaf(__half2float(__ushort_as_half(s[u])), dot32_int4<LEAN>(w[u], v_s4, c), acc);
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            w[u] = w_next[u];
            s[u] = s_next[u];
        }
    }
    return acc;
}

// Item `item` of a projection once the activations are staged: every warp's row sum scaled into row_sum, then
// gemv_rows.cuh's epilogue. w, s hold this warp's first batch on entry.
template <bool LEAN, int U>
__device__ __forceinline__ void gemv_int4_item(uint4 (&w)[U], uint16_t (&s)[U], const Int4Row& row, int K, int group,
                                               const float4* v_s4, float scale, int mode, int item, float* row_sum,
                                               const float* bias, float* out, int out_cols, int rows,
                                               const RopeTarget& rt) {
    const float acc = warp_sum(gemv_int4_row<LEAN>(w, s, row, K, group, v_s4)) * scale;
    if ((threadIdx.x & 31) == 0) row_sum[threadIdx.x >> 5] = acc;
    __syncthreads();
    gemv_epilogue(mode, item, row_sum, bias, out, out_cols, rows, rt);
}


// The dynamic shared memory of every entry: [K / 4] staged activations, swizzled ([9 K / 32] padded for the _lean
// entries: cuda_int4_launchers.gemv_int4_shared_bytes on the host). Declared once here: the same
// extern array declared inside the kernel and inside the looped entries' device function draws nvcc's
// "name linkage conflicts" warning.
extern __shared__ float4 v_s4[];

// A block per 8-row item.
template <bool LEAN>
__device__ __forceinline__ void gemv_int4_block(GEMV_INT4_PARAMS) {
    __shared__ float row_sum[GEMV_WARPS];
    __shared__ float scratch[32];
    const Int4Row row = int4_row(Wq, scales, gemv_row(mode, blockIdx.x, threadIdx.x >> 5), rows, K, group);
    uint4 w[GEMV4_LANE_LOADS];
    uint16_t s[GEMV4_LANE_LOADS];
    int4_batch_loads<LEAN>(row, 0, K >> 5, group, w, s);
    griddep_wait();                                             // x (and the tables) come from earlier kernels
    griddep_launch_dependents();
    const float scale = gemv_stage_activations<LEAN ? STAGE_PADDED : STAGE_SWIZZLE>(x, norm_w, eps, K, v_s4, scratch);
    const RopeTarget rt{pos_table, slot_table, ctl, inv_freq, k_cache, v_cache, n_q_heads, n_kv_heads, head_dim,
                        capacity};
    gemv_int4_item<LEAN>(w, s, row, K, group, v_s4, scale, mode, blockIdx.x, row_sum, bias, out, out_cols, rows, rt);
}

// gemv_int4's items looped over a smaller grid (KernelPlan.decode_gemv_blocks_per_sm, or for INT4
// int4_gemv_items_per_block): the activations staged (and RMS-normalised) once per block for all of its items,
// items blockIdx.x, blockIdx.x + gridDim.x, ... for any grid. ROWS items at a time: each warp has the first batch
// of ROWS rows in flight together (ROWS 2, KernelPlan.int4_gemv_rows_per_warp: a 1536-wide INT4 row is only 1.5
// 16-byte loads per lane, so one row leaves a warp with little in flight). Each row's sum is gemv_int4_row's
// whatever ROWS and the grid are, and every output has one writer, so every entry writes the same bits. Each
// step's first batches are loaded as it starts (gemv_item's hand-over to the next row is a bf16 refinement not
// repeated here).
template <bool LEAN, int ROWS>
__device__ __forceinline__ void gemv_int4_loop(GEMV_INT4_PARAMS) {
    __shared__ float row_sum[ROWS][GEMV_WARPS];
    __shared__ float scratch[32];
    const int n_items = gemv_items(rows), warp = threadIdx.x >> 5, b = blockIdx.x, g = gridDim.x;
    uint4 w[ROWS][GEMV4_LANE_LOADS];
    uint16_t s[ROWS][GEMV4_LANE_LOADS];
    // Slot r of the step from item i runs item i + r g: rows past the matrix (loads give zeros) where that is past
    // the items. `in`: known to be an item (slot 0 inside the loop), so ROWS 1 tests nothing gemv_int4_items did not.
    auto row_of = [&](int item, bool in) {
        return int4_row(Wq, scales, in || item < n_items ? gemv_row(mode, item, warp) : rows, rows, K, group);
    };
#pragma unroll
    for (int r = 0; r < ROWS; ++r) int4_batch_loads<LEAN>(row_of(b + r * g, false), 0, K >> 5, group, w[r], s[r]);
    griddep_wait();                                             // x (and the tables) come from earlier kernels
    griddep_launch_dependents();
    if (b >= n_items) return;                                   // block-uniform
    const float scale = gemv_stage_activations<LEAN ? STAGE_PADDED : STAGE_SWIZZLE>(x, norm_w, eps, K, v_s4, scratch);
    const RopeTarget rt{pos_table, slot_table, ctl, inv_freq, k_cache, v_cache, n_q_heads, n_kv_heads, head_dim,
                        capacity};
    for (int item = b; item < n_items; item += ROWS * g) {
        if (item != b) {
#pragma unroll
            for (int r = 0; r < ROWS; ++r)
                int4_batch_loads<LEAN>(row_of(item + r * g, r == 0), 0, K >> 5, group, w[r], s[r]);
        }
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            if (r > 0 && item + r * g >= n_items) break;        // block-uniform: the last step may hold fewer
            const Int4Row row = row_of(item + r * g, r == 0);
            const float acc = warp_sum(gemv_int4_row<LEAN>(w[r], s[r], row, K, group, v_s4)) * scale;
            if ((threadIdx.x & 31) == 0) row_sum[r][warp] = acc;
        }
        __syncthreads();
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            if (r == 0 || item + r * g < n_items)
                gemv_epilogue(mode, item + r * g, row_sum[r], bias, out, out_cols, rows, rt);
        }
        __syncthreads();                                        // row_sum is reused by the next step
    }
}

GEMV_INT4_ENTRY(gemv_int4) { gemv_int4_block<false>(GEMV_INT4_ARGS); }
GEMV_INT4_ENTRY(gemv_int4_items) { gemv_int4_loop<false, 1>(GEMV_INT4_ARGS); }
GEMV_INT4_ENTRY(gemv_int4_items2) { gemv_int4_loop<false, 2>(GEMV_INT4_ARGS); }

// The LEAN entries (KernelPlan.int4_decode_lean_loop): the same loads and arithmetic, so the same bits, in fewer
// instructions per weight: each chunk's scale indexed by a shift (groups of 32 x a power of two only), each nibble
// made a float by one LOP3, the activations staged padded (their reads need no address arithmetic each).
GEMV_INT4_ENTRY(gemv_int4_lean) { gemv_int4_block<true>(GEMV_INT4_ARGS); }
GEMV_INT4_ENTRY(gemv_int4_items_lean) { gemv_int4_loop<true, 1>(GEMV_INT4_ARGS); }
GEMV_INT4_ENTRY(gemv_int4_items2_lean) { gemv_int4_loop<true, 2>(GEMV_INT4_ARGS); }
