"""The bulk prefill (gemm_bulk.cu, prefill_bulk.cu; model.bulk_prefill_min_rows) against references.

GPU only (marker `gpu`). Kernel by kernel against kernel_reference (fresh random draws, outputs poisoned
so that an unwritten element fails, ragged shapes), then whole forwards through CudaBackend against the
numpy backend and against the cycle's prefill kernels, in one pass and in several.

Tolerances: the GEMM sums exact products of bf16 weights and (hi + lo) activations in fp32, so its error
is fp32 accumulation over K (~1e-7 .. 1e-6 relative to the output's scale); its SwiGLU output and the
attention output are written as hi + lo again (~2^-16 ~ 1.5e-5 of each value), and the attention's
products drop lo.lo terms as attention_mma.cu does (~1e-5 relative, its measured bound).
"""
import dataclasses

import numpy as np
import pytest

from kernel_compare import assert_close, peak, rel_norm
from vla_edge_ros.model import cuda_bulk_launchers as cbl
from vla_edge_ros.model import kernel_reference as ref
from vla_edge_ros.model import weight_layouts as layouts

pytestmark = pytest.mark.gpu

RTOL = 1e-5
NAN_BF16 = 0xFFFF


def _split(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """fp32 -> (hi, lo) bf16 bits, hi = bf16(x), lo = bf16(x - hi): what the device's split_hi_lo does."""
    hi = ref.to_bf16_bits(x)
    lo = ref.to_bf16_bits(x - ref.from_bf16_bits(hi))
    return hi, lo


def _joined(flat: np.ndarray, part_stride: int, rows: int, cols: int) -> np.ndarray:
    """hi + lo of a flat hi/lo buffer's first rows x cols values, in float64."""
    hi = ref.from_bf16_bits(flat[:rows * cols]).astype(np.float64)
    lo = ref.from_bf16_bits(flat[part_stride:part_stride + rows * cols]).astype(np.float64)
    return (hi + lo).reshape(rows, cols)


GEMM_KERNELS = ["mma", "wgmma128", "tma", "tma2"]


def _gemm_kernel(kn, kernel):
    """Skips a wgmma kernel on a device without sm_90a (it cannot be built there)."""
    from vla_edge_ros.model import cuda_kernels as ck
    if ck.family_arch(cbl.BULK_GEMMS[kernel].family, kn.arch) is None:
        pytest.skip(f"{kernel} needs sm_90a; this device is {kn.arch}")
    return kernel


def test_tensor_maps_are_encoded_by_the_driver_and_cached(kn):
    """cuda_tensor_map.bf16_tiled: 128 bytes from cuTensorMapEncodeTiled, the same bytes again from the cache, other
    bytes for another shape, and a clear error for what the driver would refuse."""
    from vla_edge_ros.model.cuda_kernels import KernelError
    from vla_edge_ros.model.cuda_tensor_map import MAP_BYTES, bf16_tiled
    a = bf16_tiled(1 << 20, (1536, 300, 2), (3072, 1 << 20), (64, 128, 1))
    assert len(a) == MAP_BYTES and a == bf16_tiled(1 << 20, (1536, 300, 2), (3072, 1 << 20), (64, 128, 1))
    assert a != bf16_tiled(1 << 20, (1536, 301, 2), (3072, 1 << 20), (64, 128, 1))
    with pytest.raises(KernelError, match="16-byte"):
        bf16_tiled((1 << 20) + 8, (1536, 300), (3072,), (64, 128))


def _close(got, expected, norm_tol, what):
    assert_close(got, expected, rtol=RTOL, atol=2 * norm_tol * peak(expected), what=what, norm_rtol=norm_tol)


@pytest.mark.parametrize("M,N,K,k_split", [
    (200, 96, 96, None),             # ragged M and N, K shorter than the pipeline's stages
    (37, 256, 128, 1),
    (300, 2048, 1536, 1),            # the 1.5B q|k|v shape
    (256, 1536, 1536, None),         # o: too few tiles, so K is split over blocks (atomic adds)
    (64, 192, 512, 3),
    (333, 640, 256, 2),
])
@pytest.mark.parametrize("parts", [2, 1])
@pytest.mark.parametrize("kernel", GEMM_KERNELS)
def test_gemm_bulk_add_and_store(kn, gpu, M, N, K, k_split, parts, kernel):
    from vla_edge_ros.model import cuda_kernels as ck
    kernel = _gemm_kernel(kn, kernel)
    ga, stream = gpu
    rng = np.random.default_rng(M * 7 + N + parts)
    x = (rng.standard_normal((M, K)) * 2).astype(np.float32)
    W = ref.to_bf16_bits(rng.standard_normal((N, K)).astype(np.float32) * 0.05)
    hi, lo = _split(x)
    stride = M * K + 8                                          # lo parts start a little after the hi rows
    flat = np.zeros(2 * stride, np.uint16)
    flat[:M * K], flat[stride:stride + M * K] = hi.reshape(-1), lo.reshape(-1)
    x_eff = ref.from_bf16_bits(hi).astype(np.float64) + (ref.from_bf16_bits(lo) if parts == 2 else 0.0)
    start = rng.standard_normal((M, N)).astype(np.float32)
    out = ga.to_gpu(start)
    W_d, x_d = ga.to_gpu(W), ga.to_gpu(flat)
    used = kn.gemm_bulk(W_d, x_d, stride, M, ck.MODE_ADD, stream, out=out, parts=parts, k_split=k_split,
                        kernel=kernel)
    stream.synchronize()
    _close(out.get(), ref.projection_ref(W, x_eff, ck.MODE_ADD, out=start), 1e-5,
           f"gemm_bulk {kernel} ADD, k_split {used}")
    bias = rng.standard_normal(N).astype(np.float32)
    out = ga.to_gpu(np.full((M, N), np.nan, np.float32))
    kn.gemm_bulk(W_d, x_d, stride, M, ck.MODE_STORE, stream, out=out, bias=ga.to_gpu(bias), parts=parts, kernel=kernel)
    stream.synchronize()
    _close(out.get(), ref.projection_ref(W, x_eff, ck.MODE_STORE, bias=bias), 1e-5, f"gemm_bulk {kernel} STORE")


@pytest.mark.parametrize("M,inter,K", [(70, 352, 128), (300, 8960, 1536), (200, 352, 96)])
@pytest.mark.parametrize("kernel", GEMM_KERNELS)
def test_gemm_bulk_swiglu_writes_hi_lo(kn, gpu, M, inter, K, kernel):
    from vla_edge_ros.model import cuda_kernels as ck
    kernel = _gemm_kernel(kn, kernel)
    ga, stream = gpu
    rng = np.random.default_rng(inter)
    gate = rng.standard_normal((inter, K)).astype(np.float32) * 0.05
    up = rng.standard_normal((inter, K)).astype(np.float32) * 0.05
    W = ref.to_bf16_bits(layouts.interleave_gate_up(gate, up))
    x = rng.standard_normal((M, K)).astype(np.float32)
    hi, lo = _split(x)
    flat = np.concatenate([hi.reshape(-1), lo.reshape(-1)])
    out_stride = M * inter
    out_hl = ga.to_gpu(np.full(2 * out_stride, NAN_BF16, np.uint16))
    kn.gemm_bulk(ga.to_gpu(W), ga.to_gpu(flat), M * K, M, ck.MODE_SWIGLU, stream, out_hl=out_hl,
                 out_part_stride=out_stride, out_cols=inter, kernel=kernel)
    stream.synchronize()
    x_eff = ref.from_bf16_bits(hi).astype(np.float64) + ref.from_bf16_bits(lo)
    expected = ref.projection_ref(W, x_eff, ck.MODE_SWIGLU, out_cols=inter)
    _close(_joined(out_hl.get(), out_stride, M, inter), expected, 3e-5, f"gemm_bulk {kernel} SWIGLU")


def test_rmsnorm_split_rows_and_bias_init(kn, gpu):
    ga, stream = gpu
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((9, 96)) * 3).astype(np.float32)
    w = rng.standard_normal(96).astype(np.float32)
    bias = rng.standard_normal(40).astype(np.float32)
    stride = 9 * 96
    out = ga.to_gpu(np.full(2 * stride, NAN_BF16, np.uint16))
    init = ga.to_gpu(np.full((9, 40), np.nan, np.float32))
    kn.rmsnorm_split(ga.to_gpu(x), ga.to_gpu(w), out, stride, 9, 1e-6, stream, init_dst=init, init_src=ga.to_gpu(bias))
    stream.synchronize()
    expected, exp_init = ref.rmsnorm_rows_ref(x, w, 1e-6, bias, 40)
    # rmsnorm's error (1e-6) plus the hi + lo representation (~2^-16 relative to each value)
    _close(_joined(out.get(), stride, 9, 96), expected, 2e-5, "rmsnorm_split")
    np.testing.assert_array_equal(init.get(), exp_init)


def _flash_case(kernels, gpu, hq, kvh, hd, ctx, row_offset, n, splits, stages, seed, cap=700, parts=2,
                heads_per_warp=1, kv_overlap=False, hoisted_copies=False, tile_entries=32):
    """K/V behind a permuted slot list, n query rows after ctx + row_offset visible entries: kv_stage, then
    attention_flash; returns (ours, the reference)."""
    ga, stream = gpu
    rng = np.random.default_rng(seed)
    k = rng.standard_normal((kvh, cap, hd)).astype(np.float32)
    v = rng.standard_normal((kvh, cap, hd)).astype(np.float32)
    if kernels.kv_dtype == "bfloat16":                        # the arena holds bf16 values
        k, v = ref.from_bf16_bits(ref.to_bf16_bits(k)), ref.from_bf16_bits(ref.to_bf16_bits(v))
        k_d, v_d = ga.to_gpu(ref.to_bf16_bits(k)), ga.to_gpu(ref.to_bf16_bits(v))
    else:
        k_d, v_d = ga.to_gpu(k), ga.to_gpu(v)
    qkv = (rng.standard_normal((n, (hq + 2 * kvh) * hd)) * 2).astype(np.float32)
    attend = rng.permutation(cap)[:ctx + row_offset + n].astype(np.int32)
    ctl = np.array([row_offset, ctx, 0, -1], np.int32)
    stage = ga.to_gpu(np.full((4, kvh, cap, hd), NAN_BF16, np.uint16))
    q_dim = hq * hd
    part_o = ga.to_gpu(np.full(splits * n * q_dim, np.nan, np.float32))
    part_ml = ga.to_gpu(np.full(splits * n * hq * 2, np.nan, np.float32))
    out_stride = n * q_dim + 16
    out = ga.to_gpu(np.full(2 * out_stride, NAN_BF16, np.uint16))
    ctl_d, attend_d = ga.to_gpu(ctl), ga.to_gpu(attend)
    kernels.kv_stage(int(k_d.gpudata), int(v_d.gpudata), attend_d, ctl_d, stage, n, kvh, cap, hd, stream)
    kernels.attention_flash(ga.to_gpu(qkv), stage, ctl_d, part_o, part_ml, out, out_stride, n, hq, kvh, hd, splits,
                            hd ** -0.5, stream, stages=stages, parts=parts, heads_per_warp=heads_per_warp,
                            kv_overlap=kv_overlap, hoisted_copies=hoisted_copies, tile_entries=tile_entries)
    stream.synchronize()
    expected = ref.attention_ref(qkv, k, v, attend, ctl, hq, kvh, hd, hd ** -0.5)
    return _joined(out.get(), out_stride, n, q_dim), expected


@pytest.mark.parametrize("hq,kvh,hd,ctx,row_offset,n,splits", [
    (4, 2, 32, 0, 0, 40, 1),          # tiny: a recompute from nothing (the first row sees only itself)
    (4, 1, 32, 50, 3, 37, 3),         # llama-tiny's grouping, ragged rows, the list split three ways
    (12, 2, 128, 300, 0, 130, 2),     # the 1.5B shape
    (8, 2, 64, 97, 20, 64, 5),        # more splits than some row blocks have tiles: empty splits
])
@pytest.mark.parametrize("stages", [1, 2])
def test_attention_flash_matches_reference(kn, gpu, hq, kvh, hd, ctx, row_offset, n, splits, stages):
    got, expected = _flash_case(kn, gpu, hq, kvh, hd, ctx, row_offset, n, splits, stages, seed=hd + n)
    _close(got, expected, 3e-5, f"attention_flash hd={hd} splits={splits} stages={stages}")


@pytest.mark.parametrize("hq,kvh,hd,ctx,row_offset,n,splits", [
    (4, 2, 32, 0, 0, 40, 1),          # group 2: one warp of two heads
    (4, 1, 32, 50, 3, 37, 3),         # group 4: two warps
    (12, 2, 128, 300, 0, 130, 2),     # the 1.5B shape: three warps of two heads
    (8, 2, 64, 97, 20, 64, 5),        # empty splits
])
def test_attention_flash_two_heads_per_warp(kn, gpu, hq, kvh, hd, ctx, row_offset, n, splits):
    """heads_per_warp 2 (KernelPlan.bulk_attention_heads_per_warp): each warp's K/V fragments serve two heads; the
    same sums as one head per warp, so the same bound against the reference, and within bf16 rounding with one part."""
    got, expected = _flash_case(kn, gpu, hq, kvh, hd, ctx, row_offset, n, splits, 1, seed=hd + n, heads_per_warp=2)
    _close(got, expected, 3e-5, f"attention_flash w2 hd={hd} splits={splits}")
    got1, _ = _flash_case(kn, gpu, hq, kvh, hd, ctx, row_offset, n, splits, 1, seed=hd + n, heads_per_warp=2, parts=1)
    _close(got1, expected, 1e-2, f"attention_flash w2 p1 hd={hd} splits={splits}")


def test_attention_flash_refuses_two_heads_per_warp_where_it_cannot(kn, gpu):
    from vla_edge_ros.model.cuda_kernels import KernelError
    with pytest.raises(KernelError, match="heads per warp"):
        _flash_case(kn, gpu, 3, 1, 32, 0, 0, 16, 1, 1, seed=1, heads_per_warp=2)      # group 3: odd
    with pytest.raises(KernelError, match="heads per warp"):
        _flash_case(kn, gpu, 4, 2, 32, 0, 0, 16, 1, 2, seed=1, heads_per_warp=2)      # two stages


@pytest.mark.parametrize("hq,kvh,hd,ctx,row_offset,n,splits", [
    (4, 2, 32, 0, 0, 40, 1),          # from nothing: every tile of a block holds its diagonal or lies past it
    (4, 1, 32, 50, 3, 37, 3),         # ragged rows, three splits
    (12, 2, 128, 300, 0, 130, 2),     # the 1.5B shape: whole tiles before the diagonal ones
    (8, 2, 64, 97, 20, 64, 5),        # empty splits
    (12, 2, 128, 640, 0, 50, 1),      # one split over twenty-odd tiles, a partial last row block
])
@pytest.mark.parametrize("parts,heads_per_warp", [(2, 1), (1, 1), (2, 2), (1, 2)])
@pytest.mark.parametrize("arena", ["float32", "bfloat16"])
def test_attention_flash_kv_overlap_gives_the_one_stage_bits(kn, kn16, gpu, hq, kvh, hd, ctx, row_offset, n, splits,
                                                             parts, heads_per_warp, arena):
    """kv_overlap (KernelPlan.bulk_attention_kv_overlap, attention_flash_kvo.cu) only reorders the block's copies
    against its products and leaves the causal mask off whole tiles: every output bit equals the one-stage entry's
    on the same inputs, and both stay within the reference's bound."""
    kernels = kn if arena == "float32" else kn16
    case = (kernels, gpu, hq, kvh, hd, ctx, row_offset, n, splits, 1)
    kw = {"seed": hd + n + ctx, "parts": parts, "heads_per_warp": heads_per_warp, "cap": 720}
    got, expected = _flash_case(*case, kv_overlap=True, **kw)
    one_stage, _ = _flash_case(*case, **kw)
    np.testing.assert_array_equal(got, one_stage)
    _close(got, expected, 3e-5 if parts == 2 else 1e-2, f"attention_flash kvo p{parts} w{heads_per_warp} hd={hd}")


@pytest.mark.parametrize("hq,kvh,hd,ctx,row_offset,n,splits", [
    (4, 2, 32, 0, 0, 40, 1),          # from nothing: every tile of a block holds its diagonal or lies past it
    (4, 1, 32, 50, 3, 37, 3),         # ragged rows, three splits
    (12, 2, 128, 300, 0, 130, 2),     # the 1.5B shape: whole tiles before the diagonal ones
    (8, 2, 64, 97, 20, 64, 5),        # empty splits
    (12, 2, 128, 640, 0, 50, 1),      # one split over many tiles, a partial last row block
])
@pytest.mark.parametrize("parts", [2, 1])
@pytest.mark.parametrize("arena", ["float32", "bfloat16"])
def test_attention_flash_hoisted_copies_and_wide_tiles(kn, kn16, gpu, hq, kvh, hd, ctx, row_offset, n, splits, parts,
                                                       arena):
    """attention_flash_tiles.cu: the hoisted copies (KernelPlan.bulk_attention_hoisted_copies) put the same bytes in
    the same places, so every output bit equals the K/V overlap's entry; the 64-entry tiles
    (bulk_attention_tile_entries) round the online softmax per 64 entries, within the reference's bound."""
    kernels = kn if arena == "float32" else kn16
    case = (kernels, gpu, hq, kvh, hd, ctx, row_offset, n, splits, 1)
    kw = {"seed": hd + n + ctx, "parts": parts, "cap": 720, "kv_overlap": True}
    overlap, expected = _flash_case(*case, **kw)
    hoisted, _ = _flash_case(*case, hoisted_copies=True, **kw)
    np.testing.assert_array_equal(hoisted, overlap)
    wide, _ = _flash_case(*case, hoisted_copies=True, tile_entries=64, **kw)
    bound = 3e-5 if parts == 2 else 1e-2
    _close(wide, expected, bound, f"attention_flash t64 p{parts} hd={hd}")
    _close(hoisted, expected, bound, f"attention_flash h p{parts} hd={hd}")


def test_attention_flash_refuses_the_tile_entries_it_has_no_entry_for(kn, gpu):
    from vla_edge_ros.model.cuda_kernels import KernelError
    with pytest.raises(KernelError, match="hoisted copies are entries of the K/V overlap"):
        _flash_case(kn, gpu, 4, 2, 32, 0, 0, 16, 1, 1, seed=1, hoisted_copies=True)
    with pytest.raises(KernelError, match="64-entry tiles"):
        _flash_case(kn, gpu, 8, 1, 32, 0, 0, 16, 1, 1, seed=1, kv_overlap=True, hoisted_copies=True,
                    tile_entries=64)                                                 # group 8: over the bound of 6
    with pytest.raises(KernelError, match="64-entry tiles"):
        _flash_case(kn, gpu, 4, 2, 32, 0, 0, 16, 1, 1, seed=1, kv_overlap=True, tile_entries=64)


def test_attention_flash_refuses_the_kv_overlap_with_two_stages(kn, gpu):
    from vla_edge_ros.model.cuda_kernels import KernelError
    with pytest.raises(KernelError, match="K/V overlap runs one stage"):
        _flash_case(kn, gpu, 4, 2, 32, 0, 0, 16, 1, 2, seed=1, kv_overlap=True)


@pytest.fixture(scope="module")
def kn16(cuda_device):
    from vla_edge_ros.model.cuda_kernels import CudaKernels
    return CudaKernels(cuda_device, kv_dtype="bfloat16")


def test_attention_flash_on_a_bf16_arena(kn16, gpu):
    got, expected = _flash_case(kn16, gpu, 12, 2, 128, 200, 5, 70, 2, 2, seed=9)
    _close(got, expected, 3e-5, "attention_flash, bf16 arena")


@pytest.mark.parametrize("arena", ["float32", "bfloat16"])
def test_attention_flash_bf16_products(kn, kn16, gpu, arena):
    """The _p1 entries (KernelPlan.bulk_activation_parts 1) multiply q, K, P and V rounded to bf16 once, as a bf16
    SDPA does: within that rounding of the fp32 reference (~2^-9 per factor; 1e-2 of the output's norm), and
    measurably less exact than the hi/lo entries on the same inputs (so the one-part path really ran)."""
    kernels = kn if arena == "float32" else kn16
    case = (kernels, gpu, 12, 2, 128, 300, 0, 130, 2, 1)
    got, expected = _flash_case(*case, seed=4, parts=1)
    _close(got, expected, 1e-2, f"attention_flash p1, {arena} arena")
    exact, _ = _flash_case(*case, seed=4, parts=2)
    assert rel_norm(exact, expected) < 3e-5 < rel_norm(got, expected)


# ---------------------------------------------------------------- whole forwards through CudaBackend


@pytest.fixture(scope="module", params=["tiny", "llama-tiny", "qwen2.5-1.5b-random"])
def model(request, tmp_path_factory):
    from vla_edge_ros.model.make_model import make_model
    from vla_edge_ros.model.spec import ModelSpec
    from vla_edge_ros.model.weights import load_weights
    layers = 2 if request.param.startswith("qwen2.5") else None
    path = make_model(request.param, tmp_path_factory.mktemp("bulk"), seed=5, dtype="bf16", layers=layers)
    spec = ModelSpec.from_dir(path)
    return spec, load_weights(path, spec)


def _backend(model, capacity, **kw):
    from vla_edge_ros.model.cuda_backend import CudaBackend
    spec, weights = model
    return CudaBackend(spec, weights, capacity, "bfloat16", **kw)


def test_bulk_forward_matches_numpy_and_the_cycle_kernels(model):
    """A context, then 300 rows on holes in the slot list: the bulk prefill in one pass and in three (the K/V
    each pass leaves must serve the next), the cycle's prefill kernels, and the numpy backend agree."""
    from vla_edge_ros.model.numpy_backend import NumpyBackend
    spec, weights = model
    cap = 700
    bulk = _backend(model, cap, bulk_prefill_min_rows=1, bulk_prefill_max_rows=512)
    passes = _backend(model, cap, bulk_prefill_min_rows=1, bulk_prefill_max_rows=128)
    cycle = _backend(model, cap, bulk_prefill_min_rows=0)
    numpy = NumpyBackend(spec, weights, cap, "bfloat16")
    assert bulk.bulk_min_rows == 1 and cycle.bulk_min_rows == 0
    gemm = bulk.kernel_plan.bulk_gemm
    named = {f"bulk {gemm}": bulk, f"bulk {passes.kernel_plan.bulk_gemm} in passes": passes, "cycle kernels": cycle}
    for max_rows in (512, 128):    # two query heads per flash-attention warp (the model's group allowing)
        b = _backend(model, cap, bulk_prefill_min_rows=1, bulk_prefill_max_rows=max_rows)
        plan = b.use_kernel_plan(dataclasses.replace(b.kernel_plan, bulk_attention_heads_per_warp=2))
        assert plan.bulk_attention_heads_per_warp == (2 if (spec.num_heads // spec.num_kv_heads) % 2 == 0 else 1)
        named[f"bulk, 2 heads per attention warp, passes of {max_rows}"] = b
    assert bulk.kernel_plan.bulk_attention_kv_overlap      # the default: K/V copies under the attention's products
    for max_rows in (512, 128):    # ... and without them (prefill_bulk.cu's one-stage entries)
        b = _backend(model, cap, bulk_prefill_min_rows=1, bulk_prefill_max_rows=max_rows)
        assert not b.use_kernel_plan(dataclasses.replace(b.kernel_plan, bulk_attention_kv_overlap=False)
                                     ).bulk_attention_kv_overlap
        named[f"bulk, no K/V overlap in the attention, passes of {max_rows}"] = b
    for entries in (32, 64):       # hoisted copies, and with them 64-entry tiles (attention_flash_tiles.cu)
        b = _backend(model, cap, bulk_prefill_min_rows=1, bulk_prefill_max_rows=128)
        plan = b.use_kernel_plan(dataclasses.replace(b.kernel_plan, bulk_attention_hoisted_copies=True,
                                                     bulk_attention_tile_entries=entries))
        assert (plan.bulk_attention_hoisted_copies, plan.bulk_attention_tile_entries) == (True, entries)
        named[f"bulk, hoisted copies, {entries}-entry tiles, passes of 128"] = b
    if gemm != "mma":              # the Hopper default: the other GEMMs too (mma.sync, TMA), one pass and three
        for other in (g for g in GEMM_KERNELS if g != gemm):
            for max_rows in (512, 128):
                b = _backend(model, cap, bulk_prefill_min_rows=1, bulk_prefill_max_rows=max_rows)
                assert b.use_kernel_plan(dataclasses.replace(b.kernel_plan, bulk_gemm=other)).bulk_gemm == other
                named[f"bulk {other}, passes of {max_rows}"] = b
    rng = np.random.default_rng(6)
    slots = rng.permutation(cap)
    x = numpy.embed(rng.integers(0, spec.vocab_size, size=340))
    pos = np.arange(340) * 2 + 1
    ctx = slots[:40]
    results = {}
    for name, b in (*named.items(), ("numpy", numpy)):
        b.forward(x[:40], pos[:40], ctx, np.array([], np.int64), logits="none")
        results[name] = b.forward(x[40:], pos[40:], slots[40:340], np.delete(ctx, [2, 9]), logits="all",
                                  return_hidden=True)
    exp = results["numpy"]
    for name in named:
        got = results[name]
        for layer, (h, e) in enumerate(zip(got.hidden_states, exp.hidden_states)):
            assert rel_norm(h, e) < 1e-4, f"{name}: hidden state {layer}"
        assert rel_norm(got.logits, exp.logits) < 1e-4, name
    kv_ref = np.stack([numpy._k[:, slots[:340]], numpy._v[:, slots[:340]]]).reshape(2, spec.num_layers, 340, -1)
    for name, b in named.items():
        if name != "cycle kernels":
            assert rel_norm(b.read_kv(slots[:340]), kv_ref) < 1e-4, name


def test_bulk_forward_in_bf16_products_stays_near_numpy(model):
    """bulk_activation_parts 1 (GEMM activations and attention factors in bf16, as HF's bf16 model computes) with
    each GEMM this device runs, in passes: hidden states, logits and the K/V it stores within bf16 rounding of the
    numpy backend (fp32 activations), and the K/V not identical to the two-part path's."""
    from vla_edge_ros.model import cuda_kernels as ck
    from vla_edge_ros.model.numpy_backend import NumpyBackend
    spec, weights = model
    cap = 400
    numpy = NumpyBackend(spec, weights, cap, "bfloat16")
    rng = np.random.default_rng(12)
    x = numpy.embed(rng.integers(0, spec.vocab_size, size=300))
    slots = rng.permutation(cap)[:300]
    exp = numpy.forward(x, np.arange(300), slots, np.array([], np.int64), logits="all", return_hidden=True)
    kv_ref = np.stack([numpy._k[:, slots], numpy._v[:, slots]]).reshape(2, spec.num_layers, 300, -1)
    two_part = _backend(model, cap, bulk_prefill_min_rows=1, bulk_prefill_max_rows=128)
    two_part.forward(x, np.arange(300), slots, np.array([], np.int64), logits="none")
    for gemm in GEMM_KERNELS:
        b = _backend(model, cap, bulk_prefill_min_rows=1, bulk_prefill_max_rows=128)
        if ck.family_arch(cbl.BULK_GEMMS[gemm].family, b.kernels.arch) is None:
            continue
        plan = b.use_kernel_plan(dataclasses.replace(b.kernel_plan, bulk_gemm=gemm, bulk_activation_parts=1))
        assert (plan.bulk_gemm, plan.bulk_activation_parts) == (gemm, 1)
        got = b.forward(x, np.arange(300), slots, np.array([], np.int64), logits="all", return_hidden=True)
        for layer, (h, e) in enumerate(zip(got.hidden_states, exp.hidden_states)):
            assert rel_norm(h, e) < 3e-2, f"{gemm} p1: hidden state {layer}"
        assert rel_norm(got.logits, exp.logits) < 3e-2, gemm
        kv = b.read_kv(slots)
        assert rel_norm(kv, kv_ref) < 3e-2, gemm
        assert rel_norm(kv, two_part.read_kv(slots)) > 1e-5, f"{gemm} p1 computed the two-part K/V"


def test_the_configured_bf16_precision_runs_the_one_part_products(model):
    """model.bulk_prefill_precision bf16 reaches the plan as one activation part (the kernels of the test above),
    a split backend keeps two, and an unknown name is refused before anything is allocated."""
    spec, weights = model
    assert _backend(model, 400, bulk_prefill_precision="bf16").kernel_plan.bulk_activation_parts == 1
    assert _backend(model, 400, bulk_prefill_precision="split").kernel_plan.bulk_activation_parts == 2
    with pytest.raises(ValueError, match="bulk_prefill_precision must be one of"):
        _backend(model, 400, bulk_prefill_precision="fp8")


@pytest.mark.parametrize("kernel", [None, "mma", "wgmma128"])
def test_bulk_graph_replays_serve_other_offsets_and_contexts(model, kernel):
    """The graph of a bulk pass reads its offsets, lengths and slots from device tables: the second forward
    of the same row count (a different context, other slots) replays it and must still be right. With the
    default GEMM (gemm_tma.cu on the H200: its tensor maps are parameters by value, copied into the captured
    graph), gemm_bulk.cu's mma.sync and gemm_wgmma.cu's cp.async copies."""
    from vla_edge_ros.model.numpy_backend import NumpyBackend
    spec, weights = model
    cap = 400
    cuda = _backend(model, cap, bulk_prefill_min_rows=64)
    if kernel is not None:
        _gemm_kernel(cuda.kernels, kernel)
        cuda.use_kernel_plan(dataclasses.replace(cuda.kernel_plan, bulk_gemm=kernel))
    numpy = NumpyBackend(spec, weights, cap, "bfloat16")
    cuda.prepare_forward([96])
    assert ("bulk", 96) in cuda._graphs
    rng = np.random.default_rng(8)
    x = numpy.embed(rng.integers(0, spec.vocab_size, size=192))
    for b in (cuda, numpy):
        b.forward(x[:96], np.arange(96), np.arange(96), np.array([], np.int64), logits="none")
        b.forward(x[96:], np.arange(96, 192) + 7, np.arange(200, 296), np.arange(5, 90), logits="none")
    kv = cuda.read_kv(np.arange(200, 296))
    kv_ref = np.stack([numpy._k[:, 200:296], numpy._v[:, 200:296]]).reshape(kv.shape)
    assert rel_norm(kv, kv_ref) < 1e-4
    assert np.isfinite(cuda.read_kv(np.arange(96))).all()
