"""attention_mma.cu's head-halves entry (KernelPlan.attention_head_halves, off until measured), checked on the CPU
(no PyCUDA or device; test_cuda_attention_mma.py runs it bit for bit against the entry it splits): it is declared in
the source as its registered name says, the launcher picks it with blocks of at most ATTN_MMA_HS_TARGET_QV query
vectors and refuses what has no entry, a backend keeps the plan's choice only where that entry exists, and the lab
names the switch.
"""
import dataclasses
import logging

import numpy as np
import pytest

from attention_decode_host import MmaRecorder, array, declared_mma_entries, in_effect
from vla_edge_ros.model import cuda_attention_launchers as ca
from vla_edge_ros.model import cuda_kernels as ck
from vla_edge_ros.model.cuda_kernel_plan import MEASURED_BEST
from vla_edge_ros.model.cuda_launch_common import KernelError



def test_the_head_halves_entry_is_declared_as_registered():
    declared = declared_mma_entries()
    assert set(declared) == set(ck.FAMILIES["attention_mma"])
    assert {name for name, (_, halves) in declared.items() if halves == 2} == {"attention_partial_mma_hd128_b2_hs"}
    assert all(halves in (1, 2) for _, halves in declared.values())


def _prefill(kn, hd=128, n=32, **kw):
    hq, kvh, cap, n_splits = 12, 2, 4096, 64
    kn.attention(array((n, (hq + 2 * kvh) * hd)), 0, 0, array((cap,), np.int32), array((4,), np.int32),
                 array((n, hq, n_splits, hd)), array((n, hq, n_splits, 2)), array((n, hq * hd)), n, hq, kvh, hd, cap,
                 n_splits, hd ** -0.5, None, **kw)
    return kn.launches[-2]


@pytest.mark.parametrize("n", [1, 7, 32, 100])
def test_the_launcher_gives_each_block_at_most_a_round_of_tiles(n):
    """Four tiles of 16 query vectors a round (8 warps, two a tile): whole rows of the 1.5B's group of 6, balanced,
    so that no split's chunks are gathered twice."""
    kn = MmaRecorder()
    name, grid, block = _prefill(kn, n=n, tensor_cores=True, blocks_per_sm=2, max_splits=16, head_halves=True)
    assert name == "attention_partial_mma_hd128_b2_hs" and block == ca.ATTN_TILED_THREADS
    rows = -(-n // grid[0])
    assert rows * 6 <= ca.ATTN_MMA_HS_TARGET_QV and grid[0] == -(-n // (ca.ATTN_MMA_HS_TARGET_QV // 6))
    assert grid[1:] == (16, 2)
    # An explicit rows_per_block is taken as given (the probe's r10: 60 query vectors, 4 tiles).
    assert _prefill(kn, n=n, tensor_cores=True, blocks_per_sm=2, max_splits=16, head_halves=True,
                    rows_per_block=10)[1][0] == -(-n // 10)


def test_the_launcher_refuses_what_has_no_head_halves_entry():
    kn = MmaRecorder()
    with pytest.raises(KernelError, match="no entry attention_partial_mma_hd128_b1_hs"):
        _prefill(kn, tensor_cores=True, blocks_per_sm=1, head_halves=True)
    with pytest.raises(KernelError, match="no entry attention_partial_mma_hd64_b2_hs"):
        _prefill(kn, hd=64, tensor_cores=True, blocks_per_sm=2, head_halves=True)
    with pytest.raises(KernelError, match="head_halves is an entry of attention_mma.cu"):
        _prefill(kn, head_halves=True)
    with pytest.raises(KernelError, match="both head_halves and masked_softmax"):
        _prefill(kn, tensor_cores=True, blocks_per_sm=2, head_halves=True, masked_softmax=True)


def test_a_backend_keeps_the_head_halves_only_where_it_has_an_entry(caplog):
    hs = dataclasses.replace(MEASURED_BEST, attention_head_halves=True)
    assert in_effect(MEASURED_BEST, 12, 2)["attention_head_halves"] is False            # off by default
    assert MEASURED_BEST.attention_blocks_per_sm == 2
    assert in_effect(hs, 12, 2)["attention_head_halves"] is True                        # bf16, head_dim 128
    with caplog.at_level(logging.INFO, logger="vla_edge_ros.model.cuda_backend"):
        assert in_effect(hs, 4, 2, head_dim=64)["attention_head_halves"] is False
        assert in_effect(hs, 12, 2, dtype="float32")["attention_head_halves"] is False   # attention_tiled.cu
        one_block = dataclasses.replace(hs, attention_blocks_per_sm=1)
        assert in_effect(one_block, 12, 2)["attention_head_halves"] is False
        both = dataclasses.replace(hs, attention_masked_softmax=True)
        assert in_effect(both, 12, 2)["attention_head_halves"] is False
        assert in_effect(both, 12, 2)["attention_masked_softmax"] is True
    assert "head-halves entry serves bf16 models with head_dim 128" in caplog.text


def test_the_lab_names_the_switch_and_the_plan_checks_it():
    from vla_edge_ros.bench.kernel_lab import mode_plan
    assert mode_plan("plain+hs") == dataclasses.replace(MEASURED_BEST, attention_head_halves=True)
    assert mode_plan("plain+hs+nohs") == MEASURED_BEST
    with pytest.raises(ValueError, match="attention_head_halves must be True or False"):
        dataclasses.replace(MEASURED_BEST, attention_head_halves=1)
