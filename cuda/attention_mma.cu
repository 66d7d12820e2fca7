// attention_mma.cu: the partial sums of attention_tiled.cu (same inputs, same split layout, same
// merge), computed on the tensor cores: the prefill's 32 query rows against a 64-slot chunk of
// the attend list as two small matrix products per query tile.
//
// Why: attention_tiled.cu multiplies fp32 values out of shared memory on the CUDA cores (80 us
// per layer at 32 rows x 4064 slots on the H200, the largest single item of the prefill). Here
// the products are bf16 mma.sync: measured 24.5 us per layer (bench/attention_probe.py; the
// prefill's attention 2.28 -> 0.70 ms). Where the rest goes is not measured per part; the
// probe's launch shapes point at both the gather (every block loads its chunk's fp32 K/V rows,
// 64 KB, through the slot list, splits them and transposes V before the first product; bf16 KV
// in the arena would halve that) and each tile's chain of q loads and products. Not the gather's wait:
// copying the next chunk raw (cp.async) under the current chunk's products measured no faster on the H200
// (32 rows over 32000 slots, at most 66 splits: 141 us per layer as _b2 here, 154-190 pipelined; a bf16
// arena 100 vs 102; notes/cuda_notes.md, 2026-12-03 second session), and the time follows the product
// count instead (bf16 arena: 2 products a step instead of 3, 141 -> 100 us).
//
// Precision: K, V, the scaled q and the softmax weights P are fp32; each goes into the mma as a
// bf16 pair hi + lo (mma_bf16.cuh's split, ~16 mantissa bits), and a product x.y is taken as
// hi_x.hi_y + hi_x.lo_y + lo_x.hi_y (the lo.lo term, ~2^-16 of the product, is dropped).
// Scores and sums accumulate in fp32. The error is ~1e-5 relative, that of
// the bf16 prefill projections; the fp32 model keeps attention_tiled.cu (cuda_backend.py).
// A bf16 arena (kv_store.cuh, -DKV_BF16) holds K and V as bf16 already: their lo halves are zero,
// so they are neither gathered nor multiplied (2 products per step instead of 3, half the shared
// memory). Adding a zero product changes no accumulator, so the results are bit-identical to an
// fp32 arena holding the same values.
//
// Per split s, query vector (row i, head h), as attention_tiled.cu:
//            m = max_j score_j,  l = sum_j exp(score_j - m),  o[:] = sum_j exp(score_j - m) v_j[:]
//            over list entries j in [s*S, (s+1)*S) ∩ [0, len_i), score_j = (q.k_j) * scale, S = split_span(ctl,
//            n_rows, n_splits) (common.cuh): one ATTN_CHUNK when the splits cover the arena, several (walked
//            one after another with a running softmax) when the host launches fewer splits, as it does at
//            long context, where the partial sums of 64-entry splits outweigh the K/V they summarise.
//            Splits a row cannot see write nothing (attention.cu's merge skips them).
//
// Layouts:   as attention_tiled.cu (qkv rows, one layer's k/v arena [KVH, capacity, hd] kv_t, attend_list,
//            part_o [n_rows, Hq, n_splits, hd], part_ml [n_rows, Hq, n_splits, 2]).
// Launch:    grid (ceil_div(n_rows, R), n_splits, KVH), block AM_THREADS (8 warps), dynamic shared memory
//            2 * AM_KV_PARTS * (CHUNK * (hd + 8) + hd * (CHUNK + 8)) bytes; R = rows_per_block, R * group <= 256
//            (cuda_kernels.ATTN_MMA_MAX_QV).
//            Entry points attention_partial_mma_hd<hd>_b<blocks per SM> (below): head_dim is a template
//            parameter, as it sizes the per-warp accumulators.
// Block:     one split x one KV head x R query rows: its query vectors qv = rr * group + g form tiles
//            of 16 (the mma's M); warp w takes tiles w, w + 8, ... Each chunk's K (slot-major) and V
//            (transposed, dimension-major) are gathered into shared memory as bf16 hi/lo. The row blocks
//            of one split are neighbours in the grid, so the second gathers its chunks from L2.
//            Per tile: S[16 x 64] = Q K^T (8 n-tiles of 8 slots, hd/16 k-steps); the softmax
//            statistics of each row from its quad's registers; then O[16 x hd] = P V with P taken
//            straight from S's accumulator registers (an m16n8 accumulator pair is an m16k16 A fragment).
#include "mma_bf16.cuh"
#include "kv_store.cuh"

#define AM_THREADS 256
#define AM_WARPS (AM_THREADS / 32)
#define AM_GATHER 4                        // 8-value K (and V) pieces per thread in flight
#ifdef KV_BF16
#define AM_KV_PARTS 1                      // K/V in shared memory as bf16 hi only (lo is zero)
#else
#define AM_KV_PARTS 2                      // hi and lo
#endif

// Shared-memory row strides in bf16 elements: 8 extra halves (16 bytes) so that the fragment loads
// of a warp (8 rows g x 4 words t) fall in 32 distinct banks.
template <int HD> struct MmaLayout {
    static constexpr int KS = HD + 8;                  // K_hi / K_lo: [ATTN_CHUNK][KS]
    static constexpr int VS = ATTN_CHUNK + 8;          // V_hi / V_lo: [HD][VS] (transposed)
    static constexpr int K_HALVES = ATTN_CHUNK * KS;
    static constexpr int V_HALVES = HD * VS;
};

// 8 fp32 values -> 4 words of bf16 hi and 4 of lo (low half = lower index).
__device__ __forceinline__ void split8(const float4& a, const float4& b, uint4& hi, uint4& lo) {
    const float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
    uint32_t h[4], l[4];
    split_activations(v, h, l);
    hi = make_uint4(h[0], h[1], h[2], h[3]);
    lo = make_uint4(l[0], l[1], l[2], l[3]);
}

// Two fp32 values -> one hi word and one lo word.
__device__ __forceinline__ void split2(float a, float b, uint32_t& hi, uint32_t& lo) {
    const float ha = __bfloat162float(__float2bfloat16_rn(a));
    const float hb = __bfloat162float(__float2bfloat16_rn(b));
    hi = pack_bf16x2(ha, hb);
    lo = pack_bf16x2(a - ha, b - hb);
}

// c += x.y as three bf16 products (hi.hi + hi.lo + lo.hi); y = K or V, whose lo is zero (and not
// read) in a bf16 arena, which leaves two.
__device__ __forceinline__ void mma_split(float* c, const uint32_t (&ah)[4], const uint32_t (&al)[4],
                                          uint32_t bh0, uint32_t bh1, uint32_t bl0, uint32_t bl1) {
    if (AM_KV_PARTS == 2) mma_bf16_16816(c, ah[0], ah[1], ah[2], ah[3], bl0, bl1);
    mma_bf16_16816(c, al[0], al[1], al[2], al[3], bh0, bh1);
    mma_bf16_16816(c, ah[0], ah[1], ah[2], ah[3], bh0, bh1);
}

// 8 consecutive arena values of one K or V row, as loaded (the gather keeps AM_GATHER of them in
// flight before converting any).
struct KvPiece {
#ifdef KV_BF16
    uint4 w;                                               // 8 bf16
#else
    float4 a, b;
#endif
};

__device__ __forceinline__ KvPiece load_piece(const kv_t* p) {
    KvPiece r;
#ifdef KV_BF16
    r.w = __ldg(reinterpret_cast<const uint4*>(p));
#else
    r.a = __ldg(reinterpret_cast<const float4*>(p));
    r.b = __ldg(reinterpret_cast<const float4*>(p) + 1);
#endif
    return r;
}

__device__ __forceinline__ KvPiece zero_piece() {
    KvPiece r;
#ifdef KV_BF16
    r.w = make_uint4(0u, 0u, 0u, 0u);
#else
    r.a = r.b = make_float4(0.f, 0.f, 0.f, 0.f);
#endif
    return r;
}

// A piece as 4 words of bf16 hi and (fp32 arena only) 4 of lo.
__device__ __forceinline__ void split_piece(const KvPiece& x, uint4& hi, uint4& lo) {
#ifdef KV_BF16
    hi = x.w;
    lo = make_uint4(0u, 0u, 0u, 0u);
#else
    split8(x.a, x.b, hi, lo);
#endif
}

// Gather the chunk's K and V rows (list entries j0 .. j0 + n_here) into shared memory as bf16 hi/lo
// (hi only for a bf16 arena); slots past n_here are zeros (their scores are masked, and 0 * garbage
// could be NaN).
template <int HD>
__device__ __forceinline__ void gather_chunk(const kv_t* k_head, const kv_t* v_head, const int* attend_list,
                                             int j0, int n_here, uint16_t* kh, uint16_t* kl, uint16_t* vh,
                                             uint16_t* vl) {
    using L = MmaLayout<HD>;
    constexpr int C8 = HD / 8;                           // 8-value pieces per K/V row
    constexpr int TOTAL = ATTN_CHUNK * C8;
    for (int base = threadIdx.x; base < TOTAL; base += AM_THREADS * AM_GATHER) {
        KvPiece kp[AM_GATHER], vp[AM_GATHER];
#pragma unroll
        for (int u = 0; u < AM_GATHER; ++u) {
            const int e = base + u * AM_THREADS;         // range [0, TOTAL) when in bounds
            // K: 8 consecutive dimensions of one slot per thread, dimension-fastest (coalesced rows);
            // V: slot-fastest, so the transposed 16-bit stores of a warp land in one shared-memory row.
            const int kj = e / C8, kc = e - kj * C8;
            const int vj = e % ATTN_CHUNK, vc = e / ATTN_CHUNK;
            kp[u] = vp[u] = zero_piece();
            if (e < TOTAL && kj < n_here) kp[u] = load_piece(k_head + (size_t)attend_list[j0 + kj] * HD + 8 * kc);
            if (e < TOTAL && vj < n_here) vp[u] = load_piece(v_head + (size_t)attend_list[j0 + vj] * HD + 8 * vc);
        }
#pragma unroll
        for (int u = 0; u < AM_GATHER; ++u) {
            const int e = base + u * AM_THREADS;
            if (e >= TOTAL) continue;
            uint4 hi, lo;
            const int kj = e / C8, kc = e - kj * C8;
            split_piece(kp[u], hi, lo);
            *reinterpret_cast<uint4*>(kh + kj * L::KS + 8 * kc) = hi;
            if (AM_KV_PARTS == 2) *reinterpret_cast<uint4*>(kl + kj * L::KS + 8 * kc) = lo;
            const int vj = e % ATTN_CHUNK, vc = e / ATTN_CHUNK;
            split_piece(vp[u], hi, lo);
            const uint32_t hw[4] = {hi.x, hi.y, hi.z, hi.w}, lw[4] = {lo.x, lo.y, lo.z, lo.w};
#pragma unroll
            for (int d = 0; d < 8; ++d) {
                const int row = (8 * vc + d) * L::VS + vj;
                vh[row] = (uint16_t)(hw[d >> 1] >> (16 * (d & 1)));
                if (AM_KV_PARTS == 2) vl[row] = (uint16_t)(lw[d >> 1] >> (16 * (d & 1)));
            }
        }
    }
}

// One query tile's running softmax state across the chunks of its split (rows g and g + 8 of the tile):
// m = -inf until the row has seen a slot; o holds the unnormalised P.V sums, of all HD dimensions (HALVES 1) or
// of the warp's half of them (HALVES 2: the _hs entries below).
template <int HD, int HALVES = 1>
struct TileState {
    float o[HD / 8 / HALVES][4];
    float m[2], l[2];
};

// The tile's scores against the chunk in shared memory, folded into st (online softmax). lim[r]: the
// chunk's slots row r sees (0: none, and its state is left as it was). FIRST: the split's first chunk,
// st not yet set: it is written, not rescaled, so the P.V sums are not live while S is computed (the
// registers of a one-chunk split, the common case, are those of a kernel without a running state).
// HALVES 2 (the _hs entries): the warp keeps the P.V sums of half of the head's dimensions, `half` saying which;
// the scores, the softmax and each product of its half are those of a warp that keeps them all (the same bits).
// MASKED_ARGS (the _ma entries): a slot the row does not see enters the maximum as -inf and the exponential
// as expf(-inf), which is +0 exactly, instead of being skipped by a test. The same values, so the same bits;
// without the tests the 32 exponentials per thread are one straight run of code. With them, nvcc makes each
// test a branch around its expf (the _b2 entry's SASS on the bf16 arena: a BRA before each of the 32 MUFU.EX2 of
// the softmax, spills stored between them), so a chunk's softmax runs one exponential after another.
template <int HD, bool FIRST, bool MASKED_ARGS = false, int HALVES = 1>
__device__ __forceinline__ void tile_chunk(TileState<HD, HALVES>& st, const float* const (&q_src)[2],
                                           const int (&lim)[2], float scale, const uint32_t* kh32,
                                           const uint32_t* kl32, const uint32_t* vh32, const uint32_t* vl32, int g,
                                           int t, int half = 0) {
    constexpr int ND = HD / 8 / HALVES;                         // the n-tiles of O this warp keeps
    using L = MmaLayout<HD>;
    // S = (q * scale) K^T: 8 n-tiles of 8 slots.
    float s[ATTN_CHUNK / 8][4];
#pragma unroll
    for (int nt = 0; nt < ATTN_CHUNK / 8; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
#pragma unroll
    for (int ks = 0; ks < HD / 16; ++ks) {
        uint32_t ah[4], al[4];
#pragma unroll
        for (int f = 0; f < 4; ++f) {                           // fragment f: row (f & 1), column half (f >> 1)
            const float2 q = *reinterpret_cast<const float2*>(q_src[f & 1] + 16 * ks + 2 * t + 8 * (f >> 1));
            split2(q.x * scale, q.y * scale, ah[f], al[f]);
        }
#pragma unroll
        for (int nt = 0; nt < ATTN_CHUNK / 8; ++nt) {
            const int w = ((nt * 8 + g) * L::KS + 16 * ks + 2 * t) >> 1;
            mma_split(s[nt], ah, al, kh32[w], kh32[w + 4], AM_KV_PARTS == 2 ? kl32[w] : 0u,
                      AM_KV_PARTS == 2 ? kl32[w + 4] : 0u);
        }
    }

    // Softmax statistics per row, over the quad of 4 threads that holds it (slots 8 nt + 2t + j); the
    // running sums are rescaled to the new maximum (corr = 0 while nothing was seen: o and l are 0).
    float corr[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        float mx = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < ATTN_CHUNK / 8; ++nt)
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                const bool seen = nt * 8 + 2 * t + j < lim[r];
                if (MASKED_ARGS) mx = fmaxf(mx, seen ? s[nt][2 * r + j] : -INFINITY);
                else if (seen) mx = fmaxf(mx, s[nt][2 * r + j]);
            }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_old = FIRST ? -INFINITY : st.m[r];
        const float m_new = lim[r] > 0 ? fmaxf(m_old, mx) : m_old;
        corr[r] = lim[r] <= 0 ? 1.f : (m_old == -INFINITY ? 0.f : expf(m_old - m_new));
        float sum = 0.f;
#pragma unroll
        for (int nt = 0; nt < ATTN_CHUNK / 8; ++nt)
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                const bool seen = nt * 8 + 2 * t + j < lim[r];
                const float p = MASKED_ARGS ? expf(seen ? s[nt][2 * r + j] - m_new : -INFINITY)
                                            : seen ? expf(s[nt][2 * r + j] - m_new) : 0.f;
                s[nt][2 * r + j] = p;
                sum += p;
            }
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        st.l[r] = FIRST ? sum : st.l[r] * corr[r] + sum;
        st.m[r] = m_new;
    }

    // O = O corr + P V: 4 k-steps of 16 slots, hd / 8 n-tiles of 8 dimensions (this warp's ND of them).
#pragma unroll
    for (int nd = 0; nd < ND; ++nd) {
        if (FIRST) {
            st.o[nd][0] = st.o[nd][1] = st.o[nd][2] = st.o[nd][3] = 0.f;
        } else {
            st.o[nd][0] *= corr[0]; st.o[nd][1] *= corr[0];
            st.o[nd][2] *= corr[1]; st.o[nd][3] *= corr[1];
        }
    }
#pragma unroll
    for (int kk = 0; kk < ATTN_CHUNK / 16; ++kk) {
        uint32_t ph[4], pl[4];
        split2(s[2 * kk][0], s[2 * kk][1], ph[0], pl[0]);           // row g,     slots 16kk + 2t
        split2(s[2 * kk][2], s[2 * kk][3], ph[1], pl[1]);           // row g + 8, slots 16kk + 2t
        split2(s[2 * kk + 1][0], s[2 * kk + 1][1], ph[2], pl[2]);   // row g,     slots 16kk + 8 + 2t
        split2(s[2 * kk + 1][2], s[2 * kk + 1][3], ph[3], pl[3]);   // row g + 8, slots 16kk + 8 + 2t
#pragma unroll
        for (int nd = 0; nd < ND; ++nd) {
            const int w = (((half * ND + nd) * 8 + g) * L::VS + 16 * kk + 2 * t) >> 1;
            mma_split(st.o[nd], ph, pl, vh32[w], vh32[w + 4], AM_KV_PARTS == 2 ? vl32[w] : 0u,
                      AM_KV_PARTS == 2 ? vl32[w + 4] : 0u);
        }
    }
}

// Row r of a warp's partial sums when it keeps half of the head's dimensions (HALVES 2): its half of o; m and l
// (the same in both warps of the tile) by the first half's warp.
template <int HD, int HALVES>
__device__ __forceinline__ void store_partial_part(const float (&o)[HD / 8 / HALVES][4], int r, float m, float l,
                                                   float* part_o, float* part_ml, size_t base, int t, int half) {
    if (half == 0 && t == 0) {
        part_ml[2 * base] = m;
        part_ml[2 * base + 1] = l;
    }
    float* dst = part_o + base * HD + half * (HD / HALVES);
#pragma unroll
    for (int nd = 0; nd < HD / 8 / HALVES; ++nd)
        *reinterpret_cast<float2*>(dst + nd * 8 + 2 * t) = make_float2(o[nd][2 * r], o[nd][2 * r + 1]);
}

template <int HD, bool MASKED_ARGS, int HALVES = 1>
__device__ __forceinline__ void attention_partial_mma(
        const float* qkv, int qkv_stride, const kv_t* k_cache, const kv_t* v_cache, const int* attend_list,
        const int* ctl, float* part_o, float* part_ml, int n_q_heads, int n_kv_heads, int capacity, int n_splits,
        float scale, int n_rows, int rows_per_block) {
    using L = MmaLayout<HD>;
    extern __shared__ uint4 smem_mma[];
    uint16_t* kh = reinterpret_cast<uint16_t*>(smem_mma);
    uint16_t* kl = kh + L::K_HALVES;                            // lo halves: fp32 arena only
    uint16_t* vh = kh + AM_KV_PARTS * L::K_HALVES;
    uint16_t* vl = vh + L::V_HALVES;
    const int r_begin = blockIdx.x * rows_per_block;            // rows [r_begin, r_end) of the call
    const int split = blockIdx.y;                               // range [0, n_splits)
    const int kvh = blockIdx.z;                                 // range [0, KVH)
    const int r_end = min(n_rows, r_begin + rows_per_block);
    const int group = n_q_heads / n_kv_heads;
    const int span = split_span(ctl, n_rows, n_splits);
    const int j0 = split * span;
    const int j_end = min(j0 + span, list_length(ctl, r_end - 1));   // the block's last row sees the most
    if (j0 >= j_end) return;                                    // block-uniform: no barrier skipped
    const kv_t* k_head = k_cache + (size_t)kvh * capacity * HD;
    const kv_t* v_head = v_cache + (size_t)kvh * capacity * HD;

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;                      // mma fragment coordinates
    const int n_q = (r_end - r_begin) * group;                  // query vectors of this block
    const uint32_t* kh32 = reinterpret_cast<const uint32_t*>(kh);
    const uint32_t* kl32 = reinterpret_cast<const uint32_t*>(kl);
    const uint32_t* vh32 = reinterpret_cast<const uint32_t*>(vh);
    const uint32_t* vl32 = reinterpret_cast<const uint32_t*>(vl);
    constexpr int TILES = AM_WARPS / HALVES;                    // tiles a round serves (HALVES warps each)
    const int half = warp % HALVES;                             // the head dimensions' half this warp keeps
    const int rounds = (n_q + 16 * TILES - 1) / (16 * TILES);   // tiles per warp, block-uniform
    int gathered = -1;                                          // the chunk now in shared memory
    for (int round = 0; round < rounds; ++round) {
        const int tile = warp / HALVES + round * TILES;
        const bool has_tile = tile * 16 < n_q;                  // warp-uniform
        // This thread's two query vectors: rows g and g + 8 of the tile.
        int qv[2], row[2], len[2];
        const float* q_src[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            qv[r] = tile * 16 + g + 8 * r;
            const bool ok = qv[r] < n_q;
            const int rr = ok ? qv[r] / group : 0;
            row[r] = r_begin + rr;
            const int h = kvh * group + (ok ? qv[r] - rr * group : 0);
            q_src[r] = qkv + (size_t)row[r] * qkv_stride + (size_t)h * HD;
            len[r] = ok ? list_length(ctl, row[r]) : 0;
        }
        TileState<HD, HALVES> st;                               // set by the first chunk

        // The split's chunks in turn (one, where the splits cover the arena): each gathered into shared
        // memory once (a second round of tiles over a one-chunk split reuses it).
        for (int c0 = j0; c0 < j_end; c0 += ATTN_CHUNK) {
            const int n_here = min(ATTN_CHUNK, j_end - c0);
            if (c0 != gathered) {
                if (gathered >= 0) __syncthreads();             // every warp is done with the previous chunk
                gather_chunk<HD>(k_head, v_head, attend_list, c0, n_here, kh, kl, vh, vl);
                __syncthreads();
                gathered = c0;
            }
            if (!has_tile) continue;
            const int lim[2] = {min(n_here, len[0] - c0), min(n_here, len[1] - c0)};   // visible slots
            if (c0 == j0)
                tile_chunk<HD, true, MASKED_ARGS, HALVES>(st, q_src, lim, scale, kh32, kl32, vh32, vl32, g, t, half);
            else
                tile_chunk<HD, false, MASKED_ARGS, HALVES>(st, q_src, lim, scale, kh32, kl32, vh32, vl32, g, t, half);
        }

        if (!has_tile) continue;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            if (st.m[r] == -INFINITY) continue;                 // saw nothing: not written, the merge skips it
            const int h = kvh * group + (qv[r] - (row[r] - r_begin) * group);
            const size_t base = ((size_t)row[r] * n_q_heads + h) * n_splits + split;
            if constexpr (HALVES == 1)                          // st.o is the whole row's [HD / 8][4] then
                store_partial_row<HD>(st.o, r, st.m[r], st.l[r], part_o, part_ml, base, t);
            else
                store_partial_part<HD, HALVES>(st.o, r, st.m[r], st.l[r], part_o, part_ml, base, t, half);
        }
    }
}

// Entries by head_dim and blocks per SM: _b1 keeps every accumulator in registers (169 of them at
// hd 128: one block of 8 warps per SM); _b2 caps registers at 128 for two blocks per SM (a little of
// the state spilled), so one block's gather overlaps another's products.
// _ma: the same with the softmax's unseen slots masked in its arguments (tile_chunk's MASKED_ARGS; KernelPlan.
// attention_masked_softmax, off until measured), the same bits; head_dim 128 only. ptxas (sm_90, bf16 / fp32
// arena): _hd128_b2_ma 128 / 128 registers, 312 / 380 bytes spilled (_hd128_b2: 292 / 420); the SASS of the bf16
// arena's _b2 entries: 22 BRA against 86, 85 spill loads against 60 (the exponentials' arguments live at once).
// _hs (KernelPlan.attention_head_halves, off until measured): two warps per 16-row tile, each keeping the P.V
// sums of half of the head's dimensions (both compute the tile's scores and softmax: 1.5x the products), so a
// round serves 4 tiles instead of 8 (the launcher gives a block half the query vectors). Why: the serving _b2
// entry caps registers at 128 and spills (ncu, H200, 32 rows over 32000 slots on the bf16 arena: 1.0 M local-memory
// requests a launch, long-scoreboard and barrier stalls, tensor pipe 20%; notes/cuda_notes.md, 2026-12-05
// nineteenth session). ptxas (sm_90, bf16 / fp32 arena): _hd128_b2_hs 12 / 8 bytes spilled (_hd128_b2: 292 / 420);
// with 3 blocks per SM (85 registers) it spilled 620 / 676, so there is no such entry.
#define ATTENTION_MMA_ENTRY(HD, MINB, MASKED, HALVES, SUFFIX)                                                \
    extern "C" __global__ void __launch_bounds__(AM_THREADS, MINB)                                           \
    attention_partial_mma_hd##HD##_b##MINB##SUFFIX(                                                          \
            const float* qkv, int qkv_stride, const kv_t* k_cache, const kv_t* v_cache,                      \
            const int* attend_list, const int* ctl, float* part_o, float* part_ml, int n_q_heads,            \
            int n_kv_heads, int capacity, int n_splits, float scale, int n_rows, int rows_per_block) {      \
        attention_partial_mma<HD, MASKED, HALVES>(qkv, qkv_stride, k_cache, v_cache, attend_list, ctl,       \
                                                  part_o, part_ml, n_q_heads, n_kv_heads, capacity, n_splits, \
                                                  scale, n_rows, rows_per_block);                           \
    }
ATTENTION_MMA_ENTRY(32, 1, false, 1, )
ATTENTION_MMA_ENTRY(64, 1, false, 1, )
ATTENTION_MMA_ENTRY(128, 1, false, 1, )
ATTENTION_MMA_ENTRY(128, 2, false, 1, )
ATTENTION_MMA_ENTRY(128, 1, true, 1, _ma)
ATTENTION_MMA_ENTRY(128, 2, true, 1, _ma)
ATTENTION_MMA_ENTRY(128, 2, false, 2, _hs)
