"""projection_int4_staged.cu's wiring, checked on the CPU (no nvcc, PyCUDA or device; test_kernel_compile.py compiles
it, test_cuda_projection_int4_staged.py runs it): the family is registered on demand with projection_int4.cu's
arguments, the mirrored limits equal the kernel's #defines, the shared-memory layout is conflict-free as its header
says, the INT4 helpers live in mma_int4.cuh alone, the launcher gives the same arguments and K parts as
projection_int4's, the lean entry (KernelPlan.int4_prefill_lean_loop, off by default, not yet measured) the same
arguments and grid and its refusals, and the layer code takes it only where the plan asks, for INT4 weights and up to
32 rows.
"""
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from vla_edge_ros.model import cuda_int4_launchers as c4
from vla_edge_ros.model import cuda_kernels as ck
from vla_edge_ros.model import kernel_constants as kc
from vla_edge_ros.model.cuda_kernel_plan import KernelPlan
from vla_edge_ros.model.cuda_launch_common import KernelError

CUDA = Path(__file__).resolve().parents[1] / "cuda"
INT4_HELPERS = ("biased_nibbles_to_bf16x2", "nibbles_to_bf16x2", "int4_pairs", "split_activations_int4", "quad_transpose", "load_int4_block",
                "int4_step_group", "int4_group_starts", "int4_step_flushes",
                "int4_mma_step", "int4_part_blocks", "int4_flush_here", "int4_scale", "flush_group")


def _defines(name: str) -> dict:
    return kc.parse_defines((CUDA / name).read_text())


def test_the_family_is_registered_on_demand_with_projection_int4s_arguments():
    lean = re.findall(r"^PROJECTION_INT4_ENTRY\((\d), (\w+), (\w*)\)", (CUDA / "projection_int4.cu").read_text(),
                      re.MULTILINE)
    assert {f"projection_int4_nt{nt}{suffix}" for nt, _, suffix in lean} == set(ck.FAMILIES["projection_int4"])
    assert len(ck.FAMILIES["projection_int4"]) == 6                                      # nt 1, 2, 4; lean or not
    assert ck.FAMILIES["projection_int4_staged"] == {name: "PPiPPPiiiiiiii" for name in (   # one part; prefetch
        "projection_int4_staged", "projection_int4_staged_p1", "projection_int4_staged_pf",
        "projection_int4_staged_p1_pf", "projection_int4_staged_lean")}
    source = (CUDA / "projection_int4_staged.cu").read_text()
    declared = re.findall(r"^PROJECTION_INT4_STAGED_ENTRY\(\d, \w+, \w+, (\w*)\)", source, re.MULTILINE)
    assert {"projection_int4_staged" + suffix for suffix in declared} == set(ck.FAMILIES["projection_int4_staged"])
    dynamic = {n for n in ck.FAMILIES["projection_int4_staged"] if n in ck.DYNAMIC_SHARED_KERNELS}
    assert dynamic == {"projection_int4_staged_pf", "projection_int4_staged_p1_pf"}
    assert set(ck.FAMILIES["projection_int4"].values()) == {"PPiPPPiiiiiiii"}
    assert "projection_int4_staged" in ck.ON_DEMAND_FAMILIES
    assert "projection_int4_staged" not in ck.KV_FAMILIES and "projection_int4_staged" not in ck.ARCH_SPECIFIC_FAMILIES
    assert ck.family_arch("projection_int4_staged", "sm_90") == "sm_90"       # mma.sync: no "a" target needed


def test_mirrored_limits_and_the_shared_layout():
    staged, helpers = _defines("projection_int4_staged.cu"), _defines("mma_int4.cuh")
    assert staged["STG4_WARPS"] == c4.STG4_WARPS and staged["STG4_TOKENS"] == c4.STAGED_INT4_MAX_TOKENS
    assert staged["STG4_ROW"] == c4.STG4_ROW_WORDS                 # the _pf entries' dynamic shared memory
    assert c4.staged_int4_prefetch_shared(2) == 4 * 2 * 2 * staged["STG4_TOKENS"] * staged["STG4_ROW"] + 16384
    assert c4.staged_int4_prefetch_shared(1) <= 48 * 1024 < c4.staged_int4_prefetch_shared(2)   # opted in
    assert helpers["INT4_BLOCK_STEPS"] * 32 == c4.PROJ4_BLOCK_COLUMNS
    assert _defines("projection_int4.cu")["PROJ4_WARPS"] == c4.PROJ4_WARPS
    row = staged["STG4_ROW"]
    assert 2 * 2 * staged["STG4_TOKENS"] * row * 4 <= 48 * 1024, "static shared memory over 48 KB"
    assert row >= 64 and row % 4 == 0, "a 128-column chunk is 64 words; 16-byte aligned rows"
    # One LDS.128 phase: lanes (g, t), g in {0, 1}, t < 4, read words (8 nt + g) row + 16 s + 4 t .. + 3.
    for nt in range(4):
        for s in range(4):
            banks = [(((8 * nt + g) * row + 16 * s + 4 * t + e) % 32) for g in (0, 1) for t in range(4)
                     for e in range(4)]
            assert len(set(banks)) == 32, (nt, s)
    # Staging stores: 8 consecutive items of one token, c8 = 0..7 or 8..15, write words n row + 4 c8 .. + 3.
    for n in range(32):
        for c0 in (0, 8):
            assert len({(n * row + 4 * c8 + e) % 32 for c8 in range(c0, c0 + 8) for e in range(4)}) == 32


def test_int4_helpers_are_defined_in_mma_int4_cuh_only():
    for path in sorted(CUDA.glob("*.cu*")):
        text = path.read_text()
        for helper in INT4_HELPERS:
            defined = re.search(rf"^[ \t]*(template[^\n]*\n[ \t]*)?__device__[^\n]*\b{helper}[ \t]*\(", text,
                                re.MULTILINE) is not None
            assert defined == (path.name == "mma_int4.cuh"), \
                f"{path.name}: {helper} {'defined' if defined else 'missing'}; it belongs in mma_int4.cuh"
    for family in ("projection_int4", "projection_int4_staged"):
        src = ck.family_source(family)
        assert src.count("uint32_t nibbles_to_bf16x2(") == 1 and src.count("void mma_bf16_16816(") == 1, family


class _Recorder(c4.Int4Launchers):
    """The INT4 launchers without a device: every launch recorded as (kernel, grid, block, arguments)."""
    num_sms = 132

    def __init__(self):
        self.launches = []

    def _launch(self, name, grid, block, stream, *args, shared=0):
        self.launches.append((name, tuple(grid), block, args))


def _array(shape, dtype, address):
    return SimpleNamespace(shape=tuple(shape), dtype=np.dtype(dtype), gpudata=address,
                           nbytes=int(np.prod(shape)) * np.dtype(dtype).itemsize)


def _int4(rows, k, group):
    return c4.Int4Matrix(_array((rows, k // 2), np.uint8, 1 << 20), _array((rows, k // group), np.uint16, 1 << 30),
                         group)


# (rows, K, group, tokens, mode, ksplit): the 1.5B q|k|v, o, gate/up and down at 32 rows, ragged ones.
LAUNCHES = [(2048, 1536, 128, 32, kc.MODE_ADD, None), (1536, 1536, 128, 32, kc.MODE_ADD, None),
            (17920, 1536, 128, 32, kc.MODE_SWIGLU, None), (1536, 8960, 128, 32, kc.MODE_ADD, None),
            (272, 352, 32, 13, kc.MODE_STORE, None), (40, 96, 32, 1, kc.MODE_ADD, 1), (130, 512, 256, 17, kc.MODE_ADD, 3)]


@pytest.mark.parametrize("rows,k,group,n,mode,ksplit", LAUNCHES)
def test_the_staged_launcher_passes_projection_int4s_arguments_and_parts(rows, k, group, n, mode, ksplit):
    kn = _Recorder()
    W = _int4(rows, k, group)
    x, out = _array((40, k + 64), np.float32, 1 << 34), _array((40, rows), np.float32, 1 << 36)
    cols = rows // 2 if mode == kc.MODE_SWIGLU else rows
    for launch in (kn.projection_int4, kn.projection_int4_staged):
        launch(W, x, out, n, mode, None, out_cols=cols, ksplit=ksplit, x_row0=2)
    (plain, plain_grid, plain_block, plain_args), (name, grid, block, args) = kn.launches
    assert name == "projection_int4_staged" and block == 256 and plain_block == 128
    assert [int(a) for a in args] == [int(a) for a in plain_args]       # the same ksplit (its last argument) too
    parts, tiles = int(args[-1]), -(-rows // 16)
    assert grid == (-(-tiles // 8) * parts,)
    assert plain_grid[0] * 4 >= tiles * parts and plain_grid[0] * 4 < tiles * parts + 4
    assert int(args[3]) == (1 << 34) + 2 * (k + 64) * 4                  # x from row x_row0, its own stride


# Both tensor-core launchers on LAUNCHES; projection_int4.cu also on a reconciler step of 15 frames (480 rows).
LEAN_LAUNCHES = [(launcher, *case) for launcher in ("projection_int4_staged", "projection_int4") for case in LAUNCHES]
LEAN_LAUNCHES.append(("projection_int4", 2048, 1536, 128, 480, kc.MODE_ADD, None))


@pytest.mark.parametrize("launcher,rows,k,group,n,mode,ksplit", LEAN_LAUNCHES)
def test_the_lean_entry_takes_the_same_arguments_and_grid(launcher, rows, k, group, n, mode, ksplit):
    kn = _Recorder()
    W = _int4(rows, k, group)
    x, out = _array((n + 8, k + 64), np.float32, 1 << 34), _array((n + 8, rows), np.float32, 1 << 36)
    cols = rows // 2 if mode == kc.MODE_SWIGLU else rows
    for lean in (False, True):
        getattr(kn, launcher)(W, x, out, n, mode, None, out_cols=cols, ksplit=ksplit, x_row0=2, lean=lean)
    (name, grid, block, args), (lean_name, lean_grid, lean_block, lean_args) = kn.launches
    assert lean_name == name + "_lean" and (lean_grid, lean_block) == (grid, block)
    assert [int(a) for a in lean_args] == [int(a) for a in args]


def test_the_staged_launcher_refuses_what_the_kernel_cannot_do():
    kn = _Recorder()
    W = _int4(64, 256, 32)
    x, out = _array((40, 256), np.float32, 1 << 34), _array((40, 64), np.float32, 1 << 36)
    with pytest.raises(KernelError, match="33 tokens > 32"):
        kn.projection_int4_staged(W, x, out, 33, kc.MODE_STORE, None)
    with pytest.raises(KernelError, match="projection_int4_staged: ksplit 2 needs MODE_ADD"):
        kn.projection_int4_staged(W, x, out, 4, kc.MODE_STORE, None, ksplit=2)
    with pytest.raises(KernelError, match=r"ksplit 3 outside \[1, 2\]"):
        kn.projection_int4_staged(W, x, out, 4, kc.MODE_ADD, None, ksplit=3)
    with pytest.raises(KernelError, match="an Int4Matrix expected"):
        kn.projection_int4_staged(_array((64, 256), np.uint16, 1), x, out, 4, kc.MODE_STORE, None)
    with pytest.raises(KernelError, match="lean entry takes two parts without the prefetch, not parts 1"):
        kn.projection_int4_staged(W, x, out, 4, kc.MODE_STORE, None, parts=1, lean=True)
    with pytest.raises(KernelError, match="lean entry takes two parts without the prefetch, not parts 2, prefetch True"):
        kn.projection_int4_staged(W, x, out, 4, kc.MODE_STORE, None, prefetch=True, lean=True)
    for launcher in (kn.projection_int4_staged, kn.projection_int4):
        with pytest.raises(KernelError, match="group 96 is not 32 x a power of two"):
            launcher(_int4(64, 384, 96), _array((40, 384), np.float32, 1 << 34), out, 4, kc.MODE_STORE, None,
                     lean=True)
    assert kn.launches == []


def test_the_plan_and_the_lab_name_the_prefill_lean_entry():
    from vla_edge_ros.bench.kernel_lab import mode_plan
    from vla_edge_ros.model.cuda_kernel_plan import MEASURED_BEST
    assert MEASURED_BEST.int4_prefill_lean_loop is False                                 # off until measured
    assert mode_plan("plain+i4plean").int4_prefill_lean_loop is True
    unstaged = mode_plan("plain+i4plean+int4unstaged")                              # projection_int4.cu's lean
    assert unstaged.int4_prefill_lean_loop is True and unstaged.staged_int4_prefill_projections is False
    for fields in (dict(int4_prefill_activation_parts=1), dict(int4_prefill_activation_prefetch=True)):
        with pytest.raises(ValueError, match="lean entry for two activation parts without the prefetch only"):
            KernelPlan(int4_prefill_lean_loop=True, **fields)
    with pytest.raises(ValueError, match="int4_prefill_lean_loop must be True or False"):
        KernelPlan(int4_prefill_lean_loop="yes")


class _Kernels:
    """What LayerEnqueue._project calls: the kernel each projection goes to (and its keywords, in `keywords`)."""

    def __init__(self):
        self.calls, self.keywords = [], []

    def __getattr__(self, name):
        if name.startswith("projection"):
            return lambda W, x, out, n, mode, stream, **kw: (self.calls.append(name), self.keywords.append(kw))
        raise AttributeError(name)


@pytest.mark.parametrize("plan, weights, n, kernel", [
    (KernelPlan(staged_int4_prefill_projections=True), "int4", 32, "projection_int4_staged"),
    (KernelPlan(staged_int4_prefill_projections=True), "int4", 1, "projection_int4_staged"),
    (KernelPlan(staged_int4_prefill_projections=True), "int4", 33, "projection"),        # a long forward's pass
    (KernelPlan(), "int4", 32, "projection_int4_staged"),                              # the default
    (KernelPlan(staged_int4_prefill_projections=False), "int4", 32, "projection"),     # lab +int4unstaged
    (KernelPlan(staged_int4_prefill_projections=True), "bf16", 32, "projection_staged"),
    (KernelPlan(staged_prefill_projections=False, staged_int4_prefill_projections=True), "bf16", 32, "projection"),
    (KernelPlan(int4_prefill_lean_loop=True), "int4", 32, "projection_int4_staged"),
    (KernelPlan(int4_prefill_lean_loop=True), "int4", 33, "projection"),               # projection_int4.cu's lean
    (KernelPlan(staged_int4_prefill_projections=False, int4_prefill_lean_loop=True), "int4", 32, "projection"),
    (KernelPlan(int4_prefill_lean_loop=True), "bf16", 40, "projection"),               # a float weight: no lean
])
def test_the_layer_code_takes_the_staged_int4_kernel_only_where_asked(plan, weights, n, kernel):
    from vla_edge_ros.model.cuda_layer_enqueue import LayerEnqueue
    W = _int4(64, 256, 32) if weights == "int4" else _array((64, 256), np.uint16, 1)
    layer = SimpleNamespace(kernel_plan=plan, kernels=_Kernels(), stream=None)
    LayerEnqueue._project(layer, W, None, None, n, kc.MODE_ADD)
    assert layer.kernels.calls == [kernel]
    if weights == "int4" and kernel != "projection_staged":
        assert layer.kernels.keywords[0]["lean"] is plan.int4_prefill_lean_loop
    else:                                                              # bf16 kernels take no such keyword
        assert "lean" not in layer.kernels.keywords[0]
