"""gemv_int4.cu (the one-row decode projections from INT4 weights) against kernel_reference on w_hat.

GPU only (marker `gpu`). Weights are quantized by model/int4.py (the format a snapshot stores) and uploaded as
they are; the reference is kernel_reference's gemv oracle (folded_projection_ref, rope_store_ref) on
w_hat = int4.dequantize(...) in float64. Every mode with and without the RMSNorm prologue, the 1.5B shape's
projections (K 1536 and 8960, groups of 128), groups of 32 and 64 (tiny models), ragged row counts, the
row-permuted layouts (gate/up interleaved, QKV_ROPE's order: packed rows and scale rows permuted together),
the looped-items entry bit for bit against one block per item (the decode gemv grid of KernelPlan.
int4_gemv_items_per_block / int4_gemv_rows_per_warp too, every mode), and the refusals by name.

Tolerance: fp32 FMAs over K <= 8960 exact q * fp32 x products, summed in another order than float64 and
scaled per 32-column chunk: ~1e-6 of the output's scale, as gemv.cu's bf16 products; 1e-5 of it (plus 1e-5
relative) leaves room and still fails any wrong row, column, nibble or scale.
"""
import numpy as np
import pytest

from gpu_cases import int4_device, int4_gemv_modes_case, int4_quantized, items_loop_case, qkv_rope_case
from kernel_compare import assert_close, peak
from vla_edge_ros.model import weight_layouts as layouts

pytestmark = pytest.mark.gpu


def _close(got, expected, what):
    assert_close(got, expected, rtol=1e-5, atol=1e-5 * max(peak(expected), 1e-3), what=what, norm_rtol=1e-5)


def _nan(ga, shape):
    return ga.to_gpu(np.full(shape, np.nan, np.float32))


SHAPES = [(1536, 1536, 128), (256, 8960, 128), (1536, 8960, 128), (72, 96, 32), (130, 640, 64), (352, 128, 32)]


@pytest.mark.parametrize("norm", [False, True])
@pytest.mark.parametrize("rows,k,group", SHAPES)
def test_gemv_int4_modes_match_reference(kn, gpu, rows, k, group, norm):
    int4_gemv_modes_case(kn, gpu, rows, k, group, norm, np.random.default_rng(rows + k + group + norm),
                         f"gemv_int4 {rows}x{k} G{group} norm={norm}", _close)


@pytest.mark.parametrize("norm", [False, True])
@pytest.mark.parametrize("hq,kvh,hd,group", [(12, 2, 128, 128), (4, 1, 32, 32), (4, 2, 32, 64)])
def test_gemv_int4_qkv_rope_writes_q_and_kv_slots(kn, gpu, hq, kvh, hd, group, norm):
    """QKV_ROPE from the INT4 q|k|v in qkv_rope_row_order (packed and scale rows permuted together) against
    RMSNorm -> natural projection on w_hat + bias -> rope_store_ref."""
    ga, _ = gpu
    rng = np.random.default_rng(hq * hd + group + norm)
    hidden, qkv_rows = (1536 if hd == 128 else 128), (hq + 2 * kvh) * hd
    packed, scales, w_hat = int4_quantized(rng, qkv_rows, hidden, group)
    dev_packed, dev_scales = layouts.int4_rows(packed, scales, layouts.qkv_rope_row_order(hq, kvh, hd))
    qkv_rope_case(kn, gpu, int4_device(ga, dev_packed, dev_scales, group), w_hat, hq, kvh, hd, rng, norm,
                  f"gemv_int4 QKV_ROPE {hq}/{kvh}x{hd} G{group} norm={norm}", _close)


@pytest.mark.parametrize("blocks_per_sm", [1, 4])
def test_gemv_int4_items_loop_gives_the_same_sums(kn, gpu, blocks_per_sm):
    """gemv_int4_items (a grid of blocks_per_sm per SM looping over the 8-row items) writes what gemv_int4
    writes, bit for bit, on more items than the grid has blocks and a last item with missing rows."""
    ga, _ = gpu
    rows, k, group = 16 * (kn.num_sms * 5 // 2) + 8, 1536, 128
    rng = np.random.default_rng(rows + blocks_per_sm)
    packed, scales, _ = int4_quantized(rng, rows, k, group)
    items_loop_case(kn, gpu, int4_device(ga, packed, scales, group), rows, k, rng, blocks_per_sm)


# (items_per_block, rows_per_warp): KernelPlan.int4_gemv_items_per_block / int4_gemv_rows_per_warp. Odd counts leave
# blocks with fewer items and, with two rows per warp, a last step holding one; 64 leaves a grid of a few blocks.
ITEM_GRIDS = [dict(items_per_block=ipb, rows_per_warp=rpw)
              for ipb, rpw in [(2, 1), (3, 1), (8, 1), (2, 2), (3, 2), (8, 2), (64, 2)]]
# KernelPlan.int4_decode_lean_loop: the _lean entry of each grid (a block per item, every projection looped with one
# and two rows per warp; the plan's looped gate/up, blocks_per_sm, loops only over more items than SMs: the
# QKV_ROPE test's 256 items).
LEAN_GRIDS = [dict(lean=True), dict(lean=True, items_per_block=3), dict(lean=True, items_per_block=3, rows_per_warp=2)]


def _int4_grid_outputs(kn, stream, launch, out_init, variants):
    """What `launch(outs, **variant)` leaves in a fresh copy of out_init (a list of device arrays and host arrays
    to copy there) for a block per item of the plain entry (no keywords) and for each of `variants`."""
    results = []
    for variant in [{}, *variants]:
        outs = [init() for init in out_init]
        launch(outs, **variant)
        stream.synchronize()
        results.append((variant, [o.get() for o in outs]))
    return results


def _assert_same_bits(results, what):
    (_, base), *others = results
    for variant, got in others:
        for i, (g, b) in enumerate(zip(got, base)):
            np.testing.assert_array_equal(g, b, err_msg=f"{what} output {i}: {variant} differs from a block per "
                                                        f"item of the plain entry")


def _modes_same_bits(kn, gpu, k, group, variants, seed):
    """STORE (norm, bias), ADD, SWIGLU (norm, ragged out_cols) on 75 items (odd, a last one half empty) through
    each of `variants`: the same bits as a block per item of the plain entry."""
    ga, stream = gpu
    from vla_edge_ros.model.cuda_kernels import MODE_ADD, MODE_STORE, MODE_SWIGLU
    rows = 16 * 37 + 8
    rng = np.random.default_rng(seed)
    packed, scales, _ = int4_quantized(rng, rows, k, group)
    W = int4_device(ga, packed, scales, group)
    x = ga.to_gpu((rng.standard_normal((2, k)) * 2).astype(np.float32))
    norm_w = ga.to_gpu(rng.standard_normal(k).astype(np.float32))
    bias = ga.to_gpu(rng.standard_normal(rows).astype(np.float32))
    base = rng.standard_normal((1, rows)).astype(np.float32)
    cases = [("STORE", MODE_STORE, dict(norm_w=norm_w, eps=1e-6, bias=bias, rows=rows - 5), None),
             ("ADD", MODE_ADD, dict(rows=rows), base),
             ("SWIGLU", MODE_SWIGLU, dict(norm_w=norm_w, eps=1e-6, out_cols=(rows - 8) // 2 - 3, rows=rows - 8), None)]
    for what, mode, kw, init in cases:
        def launch(outs, **variant):
            kn.gemv(W, x, outs[0], mode, stream, x_row0=1, **variant, **kw)
        out_init = [lambda: ga.to_gpu(init.copy()) if init is not None else _nan(ga, (1, rows))]
        results = _int4_grid_outputs(kn, stream, launch, out_init, variants)
        n_out = kw.get("out_cols", kw["rows"])
        assert np.isfinite(results[0][1][0][:, :n_out]).all(), f"{what}: outputs left unwritten"
        _assert_same_bits(results, f"{what} K {k} G{group}")


@pytest.mark.parametrize("k", [1536, 8960])
def test_gemv_int4_items_per_block_gives_the_same_bits(kn, gpu, k):
    """int4_gemv_items_per_block N (every projection looped over ceil(items / N) blocks) and
    int4_gemv_rows_per_warp 2 (gemv_int4_items2) write what a block per item writes, bit for bit, in STORE (norm,
    bias), ADD, SWIGLU (norm, ragged out_cols): each row's sum is gemv_int4_row's whatever the grid, one writer
    per output. K 8960 (down) streams several batches per row, so gemv_int4_items2's second row waits in flight."""
    _modes_same_bits(kn, gpu, k, 128, ITEM_GRIDS, k)


@pytest.mark.parametrize("k,group", [(1536, 128), (8960, 128), (4096, 128), (11008, 128), (640, 64), (96, 32),
                                     (8960, 32), (11008, 64), (4096, 256), (1536, 64)])
def test_gemv_int4_lean_entries_give_the_same_bits(kn, gpu, k, group):
    """KernelPlan.int4_decode_lean_loop: the _lean entries (each chunk's scale by a shift, each nibble by one LOP3)
    write what the plain entries write, bit for bit, on every grid, in STORE, ADD and SWIGLU: the 1.5B's and the
    7B's widths (K 11008 leaves a last batch partly past the row) with groups of 32 to 256 (shifts 0 to 3), and the
    tiny models' groups of 32 and 64. K 11008 at 4.5 K bytes of padded staging per 1024 columns is past the default
    48 KB of dynamic shared memory: the launch needs the raised limit."""
    _modes_same_bits(kn, gpu, k, group, LEAN_GRIDS, k + group)


@pytest.mark.parametrize("norm", [False, True])
def test_gemv_int4_items_per_block_qkv_rope_gives_the_same_bits(kn, gpu, norm):
    """QKV_ROPE (q written, K/V stored into the cache slot) on the 1.5B q|k|v shape (256 items) through every
    grid of ITEM_GRIDS and the lean entries: the same bits as a block per item in q and in both caches."""
    ga, stream = gpu
    from vla_edge_ros.model.cuda_kernels import MODE_QKV_ROPE
    from vla_edge_ros.model.cuda_projection_launchers import RopeTarget
    hq, kvh, hd, group, hidden, cap = 12, 2, 128, 128, 1536, 64
    rng = np.random.default_rng(23 + norm)
    qkv_rows = (hq + 2 * kvh) * hd
    packed, scales, _ = int4_quantized(rng, qkv_rows, hidden, group)
    dev_packed, dev_scales = layouts.int4_rows(packed, scales, layouts.qkv_rope_row_order(hq, kvh, hd))
    W = int4_device(ga, dev_packed, dev_scales, group)
    x = ga.to_gpu((rng.standard_normal((1, hidden)) * 2).astype(np.float32))
    norm_w = ga.to_gpu(rng.standard_normal(hidden).astype(np.float32)) if norm else None
    bias = ga.to_gpu(rng.standard_normal(qkv_rows).astype(np.float32))
    tables = [ga.to_gpu(t) for t in (rng.integers(0, 30000, size=4).astype(np.int32),
                                     rng.permutation(cap)[:4].astype(np.int32),
                                     np.array([3, 0, 0, -1], np.int32), layouts.rope_inv_freq(1e6, hd))]
    k0 = np.full((kvh, cap, hd), 7.0, np.float32)

    def launch(outs, **variant):
        out, k_d, v_d = outs
        rope = RopeTarget(*tables, int(k_d.gpudata), int(v_d.gpudata), hq, kvh, hd, cap)
        kn.gemv(W, x, out, MODE_QKV_ROPE, stream, norm_w=norm_w, eps=1e-6, bias=bias, rope=rope, **variant)
    out_init = [lambda: _nan(ga, (1, qkv_rows)), lambda: ga.to_gpu(k0.copy()), lambda: ga.to_gpu(k0.copy())]
    results = _int4_grid_outputs(kn, stream, launch, out_init, ITEM_GRIDS + LEAN_GRIDS)
    q, k_cache, _ = results[0][1]
    assert np.isfinite(q[:, :hq * hd]).all() and (k_cache != 7.0).any(), "q or the K slot left unwritten"
    _assert_same_bits(results, f"QKV_ROPE norm={norm}")


def test_gemv_int4_refuses_what_it_cannot_take(kn, gpu):
    ga, stream = gpu
    from vla_edge_ros.model.cuda_int4_launchers import Int4Matrix
    from vla_edge_ros.model.cuda_kernels import MODE_STORE, KernelError
    x, out = ga.zeros((1, 80), np.float32), ga.zeros((1, 8), np.float32)
    bad = Int4Matrix(ga.to_gpu(np.zeros((8, 40), np.uint8)), ga.to_gpu(np.zeros((8, 1), np.uint16)), 80)
    with pytest.raises(KernelError, match="group 80 must be a multiple of 32"):
        kn.gemv(bad, x, out, MODE_STORE, stream)
    huge = Int4Matrix(ga.to_gpu(np.zeros((8, 40000), np.uint8)), ga.to_gpu(np.zeros((8, 625), np.uint16)), 128)
    with pytest.raises(KernelError, match="bytes of shared memory"):
        kn.gemv(huge, ga.zeros((1, 80000), np.float32), out, MODE_STORE, stream)
    odd = Int4Matrix(ga.to_gpu(np.zeros((8, 48), np.uint8)), ga.to_gpu(np.zeros((8, 1), np.uint16)), 96)
    with pytest.raises(KernelError, match="group 96 is not 32 x a power of two"):
        kn.gemv(odd, ga.zeros((1, 96), np.float32), out, MODE_STORE, stream, lean=True)
