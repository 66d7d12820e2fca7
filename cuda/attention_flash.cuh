// attention_flash.cuh: the bulk prefill's causal flash attention over staged K/V (prefill_bulk.cu's entries,
// and attention_flash_kvo.cu's with the K/V overlap), as one template. prefill_bulk.cu's header comment has the
// precision and the layouts.
#pragma once
#include "common.cuh"
#include "kv_store.cuh"
#include "mma_bf16.cuh"
#include "mma_tiles.cuh"

#define FA_ROWS 16                       // query rows per block: one m16 tile per query head of the group
#define FA_BKV 32                        // list entries per K/V tile
#ifdef KV_BF16
#define FA_KV_PARTS 1                    // staged K/V: hi only (lo is zero)
#else
#define FA_KV_PARTS 2                    // hi and lo
#endif

// ---------------------------------------------------------------- flash attention

// Shared-memory rows of HD bf16 plus 16 bytes of padding: the 8 row addresses of an ldmatrix then fall
// in 8 different 16-byte bank groups ((HD + 8) * 2 bytes = an odd number of 16-byte groups).
template <int HD, int BKV = FA_BKV> struct FlashLayout {
    static constexpr int ROW = HD + 8;
    static constexpr int Q_TILE = FA_ROWS * ROW;               // one warp's query rows, one part
    static constexpr int KV_TILE = BKV * ROW;                  // one staged array's tile
};

// c0 / c1 += a . b for the two n8 tiles of one ldmatrix_x4 B load (b0 b1 of the first, then of the second).
__device__ __forceinline__ void mma_tile_pair(float (&c0)[4], float (&c1)[4], const uint32_t (&a)[4],
                                              const uint32_t (&b)[4]) {
    mma_bf16_16816(c0, a[0], a[1], a[2], a[3], b[0], b[1]);
    mma_bf16_16816(c1, a[0], a[1], a[2], a[3], b[2], b[3]);
}

// Block (row block, KV head, split): query rows [16 rb, 16 rb + 16) of the pass, every query head of the
// KV head's group, list entries of tiles [split T / S, (split + 1) T / S), T = the tiles the block's last row
// can see. Warp w holds HPW heads, kvh * group + w HPW + j (j < HPW), each a 16-row mma tile: with HPW 2 every
// K/V fragment a warp loads from shared memory feeds both of its heads' products, so a block reads each tile's
// fragments group / 2 times instead of group times (ldmatrix traffic, not the products, bounds this kernel on
// the H200: 6 warps each re-read the same K/V tile), for twice the accumulators per thread. Row blocks run
// last-first: the late rows see the longest lists, so the longest blocks start first.
// OVERLAP (attention_flash_kvo.cu; one stage's buffers, one K tile and one V tile): the block's copies overlap
// its own products, as flash-attention 2 orders them. V(t) is copied while the warps form S(t) = q K(t)^T;
// K(t + 1) while they take the softmax of S(t) and add P V(t). Without it (STAGES 1) a block waits for each
// whole tile after the last warp is done with the one before, and only a second block on the SM hides the
// copy. OVERLAP also skips the causal mask on tiles that every row of the block sees whole (the block's first
// row sees the fewest entries): same values, fewer comparisons.
// BKV (attention_flash_tiles.cu: 64): list entries per K/V tile, FA_BKV by default. A tile's fixed costs (two
// barriers with OVERLAP, the softmax's row reductions and rescale of every accumulator, the Q fragments' loads)
// then serve twice the entries; S takes twice the registers.
// HOIST (attention_flash_tiles.cu): each thread copies the same 16-byte column of rows tid / (HD / 8) + k step
// of every tile, its source and destination pointers advanced by constants (9 PTX instructions a copy). Without
// it every copy derives its array, row and column from a running index (~40 instructions each in PTX; with
// 32-entry tiles ~250 of the ~670 a warp issues per tile at head_dim 128). The same bytes land in the same places.
// Launch: grid (ceil(n_rows / 16), KVH, S), block 32 * group / HPW, dynamic shared memory
// 2 * (2 group Q_TILE + STAGES 2 FA_KV_PARTS KV_TILE) bytes (cuda_kernels.attention_flash).
template <int HD, int STAGES, int PARTS, int HPW, bool OVERLAP, int BKV = FA_BKV, bool HOIST = false>
__device__ __forceinline__ void attention_flash(const float* qkv, int qkv_stride, const uint16_t* k_hi,
                                                const uint16_t* k_lo, const uint16_t* v_hi, const uint16_t* v_lo,
                                                int stage_cap, const int* ctl, float* part_o, float* part_ml,
                                                int n_rows, int n_q_heads, int n_kv_heads, int n_splits,
                                                float scale_log2) {
    using L = FlashLayout<HD, BKV>;
    static_assert(!HOIST || OVERLAP, "the hoisted copies are written for the K/V overlap's copy order");
    extern __shared__ uint4 smem_flash[];
    uint16_t* smem = reinterpret_cast<uint16_t*>(smem_flash);
    const int group = n_q_heads / n_kv_heads;                  // = HPW x the warps of the block
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;                     // mma fragment coordinates
    const int kvh = blockIdx.y, split = blockIdx.z;
    const int r0 = (gridDim.x - 1 - blockIdx.x) * FA_ROWS;     // latest rows first
    const int r_end = min(n_rows, r0 + FA_ROWS);
    const int h0 = warp * HPW;                                 // the warp's first head within the group
    uint16_t* kv_smem = smem + 2 * group * L::Q_TILE;           // STAGES x [Kh, (Kl), Vh, (Vl)]

    const int visible_last = list_length(ctl, r_end - 1);      // entries the block's last row sees
    const int n_tiles = (visible_last + BKV - 1) / BKV;
    const int t_begin = (int)(((long long)split * n_tiles) / n_splits);
    const int t_end = (int)(((long long)(split + 1) * n_tiles) / n_splits);
    static_assert(!OVERLAP || STAGES == 1, "the K/V overlap uses one stage's buffers");
    const int len_first = list_length(ctl, r0);                // entries the block's first row sees: the fewest

    // HOIST: this thread's column of 16 bytes and first row of every tile, and the rows between its copies.
    constexpr int H_CHUNKS = HD / 8;
    const int h_col = (threadIdx.x % H_CHUNKS) * 8, h_row0 = threadIdx.x / H_CHUNKS;
    const int h_step = blockDim.x / H_CHUNKS;                  // blockDim is 32 x warps: a multiple of H_CHUNKS
    const size_t h_head = (size_t)kvh * stage_cap;
    auto load_hoisted = [&](int tile, int buf, int first, int n_arrays) {
        uint16_t* dst0 = kv_smem + buf * (2 * FA_KV_PARTS) * L::KV_TILE + h_col;
        const int j0 = tile * BKV;
        for (int a = first; a < first + n_arrays; ++a) {
            const uint16_t* array = a < FA_KV_PARTS ? (a == 0 ? k_hi : k_lo) : (a == FA_KV_PARTS ? v_hi : v_lo);
            const uint16_t* head = array + h_head * HD + h_col;    // entry 0: a valid address for the zero fills
            const uint16_t* src = head + (size_t)(j0 + h_row0) * HD;
            uint16_t* dst = dst0 + a * L::KV_TILE + h_row0 * L::ROW;
            for (int j = j0 + h_row0; j < j0 + BKV; j += h_step, src += h_step * HD, dst += h_step * L::ROW) {
                const bool ok = j < visible_last;              // entries past the last row's list: zeros
                cp_async16(dst, ok ? src : head, ok ? 16 : 0);
            }
        }
    };

    // One tile of `n_arrays` staged arrays from array `first` on (in shared-memory order: K hi, (K lo), V hi,
    // (V lo)) into stage buffer `buf`; entries past the last row's list are zeros (masked anyway, and 0 *
    // garbage could be NaN).
    auto load_arrays = [&](int tile, int buf, int first, int n_arrays) {
        constexpr int CHUNKS = HD / 8;                         // 16-byte copies per row
        if constexpr (HOIST) {
            load_hoisted(tile, buf, first, n_arrays);
            return;
        }
        constexpr int PER_ARRAY = BKV * CHUNKS;
        uint16_t* dst = kv_smem + buf * (2 * FA_KV_PARTS) * L::KV_TILE;
        const int j0 = tile * BKV;
        for (int c = threadIdx.x; c < n_arrays * PER_ARRAY; c += blockDim.x) {
            const int arr = first + c / PER_ARRAY;
            const int rem = c - (arr - first) * PER_ARRAY;
            const int j = rem / CHUNKS, ch = rem - j * CHUNKS;
            const bool ok = j0 + j < visible_last;
            const uint16_t* array = arr < FA_KV_PARTS ? (arr == 0 ? k_hi : k_lo)
                                                      : (arr == FA_KV_PARTS ? v_hi : v_lo);
            const uint16_t* src = array + ((size_t)kvh * stage_cap + (ok ? j0 + j : 0)) * HD + ch * 8;
            cp_async16(dst + arr * L::KV_TILE + j * L::ROW + ch * 8, src, ok ? 16 : 0);
        }
    };
    auto load_tile = [&](int tile, int buf) { load_arrays(tile, buf, 0, 2 * FA_KV_PARTS); };

    if (t_begin < t_end) load_arrays(t_begin, 0, 0, OVERLAP ? FA_KV_PARTS : 2 * FA_KV_PARTS);   // K first alone
    cp_async_commit();

    // This warp's 16 query rows of each of its heads, scaled into log2 units, as bf16 hi/lo (overlaps the first
    // copy). Head hl of the group has Q tiles hl (hi) and group + hl (lo).
#pragma unroll
    for (int j = 0; j < HPW; ++j) {
        const int hl = h0 + j, h = kvh * group + hl;
        uint16_t* q_hi = smem + hl * L::Q_TILE;
        uint16_t* q_lo = smem + (group + hl) * L::Q_TILE;
        for (int e = lane; e < FA_ROWS * (HD / 4); e += 32) {
            const int i = e / (HD / 4), c = e - i * (HD / 4);
            float4 q = make_float4(0.f, 0.f, 0.f, 0.f);
            if (r0 + i < n_rows) q = *reinterpret_cast<const float4*>(qkv + (size_t)(r0 + i) * qkv_stride + h * HD + 4 * c);
            uint2 hi, lo;
            split_pair(q.x * scale_log2, q.y * scale_log2, hi.x, lo.x);
            split_pair(q.z * scale_log2, q.w * scale_log2, hi.y, lo.y);
            *reinterpret_cast<uint2*>(q_hi + i * L::ROW + 4 * c) = hi;
            *reinterpret_cast<uint2*>(q_lo + i * L::ROW + 4 * c) = lo;
        }
    }

    // Rows g and g + 8 of the warp's tiles: how many list entries each sees (0 past the pass's rows).
    int len[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) len[r] = r0 + g + 8 * r < n_rows ? list_length(ctl, r0 + g + 8 * r) : 0;
    float m[HPW][2], l[HPW][2];
    float o[HPW][HD / 8][4];
#pragma unroll
    for (int j = 0; j < HPW; ++j) {
        m[j][0] = m[j][1] = -INFINITY;
        l[j][0] = l[j][1] = 0.f;
#pragma unroll
        for (int nd = 0; nd < HD / 8; ++nd) o[j][nd][0] = o[j][nd][1] = o[j][nd][2] = o[j][nd][3] = 0.f;
    }

    for (int tile = t_begin; tile < t_end; ++tile) {
        const int buf = STAGES > 1 ? (tile - t_begin) % STAGES : 0;
        if (STAGES == 1 && !OVERLAP && tile > t_begin) {
            __syncthreads();                                   // every warp is done with the buffer
            load_tile(tile, 0);
            cp_async_commit();
        }
        cp_async_wait<0>();
        __syncthreads();                                       // the tile (OVERLAP: its K) and the Q rows visible
        if (OVERLAP) {                                         // every warp is past P V(tile - 1): V's buffer is free
            load_arrays(tile, 0, FA_KV_PARTS, FA_KV_PARTS);
            cp_async_commit();
        }
        if (STAGES > 1 && tile + 1 < t_end) {
            load_tile(tile + 1, (buf + 1) % STAGES);           // read by all before the barrier above
            cp_async_commit();
        }
        const uint16_t* kh = kv_smem + buf * (2 * FA_KV_PARTS) * L::KV_TILE;
        const uint16_t* vh = kh + FA_KV_PARTS * L::KV_TILE;

        // S = q K^T over the tile: BKV / 8 n8 tiles of entries, HD / 16 k-steps; each K fragment serves the
        // warp's HPW heads.
        float s[HPW][BKV / 8][4];
#pragma unroll
        for (int j = 0; j < HPW; ++j)
#pragma unroll
            for (int nt = 0; nt < BKV / 8; ++nt) s[j][nt][0] = s[j][nt][1] = s[j][nt][2] = s[j][nt][3] = 0.f;
#pragma unroll
        for (int ks = 0; ks < HD / 16; ++ks) {
            uint32_t ah[HPW][4], al[HPW][4];
#pragma unroll
            for (int j = 0; j < HPW; ++j) {
                ldmatrix_x4(ah[j], a_fragment_row(smem + (h0 + j) * L::Q_TILE + ks * 16, L::ROW, lane));
                if (PARTS == 2)
                    ldmatrix_x4(al[j], a_fragment_row(smem + (group + h0 + j) * L::Q_TILE + ks * 16, L::ROW, lane));
            }
#pragma unroll
            for (int np = 0; np < BKV / 16; ++np) {
                uint32_t b[4];
                ldmatrix_x4(b, b_fragment_row(kh + np * 16 * L::ROW + ks * 16, L::ROW, lane));
#pragma unroll
                for (int j = 0; j < HPW; ++j) {
                    mma_tile_pair(s[j][2 * np], s[j][2 * np + 1], ah[j], b);
                    if (PARTS == 2) mma_tile_pair(s[j][2 * np], s[j][2 * np + 1], al[j], b);
                }
#if FA_KV_PARTS == 2
                if (PARTS == 2) {
                    ldmatrix_x4(b, b_fragment_row(kh + L::KV_TILE + np * 16 * L::ROW + ks * 16, L::ROW, lane));
#pragma unroll
                    for (int j = 0; j < HPW; ++j) mma_tile_pair(s[j][2 * np], s[j][2 * np + 1], ah[j], b);
                }
#endif
            }
        }

        if (OVERLAP) {
            cp_async_wait<0>();
            __syncthreads();                                   // V(tile) visible; every warp is done with K(tile)
            if (tile + 1 < t_end) {
                load_arrays(tile + 1, 0, 0, FA_KV_PARTS);
                cp_async_commit();
            }
        }
        const bool whole = OVERLAP && (tile + 1) * BKV <= len_first;   // no entry of the tile is masked

        // Online softmax of rows g (r = 0) and g + 8 (r = 1) of each head; s[j][nt][2 r + e] is entry
        // tile*BKV + 8 nt + 2 t + e.
#pragma unroll
        for (int j = 0; j < HPW; ++j)
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                float mx = m[j][r];
#pragma unroll
                for (int nt = 0; nt < BKV / 8; ++nt)
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const int jj = tile * BKV + nt * 8 + 2 * t + e;
                        if (whole || jj < len[r]) mx = fmaxf(mx, s[j][nt][2 * r + e]);
                    }
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                // mx is -inf only while the row has seen nothing yet: its weights stay 0.
                const float alpha = mx == -INFINITY ? 1.f : exp2f(m[j][r] - mx);
                float sum = 0.f;
#pragma unroll
                for (int nt = 0; nt < BKV / 8; ++nt)
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const int jj = tile * BKV + nt * 8 + 2 * t + e;
                        const float p = whole || jj < len[r] ? exp2f(s[j][nt][2 * r + e] - mx) : 0.f;
                        s[j][nt][2 * r + e] = p;
                        sum += p;
                    }
                sum += __shfl_xor_sync(0xffffffffu, sum, 1);
                sum += __shfl_xor_sync(0xffffffffu, sum, 2);
                l[j][r] = l[j][r] * alpha + sum;
                m[j][r] = mx;
#pragma unroll
                for (int nd = 0; nd < HD / 8; ++nd) {
                    o[j][nd][2 * r] *= alpha;
                    o[j][nd][2 * r + 1] *= alpha;
                }
            }

        // O += P V: P straight from S's accumulators (an m16n8 pair is an m16k16 A fragment), split hi/lo;
        // V's B fragments by ldmatrix.trans from the [entry][dim] tile, each serving the warp's HPW heads.
#pragma unroll
        for (int kk = 0; kk < BKV / 16; ++kk) {
            uint32_t ph[HPW][4], pl[HPW][4];
#pragma unroll
            for (int j = 0; j < HPW; ++j) {
                split_pair(s[j][2 * kk][0], s[j][2 * kk][1], ph[j][0], pl[j][0]);           // row g,     16 kk + 2t
                split_pair(s[j][2 * kk][2], s[j][2 * kk][3], ph[j][1], pl[j][1]);           // row g + 8
                split_pair(s[j][2 * kk + 1][0], s[j][2 * kk + 1][1], ph[j][2], pl[j][2]);   // row g, 16 kk + 8 + 2t
                split_pair(s[j][2 * kk + 1][2], s[j][2 * kk + 1][3], ph[j][3], pl[j][3]);   // row g + 8
            }
#pragma unroll
            for (int dp = 0; dp < HD / 16; ++dp) {
                uint32_t b[4];
                ldmatrix_x4_trans(b, bt_fragment_row(vh + kk * 16 * L::ROW + dp * 16, L::ROW, lane));
#pragma unroll
                for (int j = 0; j < HPW; ++j) {
                    mma_tile_pair(o[j][2 * dp], o[j][2 * dp + 1], ph[j], b);
                    if (PARTS == 2) mma_tile_pair(o[j][2 * dp], o[j][2 * dp + 1], pl[j], b);
                }
#if FA_KV_PARTS == 2
                if (PARTS == 2) {
                    ldmatrix_x4_trans(b, bt_fragment_row(vh + L::KV_TILE + kk * 16 * L::ROW + dp * 16, L::ROW, lane));
#pragma unroll
                    for (int j = 0; j < HPW; ++j) mma_tile_pair(o[j][2 * dp], o[j][2 * dp + 1], ph[j], b);
                }
#endif
            }
        }
    }
    cp_async_wait<0>();

    // The split's partial sums of rows g and g + 8 of each head (a split that saw nothing writes m = -inf, l = 0,
    // o = 0).
#pragma unroll
    for (int j = 0; j < HPW; ++j)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int row = r0 + g + 8 * r;
            if (row >= n_rows) continue;
            const size_t base = ((size_t)split * n_rows + row) * n_q_heads + kvh * group + h0 + j;
            store_partial_row<HD>(o[j], r, m[j][r], l[j][r], part_o, part_ml, base, t);
        }
}

// One extern "C" entry of the template: attention_flash_hd<HD>_s<STAGES><SUFFIX>.
#define ATTENTION_FLASH_ENTRY(HD, STAGES, PARTS, HPW, OVERLAP, SUFFIX, BOUNDS)                                 \
    extern "C" __global__ void __launch_bounds__ BOUNDS attention_flash_hd##HD##_s##STAGES##SUFFIX(           \
            const float* qkv, int qkv_stride, const uint16_t* k_hi, const uint16_t* k_lo, const uint16_t* v_hi,  \
            const uint16_t* v_lo, int stage_cap, const int* ctl, float* part_o, float* part_ml, int n_rows,     \
            int n_q_heads, int n_kv_heads, int n_splits, float scale_log2) {                                   \
        attention_flash<HD, STAGES, PARTS, HPW, OVERLAP>(qkv, qkv_stride, k_hi, k_lo, v_hi, v_lo, stage_cap,  \
                                                         ctl, part_o, part_ml, n_rows, n_q_heads, n_kv_heads,  \
                                                         n_splits, scale_log2);                                \
    }

// An entry with its tile size and copy scheme (attention_flash_tiles.cu): K/V overlap, one stage, one head per warp.
#define ATTENTION_FLASH_TILE_ENTRY(HD, PARTS, BKV, HOIST, SUFFIX, BOUNDS)                                        \
    extern "C" __global__ void __launch_bounds__ BOUNDS attention_flash_hd##HD##_s1##SUFFIX(                    \
            const float* qkv, int qkv_stride, const uint16_t* k_hi, const uint16_t* k_lo, const uint16_t* v_hi,  \
            const uint16_t* v_lo, int stage_cap, const int* ctl, float* part_o, float* part_ml, int n_rows,     \
            int n_q_heads, int n_kv_heads, int n_splits, float scale_log2) {                                   \
        attention_flash<HD, 1, PARTS, 1, true, BKV, HOIST>(qkv, qkv_stride, k_hi, k_lo, v_hi, v_lo, stage_cap, \
                                                           ctl, part_o, part_ml, n_rows, n_q_heads, n_kv_heads, \
                                                           n_splits, scale_log2);                              \
    }
