"""The decode attention's entries for an exact group (KernelPlan.decode_attention_exact_group, off until measured),
checked on the CPU (no PyCUDA or device; test_cuda_attention_decode.py runs them bit for bit against the entries for
any group): each registered entry is declared in attention_decode.cu for that group, warps per slot group and
prefetch, the launcher picks it only where one was compiled and says why it refuses otherwise, the lab names the
switch, and a backend keeps the plan's choice only for a model whose group has an entry.
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


def test_each_exact_entry_is_declared_for_its_group_warps_and_prefetch():
    declared = declared_decode_entries()
    assert set(declared) == set(ck.FAMILIES["attention_decode"])
    exact = {name: d for name, d in declared.items() if d[3]}
    want = {f"attention_decode_partial_v1{'_h2' if hs == 2 else '_pf'}_x{g}": (hs, str(g), pf, True)
            for (hs, pf), groups in ca.ATTN_DECODE_EXACT_GROUPS.items() for g in groups}
    assert exact == want
    assert all(name in PDL_KERNELS and name in ck.DYNAMIC_SHARED_KERNELS for name in exact)
    # two warps per slot group need a group they share evenly (the header's static_assert says the same)
    assert all(g % 2 == 0 for g in ca.ATTN_DECODE_EXACT_GROUPS[(2, False)])


@pytest.mark.parametrize("hq, kvh, hd, kw, entry", [
    (12, 2, 128, dict(head_split=2), "attention_decode_partial_v1_h2_x6"),
    (12, 2, 128, dict(head_split=1, prefetch=True), "attention_decode_partial_v1_pf_x6"),
    (9, 3, 64, dict(head_split=1, prefetch=True), "attention_decode_partial_v1_pf_x3"),
    (4, 2, 32, dict(head_split=2), "attention_decode_partial_v1_h2_x2"),
    (4, 1, 32, dict(head_split=2), "attention_decode_partial_v1_h2_x4"),
])
def test_the_launcher_picks_the_exact_entry_on_the_same_grid(hq, kvh, hd, kw, entry):
    kn = Recorder()
    name, grid, block = decode(kn, hq, kvh, hd, max_splits=16, exact_group=True, **kw)
    assert name == entry
    same = decode(kn, hq, kvh, hd, max_splits=16, **kw)   # the entry for any group: same grid and block
    assert same[0] == entry.rsplit("_x", 1)[0] and same[1:] == (grid, block)


@pytest.mark.parametrize("hq, kvh, hd, kw, why", [
    (10, 2, 128, dict(head_split=2), "no entry for exactly group 5"),          # no odd group with two warps
    (9, 3, 64, dict(head_split=2), "no entry for exactly group 3"),
    (12, 2, 128, dict(head_split=1), "prefetch False"),                       # one warp without the prefetch
    (12, 2, 256, dict(head_split=2), "head_dim 256"),                         # two float4s a lane: not compiled
    (32, 32, 128, dict(head_split=1, one_head=True), "one-head entry already serves"),
])
def test_the_launcher_refuses_an_exact_entry_it_does_not_have(hq, kvh, hd, kw, why):
    with pytest.raises(KernelError, match=why):
        decode(Recorder(), hq, kvh, hd, exact_group=True, **kw)


def test_the_lab_names_the_switch_and_the_plan_checks_it():
    from vla_edge_ros.bench.kernel_lab import mode_plan
    assert MEASURED_BEST.decode_attention_exact_group is True          # measured faster (eighteenth session)
    assert mode_plan("plain+xg") == MEASURED_BEST
    assert mode_plan("plain+noxg") == dataclasses.replace(MEASURED_BEST, decode_attention_exact_group=False)
    with pytest.raises(ValueError, match="decode_attention_exact_group must be True or False"):
        dataclasses.replace(MEASURED_BEST, decode_attention_exact_group=1)


def test_a_backend_keeps_the_exact_entry_only_where_its_group_has_one(caplog):
    xg = dataclasses.replace(MEASURED_BEST, decode_attention_exact_group=True)
    off = dataclasses.replace(MEASURED_BEST, decode_attention_exact_group=False)
    assert in_effect(off, 12, 2)["decode_attention_exact_group"] is False               # not asked: never
    assert in_effect(xg, 12, 2)["decode_attention_exact_group"] is True                 # the 1.5B's 6, two warps
    h1 = dataclasses.replace(xg, decode_attention_head_split=1)
    assert in_effect(h1, 12, 2)["decode_attention_exact_group"] is True                 # one warp, prefetched
    assert in_effect(h1, 12, 2)["decode_attention_prefetch"] is True
    with caplog.at_level(logging.INFO, logger="vla_edge_ros.model.cuda_backend"):
        assert in_effect(xg, 9, 3, head_dim=64)["decode_attention_exact_group"] is False  # 3 with two warps
        assert in_effect(xg, 32, 32)["decode_attention_exact_group"] is False         # group 1: the one-head entry
        assert in_effect(xg, 12, 2, head_dim=256)["decode_attention_exact_group"] is False
    assert "no decode attention entry for exactly group 3" in caplog.text
    assert "the one-head entry" in caplog.text and "head_dim 256" in caplog.text
    mma = dataclasses.replace(xg, decode_attention_tensor_cores=True)
    assert in_effect(mma, 12, 2)["decode_attention_exact_group"] is False              # not attention_decode.cu
