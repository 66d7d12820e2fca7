"""Each kernel of cuda/*.cu against its numpy reference (model/kernel_reference.py).

GPU only (marker `gpu`): skipped where PyCUDA or a device is missing. Inputs
are fresh random draws, outputs are poisoned with NaN before each launch so an
unwritten element fails, and shapes include ragged edges.
"""
import numpy as np
import pytest

from vla_edge_ros.model import kernel_reference as ref

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def kn(cuda_device):
    from vla_edge_ros.model.cuda_kernels import CudaKernels
    return CudaKernels(cuda_device)


@pytest.fixture(scope="module")
def gpu(cuda_device):
    from pycuda import gpuarray
    return gpuarray, cuda_device.drv.Stream()


def _nan(gpuarray, shape, dtype=np.float32):
    return gpuarray.to_gpu(np.full(shape, np.nan, dtype))


def _rel_err(out, expected):
    assert np.all(np.isfinite(out)), "kernel left unwritten (NaN) elements"
    return float(np.linalg.norm(out.astype(np.float64) - expected) / max(np.linalg.norm(expected), 1e-30))


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
    assert _rel_err(out.get(), exp_out) < 1e-6
    np.testing.assert_array_equal(init.get(), exp_init)
    # one row in the middle, no init: other rows untouched
    out2 = _nan(ga, x.shape)
    kn.rmsnorm(ga.to_gpu(x), ga.to_gpu(w), out2, 1, 1e-6, stream, row0=3)
    stream.synchronize()
    got = out2.get()
    assert _rel_err(got[3:4], exp_out[3:4]) < 1e-6 and np.isnan(np.delete(got, 3, axis=0)).all()


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
    tol = 2e-5 if wdtype == "bf16" else 2e-6    # bf16: activations kept to ~16 bits by the hi/lo split

    out = _nan(ga, (n, rows))
    kn.projection(w_dev, ga.to_gpu(x), out, n, MODE_STORE, stream, bias=ga.to_gpu(bias))
    stream.synchronize()
    assert _rel_err(out.get(), ref.projection_ref(w_dev_host, x, MODE_STORE, bias=bias)) < tol

    base = rng.standard_normal((n, rows)).astype(np.float32)
    expected_add = ref.projection_ref(w_dev_host, x, MODE_ADD, out=base)
    splits = [1, 3] if wdtype == "bf16" and k >= 96 else [None]
    for ksplit in splits:
        acc = ga.to_gpu(base)
        kn.projection(w_dev, ga.to_gpu(x), acc, n, MODE_ADD, stream, ksplit=ksplit)
        stream.synchronize()
        assert _rel_err(acc.get() - base, expected_add.astype(np.float64) - base) < tol * 5, f"ksplit={ksplit}"

    if rows % 16 == 0:
        inter = rows // 2 - 3                                   # ragged: last tile half padding
        gate, up = w[:inter], w[rows // 2: rows // 2 + inter]
        w_gu = ref.interleave_gate_up(gate, up)
        w_gu_dev = ref.to_bf16_bits(w_gu) if wdtype == "bf16" else w_gu
        act = _nan(ga, (n, inter))
        kn.projection(ga.to_gpu(w_gu_dev), ga.to_gpu(x), act, n, MODE_SWIGLU, stream, out_cols=inter)
        stream.synchronize()
        assert _rel_err(act.get(), ref.projection_ref(w_gu_dev, x, MODE_SWIGLU, out_cols=inter)) < tol * 5


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
    inv = ref.rope_inv_freq(1e6, hd)
    k0 = np.full((kvh, cap, hd), 7.0, np.float32)
    qkv_d, k_d, v_d = ga.to_gpu(qkv), ga.to_gpu(k0), ga.to_gpu(k0.copy())
    ctl = _ctl(row_offset, 0)
    kn.rope_store(qkv_d, ga.to_gpu(pos), ga.to_gpu(slots), ga.to_gpu(ctl), ga.to_gpu(inv), int(k_d.gpudata),
                  int(v_d.gpudata), n, hq, kvh, hd, cap, stream)
    stream.synchronize()
    e_qkv, e_k, e_v = ref.rope_store_ref(qkv, pos, slots, ctl, inv, k0, k0.copy(), hq, kvh, hd)
    assert _rel_err(qkv_d.get(), e_qkv) < 1e-6
    assert _rel_err(k_d.get(), e_k) < 1e-6
    np.testing.assert_array_equal(v_d.get(), e_v)


@pytest.mark.parametrize("norm", [False, True])
@pytest.mark.parametrize("rows,k,n", PROJ_SHAPES + [(48, 1536, 13)])
def test_projection_fused_modes_match_reference(kn, gpu, rows, k, n, norm):
    ga, stream = gpu
    from vla_edge_ros.model.cuda_kernels import MODE_ADD, MODE_STORE, MODE_SWIGLU
    rng = np.random.default_rng(rows * 5 + k + n + norm)
    w = ref.to_bf16_bits((rng.standard_normal((rows, k)) / np.sqrt(k)).astype(np.float32))
    x = (rng.standard_normal((n, k)) * 2).astype(np.float32)
    norm_w = rng.standard_normal(k).astype(np.float32) if norm else None
    bias = rng.standard_normal(rows).astype(np.float32)
    nw_dev = ga.to_gpu(norm_w) if norm else None
    eps = 1e-6
    tol = 2e-5

    out = _nan(ga, (n, rows))
    kn.projection_fused(ga.to_gpu(w), ga.to_gpu(x), out, n, MODE_STORE, stream, norm_w=nw_dev, eps=eps, bias=ga.to_gpu(bias))
    stream.synchronize()
    assert _rel_err(out.get(), ref.projection_fused_ref(w, x, MODE_STORE, norm_w=norm_w, eps=eps, bias=bias)) < tol

    base = rng.standard_normal((n, rows)).astype(np.float32)
    expected = ref.projection_fused_ref(w, x, MODE_ADD, out=base, norm_w=norm_w, eps=eps).astype(np.float64) - base
    n_steps = k // 32
    for warps, kb in [(None, None), (1, 1), (min(3, n_steps), max(1, min(2, n_steps // 3)))]:
        acc = ga.to_gpu(base)
        kn.projection_fused(ga.to_gpu(w), ga.to_gpu(x), acc, n, MODE_ADD, stream, norm_w=nw_dev, eps=eps,
                            warps=warps, kb=kb)
        stream.synchronize()
        assert _rel_err(acc.get() - base, expected) < tol * 5, f"warps={warps} kb={kb}"

    if rows % 16 == 0:
        inter = rows // 2 - 3                                   # ragged: last tile half padding
        wf = ref.from_bf16_bits(w)
        w_gu = ref.to_bf16_bits(ref.interleave_gate_up(wf[:inter], wf[rows // 2: rows // 2 + inter]))
        act = _nan(ga, (n, inter))
        kn.projection_fused(ga.to_gpu(w_gu), ga.to_gpu(x), act, n, MODE_SWIGLU, stream, norm_w=nw_dev, eps=eps,
                            out_cols=inter)
        stream.synchronize()
        expected = ref.projection_fused_ref(w_gu, x, MODE_SWIGLU, norm_w=norm_w, eps=eps, out_cols=inter)
        assert _rel_err(act.get(), expected) < tol * 5


@pytest.mark.parametrize("norm", [False, True])
@pytest.mark.parametrize("hq,kvh,hd,n", [(12, 2, 128, 1), (12, 2, 128, 32), (4, 1, 24, 5), (4, 2, 32, 20)])
def test_projection_fused_qkv_rope_writes_q_and_kv_slots(kn, gpu, hq, kvh, hd, n, norm):
    """The QKV_ROPE epilogue against RMSNorm -> natural q|k|v projection + bias -> rope_store_ref."""
    ga, stream = gpu
    from vla_edge_ros.model.cuda_kernels import MODE_QKV_ROPE, MODE_STORE, RopeTarget
    rng = np.random.default_rng(hq * hd + n + norm)
    hidden, cap, row_offset = 96 if hd == 24 else 256, 64, 3
    qkv_rows = (hq + 2 * kvh) * hd
    w_nat = ref.from_bf16_bits(ref.to_bf16_bits((rng.standard_normal((qkv_rows, hidden)) / 16).astype(np.float32)))
    w_dev = ref.to_bf16_bits(ref.permute_rows(w_nat, ref.qkv_rope_row_order(hq, kvh, hd)))
    bias = rng.standard_normal(qkv_rows).astype(np.float32)
    x = (rng.standard_normal((n, hidden)) * 2).astype(np.float32)
    norm_w = rng.standard_normal(hidden).astype(np.float32) if norm else None
    pos = rng.integers(0, 30000, size=row_offset + n).astype(np.int32)
    slots = rng.permutation(cap)[:row_offset + n].astype(np.int32)
    inv = ref.rope_inv_freq(1e6, hd)
    ctl = _ctl(row_offset, 0)
    k0 = np.full((kvh, cap, hd), 7.0, np.float32)
    k_d, v_d = ga.to_gpu(k0), ga.to_gpu(k0.copy())
    out = _nan(ga, (n, qkv_rows))
    rope = RopeTarget(ga.to_gpu(pos), ga.to_gpu(slots), ga.to_gpu(ctl), ga.to_gpu(inv), int(k_d.gpudata),
                      int(v_d.gpudata), hq, kvh, hd, cap)
    kn.projection_fused(ga.to_gpu(w_dev), ga.to_gpu(x), out, n, MODE_QKV_ROPE, stream,
                        norm_w=ga.to_gpu(norm_w) if norm else None, eps=1e-6, bias=ga.to_gpu(bias), rope=rope)
    stream.synchronize()
    pre = ref.projection_fused_ref(w_nat, x, MODE_STORE, norm_w=norm_w, eps=1e-6, bias=bias)   # [n, q+2kv]
    e_qkv, e_k, e_v = ref.rope_store_ref(pre, pos, slots, ctl, inv, k0, k0.copy(), hq, kvh, hd)
    got = out.get()
    assert _rel_err(got[:, :hq * hd], e_qkv[:, :hq * hd]) < 2e-5
    assert np.isnan(got[:, hq * hd:]).all(), "QKV_ROPE writes only the q columns of its output"
    assert _rel_err(k_d.get(), e_k) < 2e-5
    assert _rel_err(v_d.get(), e_v) < 2e-5


def test_projection_fused_rejects_bad_arguments(kn, gpu):
    ga, stream = gpu
    from vla_edge_ros.model.cuda_kernels import MODE_ADD, MODE_QKV_ROPE, MODE_STORE, KernelError
    w = ga.to_gpu(np.zeros((32, 64), np.uint16))
    x, out = ga.zeros((1, 64), np.float32), ga.zeros((1, 32), np.float32)
    with pytest.raises(KernelError, match="rope target missing"):
        kn.projection_fused(w, x, out, 1, MODE_QKV_ROPE, stream)
    with pytest.raises(KernelError, match="norm weight: 32 values"):
        kn.projection_fused(w, x, out, 1, MODE_STORE, stream, norm_w=ga.zeros((32,), np.float32))
    with pytest.raises(KernelError, match="kb 2 > 1 needs MODE_ADD"):
        kn.projection_fused(w, x, out, 1, MODE_STORE, stream, warps=1, kb=2)
    with pytest.raises(KernelError, match="K parts"):
        kn.projection_fused(w, x, out, 1, MODE_ADD, stream, warps=2, kb=2)
    with pytest.raises(KernelError, match="dtype float32, expected uint16"):
        kn.projection_fused(ga.zeros((32, 64), np.float32), x, out, 1, MODE_STORE, stream)


ATTN_CASES = [(12, 2, 128, 300, 1), (12, 2, 128, 130, 9), (4, 1, 32, 0, 6), (12, 2, 128, 400, 32), (4, 1, 24, 70, 3),
              (8, 1, 64, 100, 12)]


@pytest.mark.parametrize("tiled", [False, True])
@pytest.mark.parametrize("hq,kvh,hd,ctx,n", ATTN_CASES)
def test_attention_over_slot_list_with_holes(kn, gpu, hq, kvh, hd, ctx, n, tiled):
    ga, stream = gpu
    from vla_edge_ros.model.cuda_kernels import ATTN_CHUNK
    rng = np.random.default_rng(ctx + n)
    cap = 512
    n_splits = -(-cap // ATTN_CHUNK)
    k = rng.standard_normal((kvh, cap, hd)).astype(np.float32)
    v = rng.standard_normal((kvh, cap, hd)).astype(np.float32)
    qkv = (rng.standard_normal((n, (hq + 2 * kvh) * hd)) * 2).astype(np.float32)
    row_offset = 2
    # a permutation of half the arena: holes everywhere, order unrelated to slot number
    attend = rng.permutation(cap)[:ctx + row_offset + n].astype(np.int32)
    ctl = _ctl(row_offset, ctx)
    out = _nan(ga, (n, hq * hd))
    part_o = ga.zeros((n, hq, n_splits, hd), np.float32)
    part_ml = ga.zeros((n, hq, n_splits, 2), np.float32)
    k_d, v_d = ga.to_gpu(k), ga.to_gpu(v)
    scale = hd ** -0.5
    kn.attention(ga.to_gpu(qkv), int(k_d.gpudata), int(v_d.gpudata), ga.to_gpu(attend), ga.to_gpu(ctl), part_o, part_ml,
                 out, n, hq, kvh, hd, cap, n_splits, scale, stream, tiled=tiled)
    stream.synchronize()
    expected = ref.attention_ref(qkv, k, v, attend, ctl, hq, kvh, hd, scale)
    assert _rel_err(out.get(), expected) < 1e-5


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
    ga, stream = gpu
    rng = np.random.default_rng(9)
    layers, kvh, cap, hd, n_max = 3, 2, 40, 32, 8
    k = rng.standard_normal((layers, kvh, cap, hd)).astype(np.float32)
    v = rng.standard_normal((layers, kvh, cap, hd)).astype(np.float32)
    k_d, v_d = ga.to_gpu(k), ga.to_gpu(v)
    slots = np.array([39, 0, 17, 5, 22], np.int32)
    staging = _nan(ga, (2, layers, n_max, kvh * hd))
    kn.kv_move("gather", k_d, v_d, ga.to_gpu(slots), staging, 5, layers, kvh, cap, hd, stream)
    stream.synchronize()
    got = staging.get()[:, :, :5]
    np.testing.assert_array_equal(got, ref.kv_gather_ref(k, v, slots))
    dst = np.array([1, 2, 3, 4, 6], np.int32)
    kn.kv_move("scatter", k_d, v_d, ga.to_gpu(dst), staging, 5, layers, kvh, cap, hd, stream)
    stream.synchronize()
    e_k, e_v = ref.kv_scatter_ref(k, v, dst, staging.get())
    np.testing.assert_array_equal(k_d.get(), e_k)
    np.testing.assert_array_equal(v_d.get(), e_v)


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
        assert _rel_err(tokens.get(), expected.tokens) < 1e-5
    sims = _nan(ga, (3,))
    kn.adjacent_cosine(pooled, 4, sims, stream)
    stream.synchronize()
    host_pooled = np.stack([enc.encode(f).pooled for f in frames])
    np.testing.assert_allclose(sims.get(), adjacent_cosine_similarities(host_pooled), atol=1e-5)
    assert int(np.argmax(sims.get())) == 1
