"""Each kernel of cuda/*.cu against its numpy reference (model/kernel_reference.py).

GPU only (marker `gpu`): skipped where PyCUDA or a device is missing. Inputs
are fresh random draws, outputs are poisoned with NaN before each launch so an
unwritten element fails, and shapes include ragged edges.

Tolerances. Each float comparison is `_close(got, expected, norm_tol, what)`:
  * norm-wise, ||got - ref|| / ||ref|| <= norm_tol: the typical error. Each kernel's
    norm_tol is the one these tests had before the per-element checks (they passed in the
    H200 runs of notes/cuda_notes.md); its comment says where the error comes from;
  * per element, |got - ref| <= atol + rtol |ref| (kernel_compare.assert_close), which
    catches one bad element that a norm over thousands of elements would hide:
      rtol = 1e-5 covers the errors that scale with the element itself (a few fp32
        roundings, rsqrtf/cosf ulps: 1e-7 .. 1e-6 relative);
      atol = 2 * norm_tol * max|ref|: sums (dot products, softmax averages, a*cos - b*sin)
        lose precision in proportion to their terms, not to their result, so an output
        near 0 carries the absolute error of the output's scale. With ~Gaussian errors
        whose rms sat at norm_tol * rms(ref), the largest of N would be ~z rms, z =
        sqrt(2 ln N), and max|ref| is ~z rms(ref) as well; the factor 2 is the margin.
"""
import numpy as np
import pytest

from gpu_cases import attention_case, kv_round_trip
from kernel_compare import assert_close, peak
from vla_edge_ros.model import kernel_reference as ref
from vla_edge_ros.model import weight_layouts as layouts

pytestmark = pytest.mark.gpu

# fp32 rounding that scales with the element itself (see the module docstring).
RTOL = 1e-5


def _nan(gpuarray, shape, dtype=np.float32):
    return gpuarray.to_gpu(np.full(shape, np.nan, dtype))


def _close(got, expected, norm_tol, what):
    """Per element within atol = 2 norm_tol max|ref| (+ RTOL |ref|), and norm-wise within norm_tol."""
    assert_close(got, expected, rtol=RTOL, atol=2 * norm_tol * peak(expected), what=what, norm_rtol=norm_tol)


def _ctl(row_offset, ctx_len):
    return np.array([row_offset, ctx_len, 0, -1], np.int32)


def test_embed_gather_rows_and_out_of_range_ids(kn, gpu):
    ga, stream = gpu
    rng = np.random.default_rng(1)
    table = rng.standard_normal((300, 96)).astype(np.float32)
    ids = np.array([0, 299, 17, -1, 300, 5], np.int32)
    for dev_table in (ga.to_gpu(ref.to_bf16_bits(table)), ga.to_gpu(table)):
        out = _nan(ga, (len(ids), 96))
        kn.embed_gather(dev_table, ga.to_gpu(ids), out, len(ids), stream)
        stream.synchronize()
        got = out.get()
        expected = ref.embed_gather_ref(dev_table.get(), ids)
        ok = np.isfinite(expected).all(axis=1)
        np.testing.assert_array_equal(got[ok], expected[ok])
        assert np.isnan(got[~ok]).all(), "out-of-range ids must give NaN rows"


@pytest.mark.parametrize("hidden", [96, 1536])
def test_rmsnorm_with_accumulator_init(kn, gpu, hidden):
    ga, stream = gpu
    rng = np.random.default_rng(hidden)
    x = (rng.standard_normal((7, hidden)) * 3).astype(np.float32)
    w = rng.standard_normal(hidden).astype(np.float32)
    bias = rng.standard_normal(40).astype(np.float32)
    out, init = _nan(ga, x.shape), _nan(ga, (7, 40))
    kn.rmsnorm(ga.to_gpu(x), ga.to_gpu(w), out, 7, 1e-6, stream, init_dst=init, init_src=ga.to_gpu(bias))
    stream.synchronize()
    exp_out, exp_init = ref.rmsnorm_rows_ref(x, w, 1e-6, bias, 40)
    # fp32 sum of squares of positive terms (no cancellation), rsqrtf (2 ulp), two products:
    # a few 1e-7 of each element, the same relative error for all of a row.
    _close(out.get(), exp_out, 1e-6, f"rmsnorm hidden={hidden}")
    np.testing.assert_array_equal(init.get(), exp_init)
    # one row in the middle, no init: other rows untouched
    out2 = _nan(ga, x.shape)
    kn.rmsnorm(ga.to_gpu(x), ga.to_gpu(w), out2, 1, 1e-6, stream, row0=3)
    stream.synchronize()
    got = out2.get()
    _close(got[3:4], exp_out[3:4], 1e-6, f"rmsnorm row 3 hidden={hidden}")
    assert np.isnan(np.delete(got, 3, axis=0)).all()


PROJ_SHAPES = [(40, 96, 1), (40, 96, 13), (2048, 1536, 1), (2048, 1536, 32), (272, 352, 40)]


@pytest.mark.parametrize("wdtype", ["bf16", "f32"])
@pytest.mark.parametrize("rows,k,n", PROJ_SHAPES)
def test_projection_modes_match_reference(kn, gpu, wdtype, rows, k, n):
    ga, stream = gpu
    from vla_edge_ros.model.cuda_kernels import MODE_ADD, MODE_STORE, MODE_SWIGLU
    rng = np.random.default_rng(rows * 7 + k + n)
    w = (rng.standard_normal((rows, k)) / np.sqrt(k)).astype(np.float32)
    w_dev_host = ref.to_bf16_bits(w) if wdtype == "bf16" else w
    w_dev = ga.to_gpu(w_dev_host)
    x = rng.standard_normal((n, k)).astype(np.float32)
    bias = rng.standard_normal(rows).astype(np.float32)
    # Outputs ~N(0, 1) (+ bias): K terms of size ~1/sqrt(K) each. The weights are the same bf16 values
    # in the reference, so only the arithmetic differs:
    #   f32:  fp32 FFMA over K (per-lane chains + a warp tree): a few 1e-7 of the output scale.
    #   bf16: the hi/lo split leaves ~2^-16 of each activation behind and the tensor cores' fp32
    #         accumulation truncates; ~1e-6 .. 1e-5 of the output scale at K = 1536.
    tol = 2e-5 if wdtype == "bf16" else 2e-6
    case = f"projection {wdtype} {rows}x{k} n={n}"

    out = _nan(ga, (n, rows))
    kn.projection(w_dev, ga.to_gpu(x), out, n, MODE_STORE, stream, bias=ga.to_gpu(bias))
    stream.synchronize()
    _close(out.get(), ref.projection_ref(w_dev_host, x, MODE_STORE, bias=bias), tol, f"{case} STORE")

    # ADD is compared as the increment (out - base), whose scale is the product alone: both sides also
    # carry the fp32 rounding of base + acc (~2.4e-7 at |base + acc| < 8), hence 5 tol.
    base = rng.standard_normal((n, rows)).astype(np.float32)
    expected_add = ref.projection_ref(w_dev_host, x, MODE_ADD, out=base)
    splits = [1, 3] if wdtype == "bf16" and k >= 96 else [None]
    for ksplit in splits:
        acc = ga.to_gpu(base)
        kn.projection(w_dev, ga.to_gpu(x), acc, n, MODE_ADD, stream, ksplit=ksplit)
        stream.synchronize()
        _close(acc.get().astype(np.float64) - base, expected_add.astype(np.float64) - base, tol * 5,
               f"{case} ADD ksplit={ksplit}")

    if rows % 16 == 0:
        inter = rows // 2 - 3                                   # ragged: last tile half padding
        gate, up = w[:inter], w[rows // 2: rows // 2 + inter]
        w_gu = layouts.interleave_gate_up(gate, up)
        w_gu_dev = ref.to_bf16_bits(w_gu) if wdtype == "bf16" else w_gu
        act = _nan(ga, (n, inter))
        kn.projection(ga.to_gpu(w_gu_dev), ga.to_gpu(x), act, n, MODE_SWIGLU, stream, out_cols=inter)
        stream.synchronize()
        # silu(gate) * up: each factor's error is scaled by the other factor (both ~N(0, 1)): 5 tol. The
        # output is a product of normals, heavy-tailed, so max|ref| is a generous scale here.
        _close(act.get(), ref.projection_ref(w_gu_dev, x, MODE_SWIGLU, out_cols=inter), tol * 5, f"{case} SWIGLU")


def test_projection_rejects_bad_shapes(kn, gpu):
    ga, stream = gpu
    from vla_edge_ros.model.cuda_kernels import MODE_STORE, MODE_SWIGLU, KernelError
    w = ga.to_gpu(np.zeros((32, 40), np.uint16))            # K = 40 is not a multiple of 32
    with pytest.raises(KernelError, match="K 40"):
        kn.projection(w, ga.zeros((1, 40), np.float32), ga.zeros((1, 32), np.float32), 1, MODE_STORE, stream)
    w = ga.to_gpu(np.zeros((24, 64), np.uint16))
    with pytest.raises(KernelError, match="multiple of 16"):
        kn.projection(w, ga.zeros((1, 64), np.float32), ga.zeros((1, 12), np.float32), 1, MODE_SWIGLU, stream)
    with pytest.raises(KernelError, match="dtype float64"):
        kn.projection(w, ga.zeros((1, 64), np.float64), ga.zeros((1, 24), np.float32), 1, MODE_STORE, stream)


@pytest.mark.parametrize("hq,kvh,hd", [(12, 2, 128), (4, 1, 32)])
def test_rope_store_at_absolute_positions(kn, gpu, hq, kvh, hd):
    ga, stream = gpu
    rng = np.random.default_rng(hd)
    cap, n, row_offset = 50, 5, 3
    qkv = rng.standard_normal((n, (hq + 2 * kvh) * hd)).astype(np.float32)
    pos = rng.integers(0, 30000, size=row_offset + n).astype(np.int32)
    slots = rng.permutation(cap)[:row_offset + n].astype(np.int32)
    inv = layouts.rope_inv_freq(1e6, hd)
    k0 = np.full((kvh, cap, hd), 7.0, np.float32)
    qkv_d, k_d, v_d = ga.to_gpu(qkv), ga.to_gpu(k0), ga.to_gpu(k0.copy())
    ctl = _ctl(row_offset, 0)
    kn.rope_store(qkv_d, ga.to_gpu(pos), ga.to_gpu(slots), ga.to_gpu(ctl), ga.to_gpu(inv), int(k_d.gpudata),
                  int(v_d.gpudata), n, hq, kvh, hd, cap, stream)
    stream.synchronize()
    e_qkv, e_k, e_v = ref.rope_store_ref(qkv, pos, slots, ctl, inv, k0, k0.copy(), hq, kvh, hd)
    # The angle is the same fp32 product on both sides; cosf/sinf are within 2 ulp, and a*cos - b*sin
    # may cancel, so its error is a few ulp of |a|, |b| (~N(0, 1)) rather than of the result.
    # The untouched 7.0 cache slots are equal on both sides; a row stored in the wrong slot is off by O(1).
    _close(qkv_d.get(), e_qkv, 1e-6, f"rope q hd={hd}")
    _close(k_d.get(), e_k, 1e-6, f"rope k cache hd={hd}")
    np.testing.assert_array_equal(v_d.get(), e_v)


ATTN_CASES = [(12, 2, 128, 300, 1), (12, 2, 128, 130, 9), (4, 1, 32, 0, 6), (12, 2, 128, 400, 32), (4, 1, 24, 70, 3),
              (8, 1, 64, 100, 12)]


@pytest.mark.parametrize("hq,kvh,hd,ctx,n", ATTN_CASES)
def test_attention_over_slot_list_with_holes(kn, gpu, hq, kvh, hd, ctx, n):
    got, expected = attention_case(kn, gpu, hq, kvh, hd, ctx, n, seed=ctx + n)
    # fp32 scores (hd terms of q ~ N(0, 4) times k ~ N(0, 1), scaled to ~N(0, 4)): ~1e-6 absolute, which
    # expf turns into that relative error of each weight; the output averages v ~ N(0, 1) with those
    # weights, and the split merge rescales partial sums by expf of max differences (a few ulp).
    _close(got, expected, 1e-5, f"attention {hq}/{kvh}x{hd} ctx={ctx} n={n}")


def test_argmax_bins_ties_nan_and_control_block(kn, gpu):
    ga, stream = gpu
    rng = np.random.default_rng(5)
    logits = rng.standard_normal(256).astype(np.float32)
    logits[[40, 200]] = logits.max() + 1.0                   # tie: lowest index wins
    ctl = ga.to_gpu(np.array([10, 99, 2, -1], np.int32))
    tokens = ga.to_gpu(np.full(8, -7, np.int32))
    kn.argmax_bins(ga.to_gpu(logits), 256, 1000, ctl, tokens, 3, stream)
    stream.synchronize()
    assert tokens.get()[2] == ref.argmax_bins_ref(logits, 1000) == 1040
    np.testing.assert_array_equal(ctl.get(), [13, 99, 3, 1040])
    logits[77] = np.nan
    kn.argmax_bins(ga.to_gpu(logits), 256, 1000, ctl, tokens, 1, stream)
    stream.synchronize()
    assert tokens.get()[3] == -1 == ref.argmax_bins_ref(logits, 1000)


def test_kv_gather_scatter_round_trip(kn, gpu):
    rng = np.random.default_rng(9)
    layers, kvh, cap, hd, n_max = 3, 2, 40, 32, 8
    k = rng.standard_normal((layers, kvh, cap, hd)).astype(np.float32)
    v = rng.standard_normal((layers, kvh, cap, hd)).astype(np.float32)
    kv_round_trip(kn, gpu, k, v, n_max, poison=np.nan)


def test_vision_patch_embed_and_cosine_match_core(kn, gpu):
    ga, stream = gpu
    from vla_edge_ros.config import VisionConfig
    from vla_edge_ros.core.kv_slots import adjacent_cosine_similarities
    from vla_edge_ros.core.vision_encoder import VisionEncoder
    cfg = VisionConfig()
    enc = VisionEncoder(cfg, 128)
    rng = np.random.default_rng(3)
    frames = [rng.integers(0, 256, size=(cfg.image_height, cfg.image_width, 3), dtype=np.uint8) for _ in range(4)]
    frames[2] = frames[1].copy()                                # an identical neighbour: cosine 1
    w, b = ga.to_gpu(enc.weight), ga.to_gpu(enc.bias)
    tokens = _nan(ga, (cfg.tokens_per_frame, 128))
    pooled = _nan(ga, (4, 128))
    for i, frame in enumerate(frames):
        kn.patch_embed(ga.to_gpu(frame), cfg.grid_cols, cfg.grid_rows, cfg.patch_size, w, b, tokens, stream)
        kn.pool_rows(tokens, pooled, stream, pooled_row=i)
        stream.synchronize()
        expected = enc.encode(frame)
        # The reference is the float32 numpy encoder (a BLAS sgemm), not float64: two fp32 sums of
        # 3*16*16 = 768 terms in different orders, each ~1e-7 of the token scale (tokens ~N(0, 1/3)).
        _close(tokens.get(), expected.tokens, 1e-5, f"patch_embed frame {i}")
    sims = _nan(ga, (3,))
    kn.adjacent_cosine(pooled, 4, sims, stream)
    stream.synchronize()
    host_pooled = np.stack([enc.encode(f).pooled for f in frames])
    # Cosines in [-1, 1] of pooled rows that differ by fp32 summation order: 1e-5 absolute, as before.
    assert_close(sims.get(), adjacent_cosine_similarities(host_pooled), rtol=0.0, atol=1e-5, what="adjacent_cosine")
    assert int(np.argmax(sims.get())) == 1
