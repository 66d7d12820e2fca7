// attention_flash_kvo.cu: the bulk prefill's flash attention with the K/V overlap
// (KernelPlan.bulk_attention_kv_overlap; attention_flash.cuh's OVERLAP): each block copies V(t) while its warps
// form q K(t)^T and K(t + 1) while they add P V(t). Same inputs, outputs and launch as prefill_bulk.cu's one-stage entries (its header comment has
// the precision and the layouts), and the same values: the order of every product and sum is theirs.
// The serving choice since 2026-12-03 (eighth session: 11% faster at hd128 with two parts, 18% with one, ncu);
// a family of its own, built beside prefill_bulk.cu at cold start (its build is the shorter of the two).
#include "attention_flash.cuh"

// Entries by head_dim, parts (_p1: bf16 products only) and heads per warp (_w2: two; two blocks per SM, as
// prefill_bulk.cu's _w2 entries).
ATTENTION_FLASH_ENTRY(32, 1, 2, 1, true, _kvo, (256))
ATTENTION_FLASH_ENTRY(64, 1, 2, 1, true, _kvo, (256))
ATTENTION_FLASH_ENTRY(128, 1, 2, 1, true, _kvo, (256))
ATTENTION_FLASH_ENTRY(32, 1, 1, 1, true, _p1_kvo, (256))
ATTENTION_FLASH_ENTRY(64, 1, 1, 1, true, _p1_kvo, (256))
ATTENTION_FLASH_ENTRY(128, 1, 1, 1, true, _p1_kvo, (256))
ATTENTION_FLASH_ENTRY(32, 1, 2, 2, true, _w2_kvo, (128, 2))
ATTENTION_FLASH_ENTRY(64, 1, 2, 2, true, _w2_kvo, (128, 2))
ATTENTION_FLASH_ENTRY(128, 1, 2, 2, true, _w2_kvo, (128, 2))
ATTENTION_FLASH_ENTRY(32, 1, 1, 2, true, _w2_p1_kvo, (128, 2))
ATTENTION_FLASH_ENTRY(64, 1, 1, 2, true, _w2_p1_kvo, (128, 2))
ATTENTION_FLASH_ENTRY(128, 1, 1, 2, true, _w2_p1_kvo, (128, 2))
