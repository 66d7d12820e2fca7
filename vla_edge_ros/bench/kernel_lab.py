"""The kernel lab: what only the benches and the GPU tests do with a CudaBackend.

The serving backend runs the measured-best KernelPlan (model/cuda_kernel_plan.py) and never looks here. To time or
compare another choice, the lab builds a variant plan and switches a backend to it between cycles
(CudaBackend.use_kernel_plan):

  * launch modes: plain (ordinary launches, the serving default), pdl (programmatic dependent launch) and
    persistent[:<blocks per SM>[:<L2 prefetch MiB>]] (every layer of a decode step in one cooperative kernel);
  * kernel variants a mode may add with '+': the prefill attention (tiled, mma, mma2; ma: attention_mma.cu's
    masked-softmax entries, noma off, the default), the decode attention (its
    warps per slot group h1, h2; mmadec: on the tensor cores), the decode projections' grid (noloop, loop2,
    loop4), an INT4 model's decode projections (i4ipb2, i4ipb4, i4ipb8: every one looped, ~2 / 4 / 8 items per
    block; i4x2: two items in flight per warp of those; i4lean: the lean entries, noi4lean off, the default), its
    prefill projections (int4staged:
    projection_int4_staged.cu; i4p1: its one-part entry; i4pf: its activation prefetch; i4plean: the lean entries
    of it and projection_int4.cu, noi4plean off, the default), the decode attention's
    one-head entry for a group of 1
    (g1 on, the default; nog1 off), its prefetching entries (dpf, the default, with g1 or
    h1; nodpf off), its entries for exactly the model's group (xg, the default; noxg off) and the long-context
    attention's blocks per SM (lcs1, lcs2, lcs4) and its floor
    of splits per KV head (lcm1: none; lcm32, lcm64: 32 or 64);
  * a copy of the device state a decode step starts from, so that decode modes are compared from one prefill (two
    prefills differ in the last bits: their split-K projections add with atomics);
  * the kernel groups of a pass, which bench/pycuda_cycle.py times apart.
"""
from __future__ import annotations

import dataclasses

from ..model.cuda_kernel_plan import MEASURED_BEST, KernelPlan
from ..model.cuda_layer_enqueue import LAYER_GROUPS

LAUNCH_MODES = ("plain", "pdl", "persistent")
# Kernel variants by name, as KernelPlan fields: the prefill attention (tiled: attention_tiled.cu; mma / mma2:
# attention_mma.cu at 1 / 2 blocks per SM; ma / noma: its masked-softmax entries on / off; hs / nohs: its entry with
# two warps per tile, each keeping half of the head's P.V sums, on / off), the decode attention
# (h1 / h2: attention_decode.cu with 1 / 2 warps per 8-slot group; mmadec: attention_mma.cu for the decode row too),
# the decode projections' grid (noloop: a block per 8-row item; loop2 / loop4: 2 / 4 blocks per SM looping over the
# items), an INT4 model's decode projections (i4ipbN: every one on ceil(items / N) blocks, ~N items
# each; i4x2: each warp of those streams two items' rows at once, with an i4ipbN of N >= 2; i4lean / noi4lean:
# gemv_int4.cu's entries with fewer instructions per weight on / off, the default) and its prefill projections
# (int4staged: projection_int4_staged.cu, the activations staged once per block, the default;
# int4unstaged: projection_int4.cu; i4p1: the staged kernel on the activations' bf16 hi alone; i4pf: its next
# chunk's activations copied under the products; i4plean / noi4plean: the lean entries of the INT4 projections of
# many rows, staged or not, on / off, the default), the decode
# attention's one-head entry for a model without grouped queries (g1, the default; nog1: off), its next pass's loads
# in flight (dpf: the _pf entries, the default, with one warp per slot group: g1, or h1 for a model with grouped
# queries; nodpf: off), its entries for exactly the model's group (xg, the default; noxg off), and the
# long-context attention's blocks per SM (lcs1, lcs2, lcs4: KernelPlan.long_context_blocks_per_sm) and floor of
# splits per KV head (lcm1: KernelPlan.long_context_min_splits_per_kv_head 1, no floor; lcm32, lcm64: a floor of 32 or
# 64, for the 7B decode attention that ncu found latency-bound at 16: 40 us a layer, occupancy 21%); for the bulk prefill's flash
# attention (bench csr --kernel-variants), its hoisted copies with 64-entry tiles (fat64, the default), with
# 32-entry tiles (fah) or neither (nofah: the copies of attention_flash_kvo.cu); its operands as one bf16 part (bp1:
# model.bulk_prefill_precision bf16, e.g. `verify --kernel-variants bp1 --bulk-prefill-min-rows 1`) or two (bp2). A float
# backend runs the INT4
# variants as plain, and the mode in effect then drops their names.
# A variant left unnamed keeps the base plan's choice.
KERNEL_VARIANTS = {"tiled": {"tensor_core_attention": False},
                   "mma": {"tensor_core_attention": True, "attention_blocks_per_sm": 1},
                   "mma2": {"tensor_core_attention": True, "attention_blocks_per_sm": 2},
                   "mmadec": {"decode_attention_tensor_cores": True},
                   "h1": {"decode_attention_head_split": 1},
                   "h2": {"decode_attention_head_split": 2},
                   "noloop": {"decode_gemv_blocks_per_sm": 0},
                   "loop2": {"decode_gemv_blocks_per_sm": 2},
                   "loop4": {"decode_gemv_blocks_per_sm": 4},
                   "int4staged": {"staged_int4_prefill_projections": True},
                   "int4unstaged": {"staged_int4_prefill_projections": False, "int4_prefill_activation_parts": 2,
                                    "int4_prefill_activation_prefetch": False},
                   "i4p1": {"staged_int4_prefill_projections": True, "int4_prefill_activation_parts": 1},
                   "i4pf": {"int4_prefill_activation_prefetch": True},
                   **{f"i4ipb{n}": {"int4_gemv_items_per_block": n} for n in (2, 4, 8)},
                   "i4x2": {"int4_gemv_rows_per_warp": 2},
                   "i4lean": {"int4_decode_lean_loop": True},
                   "noi4lean": {"int4_decode_lean_loop": False},
                   "i4plean": {"int4_prefill_lean_loop": True},
                   "noi4plean": {"int4_prefill_lean_loop": False},
                   **{f"lcs{n}": {"long_context_blocks_per_sm": n} for n in (1, 2, 4)},
                   **{f"lcm{n}": {"long_context_min_splits_per_kv_head": n} for n in (1, 32, 64)},
                   "fah": {"bulk_attention_hoisted_copies": True, "bulk_attention_tile_entries": 32},
                   "nofah": {"bulk_attention_hoisted_copies": False, "bulk_attention_tile_entries": 32},
                   "fat64": {"bulk_attention_hoisted_copies": True, "bulk_attention_tile_entries": 64},
                   "bp1": {"bulk_activation_parts": 1},
                   "bp2": {"bulk_activation_parts": 2},
                   "g1": {"decode_attention_one_head_entry": True},
                   "nog1": {"decode_attention_one_head_entry": False},
                   "dpf": {"decode_attention_prefetch": True},
                   "nodpf": {"decode_attention_prefetch": False},
                   "ma": {"attention_masked_softmax": True},
                   "hs": {"attention_head_halves": True},
                   "nohs": {"attention_head_halves": False},
                   "noma": {"attention_masked_softmax": False},
                   "xg": {"decode_attention_exact_group": True},
                   "noxg": {"decode_attention_exact_group": False}}
# Device state a decode step reads or writes: what decode_state() / restore_decode_state() copy. The cycle's tables
# (positions, slots, attend list) stay as begin_cycle wrote them.
DECODE_STATE = ("k_cache", "v_cache", "resid", "ctl", "tokens_out")


def persistent_plan(blocks_per_sm: int | None = None, l2_prefetch_bytes: int | None = None,
                    base: KernelPlan = MEASURED_BEST) -> KernelPlan:
    """`base` with the decode steps in one persistent kernel (its grid and L2 prefetch: base's unless given)."""
    grid = {} if blocks_per_sm is None else {"persistent_blocks_per_sm": int(blocks_per_sm)}
    if l2_prefetch_bytes is not None:
        grid["persistent_l2_prefetch_bytes"] = int(l2_prefetch_bytes)
    return dataclasses.replace(base, persistent_decode=True, programmatic_launch=False, **grid)


def variant_fields(names, what: str = "kernel lab") -> dict:
    """The KernelPlan fields the kernel variants `names` set, later names over earlier ones; ValueError naming
    `what` for a name KERNEL_VARIANTS does not have."""
    fields = {}
    for name in names:
        if name not in KERNEL_VARIANTS:
            raise ValueError(f"{what}: kernel variant {name!r} unknown; choose from {sorted(KERNEL_VARIANTS)}")
        fields.update(KERNEL_VARIANTS[name])
    return fields


def mode_plan(mode: str, base: KernelPlan = MEASURED_BEST) -> KernelPlan:
    """The plan of a launch mode with its kernel variants (bench/pycuda_cycle.launch_mode's syntax; names outside
    KERNEL_VARIANTS, such as a KV arena type, are left to the caller) over `base`."""
    launch, *variants = mode.split("+")
    kind, *opts = launch.split(":")
    if kind not in LAUNCH_MODES:
        raise ValueError(f"launch mode {kind!r}: one of {LAUNCH_MODES}")
    chosen = variant_fields([v for v in variants if v in KERNEL_VARIANTS])
    plan = dataclasses.replace(base, persistent_decode=False, programmatic_launch=kind == "pdl", **chosen)
    if kind == "persistent":
        blocks = int(opts[0]) if opts else None
        l2 = int(float(opts[1]) * (1 << 20)) if len(opts) > 1 else None
        plan = persistent_plan(blocks, l2, plan)
    return plan


def apply_launch_mode(backend, mode: str, base: KernelPlan = MEASURED_BEST) -> str:
    """Switch `backend` to mode_plan(mode, base); returns the mode in effect: the launch (plain where the device
    cannot do the one asked for) and the kernel variants that took effect."""
    launch, *variants = mode.split("+")
    kind = launch.split(":")[0]
    in_effect = backend.use_kernel_plan(mode_plan(mode, base))
    suffix = "".join(f"+{v}" for v in variants if v in KERNEL_VARIANTS
                     and all(getattr(in_effect, k) == want for k, want in KERNEL_VARIANTS[v].items()))
    if kind == "persistent":
        return (launch if in_effect.persistent_decode else "plain") + suffix
    return ("pdl" if in_effect.programmatic_launch else "plain") + suffix


def decode_state(backend) -> dict:
    """Device copies of the state the decode steps of a begun cycle start from (call after launch_prefill)."""
    with backend.device.bound():
        backend.stream.synchronize()
        return {name: getattr(backend, name).copy() for name in DECODE_STATE}


def restore_decode_state(backend, state: dict) -> None:
    """Copy a decode_state() back into the backend's live buffers."""
    with backend.device.bound():
        backend.stream.synchronize()
        for name in DECODE_STATE:
            dst, src = getattr(backend, name), state[name]
            backend.device.drv.memcpy_dtod(int(dst.gpudata), int(src.gpudata), src.nbytes)


def layer_groups(backend, n: int) -> tuple:
    """The kernel groups (cuda_layer_enqueue.LAYER_GROUPS) a pass over n rows launches: the bf16 decode pipeline
    folds the norms and RoPE into its projections."""
    if backend._fused(n):
        return ("projections", "attention")
    return LAYER_GROUPS
