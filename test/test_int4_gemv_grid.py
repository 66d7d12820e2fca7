"""The INT4 decode grid (KernelPlan.int4_gemv_items_per_block / int4_gemv_rows_per_warp, off by default, measured
slower) and lean entries (KernelPlan.int4_decode_lean_loop, off by default, not yet measured), checked on the CPU
(no nvcc, PyCUDA or device; test_cuda_gemv_int4.py runs them bit for bit against a block per item of the plain
entry): every entry is registered like the others, the launcher's grid and entry for each choice on the 1.5B decode
projections, the same arguments whatever the grid or entry, its refusals, the layer code hands the choices to INT4
weights only, and a backend keeps the lean entries only for groups they index.
"""
import logging
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


def test_every_entry_is_registered_as_the_others():
    entries = ck.FAMILIES["gemv_int4"]
    plain = {"gemv_int4", "gemv_int4_items", "gemv_int4_items2"}
    assert set(entries) == plain | {name + "_lean" for name in plain}
    assert len(set(entries.values())) == 1                              # one argument list: the launcher's
    assert all(name in PDL_KERNELS and name in ck.DYNAMIC_SHARED_KERNELS for name in entries)
    source = (CUDA / "gemv_int4.cu").read_text()
    assert set(re.findall(r"^GEMV_INT4_ENTRY\((\w+)\)", source, re.MULTILINE)) == set(entries)


class _Recorder(c4.Int4Launchers):
    """The INT4 launchers without a device: every launch recorded as (kernel, grid, arguments)."""
    num_sms = SMS

    def __init__(self):
        self.launches, self.shared = [], []
        self._shared_limits = {name: 227 * 1024 for name in ck.FAMILIES["gemv_int4"]}

    def _function(self, name):
        assert name in self._shared_limits, name

    def _launch(self, name, grid, block, stream, *args, shared=0):
        self.launches.append((name, tuple(grid), [int(a) if not isinstance(a, np.floating) else float(a)
                                                  for a in args]))
        self.shared.append(shared)


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


@pytest.mark.parametrize("rows,k,mode,items", PROJECTIONS)
@pytest.mark.parametrize("grid", [dict(), dict(blocks_per_sm=4), dict(items_per_block=3),
                                  dict(items_per_block=3, rows_per_warp=2)])
def test_the_lean_entry_takes_the_same_grid_and_arguments(rows, k, mode, items, grid):
    kn = _Recorder()
    W, x, out = _int4(rows, k), _array((1, k), np.float32, 1 << 34), _array((1, rows), np.float32, 1 << 36)
    kw = dict(out_cols=rows // 2) if mode == kc.MODE_SWIGLU else {}
    kn.gemv(W, x, out, mode, None, **grid, **kw)
    kn.gemv(W, x, out, mode, None, lean=True, **grid, **kw)
    (name, grid_dims, args), (lean_name, lean_grid, lean_args) = kn.launches
    assert lean_name == name + "_lean" and lean_grid == grid_dims and lean_args == args
    # The lean entries stage the activations with a float4 of padding after each 32-column chunk (9 K / 32 float4s).
    assert kn.shared == [4 * k, 16 * (9 * k // 32)]


@pytest.mark.parametrize("group,ok", [(32, True), (64, True), (128, True), (256, True), (1024, True), (96, False),
                                      (160, False), (384, False), (16, False), (0, False)])
def test_the_lean_entries_take_groups_of_32_times_a_power_of_two(group, ok):
    assert c4.lean_int4_group(group) is ok


def test_the_launcher_refuses_an_impossible_grid():
    kn = _Recorder()
    W, x, out = _int4(64, 256, 32), _array((1, 256), np.float32), _array((1, 64), np.float32)
    with pytest.raises(KernelError, match=r"items_per_block 65 outside \[0, 64\]"):
        kn.gemv(W, x, out, kc.MODE_STORE, None, items_per_block=65)
    with pytest.raises(KernelError, match=r"rows_per_warp 3 not in \(1, 2\)"):
        kn.gemv(W, x, out, kc.MODE_STORE, None, items_per_block=2, rows_per_warp=3)
    odd = _int4(64, 384, 96)
    with pytest.raises(KernelError, match="group 96 is not 32 x a power of two"):
        kn.gemv(odd, _array((1, 384), np.float32), out, kc.MODE_STORE, None, lean=True)
    kn._shared_limits = {name: 4 * 8192 for name in kn._shared_limits}     # K 8192 fits 4 K bytes, not 4.5 K
    wide = _int4(64, 8192)
    kn.gemv(wide, _array((1, 8192), np.float32), out, kc.MODE_STORE, None)
    with pytest.raises(KernelError, match="K 8192 needs 36864 bytes of shared memory > 32768"):
        kn.gemv(wide, _array((1, 8192), np.float32), out, kc.MODE_STORE, None, lean=True)
    kn.launches.pop()
    assert kn.launches == []


class _Kernels:
    """What LayerEnqueue._enqueue_layer_fused calls: each gemv's weight and keyword arguments."""

    def __init__(self):
        self.calls = []

    def gemv(self, W, x, out, mode, stream, **kw):
        self.calls.append((W, kw))


@pytest.mark.parametrize("plan", [MEASURED_BEST, KernelPlan(int4_gemv_items_per_block=4),
                                  KernelPlan(int4_gemv_items_per_block=2, int4_gemv_rows_per_warp=2),
                                  KernelPlan(int4_decode_lean_loop=True)])
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
            assert (kw["items_per_block"], kw["rows_per_warp"], kw["lean"]) == (
                plan.int4_gemv_items_per_block, plan.int4_gemv_rows_per_warp, plan.int4_decode_lean_loop)
        else:                                                           # gemv.cu takes none of them
            assert not {"items_per_block", "rows_per_warp", "lean"} & set(kw)


def _int4_in_effect(plan, int4, group=128):
    """CudaBackend._int4_in_effect of a backend with or without INT4 weights in groups of `group`."""
    from vla_edge_ros.model.cuda_backend import CudaBackend
    fake = SimpleNamespace(int4=int4, int4_group=group if int4 else 0, dtype="bfloat16",
                           _weights_kind=lambda: "INT4" if int4 else "bfloat16")
    return CudaBackend._int4_in_effect(fake, plan)


def test_a_backend_keeps_the_lean_entries_for_groups_they_index(caplog):
    lean = KernelPlan(int4_decode_lean_loop=True, int4_prefill_lean_loop=True)
    assert _int4_in_effect(MEASURED_BEST, True)["int4_decode_lean_loop"] is False          # not asked: never
    assert _int4_in_effect(MEASURED_BEST, True)["int4_prefill_lean_loop"] is False
    for group in (32, 64, 128):
        got = _int4_in_effect(lean, True, group)
        assert got["int4_decode_lean_loop"] is True and got["int4_prefill_lean_loop"] is True
    unstaged = KernelPlan(staged_int4_prefill_projections=False, int4_prefill_lean_loop=True)
    assert _int4_in_effect(unstaged, True)["int4_prefill_lean_loop"] is True           # projection_int4.cu's entries
    grid = KernelPlan(int4_gemv_items_per_block=3, int4_gemv_rows_per_warp=2, int4_decode_lean_loop=True)
    assert _int4_in_effect(grid, True) == {"int4_gemv_items_per_block": 3, "int4_gemv_rows_per_warp": 2,
                                           "int4_decode_lean_loop": True, "int4_prefill_lean_loop": False}
    with caplog.at_level(logging.INFO, logger="vla_edge_ros.model.cuda_backend"):
        got = _int4_in_effect(lean, True, 96)
        assert got["int4_decode_lean_loop"] is False and got["int4_prefill_lean_loop"] is False
        assert "groups of 96 keep the other entries" in caplog.text
        caplog.clear()
        assert _int4_in_effect(lean, False) == {"int4_gemv_items_per_block": 0, "int4_gemv_rows_per_warp": 1,
                                                "int4_decode_lean_loop": False, "int4_prefill_lean_loop": False}
        assert "apply to INT4 weights only" in caplog.text


def test_the_lab_names_the_lean_switch_and_the_plan_checks_it():
    from vla_edge_ros.bench.kernel_lab import mode_plan
    assert MEASURED_BEST.int4_decode_lean_loop is False                                  # off until measured
    assert mode_plan("plain+i4lean").int4_decode_lean_loop is True
    assert mode_plan("plain+i4lean+noi4lean").int4_decode_lean_loop is False
    with pytest.raises(ValueError, match="int4_decode_lean_loop must be True or False"):
        KernelPlan(int4_decode_lean_loop=1)
