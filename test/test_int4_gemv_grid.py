"""The INT4 decode grid (KernelPlan.int4_gemv_items_per_block / int4_gemv_rows_per_warp, off by default, measured
slower), checked on the CPU (no nvcc, PyCUDA or device; test_cuda_gemv_int4.py runs it bit for bit against a
block per item): gemv_int4_items2 is registered like the other entries, the launcher's grid and entry for each
choice on the 1.5B decode projections, the same arguments whatever the grid, its refusals, and the layer code hands
the choice to INT4 weights only.
"""
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from vla_edge_ros.model import cuda_int4_launchers as c4
from vla_edge_ros.model import cuda_kernels as ck
from vla_edge_ros.model import kernel_constants as kc
from vla_edge_ros.model.cuda_kernel_plan import MEASURED_BEST, KernelPlan
from vla_edge_ros.model.cuda_launch_common import KernelError
from vla_edge_ros.model.cuda_pdl import PDL_KERNELS

CUDA = Path(__file__).resolve().parents[1] / "cuda"
SMS = 132


def test_the_two_row_entry_is_registered_as_the_others():
    entries = ck.FAMILIES["gemv_int4"]
    assert set(entries) == {"gemv_int4", "gemv_int4_items", "gemv_int4_items2"}
    assert len(set(entries.values())) == 1                              # one argument list: the launcher's
    assert all(name in PDL_KERNELS and name in ck.DYNAMIC_SHARED_KERNELS for name in entries)
    source = (CUDA / "gemv_int4.cu").read_text()
    assert set(re.findall(r"^GEMV_INT4_ENTRY\((\w+)\)", source, re.MULTILINE)) == set(entries)


class _Recorder(c4.Int4Launchers):
    """The INT4 launchers without a device: every launch recorded as (kernel, grid, arguments)."""
    num_sms = SMS

    def __init__(self):
        self.launches = []
        self._shared_limits = {name: 227 * 1024 for name in ck.FAMILIES["gemv_int4"]}

    def _function(self, name):
        assert name in self._shared_limits, name

    def _launch(self, name, grid, block, stream, *args, shared=0):
        self.launches.append((name, tuple(grid), [int(a) if not isinstance(a, np.floating) else float(a)
                                                  for a in args]))


def _array(shape, dtype, address=1 << 20):
    return SimpleNamespace(shape=tuple(shape), dtype=np.dtype(dtype), gpudata=address,
                           nbytes=int(np.prod(shape)) * np.dtype(dtype).itemsize)


def _int4(rows, k, group=128):
    return c4.Int4Matrix(_array((rows, k // 2), np.uint8, 1 << 24), _array((rows, k // group), np.uint16, 1 << 30),
                         group)


# The 1.5B decode projections: (rows, K, mode, items); the plan's rule today loops only gate/up (2240 > 4 x 132).
PROJECTIONS = [(2048, 1536, kc.MODE_STORE, 256), (1536, 1536, kc.MODE_ADD, 192), (17920, 1536, kc.MODE_SWIGLU, 2240),
               (1536, 8960, kc.MODE_ADD, 192)]


@pytest.mark.parametrize("rows,k,mode,items", PROJECTIONS)
@pytest.mark.parametrize("blocks_per_sm,items_per_block,rows_per_warp", [
    (4, 0, 1), (0, 0, 1), (4, 2, 1), (4, 4, 1), (0, 8, 1), (4, 4, 2), (4, 64, 2), (4, 1, 1)])
def test_the_grid_and_entry_of_each_choice(rows, k, mode, items, blocks_per_sm, items_per_block, rows_per_warp):
    kn = _Recorder()
    W, x, out = _int4(rows, k), _array((1, k), np.float32, 1 << 34), _array((1, rows), np.float32, 1 << 36)
    cols = rows // 2 if mode == kc.MODE_SWIGLU else None
    kw = dict(out_cols=cols) if cols else {}
    kn.gemv(W, x, out, mode, None, blocks_per_sm=0, **kw)              # a block per item: the reference arguments
    kn.gemv(W, x, out, mode, None, blocks_per_sm=blocks_per_sm, items_per_block=items_per_block,
            rows_per_warp=rows_per_warp, **kw)
    (base_name, base_grid, base_args), (name, grid, args) = kn.launches
    assert (base_name, base_grid) == ("gemv_int4", (items,))
    assert args == base_args, "the grid choices change the grid and entry only"
    if items_per_block == 1:                                            # in place of the rule: a block per item
        assert (name, grid) == ("gemv_int4", (items,))
    elif items_per_block > 1:
        blocks = -(-items // items_per_block)                           # every projection: ~items_per_block each
        assert grid == (blocks,) and name == ("gemv_int4_items2" if rows_per_warp == 2 else "gemv_int4_items")
    elif 0 < blocks_per_sm * SMS < items:                               # today's rule: gate/up only
        assert (name, grid) == ("gemv_int4_items", (blocks_per_sm * SMS,))
    else:
        assert (name, grid) == ("gemv_int4", (items,))


def test_the_launcher_refuses_an_impossible_grid():
    kn = _Recorder()
    W, x, out = _int4(64, 256, 32), _array((1, 256), np.float32), _array((1, 64), np.float32)
    with pytest.raises(KernelError, match=r"items_per_block 65 outside \[0, 64\]"):
        kn.gemv(W, x, out, kc.MODE_STORE, None, items_per_block=65)
    with pytest.raises(KernelError, match=r"rows_per_warp 3 not in \(1, 2\)"):
        kn.gemv(W, x, out, kc.MODE_STORE, None, items_per_block=2, rows_per_warp=3)
    assert kn.launches == []


class _Kernels:
    """What LayerEnqueue._enqueue_layer_fused calls: each gemv's weight and keyword arguments."""

    def __init__(self):
        self.calls = []

    def gemv(self, W, x, out, mode, stream, **kw):
        self.calls.append((W, kw))


@pytest.mark.parametrize("plan", [MEASURED_BEST, KernelPlan(int4_gemv_items_per_block=4),
                                  KernelPlan(int4_gemv_items_per_block=2, int4_gemv_rows_per_warp=2)])
@pytest.mark.parametrize("weights", ["int4", "bf16"])
def test_the_layer_code_hands_the_grid_to_int4_weights_only(plan, weights):
    from vla_edge_ros.model.cuda_layer_enqueue import LayerEnqueue
    make = (lambda r, k: _int4(r, k)) if weights == "int4" else (lambda r, k: _array((r, k), np.uint16))
    layer = SimpleNamespace(w_qkv_rope=make(2048, 1536), w_o=make(1536, 1536), w_gate_up=make(17920, 1536),
                            w_down=make(1536, 8960), input_norm=None, post_norm=None, b_qkv=None)
    backend = SimpleNamespace(spec=SimpleNamespace(rms_norm_eps=1e-6, intermediate_size=8960), stream=None,
                              kernel_plan=plan, kernels=_Kernels(), resid=None, qkv=None, attn=None, act=None,
                              _rope_target=lambda li: None)
    LayerEnqueue._enqueue_layer_fused(backend, 0, layer, 1, ("projections",))
    calls = backend.kernels.calls
    assert [W for W, _ in calls] == [layer.w_qkv_rope, layer.w_o, layer.w_gate_up, layer.w_down]
    for _, kw in calls:
        assert kw["blocks_per_sm"] == plan.decode_gemv_blocks_per_sm
        if weights == "int4":
            assert (kw["items_per_block"], kw["rows_per_warp"]) == (plan.int4_gemv_items_per_block,
                                                                    plan.int4_gemv_rows_per_warp)
        else:                                                           # gemv.cu takes neither
            assert "items_per_block" not in kw and "rows_per_warp" not in kw
