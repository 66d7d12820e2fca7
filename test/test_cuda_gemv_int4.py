"""gemv_int4.cu: a decode step's one-row projection from INT4 weights, dequantized in registers.

GPU only (marker `gpu`). Weights are quantized by model/int4.py (the format a snapshot stores), uploaded
as they are, and the kernel's product must match the numpy reference w_hat = int4.dequantize(...) (float64
product) to fp32 rounding, for the 1.5B shape's projections (K 1536 and 8960, groups of 128) and a group
of 32; the ADD mode adds into what is there; shapes the kernel cannot take are refused by name.
"""
import numpy as np
import pytest

from kernel_compare import assert_close

from vla_edge_ros.model import int4

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("rows, K, group", [(1536, 1536, 128), (1536, 8960, 128), (256, 8960, 128), (72, 96, 32)])
def test_int4_gemv_matches_the_dequantized_reference(kn, gpu, rows, K, group):
    ga, stream = gpu
    rng = np.random.default_rng(rows + K + group)
    w = (rng.standard_normal((rows, K)) * 0.02).astype(np.float32)
    packed, scales = int4.quantize(w, group)
    x = rng.standard_normal(K).astype(np.float32)
    bias = rng.standard_normal(rows).astype(np.float32)
    want = int4.dequantize(packed, scales).astype(np.float64) @ x.astype(np.float64)        # [rows]
    d_w, d_s = ga.to_gpu(packed), ga.to_gpu(scales.view(np.uint16))
    d_x, d_b = ga.to_gpu(x), ga.to_gpu(bias)
    out = ga.to_gpu(np.full(rows, np.nan, np.float32))
    from vla_edge_ros.model import cuda_kernels as ck
    kn.gemv_int4(d_w, d_s, d_x, out, ck.MODE_STORE, stream, bias=d_b, group=group)
    stream.synchronize()
    scale = float(np.abs(want).max())
    # fp32 sums of K products (|q| <= 8, |x| ~ 1) in another order than float64: ~sqrt(K) * 2^-24 of the scale.
    assert_close(out.get(), want + bias, rtol=0.0, atol=2e-5 * max(scale, 1.0), what="gemv_int4 STORE")
    base = rng.standard_normal(rows).astype(np.float32)
    acc = ga.to_gpu(base)
    kn.gemv_int4(d_w, d_s, d_x, acc, ck.MODE_ADD, stream, group=group)
    stream.synchronize()
    assert_close(acc.get(), want + base, rtol=0.0, atol=2e-5 * max(scale, 1.0), what="gemv_int4 ADD")


def test_int4_gemv_refuses_what_it_cannot_take(kn, gpu):
    ga, stream = gpu
    from vla_edge_ros.model import cuda_kernels as ck
    packed = ga.to_gpu(np.zeros((8, 40), np.uint8))               # K = 80: not a multiple of 32
    scales = ga.to_gpu(np.zeros((8, 1), np.uint16))
    x, out = ga.to_gpu(np.zeros(80, np.float32)), ga.to_gpu(np.zeros(8, np.float32))
    with pytest.raises(ck.KernelError, match="multiples of 32"):
        kn.gemv_int4(packed, scales, x, out, ck.MODE_STORE, stream, group=80)
    with pytest.raises(ck.KernelError, match="neither STORE nor ADD"):
        kn.gemv_int4(ga.to_gpu(np.zeros((8, 64), np.uint8)), ga.to_gpu(np.zeros((8, 1), np.uint16)),
                     ga.to_gpu(np.zeros(128, np.float32)), out, ck.MODE_SWIGLU, stream, group=128)
