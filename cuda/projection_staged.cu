// projection_staged.cu: y = x @ W^T for bf16 weights and up to 32 fp32 activation rows (the prefill),
// on the tensor cores, with the activations split into bf16 hi + lo ONCE per block in shared memory.
//
// NOT MEASURED YET, off by default (model.staged_prefill_projections): written after the H200 showed
// projection_bf16.cu spending the 32-row prefill re-reading activations (notes/cuda_notes.md, issue 10).
//
// Computes   exactly what projection_bf16.cu computes (same modes STORE / ADD / SWIGLU, same hi/lo
//            split and the same K order inside an mma, so the same rounding), for n_tokens <= 32.
// Why:       projection_bf16.cu gives each warp one 16-row tile, and every warp loads the 32 rows
//            of activations for its K range from L2 and splits them into hi/lo itself: 4 bytes of
//            activations per byte of weights, and the split arithmetic repeated by every tile. Here
//            the 8 warps of a block own 8 neighbouring tiles (128 rows) and the same K range; the
//            block converts each 128-wide K chunk of the activations once into shared memory and
//            all 8 warps read their mma B fragments from there.
// Layouts:   W [rows, K] bf16 bits; x [n_tokens, x_stride] float32; out [n_tokens, out_stride].
// Launch:    grid (ceil(n_tiles / 8) * ksplit), block 256 (8 warps); blockIdx.x = tile_group * ksplit
//            + part; part p covers the 32-wide K steps [p n_steps / ksplit, (p+1) n_steps / ksplit).
//            Static shared memory: 2 x 32 x STG_ROW words (20 KB).
// Shared:    hi_s[n][w] / lo_s[n][w], token n < 32, word w = the bf16 pair of chunk columns 2w, 2w+1;
//            rows padded to STG_ROW = 80 words: lanes (g, t) of a quarter-warp read 16 bytes at word
//            g * 80 + 4t, i.e. banks 16 g + 4t .. +3 (mod 32): distinct for g in {0, 1}, t < 4.
// Preconditions: K % 32 == 0, x_stride % 4 == 0, n_tokens <= 32; ksplit > 1 only with MODE ADD.
#include "common.cuh"
#include "mma_bf16.cuh"

#define STG_WARPS 8
#define STG_THREADS (STG_WARPS * 32)
#define STG_TOKENS 32
#define STG_CHUNK_STEPS 4                                       // 32-wide K steps per staged chunk
#define STG_ROW 80                                              // words per staged token row (64 + 16 pad)

extern "C" __global__ void __launch_bounds__(STG_THREADS) projection_staged(
        const uint16_t* __restrict__ W, const float* __restrict__ x, const float* __restrict__ bias, float* out,
        int rows, int K, int n_tokens, int x_stride, int out_stride, int out_cols, int mode, int ksplit) {
    __shared__ __align__(16) uint32_t hi_s[STG_TOKENS * STG_ROW];
    __shared__ __align__(16) uint32_t lo_s[STG_TOKENS * STG_ROW];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2;                                    // range [0, 8): row in tile / token in tile
    const int t = lane & 3;                                     // range [0, 4): k group / token pair
    const int group = blockIdx.x / ksplit;                      // range [0, ceil(n_tiles / 8))
    const int part = blockIdx.x - group * ksplit;               // range [0, ksplit)
    const int tile = group * STG_WARPS + warp;
    const int row_a = tile * 16 + g, row_b = row_a + 8;
    const bool ok_a = row_a < rows, ok_b = row_b < rows;
    const uint16_t* wa_row = W + (size_t)(ok_a ? row_a : 0) * K;
    const uint16_t* wb_row = W + (size_t)(ok_b ? row_b : 0) * K;
    const int n_steps = K >> 5;
    const int s_begin = (int)(((long long)part * n_steps) / ksplit);
    const int s_end = (int)(((long long)(part + 1) * n_steps) / ksplit);
    const uint4 zero = make_uint4(0u, 0u, 0u, 0u);

    float acc[4][4];
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;

    for (int c0 = s_begin; c0 < s_end; c0 += STG_CHUNK_STEPS) {  // block-uniform
        const int n_here = min(STG_CHUNK_STEPS, s_end - c0);
        // This chunk's weights first: their loads are in flight while the block stages activations.
        uint4 wa[STG_CHUNK_STEPS], wb[STG_CHUNK_STEPS];
#pragma unroll
        for (int u = 0; u < STG_CHUNK_STEPS; ++u) {
            const int k = (c0 + u) * 32 + t * 8;
            wa[u] = (u < n_here && ok_a) ? load_weights16(wa_row + k) : zero;
            wb[u] = (u < n_here && ok_b) ? load_weights16(wb_row + k) : zero;
        }
        __syncthreads();                                        // the previous chunk's fragments are read
        // Stage: item = (token n, 8 consecutive columns); 32 x 16 items, 2 per thread.
        for (int item = threadIdx.x; item < STG_TOKENS * 16; item += STG_THREADS) {
            const int n = item >> 4, grp = item & 15;
            const int k = c0 * 32 + grp * 8;
            float v[8];
            if (n < n_tokens && grp < 4 * n_here) {
                load_activations8(x + (size_t)n * x_stride + k, v);
            } else {
#pragma unroll
                for (int e = 0; e < 8; ++e) v[e] = 0.f;
            }
            uint32_t hi[4], lo[4];
            split_activations(v, hi, lo);
            *reinterpret_cast<uint4*>(hi_s + n * STG_ROW + grp * 4) = make_uint4(hi[0], hi[1], hi[2], hi[3]);
            *reinterpret_cast<uint4*>(lo_s + n * STG_ROW + grp * 4) = make_uint4(lo[0], lo[1], lo[2], lo[3]);
        }
        __syncthreads();
#pragma unroll
        for (int u = 0; u < STG_CHUNK_STEPS; ++u) {
            if (u >= n_here) break;                             // block-uniform
#pragma unroll
            for (int nt = 0; nt < 4; ++nt) {
                const int word = (nt * 8 + g) * STG_ROW + u * 16 + 4 * t;   // token nt*8+g, columns u*32+8t ..
                const uint4 h = *reinterpret_cast<const uint4*>(hi_s + word);
                const uint4 l = *reinterpret_cast<const uint4*>(lo_s + word);
                mma_bf16_16816(acc[nt], wa[u].x, wb[u].x, wa[u].y, wb[u].y, h.x, h.y);
                mma_bf16_16816(acc[nt], wa[u].x, wb[u].x, wa[u].y, wb[u].y, l.x, l.y);
                mma_bf16_16816(acc[nt], wa[u].z, wb[u].z, wa[u].w, wb[u].w, h.z, h.w);
                mma_bf16_16816(acc[nt], wa[u].z, wb[u].z, wa[u].w, wb[u].w, l.z, l.w);
            }
        }
    }

    if (tile * 16 < rows)                                       // warps past the last tile hold nothing
        store_mma_tile<4>(acc, out, out_stride, bias, rows, out_cols, n_tokens, 0, tile, g, t, mode, ksplit > 1);
}
