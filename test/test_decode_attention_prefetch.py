"""The decode attention's prefetching entries (KernelPlan.decode_attention_prefetch, on: measured faster on the 7B's
decode attention), checked on
the CPU (no nvcc, PyCUDA or device; test_cuda_attention_decode.py runs them bit for bit against the entries without):
the entries are registered as the others and exist in attention_decode.cu, the launcher picks them and refuses the
two-warp grid they do not have, the lab names them, and a backend keeps the plan's choice only where it has an
entry (one warp per slot group, not on the tensor cores).
"""
import dataclasses
import logging

import pytest

from attention_decode_host import Recorder, decode, declared_decode_entries, in_effect
from vla_edge_ros.model import cuda_attention_launchers as ca
from vla_edge_ros.model import cuda_kernels as ck
from vla_edge_ros.model.cuda_kernel_plan import MEASURED_BEST
from vla_edge_ros.model.cuda_launch_common import KernelError
from vla_edge_ros.model.cuda_pdl import PDL_KERNELS


def test_the_prefetching_entries_are_registered_and_compiled_from_the_same_body():
    entries = ck.FAMILIES["attention_decode"]
    prefetching = {name for name in entries if name.endswith("_pf") or "_pf_x" in name}   # _x: exact groups
    assert prefetching == {"attention_decode_partial_v1_pf", "attention_decode_partial_v2_pf",
                           "attention_decode_partial_v1_g1_pf", "attention_decode_partial_v2_g1_pf",
                           *(f"attention_decode_partial_v1_pf_x{g}" for g in ca.ATTN_DECODE_EXACT_GROUPS[(1, True)])}
    assert len(set(entries.values())) == 1                               # one argument list: the launcher's
    assert all(name in PDL_KERNELS and name in ck.DYNAMIC_SHARED_KERNELS for name in entries)
    declared = {name: pf for name, (_hs, _group, pf, _exact) in declared_decode_entries().items()}
    assert set(declared) == set(entries)
    assert {name for name, pf in declared.items() if pf} == prefetching


@pytest.mark.parametrize("hq, kvh, hd, kw, entry", [
    (12, 2, 128, dict(head_split=1, prefetch=True), "attention_decode_partial_v1_pf"),
    (12, 2, 256, dict(head_split=1, prefetch=True), "attention_decode_partial_v2_pf"),
    (32, 32, 128, dict(head_split=1, one_head=True, prefetch=True), "attention_decode_partial_v1_g1_pf"),
    (32, 32, 128, dict(head_split=1, one_head=True), "attention_decode_partial_v1_g1"),
    (12, 2, 128, dict(head_split=2), "attention_decode_partial_v1_h2"),
])
def test_the_launcher_picks_the_entry_on_the_same_grid(hq, kvh, hd, kw, entry):
    kn = Recorder()
    name, grid, block = decode(kn, hq, kvh, hd, max_splits=16, **kw)
    assert name == entry
    assert grid == (16, kvh, 1)
    assert block == ca.ATTN_DECODE_THREADS * kw["head_split"]


def test_the_launcher_refuses_a_prefetch_with_two_warps_per_slot_group():
    with pytest.raises(KernelError, match="one warp per 8-entry group"):
        decode(Recorder(), 12, 2, head_split=2, prefetch=True)


def test_the_lab_names_the_prefetch_on_and_off():
    from vla_edge_ros.bench.kernel_lab import mode_plan
    assert MEASURED_BEST.decode_attention_prefetch is True
    assert mode_plan("plain+dpf") == MEASURED_BEST
    assert mode_plan("plain+nodpf") == dataclasses.replace(MEASURED_BEST, decode_attention_prefetch=False)
    assert mode_plan("plain+h1+dpf") == dataclasses.replace(MEASURED_BEST, decode_attention_head_split=1)
    with pytest.raises(ValueError, match="decode_attention_prefetch must be True or False"):
        dataclasses.replace(MEASURED_BEST, decode_attention_prefetch=1)


def test_a_backend_keeps_the_prefetch_only_where_it_has_an_entry(caplog):
    pf = MEASURED_BEST                                     # asks for the prefetch
    # Llama-2-7B's grouping: the one-head entry, one warp per slot group: prefetched.
    assert in_effect(pf, 32, 32)["decode_attention_prefetch"] is True
    assert in_effect(pf, 32, 32)["decode_attention_head_split"] == 1
    # The 1.5B's (6 query heads per KV head) with the default two warps per group: no such entry, said (at debug
    # level: the default plan asks for it on every model).
    with caplog.at_level(logging.DEBUG, logger="vla_edge_ros.model.cuda_backend"):
        assert in_effect(pf, 12, 2)["decode_attention_prefetch"] is False
    assert "no prefetch" in caplog.text and "head_split 2" in caplog.text
    # ... and with one warp per group (lab "+h1+dpf"): prefetched.
    h1 = dataclasses.replace(pf, decode_attention_head_split=1)
    assert in_effect(h1, 12, 2)["decode_attention_prefetch"] is True
    # The decode row on the tensor cores is not attention_decode.cu at all.
    mma = dataclasses.replace(h1, decode_attention_tensor_cores=True)
    assert in_effect(mma, 12, 2)["decode_attention_prefetch"] is False
    # Without the plan asking, never.
    off = dataclasses.replace(MEASURED_BEST, decode_attention_prefetch=False)
    assert in_effect(off, 32, 32)["decode_attention_prefetch"] is False
