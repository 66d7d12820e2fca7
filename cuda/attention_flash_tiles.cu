// attention_flash_tiles.cu: the bulk prefill's flash attention with the K/V overlap (attention_flash_kvo.cu's entries)
// and a cheaper copy per tile, and optionally tiles of 64 list entries (attention_flash.cuh's HOIST and BKV).
// KernelPlan.bulk_attention_hoisted_copies and bulk_attention_tile_entries, both off by default: written
// 2026-12-03 (eighth session) from ncu's reading of attention_flash_hd128_s1_p1_kvo (1024 rows after 15360, bf16
// arena): the SMs issue in 37% of their cycles and the tensor pipe is mostly idle, with ~670 PTX instructions
// per warp and 32-entry tile of which 64 are mma and ~250 the K/V copy's index arithmetic. Not yet measured.
// Same inputs, outputs and launch as the other flash entries (prefill_bulk.cu's header comment has the precision
// and the layouts). _h (32-entry tiles): the same values as attention_flash_kvo.cu's entries, bit for bit (the
// same bytes copied, by other threads). _t64: 64-entry tiles, so the online softmax rescales after every 64
// entries instead of 32: other roundings, within the reference bound.
#include "attention_flash.cuh"

// The 64-entry tiles hold twice the scores per thread: at head_dim 128 with two parts 170 registers unbounded, so
// one block per SM; bounded to two blocks of at most 192 threads (a group of at most 6 query heads per KV head, the
// launcher checks) ptxas fits it in 160 without spills.

ATTENTION_FLASH_TILE_ENTRY(32, 2, 32, true, _kvo_h, (256))
ATTENTION_FLASH_TILE_ENTRY(64, 2, 32, true, _kvo_h, (256))
ATTENTION_FLASH_TILE_ENTRY(128, 2, 32, true, _kvo_h, (256))
ATTENTION_FLASH_TILE_ENTRY(32, 1, 32, true, _p1_kvo_h, (256))
ATTENTION_FLASH_TILE_ENTRY(64, 1, 32, true, _p1_kvo_h, (256))
ATTENTION_FLASH_TILE_ENTRY(128, 1, 32, true, _p1_kvo_h, (256))
ATTENTION_FLASH_TILE_ENTRY(32, 2, 64, true, _kvo_t64, (192, 2))
ATTENTION_FLASH_TILE_ENTRY(64, 2, 64, true, _kvo_t64, (192, 2))
ATTENTION_FLASH_TILE_ENTRY(128, 2, 64, true, _kvo_t64, (192, 2))
ATTENTION_FLASH_TILE_ENTRY(32, 1, 64, true, _p1_kvo_t64, (192, 2))
ATTENTION_FLASH_TILE_ENTRY(64, 1, 64, true, _p1_kvo_t64, (192, 2))
ATTENTION_FLASH_TILE_ENTRY(128, 1, 64, true, _p1_kvo_t64, (192, 2))
