"""attention_mma.cu's masked-softmax entries (KernelPlan.attention_masked_softmax, off until measured), checked on the
CPU (no PyCUDA or device; test_cuda_attention_mma.py runs them bit for bit against the entries without): they are
declared in the source as the registered names say, the launcher picks them on the same grid and refuses what has
none, a backend keeps the plan's choice only for a bf16 model of head_dim 128 on the tensor cores, and the lab names
the switch.
"""
import dataclasses
import logging

import numpy as np
import pytest

from attention_decode_host import MmaRecorder, array, declared_mma_entries, in_effect
from vla_edge_ros.model import cuda_kernels as ck
from vla_edge_ros.model.cuda_kernel_plan import MEASURED_BEST
from vla_edge_ros.model.cuda_launch_common import KernelError



def test_the_masked_entries_are_declared_as_registered():
    declared = declared_mma_entries()
    assert set(declared) == set(ck.FAMILIES["attention_mma"])
    assert {name for name, (masked, _) in declared.items() if masked} == {"attention_partial_mma_hd128_b1_ma",
                                                                          "attention_partial_mma_hd128_b2_ma"}


def _prefill(kn, hd=128, **kw):
    hq, kvh, n, cap, n_splits = 12, 2, 32, 4096, 64
    kn.attention(array((n, (hq + 2 * kvh) * hd)), 0, 0, array((cap,), np.int32), array((4,), np.int32),
                 array((n, hq, n_splits, hd)), array((n, hq, n_splits, 2)), array((n, hq * hd)), n, hq, kvh, hd, cap,
                 n_splits, hd ** -0.5, None, **kw)
    return kn.launches[-2]


@pytest.mark.parametrize("blocks", [1, 2])
def test_the_launcher_picks_the_masked_entry_on_the_same_grid(blocks):
    kn = MmaRecorder()
    name, grid, block = _prefill(kn, tensor_cores=True, blocks_per_sm=blocks, max_splits=16, masked_softmax=True)
    assert name == f"attention_partial_mma_hd128_b{blocks}_ma"
    assert _prefill(kn, tensor_cores=True, blocks_per_sm=blocks, max_splits=16)[1:] == (grid, block)
    with pytest.raises(KernelError, match="no entry attention_partial_mma_hd64_b1_ma"):
        _prefill(kn, hd=64, tensor_cores=True, masked_softmax=True)
    with pytest.raises(KernelError, match="masked_softmax is an entry of attention_mma.cu"):
        _prefill(kn, masked_softmax=True)


def test_a_backend_keeps_the_masked_softmax_only_where_it_has_an_entry(caplog):
    ma = dataclasses.replace(MEASURED_BEST, attention_masked_softmax=True)
    assert in_effect(MEASURED_BEST, 12, 2)["attention_masked_softmax"] is False         # off by default
    assert in_effect(ma, 12, 2)["attention_masked_softmax"] is True                     # bf16, head_dim 128
    with caplog.at_level(logging.INFO, logger="vla_edge_ros.model.cuda_backend"):
        assert in_effect(ma, 4, 2, head_dim=64)["attention_masked_softmax"] is False
        assert in_effect(ma, 12, 2, dtype="float32")["attention_masked_softmax"] is False   # attention_tiled.cu
    assert "masked-softmax entries serve bf16 models with head_dim 128" in caplog.text
    tiled = dataclasses.replace(ma, tensor_core_attention=False)
    assert in_effect(tiled, 12, 2)["attention_masked_softmax"] is False


def test_the_lab_names_the_switch_and_the_plan_checks_it():
    from vla_edge_ros.bench.kernel_lab import mode_plan
    assert mode_plan("plain+ma") == dataclasses.replace(MEASURED_BEST, attention_masked_softmax=True)
    assert mode_plan("plain+ma+noma") == MEASURED_BEST
    with pytest.raises(ValueError, match="attention_masked_softmax must be True or False"):
        dataclasses.replace(MEASURED_BEST, attention_masked_softmax="yes")
