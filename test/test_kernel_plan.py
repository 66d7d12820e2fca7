"""model/cuda_kernel_plan.py: the serving backend's kernel choices, checked without a GPU, and kept apart from the
lab (bench/kernel_lab.py builds the other plans; the serving code never imports bench/)."""
import ast
import dataclasses
from pathlib import Path

import pytest

from vla_edge_ros.model.cuda_kernel_plan import MEASURED_BEST, KernelPlan

PACKAGE = Path(__file__).resolve().parents[1] / "vla_edge_ros"


def test_the_measured_best_plan_is_the_default():
    # Measured on the H200: staged prefill projections, tensor-core attention at 2 blocks per SM, 2 warps per decode
    # attention slot group, the gate/up items looped over 4 blocks per SM, the TMA-fed wgmma bulk GEMM on hi/lo activations;
    # programmatic launch and the persistent decode kernel measured slower and stay off.
    assert MEASURED_BEST == KernelPlan()
    assert (MEASURED_BEST.staged_prefill_projections, MEASURED_BEST.tensor_core_attention) == (True, True)
    assert (MEASURED_BEST.attention_blocks_per_sm, MEASURED_BEST.decode_attention_head_split) == (2, 2)
    assert MEASURED_BEST.decode_gemv_blocks_per_sm == 4
    assert (MEASURED_BEST.programmatic_launch, MEASURED_BEST.persistent_decode) == (False, False)
    # 2026-12-03: the decode row on attention_mma.cu and the INT4 decode's looped grid measured slower (off); the staged
    # INT4 prefill projections faster (on, for INT4 weights).
    assert MEASURED_BEST.decode_attention_tensor_cores is False
    assert MEASURED_BEST.staged_int4_prefill_projections is True
    assert (MEASURED_BEST.int4_gemv_items_per_block, MEASURED_BEST.int4_gemv_rows_per_warp) == (0, 1)
    assert (MEASURED_BEST.bulk_gemm, MEASURED_BEST.bulk_activation_parts, MEASURED_BEST.bulk_attention_stages) == \
        ("tma", 2, 1)
    assert MEASURED_BEST.bulk_attention_heads_per_warp == 1          # two heads per warp: not yet measured
    # 2026-12-03, eighth session: the flash attention's K/V overlap faster (the same bits), as are, for a model
    # without grouped queries, the one-head decode entry (the same bits) and at least 16 long-context splits per KV head.
    assert MEASURED_BEST.bulk_attention_kv_overlap is True
    # 2026-12-03, ninth session: hoisted copies faster (the same bits); 64-entry tiles faster, other roundings,
    # verified against HF on the GPU in the tenth session.
    assert (MEASURED_BEST.bulk_attention_hoisted_copies, MEASURED_BEST.bulk_attention_tile_entries) == (True, 64)
    assert MEASURED_BEST.int4_prefill_activation_parts == 2          # one INT4 prefill part: fails verify (ninth)
    assert MEASURED_BEST.int4_prefill_activation_prefetch is False   # the INT4 activation prefetch: not yet measured
    assert MEASURED_BEST.decode_attention_one_head_entry is True
    # 2026-12-04, eleventh session: the decode attention's prefetching entries faster on the 7B (the same bits);
    # a model with grouped queries keeps two warps per slot group, which have no such entry.
    assert MEASURED_BEST.decode_attention_prefetch is True
    assert (MEASURED_BEST.long_context_blocks_per_sm, MEASURED_BEST.long_context_min_splits_per_kv_head) == (1, 16)


@pytest.mark.parametrize("change, fragment", [
    ({"decode_attention_head_split": 3}, "decode_attention_head_split must be one of"),
    ({"decode_gemv_blocks_per_sm": 9}, "decode_gemv_blocks_per_sm must be in [0, 8]"),
    ({"decode_gemv_blocks_per_sm": -1}, "decode_gemv_blocks_per_sm must be in"),
    ({"attention_blocks_per_sm": 3}, "attention_blocks_per_sm must be 1 or 2"),
    ({"persistent_blocks_per_sm": 0}, "persistent_blocks_per_sm must be 1 or 2"),
    ({"persistent_l2_prefetch_bytes": -1}, "persistent_l2_prefetch_bytes must be >= 0"),
    ({"bulk_gemm": "cublas"}, "bulk_gemm must be one of"),
    ({"bulk_activation_parts": 3}, "bulk_activation_parts must be 1 or 2"),
    ({"bulk_attention_stages": 0}, "bulk_attention_stages must be 1 or 2"),
    ({"bulk_attention_heads_per_warp": 3}, "bulk_attention_heads_per_warp must be 1 or 2"),
    ({"long_context_blocks_per_sm": 0}, "long_context_blocks_per_sm must be in [1, 8]"),
    ({"long_context_blocks_per_sm": 2.0}, "long_context_blocks_per_sm must be in [1, 8]"),
    ({"long_context_min_splits_per_kv_head": 0}, "long_context_min_splits_per_kv_head must be in [1, 256]"),
    ({"long_context_min_splits_per_kv_head": True}, "long_context_min_splits_per_kv_head must be in [1, 256]"),
    ({"bulk_attention_heads_per_warp": 2, "bulk_attention_stages": 2}, "runs one K/V stage"),
    ({"bulk_attention_kv_overlap": True, "bulk_attention_stages": 2}, "bulk_attention_kv_overlap runs one K/V stage"),
    ({"bulk_attention_kv_overlap": 1}, "bulk_attention_kv_overlap must be True or False"),
    ({"bulk_attention_hoisted_copies": 1}, "bulk_attention_hoisted_copies must be True or False"),
    ({"bulk_attention_hoisted_copies": True, "bulk_attention_kv_overlap": False},
     "bulk_attention_hoisted_copies are entries of the K/V overlap"),
    ({"bulk_attention_hoisted_copies": True, "bulk_attention_heads_per_warp": 2},
     "bulk_attention_hoisted_copies are entries of the K/V overlap with one head per warp"),
    ({"bulk_attention_tile_entries": 48}, "bulk_attention_tile_entries must be 32 or 64"),
    ({"bulk_attention_tile_entries": 64, "bulk_attention_hoisted_copies": False}, "bulk_attention_tile_entries 64 are entries with the hoisted copies"),
    ({"int4_prefill_activation_parts": 3}, "int4_prefill_activation_parts must be 1 or 2"),
    ({"decode_attention_one_head_entry": "on"}, "decode_attention_one_head_entry must be True or False"),
    ({"int4_prefill_activation_prefetch": 1}, "int4_prefill_activation_prefetch must be True or False"),
    ({"int4_prefill_activation_prefetch": True, "staged_int4_prefill_projections": False}, "staged INT4 projections"),
    ({"int4_prefill_activation_parts": 1, "staged_int4_prefill_projections": False}, "staged INT4 projections"),
    ({"staged_int4_prefill_projections": 1}, "staged_int4_prefill_projections must be True or False"),
    ({"staged_int4_prefill_projections": "yes"}, "staged_int4_prefill_projections must be True or False"),
    ({"int4_gemv_items_per_block": 65}, "int4_gemv_items_per_block must be in [0, 64]"),
    ({"int4_gemv_items_per_block": -1}, "int4_gemv_items_per_block must be in [0, 64]"),
    ({"int4_gemv_items_per_block": True}, "int4_gemv_items_per_block must be in [0, 64]"),
    ({"int4_gemv_items_per_block": 2.0}, "int4_gemv_items_per_block must be in [0, 64]"),
    ({"int4_gemv_items_per_block": 4, "int4_gemv_rows_per_warp": 3}, "int4_gemv_rows_per_warp must be one of"),
    ({"int4_gemv_items_per_block": 4, "int4_gemv_rows_per_warp": True}, "int4_gemv_rows_per_warp must be one of"),
    ({"int4_gemv_rows_per_warp": 2}, "int4_gemv_rows_per_warp 2 needs int4_gemv_items_per_block >= 2"),
    ({"int4_gemv_items_per_block": 1, "int4_gemv_rows_per_warp": 2}, "needs int4_gemv_items_per_block >= 2"),
])
def test_an_impossible_plan_is_refused_naming_the_choice(change, fragment):
    with pytest.raises(ValueError, match=fragment.replace("[", r"\[").replace("]", r"\]")):
        dataclasses.replace(MEASURED_BEST, **change)


def test_a_plan_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        MEASURED_BEST.persistent_decode = True


def _imports(path: Path) -> set:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            names.add("." * node.level + (node.module or ""))
    return names


def test_nothing_outside_the_benches_and_tools_imports_the_lab():
    # The robot's code (model, core, nodes) runs the measured-best plan; variant plans, decode-state dumps and the
    # kernel groups live in bench/. (tools/ holds the `vla-edge bench` command, which starts the benches.)
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE)
        if rel.parts[0] in ("bench", "tools"):
            continue
        if any("bench" in name.split(".") for name in _imports(path)):
            offenders.append(str(rel))
    assert not offenders, offenders


def test_the_lab_names_the_decode_row_on_the_tensor_cores():
    from vla_edge_ros.bench.kernel_lab import mode_plan
    assert mode_plan("plain+mmadec").decode_attention_tensor_cores is True
    assert mode_plan("plain").decode_attention_tensor_cores is False


def test_the_lab_names_the_staged_int4_prefill_projections():
    from vla_edge_ros.bench.kernel_lab import KERNEL_VARIANTS, mode_plan
    assert KERNEL_VARIANTS["int4staged"] == {"staged_int4_prefill_projections": True}
    assert KERNEL_VARIANTS["int4unstaged"] == {"staged_int4_prefill_projections": False,
                                               "int4_prefill_activation_parts": 2,
                                               "int4_prefill_activation_prefetch": False}    # one part and the
                                                                                             # prefetch are staged entries
    assert mode_plan("plain+int4unstaged") == dataclasses.replace(MEASURED_BEST, staged_int4_prefill_projections=False)
    assert mode_plan("plain").staged_int4_prefill_projections is True
    assert mode_plan("plain+i4p1") == dataclasses.replace(MEASURED_BEST, int4_prefill_activation_parts=1)


@pytest.mark.parametrize("items, rows", [(1, 1), (2, 2), (8, 1), (64, 2)])
def test_the_int4_decode_grid_choices_that_validate(items, rows):
    plan = dataclasses.replace(MEASURED_BEST, int4_gemv_items_per_block=items, int4_gemv_rows_per_warp=rows)
    assert (plan.int4_gemv_items_per_block, plan.int4_gemv_rows_per_warp) == (items, rows)


def test_the_lab_names_the_int4_decode_grid():
    from vla_edge_ros.bench.kernel_lab import KERNEL_VARIANTS, mode_plan
    for n in (2, 4, 8):
        assert KERNEL_VARIANTS[f"i4ipb{n}"] == {"int4_gemv_items_per_block": n}
        assert mode_plan(f"plain+i4ipb{n}") == dataclasses.replace(MEASURED_BEST, int4_gemv_items_per_block=n)
    assert mode_plan("plain+i4ipb4+i4x2") == dataclasses.replace(MEASURED_BEST, int4_gemv_items_per_block=4,
                                                                 int4_gemv_rows_per_warp=2)
    with pytest.raises(ValueError, match="needs int4_gemv_items_per_block >= 2"):
        mode_plan("plain+i4x2")
    assert (mode_plan("plain").int4_gemv_items_per_block, mode_plan("plain").int4_gemv_rows_per_warp) == (0, 1)


def test_the_lab_names_the_long_context_blocks_per_sm_and_the_splits_follow():
    """lcsN sets KernelPlan.long_context_blocks_per_sm, lcm1 its floor of splits per KV head to none;
    long_context_splits gives each KV head N x SMs / KV heads splits, at least the floor (the H200's 132 SMs: 66 per
    head at the 1.5B's 2 KV heads, 4 at the 7B's 32; 16 with 4 per SM or with the default floor of 16)."""
    from vla_edge_ros.bench.kernel_lab import mode_plan
    from vla_edge_ros.model.cuda_attention_launchers import long_context_splits
    for n in (1, 2, 4):
        assert mode_plan(f"plain+lcs{n}") == dataclasses.replace(MEASURED_BEST, long_context_blocks_per_sm=n)
    assert (long_context_splits(132, 2), long_context_splits(132, 32), long_context_splits(132, 32, 4)) == (66, 4, 16)
    assert long_context_splits(16, 32) == 1                      # more KV heads than SMs: one split each
    for n in (1, 32, 64):
        assert mode_plan(f"plain+lcm{n}") == dataclasses.replace(MEASURED_BEST, long_context_min_splits_per_kv_head=n)
    assert long_context_splits(132, 32, 1, 64) == 64
    floor = MEASURED_BEST.long_context_min_splits_per_kv_head
    assert (long_context_splits(132, 2, 1, floor), long_context_splits(132, 32, 1, floor)) == (66, 16)
    assert long_context_splits(132, 32, 4, floor) == long_context_splits(132, 32, 4) == 16
