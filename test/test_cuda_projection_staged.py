"""projection_staged.cu (prefill projections with activations staged once per block; off by default,
KernelPlan.staged_prefill_projections) against projection_bf16.cu and the numpy reference.

GPU only (marker `gpu`). The staged kernel uses the same hi/lo split and the same K order inside an
mma as projection_bf16.cu, so on STORE and SWIGLU (no atomics) it must agree with it bit for bit; ADD
with K split into parts adds partial sums atomically, so it is compared with the reference instead.
Ragged shapes: row counts that leave a block's last tiles empty, K not a multiple of the 128-wide
staged chunk, token counts below 32.
"""
import numpy as np
import pytest

from gpu_cases import one_cycle
from kernel_compare import assert_close, peak
from vla_edge_ros.model import kernel_reference as ref
from vla_edge_ros.model import weight_layouts as layouts

pytestmark = pytest.mark.gpu


def _nan(ga, shape):
    return ga.to_gpu(np.full(shape, np.nan, np.float32))


SHAPES = [(40, 96, 1), (272, 352, 13), (2048, 1536, 32), (1536, 8960, 32), (200, 160, 32)]


@pytest.mark.parametrize("rows,k,n", SHAPES)
def test_projection_staged_matches_the_unstaged_kernel_and_the_reference(kn, gpu, rows, k, n):
    ga, stream = gpu
    from vla_edge_ros.model.cuda_kernels import MODE_ADD, MODE_STORE, MODE_SWIGLU
    rng = np.random.default_rng(rows + k * 3 + n)
    w = ref.to_bf16_bits((rng.standard_normal((rows, k)) / np.sqrt(k)).astype(np.float32))
    x = rng.standard_normal((n, k)).astype(np.float32)
    bias = rng.standard_normal(rows).astype(np.float32)
    w_dev, x_dev = ga.to_gpu(w), ga.to_gpu(x)
    case = f"projection_staged {rows}x{k} n={n}"

    staged, unstaged = _nan(ga, (n, rows)), _nan(ga, (n, rows))
    kn.projection_staged(w_dev, x_dev, staged, n, MODE_STORE, stream, bias=ga.to_gpu(bias))
    kn.projection(w_dev, x_dev, unstaged, n, MODE_STORE, stream, bias=ga.to_gpu(bias))
    stream.synchronize()
    np.testing.assert_array_equal(staged.get(), unstaged.get(), err_msg=f"{case} STORE")
    expected = ref.projection_ref(w, x, MODE_STORE, bias=bias)
    # The tensor-core arithmetic of projection_bf16 (test_cuda_kernels.py): ~1e-5 of the output scale.
    assert_close(staged.get(), expected, rtol=1e-5, atol=4e-5 * peak(expected), what=f"{case} STORE")

    base = rng.standard_normal((n, rows)).astype(np.float32)
    increment = ref.projection_ref(w, x, MODE_ADD, out=base).astype(np.float64) - base
    for ksplit in (None, 1, 3):
        acc = ga.to_gpu(base)
        kn.projection_staged(w_dev, x_dev, acc, n, MODE_ADD, stream, ksplit=ksplit)
        stream.synchronize()
        assert_close(acc.get().astype(np.float64) - base, increment, rtol=1e-5, atol=2e-4 * peak(increment),
                     what=f"{case} ADD ksplit={ksplit}")

    if rows % 16 == 0:
        inter = rows // 2 - 3                                   # ragged: the last tile has padding rows
        wf = ref.from_bf16_bits(w)
        w_gu = ga.to_gpu(ref.to_bf16_bits(layouts.interleave_gate_up(wf[:inter], wf[rows // 2: rows // 2 + inter])))
        a_staged, a_unstaged = _nan(ga, (n, inter)), _nan(ga, (n, inter))
        kn.projection_staged(w_gu, x_dev, a_staged, n, MODE_SWIGLU, stream, out_cols=inter)
        kn.projection(w_gu, x_dev, a_unstaged, n, MODE_SWIGLU, stream, out_cols=inter)
        stream.synchronize()
        np.testing.assert_array_equal(a_staged.get(), a_unstaged.get(), err_msg=f"{case} SWIGLU")


def test_projection_staged_rejects_what_it_cannot_do(kn, gpu):
    ga, stream = gpu
    from vla_edge_ros.model.cuda_kernels import MODE_ADD, MODE_STORE, KernelError
    w = ga.to_gpu(np.zeros((32, 64), np.uint16))
    x, out = ga.zeros((40, 64), np.float32), ga.zeros((40, 32), np.float32)
    with pytest.raises(KernelError, match="33 tokens outside"):
        kn.projection_staged(w, x, out, 33, MODE_STORE, stream)
    with pytest.raises(KernelError, match="needs MODE_ADD"):
        kn.projection_staged(w, x, out, 4, MODE_STORE, stream, ksplit=2)
    with pytest.raises(KernelError, match="dtype float32, expected uint16"):
        kn.projection_staged(ga.zeros((32, 64), np.float32), x, out, 4, MODE_ADD, stream)


def test_a_backend_with_staged_prefill_gives_the_same_cycle(tiny_weights):
    """The same cycle with its prefill through projection_staged.cu (graphs) picks the same tokens, and its
    prefill logits agree to rounding (the residual adds split K and add atomically, in another order)."""
    from vla_edge_ros.model.cuda_backend import CudaBackend
    from vla_edge_ros.model.cuda_kernel_plan import KernelPlan
    spec, weights = tiny_weights
    results = []
    for staged in (False, True):
        b = CudaBackend(spec, weights, 300, "bfloat16", plan=KernelPlan(staged_prefill_projections=staged))
        assert b.kernel_plan.staged_prefill_projections == staged
        results.append(one_cycle(b, spec.vocab_size, n_ctx=40, n_prefill=24, seed=3))
        b.close()
    np.testing.assert_array_equal(results[0][0], results[1][0])
    assert_close(results[1][1], results[0][1], rtol=1e-5, atol=1e-4 * peak(results[0][1]), what="prefill logits")
