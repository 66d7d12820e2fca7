// attention.cu: the merge of split attention (flash-decoding): the partial sums of
// attention_tiled.cu (prefill rows) and attention_decode.cu (decode rows) over chunks of the attend
// list are combined with a numerically safe softmax.
//
// Query row i (table index t = ctl[CTL_ROW_OFFSET] + i) attends to attend_list[0, len_i) with
// len_i = ctl[CTL_CTX_LEN] + t + 1; split s holds the entries [s*S, (s+1)*S) ∩ [0, len_i), S =
// split_span(ctl, n_rows, n_splits) (common.cuh; ATTN_CHUNK when the splits cover the arena), as
// m_s = max score, l_s = sum exp(score - m_s), o_s[:] = sum exp(score - m_s) v[:].
// attention_merge: M = max_s m_s;  out[i, h, :] = sum_s e^(m_s - M) o_s[:] / sum_s e^(m_s - M) l_s
//
// Layouts:   part_o  [n_rows, Hq, n_splits, hd] float32; part_ml [n_rows, Hq, n_splits, 2] float32
//            out [n_rows, out_stride] float32, head h at columns h*hd ..
// Launch:    grid (Hq, n_rows), block 256; may be launched programmatically (waits first).
// Preconditions: hd <= ATTN_MAX_HEAD_DIM, hd % 4 == 0, n_splits <= 4096 (checked on the host);
//            out_stride % 4 == 0 and 16-byte aligned rows (float4 stores).
// (The shared-memory partial kernel that lived here, attention_partial, was dropped when
// attention_decode.cu took the decode rows: notes/cuda_notes.md, issue 10.)
#include "attention_merge.cuh"

// attention_merge: the merge of many rows (the prefill); attention_merge_prefetch: the same sums with each
// warp's first MERGE_PREFETCH part_o rows loaded up front (attention_merge.cuh), for grids of a few rows.
#define MERGE_ENTRY(NAME, PRE)                                                                                 \
    extern "C" __global__ void __launch_bounds__(MERGE_THREADS) NAME(                                         \
            const float* part_o, const float* part_ml, const int* ctl, float* out, int out_stride,             \
            int n_q_heads, int head_dim, int n_splits) {                                                       \
        griddep_wait();                   /* the partial sums come from the kernel before */                   \
        griddep_launch_dependents();                                                                           \
        merge_body<PRE>(part_o, part_ml, ctl, out, out_stride, n_q_heads, head_dim, n_splits, blockIdx.x,     \
                        blockIdx.y, gridDim.y);                                                                \
    }

MERGE_ENTRY(attention_merge, 0)
MERGE_ENTRY(attention_merge_prefetch, MERGE_PREFETCH)
