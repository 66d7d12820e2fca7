"""The INT4 kernel families (projection_int4_staged.cu too, and gemv, whose header they share), gemm_tma.cu (sm_90a),
prefill_bulk.cu (its one-part and two-heads-per-warp entries), attention_flash_kvo.cu (the same template with the
K/V overlap) and attention_flash_tiles.cu (with hoisted copies and 64-entry tiles) compile with nvcc for sm_90, as PyCUDA would
compile them on the device (scripts/compile_kernels.py: the pasted source, the family's KV options), for
both KV arena types. CPU only; skipped where nvcc is not on PATH. No kernel runs here (test_cuda_*.py do)."""
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import compile_kernels  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")


@pytest.mark.parametrize("kv_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("family", ["gemv_int4", "projection_int4", "projection_int4_staged", "gemv", "gemm_tma",
                                    "prefill_bulk", "attention_flash_kvo", "attention_flash_tiles"])
def test_family_compiles_for_sm_90(family, kv_dtype, tmp_path):
    done = compile_kernels.compile_family(family, "sm_90", tmp_path, kv_dtype)
    assert done.returncode == 0, done.stdout + done.stderr
    cubin = (tmp_path / f"{family}.cubin").read_bytes()
    from vla_edge_ros.model.cuda_kernels import FAMILIES
    for kernel in FAMILIES[family]:                 # every entry FAMILIES prepares is a symbol of the cubin
        assert kernel.encode() + b"\0" in cubin, f"{family}: {kernel} missing from the cubin"
