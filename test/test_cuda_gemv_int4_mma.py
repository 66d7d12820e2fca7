"""gemv_int4_mma.cu (the one-row INT4 decode projections on the tensor cores; KernelPlan.int4_decode_tensor_cores,
off) against kernel_reference on w_hat, and in a backend against the CUDA-core decode it would replace.

GPU only (marker `gpu`). Written 2026-12-03 (ninth session) after the device time: not yet run.

Kernel: every mode with and without the RMSNorm prologue on the 1.5B and 7B projection widths (K 1536, 4096,
8960, 11008: 12 to 86 groups of 128, so the 8 warps' K shares are uneven), ragged row counts (padding rows of the
last item), a row slice, the gate/up interleave and QKV_ROPE's row order; the reference is kernel_reference's
gemv oracle on w_hat = int4.dequantize(...) in float64. Backend: a two-layer model of the 1.5B shape written
straight to INT4 in groups of 128 gives, with the lab's "+i4mma", one-row logits near the fused gemv_int4 decode's
and a cycle that picks the same tokens.

Tolerance: the activations enter as bf16 hi + lo (16 significant bits, relative error <= 2^-17 per product) and
the group sums carry a 136 x sum(v) term subtracted back in fp32 (~5 bits of cancellation), so ~1e-5 of the
output's scale; 1e-4 of it (plus 1e-4 relative) leaves room and still fails any wrong row, column, nibble, pair
or scale (each of those moves an output by O(1) of its scale).
"""
import numpy as np
import pytest

from gpu_cases import int4_device, int4_gemv_modes_case, int4_quantized, one_cycle, qkv_rope_case
from kernel_compare import assert_close, peak, rel_norm
from vla_edge_ros.model import weight_layouts as layouts

pytestmark = pytest.mark.gpu

GROUP = 128


def _close(got, expected, what):
    assert_close(got, expected, rtol=1e-4, atol=1e-4 * max(peak(expected), 1e-3), what=what, norm_rtol=1e-4)


@pytest.mark.parametrize("norm", [False, True])
@pytest.mark.parametrize("rows,k", [(1536, 1536), (256, 4096), (264, 8960), (136, 11008), (2048, 1536)])
def test_gemv_int4_mma_modes_match_reference(kn, gpu, rows, k, norm):
    int4_gemv_modes_case(kn, gpu, rows, k, GROUP, norm, np.random.default_rng(rows + k + norm),
                         f"gemv_int4_mma {rows}x{k} norm={norm}", _close, tensor_cores=True)


@pytest.mark.parametrize("norm", [False, True])
@pytest.mark.parametrize("hq,kvh,hd,hidden", [(12, 2, 128, 1536), (32, 32, 128, 4096)])
def test_gemv_int4_mma_qkv_rope_writes_q_and_kv_slots(kn, gpu, hq, kvh, hd, hidden, norm):
    """QKV_ROPE in qkv_rope_row_order (packed and scale rows permuted together), the 1.5B and 7B head layouts,
    against RMSNorm -> natural projection on w_hat + bias -> rope_store_ref."""
    ga, _ = gpu
    rng = np.random.default_rng(hq * hd + hidden + norm)
    packed, scales, w_hat = int4_quantized(rng, (hq + 2 * kvh) * hd, hidden, GROUP)
    dev_packed, dev_scales = layouts.int4_rows(packed, scales, layouts.qkv_rope_row_order(hq, kvh, hd))
    qkv_rope_case(kn, gpu, int4_device(ga, dev_packed, dev_scales, GROUP), w_hat, hq, kvh, hd, rng, norm,
                  f"gemv_int4_mma QKV_ROPE {hq}/{kvh}x{hd} norm={norm}", _close, tensor_cores=True)


@pytest.fixture(scope="module")
def int4_1p5b_two_layers(tmp_path_factory):
    from vla_edge_ros.model.make_model import make_model
    from vla_edge_ros.model.spec import ModelSpec
    path = make_model("qwen2.5-1.5b-random", tmp_path_factory.mktemp("q15") / "int4", seed=5, layers=2,
                      int4_group_size=GROUP)
    return ModelSpec.from_dir(path), path


def test_the_tensor_core_decode_stays_near_the_cuda_core_one(int4_1p5b_two_layers):
    """The lab's "+i4mma" puts every decode projection of the backend on gemv_int4_mma.cu: a one-row forward's
    logits within 1e-3 of the fused gemv_int4 decode's (relative norm), a whole cycle (graphs) picks at least 8 of
    its 9 tokens, and "plain" switches back."""
    from vla_edge_ros.bench import kernel_lab
    from vla_edge_ros.model.cuda_backend import CudaBackend
    spec, path = int4_1p5b_two_layers
    b = CudaBackend(spec, path, 300, "bfloat16")
    rng = np.random.default_rng(3)
    ctx = np.arange(60)
    b.forward(b.embed(rng.integers(0, spec.vocab_size, size=60)), ctx, ctx, np.array([], np.int64), logits="none")
    row = b.embed(rng.integers(0, spec.vocab_size, size=1))

    def one_row():                                   # the same row into the same slot: the same K/V each time
        return b.forward(row, np.array([60]), np.array([60]), ctx).logits[0]
    cuda_cores, cuda_cores_cycle = one_row(), one_cycle(b, spec.vocab_size, n_ctx=100, n_prefill=32, seed=6)
    assert b.kernel_plan.int4_decode_tensor_cores is False
    assert kernel_lab.apply_launch_mode(b, "plain+i4mma") == "plain+i4mma"
    assert b.kernel_plan.int4_decode_tensor_cores is True and b._fused(1)
    tensor_cores = one_row()
    assert 0.0 < rel_norm(tensor_cores, cuda_cores) < 1e-3           # other roundings, the same projections
    cycle = one_cycle(b, spec.vocab_size, n_ctx=100, n_prefill=32, seed=6)
    assert np.sum(cycle[0] == cuda_cores_cycle[0]) >= 8
    assert kernel_lab.apply_launch_mode(b, "plain") == "plain" and b.kernel_plan.int4_decode_tensor_cores is False
    b.close()
