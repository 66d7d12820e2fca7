"""projection_int4.cu (the prefill projections from INT4 weights, on the tensor cores) against
kernel_reference.projection_ref on w_hat = int4.dequantize(...).

GPU only (marker `gpu`). STORE with a bias, ADD (one K range, and split over warps that add atomically),
SWIGLU on gate/up interleaved INT4 rows with ragged outputs; 1 to 128 token rows (NT 1, 2, 4 and several
token groups); groups of 32 (a scale per 32-column step: the quad transpose must keep each mma inside one),
64, 128 (the 1.5B shape) and 256 (a group spanning two 128-column loads); K not a multiple of 128 (the last
load's tail); row slices.

Tolerance (as test_cuda_kernels' bf16 projections): q is exact in bf16 and the scale exact in fp32, so the
only departures from float64 are the hi/lo split of the activations (~2^-16 of each left behind), the
tensor cores' fp32 accumulation and the per-group scaling in fp32: ~1e-6 .. 1e-5 of the output scale at
K = 1536; norm-wise 2e-5, per element 4e-5 of the peak; ADD and SWIGLU 5x (as there: the base's rounding,
and the product of two noisy factors).
"""
import numpy as np
import pytest

from gpu_cases import int4_projection_variant_case
from kernel_compare import assert_close, peak
from vla_edge_ros.model import int4
from vla_edge_ros.model import kernel_reference as ref
from vla_edge_ros.model import weight_layouts as layouts

pytestmark = pytest.mark.gpu

TOL = 2e-5


def _close(got, expected, tol, what):
    assert_close(got, expected, rtol=1e-5, atol=2 * tol * peak(expected), what=what, norm_rtol=tol)


def _device(ga, packed, scales, group):
    from vla_edge_ros.model.cuda_int4_launchers import Int4Matrix
    return Int4Matrix(ga.to_gpu(np.ascontiguousarray(packed)), ga.to_gpu(np.ascontiguousarray(scales).view(np.uint16)),
                      group)


CASES = [(2048, 1536, 32, 128), (1536, 8960, 32, 128), (272, 352, 40, 32), (40, 96, 13, 32), (64, 96, 1, 32),
         (96, 640, 128, 64), (130, 512, 17, 256), (48, 160, 9, 32)]


@pytest.mark.parametrize("rows,k,n,group", CASES)
def test_projection_int4_modes_match_reference(kn, gpu, rows, k, n, group):
    ga, stream = gpu
    from vla_edge_ros.model.cuda_kernels import MODE_ADD, MODE_STORE, MODE_SWIGLU
    rng = np.random.default_rng(rows * 7 + k + n + group)
    packed, scales = int4.quantize((rng.standard_normal((rows, k)) / np.sqrt(k)).astype(np.float32), group)
    w_hat = int4.dequantize(packed, scales)
    W = _device(ga, packed, scales, group)
    x = rng.standard_normal((n, k)).astype(np.float32)
    bias = rng.standard_normal(rows).astype(np.float32)
    case = f"projection_int4 {rows}x{k} n={n} G{group}"
    x_dev = ga.to_gpu(x)

    out = ga.to_gpu(np.full((n, rows), np.nan, np.float32))
    kn.projection(W, x_dev, out, n, MODE_STORE, stream, bias=ga.to_gpu(bias))
    stream.synchronize()
    _close(out.get(), ref.projection_ref(w_hat, x, MODE_STORE, bias=bias), TOL, f"{case} STORE")

    base = rng.standard_normal((n, rows)).astype(np.float32)
    expected_add = ref.projection_ref(w_hat, x, MODE_ADD, out=base)
    for ksplit in (1, None) + ((2,) if k > 128 else ()):              # split: whole 128-column blocks
        acc = ga.to_gpu(base)
        kn.projection(W, x_dev, acc, n, MODE_ADD, stream, ksplit=ksplit)
        stream.synchronize()
        _close(acc.get().astype(np.float64) - base, expected_add.astype(np.float64) - base, 5 * TOL,
               f"{case} ADD ksplit={ksplit}")

    lo, m = 16 * (rows // 48) + 3, rows // 3                           # rows [lo, lo + m): a slice of the head
    out = ga.to_gpu(np.full((n, m), np.nan, np.float32))
    kn.projection(W, x_dev, out, n, MODE_STORE, stream, w_row0=lo, rows=m)
    stream.synchronize()
    _close(out.get(), ref.projection_ref(w_hat[lo:lo + m], x, MODE_STORE), TOL, f"{case} STORE rows [{lo}, +{m})")

    if rows % 16 == 0:
        inter = rows // 2 - 3                                           # ragged: the last tile has padding rows
        gu_packed, gu_scales = layouts.interleave_gate_up_int4(
            (packed[:inter], scales[:inter]), (packed[rows // 2: rows // 2 + inter], scales[rows // 2: rows // 2 + inter]))
        act = ga.to_gpu(np.full((n, inter), np.nan, np.float32))
        kn.projection(_device(ga, gu_packed, gu_scales, group), x_dev, act, n, MODE_SWIGLU, stream, out_cols=inter)
        stream.synchronize()
        w_gu = layouts.interleave_gate_up(w_hat[:inter], w_hat[rows // 2: rows // 2 + inter])
        _close(act.get(), ref.projection_ref(w_gu, x, MODE_SWIGLU, out_cols=inter), 5 * TOL, f"{case} SWIGLU")


@pytest.mark.parametrize("rows,k,n,group", CASES + [(2048, 1536, 480, 128), (4096, 4096, 32, 32),
                                                  (1024, 11008, 32, 128)])
def test_the_lean_entries_give_the_same_bits(kn, gpu, rows, k, n, group):
    """lean (KernelPlan.int4_prefill_lean_loop, the _lean entries: each step's group by a shift, its first step and
    flush by masks) writes what the entries without it write, bit for bit: STORE with a bias, ADD in one K part,
    SWIGLU; ADD over the default K split to rounding (its atomics land in any order). 480 rows: a reconciler step of
    15 frames, several token groups; the 7B's widths with groups of 32 and 128."""
    int4_projection_variant_case(gpu, kn.projection, rows, k, n, group, np.random.default_rng(rows * 11 + k + n + group),
                                 f"projection_int4 lean {rows}x{k} n={n} G{group}", dict(), dict(lean=True))


def test_projection_int4_reads_rows_of_a_wider_activation_buffer(kn, gpu):
    """x_row0 and an x row stride wider than K (the backend's buffers): rows [5, 5 + 20) of x[:, :K]."""
    ga, stream = gpu
    from vla_edge_ros.model.cuda_kernels import MODE_STORE
    rng = np.random.default_rng(3)
    rows, k, group = 96, 256, 128
    packed, scales = int4.quantize((rng.standard_normal((rows, k)) / 16).astype(np.float32), group)
    x = rng.standard_normal((32, k + 64)).astype(np.float32)
    out = ga.to_gpu(np.full((20, rows + 8), np.nan, np.float32))
    kn.projection(_device(ga, packed, scales, group), ga.to_gpu(x), out, 20, MODE_STORE, stream, x_row0=5)
    stream.synchronize()
    got = out.get()
    _close(got[:, :rows], ref.projection_ref(int4.dequantize(packed, scales), x[5:25, :k], MODE_STORE), TOL,
           "projection_int4 x_row0 5, stride K + 64")
    assert np.isnan(got[:, rows:]).all(), "columns past out_cols stay unwritten"
