// attention_decode.cu: grouped-query attention for the decode rows (one query row per call in the
// engine; any n_rows works, each row re-reading the K/V, which is why prefill rows do not use it):
// the partial sums of the split scheme attention.cu merges, from registers instead of shared memory.
//
// Same contract as attention_tiled.cu: query row i (table index t = ctl[CTL_ROW_OFFSET] + i) attends
// to attend_list[0, len_i), len_i = ctl[CTL_CTX_LEN] + t + 1; query head h uses KV head h / group.
//
// attention_decode_partial: split s covers list entries [s*S, (s+1)*S) ∩ [0, len_i), S = split_span(ctl,
//            n_rows, n_splits) (common.cuh: whole ATTN_CHUNKs, one when the splits cover the arena, more
//            when the host launches fewer, as it does at long context), its chunks one after another:
//            m = max_j score_j,  l = sum_j exp(score_j - m),  o[:] = sum_j exp(score_j - m) v_j[:]
//            score_j = (q . k_j) * scale. Splits past len_i write nothing; attention.cu's
//            attention_merge combines the splits (the same layout as attention_tiled.cu's).
//
// Why not a shared-memory kernel for one row: attention.cu's former partial kernel staged a 64-slot
// chunk in shared memory, then ran 128-long scalar loops per (head, slot), so each of its ~130
// blocks spent most of its time in dependent shared-memory arithmetic (23 us per layer on the H200
// for 2 us worth of K/V bytes).
// Here a warp owns DEC_SLOTS_PER_WARP slots, every lane holds 4 (or 8) dimensions of each slot's
// K and V in registers (one coalesced 512-byte row per load instruction, all the warp's rows in
// flight at once), and a pass's dot products are summed over the warp together (each lane ends with
// one slot's score): no shared memory until the warps of a block combine their partial softmax
// states. (Measured: 0.63 -> 0.40 ms of attention per decode step at 4064 cached with one warp
// reduction per score; 0.35 with the joint sums and log2-unit exponentials; 0.32 with two warps per
// slot group (_h2), each taking half of the query heads: notes/cuda_notes.md.)
//
// Layouts:   q rows in qkv [n_rows, qkv_stride] float32 (head h at columns h*hd .. h*hd+hd-1)
//            k_cache, v_cache: one layer's arena [KVH, capacity, hd] kv_t (kv_store.cuh: fp32 or bf16)
//            part_o [n_rows, Hq, n_splits, hd] float32; part_ml [n_rows, Hq, n_splits, 2] float32
//            out [n_rows, out_stride] float32, head h at columns h*hd ..
// Launch:    grid (n_splits, KVH, n_rows), block DEC_THREADS (entries _h2: 2 DEC_THREADS); entry _v1
//            for hd <= 128, _v2 for hd <= 256 (float4s per lane); dynamic shared memory
//            DEC_WARPS * group * (8 + 4 hd) bytes.
// Preconditions: group <= ATTN_MAX_GROUP (the _g1 entries: group 1), hd % 4 == 0, hd <= 256,
//            n_splits <= MERGE_MAX_SPLITS (checked on the host).
// Programmatic dependent launch: waits (griddep_wait) before reading anything an earlier kernel
// wrote, so it may be launched with the programmatic-serialization attribute.
#include "attention_decode.cuh"

// Entries _v<VPL> (8 warps per block) and _v<VPL>_h2 (16 warps: two per 8-slot group, each with half of the
// query heads; attention_decode.cuh's HEAD_SPLIT), and _v<VPL>_g1 (8 warps, for a group of 1 only: registers for
// one query head instead of ATTN_MAX_GROUP's: 90 instead of 171 (ptxas, hd <= 128), two blocks per SM instead of
// one; KernelPlan.decode_attention_one_head_entry, serving since the 7B's decode attention took 1.87 ms per step
// with it against 2.28). The same results bit for bit.
#define DECODE_PARTIAL_ENTRY(VPL, HS, MAXG, PF, SUFFIX, EXACT)                                                 \
    extern "C" __global__ void __launch_bounds__(DEC_THREADS * HS) attention_decode_partial_v##VPL##SUFFIX(   \
            const float* qkv, int qkv_stride, const kv_t* k_cache, const kv_t* v_cache,                        \
            const int* attend_list, const int* ctl, float* part_o, float* part_ml, int n_q_heads,              \
            int n_kv_heads, int head_dim, int capacity, int n_splits, float scale) {                           \
        griddep_wait();                   /* q and this step's K/V come from the q|k|v kernel */               \
        griddep_launch_dependents();                                                                           \
        decode_partial_body<VPL, HS, MAXG, PF, EXACT>(qkv, qkv_stride, k_cache, v_cache, attend_list, ctl,     \
                                                      part_o, part_ml, n_q_heads, n_kv_heads, head_dim, capacity, \
                                                      n_splits, scale, blockIdx.x, blockIdx.y, blockIdx.z,        \
                                                      gridDim.z);                                                 \
    }

DECODE_PARTIAL_ENTRY(1, 1, ATTN_MAX_GROUP, false, , false)
DECODE_PARTIAL_ENTRY(2, 1, ATTN_MAX_GROUP, false, , false)
DECODE_PARTIAL_ENTRY(1, 2, ATTN_MAX_GROUP, false, _h2, false)
DECODE_PARTIAL_ENTRY(2, 2, ATTN_MAX_GROUP, false, _h2, false)
DECODE_PARTIAL_ENTRY(1, 1, 1, false, _g1, false)
DECODE_PARTIAL_ENTRY(2, 1, 1, false, _g1, false)

// _pf: the one-warp-per-group entries with the next pass's loads in flight while a pass is computed
// (attention_decode.cuh's PREFETCH; KernelPlan.decode_attention_prefetch: on, measured faster on the 7B's decode
// attention, 1.32 -> 1.06 ms per step). The same bits as the entry without _pf. ptxas (sm_90, bf16 / fp32 arena): _v1_g1_pf 105 / 161 registers (_v1_g1: 90 /
// 97), _v1_pf 206 / 240 (171 / 172); no _h2_pf, whose 128-register bound spilled 412 / 776 bytes.
DECODE_PARTIAL_ENTRY(1, 1, ATTN_MAX_GROUP, true, _pf, false)
DECODE_PARTIAL_ENTRY(2, 1, ATTN_MAX_GROUP, true, _pf, false)
DECODE_PARTIAL_ENTRY(1, 1, 1, true, _g1_pf, false)
DECODE_PARTIAL_ENTRY(2, 1, 1, true, _g1_pf, false)

// _x<G>: the entries for a group of exactly G query heads per KV head (attention_decode.cuh's EXACT; the host picks one
// only for that group, KernelPlan.decode_attention_exact_group): every warp's heads folded in one straight run,
// their dependent chains interleaved. The same bits as the entries for any group. Two warps per slot group for
// the even groups of the models here (tiny 2, llama-tiny 4, Qwen2.5-1.5B 6); one warp with the prefetch for those
// and SmolLM2's 3. head_dim <= 128 only (VPL 1).
DECODE_PARTIAL_ENTRY(1, 2, 2, false, _h2_x2, true)
DECODE_PARTIAL_ENTRY(1, 2, 4, false, _h2_x4, true)
DECODE_PARTIAL_ENTRY(1, 2, 6, false, _h2_x6, true)
DECODE_PARTIAL_ENTRY(1, 1, 2, true, _pf_x2, true)
DECODE_PARTIAL_ENTRY(1, 1, 3, true, _pf_x3, true)
DECODE_PARTIAL_ENTRY(1, 1, 4, true, _pf_x4, true)
DECODE_PARTIAL_ENTRY(1, 1, 6, true, _pf_x6, true)
