"""The kernel sources as the package compiles them, checked on the CPU (no nvcc, PyCUDA or device).

Numbers shared by host and kernels are written once, in cuda/common.cuh, and Python reads them
from there; the limits Python mirrors equal their #defines. family_source pastes each local
header once; the bf16 mma helpers live in mma_bf16.cuh alone. CudaKernels compiles the
on-demand families (vision) at their first launch, not at construction.
"""
import contextlib
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from vla_edge_ros.model import cuda_attention_launchers as ca
from vla_edge_ros.model import cuda_bulk_launchers as cbl
from vla_edge_ros.model import cuda_kernels as ck
from vla_edge_ros.model import cuda_projection_launchers as cp
from vla_edge_ros.model import kernel_constants as kc
from vla_edge_ros.model import kernel_reference as ref
from vla_edge_ros.model.cuda_launch_common import ATTN_MAX_GROUP

ROOT = Path(__file__).resolve().parents[1]
CUDA = ROOT / "cuda"
ANY_DEFINE = re.compile(r"^[ \t]*#[ \t]*define[ \t]+([A-Za-z_]\w*)", re.MULTILINE)
MMA_HELPERS = ("mma_bf16_16816", "load_weights16", "pack_bf16x2", "split_activations")


def _defines(name: str) -> dict:
    return kc.parse_defines((CUDA / name).read_text())


# ----------------------------------------------------------------------------
# Shared numbers


def test_python_reads_control_block_and_modes_from_common_cuh():
    assert ck.kernel_dir() == CUDA
    header = _defines("common.cuh")
    for py_name, c_name in kc.HEADER_NAMES.items():
        assert getattr(kc, py_name) == getattr(ck, py_name) == getattr(ref, py_name) == header[c_name], py_name
    modes = [kc.MODE_STORE, kc.MODE_ADD, kc.MODE_SWIGLU, kc.MODE_QKV_ROPE]
    assert len(set(modes)) == 4, f"projection modes collide: {modes}"
    slots = [kc.CTL_ROW_OFFSET, kc.CTL_CTX_LEN, kc.CTL_N_OUT, kc.CTL_TOKEN]
    assert sorted(slots) == list(range(kc.CTL_INTS)), f"control block slots {slots} vs CTL_INTS {kc.CTL_INTS}"


def test_kernel_limits_mirrored_in_python_match_the_sources():
    common = _defines("common.cuh")
    assert (ca.ATTN_CHUNK, ATTN_MAX_GROUP, ca.ATTN_MAX_HEAD_DIM) == \
        (common["ATTN_CHUNK"], common["ATTN_MAX_GROUP"], common["ATTN_MAX_HEAD_DIM"])
    assert cp.PROJ_WARPS == _defines("projection_bf16.cu")["PROJ_WARPS"]


def test_bulk_gemm_plans_match_their_kernels():
    """The launcher sizes grids and shared memory from BULK_GEMMS: each plan must be its kernel's tile, and each
    wgmma plan must name an entry gemm_wgmma.cu defines with that many weight rows and stages."""
    bulk = _defines("gemm_bulk.cu")
    assert (cbl.GEMM_BULK_BM, cbl.GEMM_BULK_BN, cbl.GEMM_BULK_BK, cbl.GEMM_BULK_STAGES, cbl.GEMM_BULK_ROW,
            cbl.GEMM_BULK_THREADS) == tuple(bulk[k] for k in ("GB_BM", "GB_BN", "GB_BK", "GB_STAGES", "GB_ROW",
                                                              "GB_THREADS"))
    assert cbl.BULK_GEMMS["mma"].k_multiple == bulk["GB_BK"]       # gemm_bulk.cu has no K tail
    source = (CUDA / "gemm_wgmma.cu").read_text()
    wg = kc.parse_defines(source)
    entries = {(int(bn), int(parts)): int(stages) for bn, parts, stages in
               re.findall(r"^GEMM_WGMMA_ENTRY\((\d+), (\d+), (\d+), \d+\)", source, re.MULTILINE)}
    assert set(ck.FAMILIES["gemm_wgmma"]) == {f"gemm_wgmma_n{bn}_p{parts}" for bn, parts in entries}
    plans = [plan for plan in cbl.BULK_GEMMS.values() if plan.family == "gemm_wgmma"]
    assert plans, "no BULK_GEMMS plan uses gemm_wgmma.cu"
    for plan in plans:
        assert (plan.bm, plan.bk, plan.row) == (wg["GW_BM"], wg["GW_BK"], wg["GW_BK"]), plan
        assert wg["GW_THREADS"] == cbl.GEMM_BULK_THREADS
        for parts in (1, 2):
            assert entries[(plan.bn, parts)] == plan.stages, (plan, parts)
            assert f"{plan.prefix}_p{parts}" in ck.FAMILIES["gemm_wgmma"]
    tma_source = (CUDA / "gemm_tma.cu").read_text()
    tma = kc.parse_defines(tma_source)
    tma_entries = {(name, int(parts)): (int(stages), int(blocks)) for name, parts, stages, blocks in
                   re.findall(r"^GEMM_TMA_ENTRY\((\w+), (\d+), (\d+), (\d+)\)", tma_source, re.MULTILINE)}
    plans = [plan for plan in cbl.BULK_GEMMS.values() if plan.family == "gemm_tma"]
    assert {plan.prefix for plan in plans} == {name for name, _ in tma_entries}
    for plan in plans:
        assert (plan.bm, plan.bn, plan.bk, plan.row, plan.threads) == \
            (tma["GT_BM"], tma["GT_BN"], tma["GT_BK"], tma["GT_BK"], tma["GT_THREADS"])
        for parts in (1, 2):
            assert tma_entries[(plan.prefix, parts)] == (plan.stages_for(parts), plan.blocks_per_sm), (plan, parts)
            # the launch bound's blocks must fit the SM's shared memory (228 KB on the H200) with these stages
            assert plan.blocks_per_sm * (plan.shared_bytes(parts) + 1024) <= 228 * 1024, (plan, parts)
        assert plan.extra_shared == 1024 and plan.barrier_bytes == 16      # alignment; a full and an empty mbarrier
        assert plan.tensor_maps
    assert set(ck.FAMILIES["gemm_tma"]) == {f"{name}_p{parts}" for name, parts in tma_entries}
    assert ck.family_arch("gemm_wgmma", "sm_90") == ck.family_arch("gemm_tma", "sm_90") == "sm_90a"
    assert ck.family_arch("gemm_wgmma", "sm_80") is None and ck.family_arch("gemm_bulk", "sm_80") == "sm_80"


def test_shared_numbers_are_defined_only_in_common_cuh():
    shared = set(kc.HEADER_NAMES.values()) | {"ATTN_CHUNK", "ATTN_MAX_GROUP", "ATTN_MAX_HEAD_DIM"}
    for path in sorted(CUDA.glob("*.cu*")):
        if path.name != "common.cuh":
            again = shared & set(ANY_DEFINE.findall(path.read_text()))
            assert not again, f"{path.name} defines {sorted(again)} again: common.cuh is their one definition"


def test_parse_defines_takes_integer_macros_only():
    text = ("#define A 3\n  #  define B -2   // why\n#define C (A + 1)\n#define D(x) 4\n#define E 1.5f\n"
            "#define F 7 /* note */\nint G = 5;\n")
    assert kc.parse_defines(text) == {"A": 3, "B": -2, "F": 7}


def test_kernel_modules_import_without_pycuda_and_read_no_file():
    code = ("import sys; import vla_edge_ros.model.kernel_reference; import vla_edge_ros.model.cuda_kernels; "
            "from vla_edge_ros.model import kernel_constants as kc; "
            "print('pycuda' in sys.modules, kc.header_values.cache_info().currsize)")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "0"]


# ----------------------------------------------------------------------------
# Headers


@pytest.mark.parametrize("family", sorted(ck.FAMILIES))
def test_family_source_is_one_translation_unit(family):
    src = ck.family_source(family)
    assert not re.search(r'^[ \t]*#[ \t]*include[ \t]+"', src, re.MULTILINE), "a local include was left in"
    assert not re.search(r"^[ \t]*#[ \t]*pragma[ \t]+once", src, re.MULTILINE)
    assert src.count("#define CTL_INTS") == 1, "common.cuh pasted once"
    mma_definitions = src.count("void mma_bf16_16816(")
    assert mma_definitions <= 1, "mma_bf16.cuh pasted once"
    if family in ("projection_bf16", "projection_staged", "projection_int4", "projection_int4_staged", "attention_mma",
                  "prefill_bulk", "attention_flash_kvo", "attention_flash_tiles"):
        assert mma_definitions == 1, f"{family}.cu includes mma_bf16.cuh"


def test_kv_families_are_exactly_the_families_that_touch_the_arena():
    """-DKV_BF16 reaches every family that reads or writes the KV arena and no other: a family left out would
    read a bf16 arena as fp32 (garbage, not an error), so the list is checked against the sources."""
    from vla_edge_ros.config import KV_DTYPES
    assert tuple(ck.KV_ARENA_TYPES) == KV_DTYPES                  # every kv.dtype the configuration accepts
    touching = {family for family in ck.FAMILIES if "typedef uint16_t kv_t;" in ck.family_source(family)}
    assert touching == ck.KV_FAMILIES
    for family in ck.FAMILIES:
        assert ck.family_options(family, "float32") == ()
        assert ck.family_options(family, "bfloat16") == (("-DKV_BF16",) if family in ck.KV_FAMILIES else ())
    with pytest.raises(ValueError, match="kv dtype 'float16' unknown"):
        ck.family_options("rope", "float16")


def test_kv_arena_is_declared_float_only_in_kv_store_cuh():
    """Outside kv_store.cuh no kernel names the arena with a float pointer: k_cache / v_cache are kv_t."""
    for path in sorted(CUDA.glob("*.cu*")):
        text = path.read_text()
        if path.name != "kv_store.cuh":
            assert not re.search(r"float\s*\*\s*(?:__restrict__\s*)?[kv]_cache\b", text), path.name


def test_bf16_mma_helpers_are_defined_in_mma_bf16_cuh_only():
    for path in sorted(CUDA.glob("*.cu*")):
        text = path.read_text()
        for helper in MMA_HELPERS:
            defined = re.search(rf"^[ \t]*__device__[^\n]*\b{helper}[ \t]*\(", text, re.MULTILINE) is not None
            assert defined == (path.name == "mma_bf16.cuh"), \
                f"{path.name}: {helper} {'defined' if defined else 'missing'}; it belongs in mma_bf16.cuh"


def test_headers_are_pasted_once_in_include_order(tmp_path, monkeypatch):
    (tmp_path / "common.cuh").write_text("#pragma once\nint common_part;\n")
    (tmp_path / "inner.cuh").write_text('#pragma once\n#include "common.cuh"\nint inner_part;\n')
    (tmp_path / "family.cu").write_text('#include "common.cuh"\n#include "inner.cuh"\n#include <stdint.h>\n'
                                        "int family_part;\n")
    (tmp_path / "broken.cu").write_text('#include "absent.cuh"\n')
    monkeypatch.setattr(ck, "kernel_dir", lambda: tmp_path)
    src = ck.family_source("family")
    assert src.count("int common_part;") == 1 and src.count("int inner_part;") == 1
    assert src.index("int common_part;") < src.index("int inner_part;") < src.index("int family_part;")
    assert "#include <stdint.h>" in src and "pragma once" not in src
    with pytest.raises(FileNotFoundError, match='broken.cu includes "absent.cuh"'):
        ck.family_source("broken")


# ----------------------------------------------------------------------------
# On-demand families


class _FakeModule:
    """What compile_family returns, minus PyCUDA: functions that record their launches."""

    def __init__(self, launches: list):
        self.launches = launches

    def get_function(self, name: str):
        launches = self.launches

        class Function:
            def prepare(self, types):
                pass

            def set_attribute(self, attribute, value):
                pass

            def get_attribute(self, attribute):
                return 0                                        # no static shared memory

            def prepared_async_call(self, grid, block, stream, *args, shared_size=0):
                launches.append(name)
        return Function()


def _fake_array(shape):
    return SimpleNamespace(dtype=np.dtype(np.float32), shape=shape, size=int(np.prod(shape)), gpudata=0)


def test_vision_family_is_compiled_at_its_first_launch_only(monkeypatch):
    compiled, launches = [], []

    def compile_family(device, family, arch=None, options=()):
        compiled.append(family)
        return _FakeModule(launches)
    monkeypatch.setattr(ck, "compile_family", compile_family)
    drv = SimpleNamespace(Error=RuntimeError,
                          device_attribute=SimpleNamespace(MULTIPROCESSOR_COUNT=0, MAX_SHARED_MEMORY_PER_BLOCK_OPTIN=1),
                          function_attribute=SimpleNamespace(MAX_DYNAMIC_SHARED_SIZE_BYTES=2, SHARED_SIZE_BYTES=3))
    device = SimpleNamespace(drv=drv, handle=object(), bound=contextlib.nullcontext,
                             device=SimpleNamespace(get_attribute=lambda attribute: 232448))

    kn = ck.CudaKernels(device, arch="sm_90")
    assert "vision" in ck.ON_DEMAND_FAMILIES
    assert sorted(compiled) == sorted(set(ck.FAMILIES) - ck.ON_DEMAND_FAMILIES)
    pooled, sims = _fake_array((4, 128)), _fake_array((3,))
    kn.adjacent_cosine(pooled, 4, sims, stream=None)
    kn.pool_rows(pooled, pooled, stream=None)
    assert compiled.count("vision") == 1 and launches == ["adjacent_cosine", "pool_rows"]


def test_persistent_decode_shares_its_stage_bodies_and_layer_table_layout():
    """decode_persistent.cu runs gemv.cu's, attention_decode.cu's and the merge's device code (one definition
    each, in their .cuh), and its DecodeLayer holds as many pointers as the host packs per layer."""
    bodies = {"dot8_bf16": "gemv_rows.cuh", "gemv_epilogue": "gemv_rows.cuh", "decode_partial_body": "attention_decode.cuh",
              "merge_body": "attention_merge.cuh"}
    for path in sorted(CUDA.glob("*.cu*")):
        text = path.read_text()
        for body, home in bodies.items():
            defined = re.search(rf"^[ \t]*(template[^\n]*\n[ \t]*)?__device__[^\n]*\b{body}[ \t]*\(", text,
                                re.MULTILINE) is not None
            assert defined == (path.name == home), f"{path.name}: {body} {'defined' if defined else 'missing'}"
    persistent_src = ck.family_source("decode_persistent")
    assert persistent_src.index("#define GRID_WRITTEN_THROUGH_L2") < persistent_src.index("#define LOAD_GRID_WRITTEN"), \
        "decode_persistent.cu must ask for L2-only loads before common.cuh is pasted"
    assert "#define GRID_WRITTEN_THROUGH_L2" not in ck.family_source("gemv")
    persistent = (CUDA / "decode_persistent.cu").read_text()
    struct = re.search(r"struct DecodeLayer \{(.*?)\};", persistent, re.DOTALL).group(1)
    fields = re.findall(r"^\s*[\w ]+\*\s*\w+;", struct, re.MULTILINE)
    assert len(fields) == ck.DECODE_LAYER_POINTERS, fields
    assert _defines("gemv_rows.cuh")["GEMV_THREADS"] == cp.GEMV_THREADS
    assert _defines("attention_decode.cuh")["DEC_THREADS"] == ca.ATTN_DECODE_THREADS
    assert _defines("attention_merge.cuh")["MERGE_MAX_SPLITS"] == ca.ATTN_MERGE_MAX_SPLITS
    assert "decode_persistent" in ck.ON_DEMAND_FAMILIES


def test_the_cold_start_builds_every_runnable_family_once_and_skips_only_on_demand_ones():
    """What a fresh process compiles side by side (cuda_kernels.all_builds less COLD_START_SKIPS): each family once
    per KV arena type that changes its options, wgmma only where sm_90a exists; a skipped family must be one that
    loads on demand, or the eager loads would compile it one by one anyway."""
    from vla_edge_ros.model import cuda_kernels as ck
    assert ck.COLD_START_SKIPS <= ck.ON_DEMAND_FAMILIES
    builds = ck.all_builds("sm_90", ("float32", "bfloat16"))
    assert len(builds) == len(set(builds))
    families = {b[0] for b in builds}
    assert families == set(ck.FAMILIES)
    assert any(b[:2] == ("gemm_wgmma", "sm_90a") for b in builds)
    per_family = {f: sum(b[0] == f for b in builds) for f in families}
    assert all(per_family[f] == 2 for f in ck.KV_FAMILIES) and all(
        per_family[f] == 1 for f in families - set(ck.KV_FAMILIES))
    assert "gemm_wgmma" not in {b[0] for b in ck.all_builds("sm_80", ("float32",))}
