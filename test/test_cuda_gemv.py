"""gemv.cu (the one-row decode projections) against the numpy references of kernel_reference.py.

GPU only (marker `gpu`). Fresh random inputs per case, outputs poisoned with NaN, ragged row
counts and K not a multiple of the 512-element batch, every mode with and without the RMSNorm
prologue, the head's slice of rows (w_row0, rows) and a row other than the first (x_row0).
"""
import dataclasses

import numpy as np
import pytest

from gpu_cases import items_loop_case, qkv_rope_case
from kernel_compare import assert_close, peak
from vla_edge_ros.model import kernel_reference as ref
from vla_edge_ros.model import weight_layouts as layouts

pytestmark = pytest.mark.gpu


def _nan(ga, shape):
    return ga.to_gpu(np.full(shape, np.nan, np.float32))


def _close(got, expected, what):
    # fp32 FMAs over K <= 8960 bf16 x fp32 products, summed in a different order than numpy's float64:
    # ~1e-6 of the output's scale; 1e-5 of it leaves room and still fails any wrong row or column.
    assert_close(got, expected, rtol=1e-5, atol=1e-5 * max(peak(expected), 1e-3), what=what, norm_rtol=1e-5)


SHAPES = [(40, 96), (256, 1536), (1536, 8960), (130, 520)]


@pytest.mark.parametrize("norm", [False, True])
@pytest.mark.parametrize("rows,k", SHAPES)
def test_gemv_modes_match_reference(kn, gpu, rows, k, norm):
    ga, stream = gpu
    from vla_edge_ros.model.cuda_kernels import MODE_ADD, MODE_STORE, MODE_SWIGLU
    rng = np.random.default_rng(rows * 7 + k + norm)
    w = ref.to_bf16_bits((rng.standard_normal((rows, k)) / np.sqrt(k)).astype(np.float32))
    x = (rng.standard_normal((3, k)) * 2).astype(np.float32)        # row 1 is the one projected
    norm_w = rng.standard_normal(k).astype(np.float32) if norm else None
    nw_dev = ga.to_gpu(norm_w) if norm else None
    bias = rng.standard_normal(rows).astype(np.float32)
    eps, case = 1e-6, f"gemv {rows}x{k} norm={norm}"
    w_dev, x_dev = ga.to_gpu(w), ga.to_gpu(x)

    out = _nan(ga, (1, rows))
    kn.gemv(w_dev, x_dev, out, MODE_STORE, stream, norm_w=nw_dev, eps=eps, bias=ga.to_gpu(bias), x_row0=1)
    stream.synchronize()
    _close(out.get(), ref.folded_projection_ref(w, x[1:2], MODE_STORE, norm_w=norm_w, eps=eps, bias=bias), f"{case} STORE")

    base = rng.standard_normal((1, rows)).astype(np.float32)
    acc = ga.to_gpu(base)
    kn.gemv(w_dev, x_dev, acc, MODE_ADD, stream, norm_w=nw_dev, eps=eps, x_row0=1)
    stream.synchronize()
    expected = ref.folded_projection_ref(w, x[1:2], MODE_ADD, out=base, norm_w=norm_w, eps=eps)
    _close(acc.get(), expected, f"{case} ADD")

    if rows >= 64:                                              # the head's slice: rows [w_row0, w_row0 + n)
        lo, n = 17, rows // 2
        out = _nan(ga, (1, n))
        kn.gemv(w_dev, x_dev, out, MODE_STORE, stream, norm_w=nw_dev, eps=eps, w_row0=lo, rows=n, x_row0=1)
        stream.synchronize()
        _close(out.get(), ref.folded_projection_ref(w[lo:lo + n], x[1:2], MODE_STORE, norm_w=norm_w, eps=eps),
               f"{case} STORE rows [{lo}, {lo + n})")

    if rows % 16 == 0:
        inter = rows // 2 - 3                                   # ragged: the last tile has padding rows
        wf = ref.from_bf16_bits(w)
        w_gu = ref.to_bf16_bits(layouts.interleave_gate_up(wf[:inter], wf[rows // 2: rows // 2 + inter]))
        act = _nan(ga, (1, inter))
        kn.gemv(ga.to_gpu(w_gu), x_dev, act, MODE_SWIGLU, stream, norm_w=nw_dev, eps=eps, out_cols=inter, x_row0=1)
        stream.synchronize()
        expected = ref.folded_projection_ref(w_gu, x[1:2], MODE_SWIGLU, norm_w=norm_w, eps=eps, out_cols=inter)
        _close(act.get(), expected, f"{case} SWIGLU")


@pytest.mark.parametrize("norm", [False, True])
@pytest.mark.parametrize("hq,kvh,hd", [(12, 2, 128), (4, 1, 24), (4, 2, 32), (16, 2, 256)])
def test_gemv_qkv_rope_writes_q_and_kv_slots(kn, gpu, hq, kvh, hd, norm):
    """The QKV_ROPE epilogue against RMSNorm -> natural q|k|v projection + bias -> rope_store_ref."""
    ga, _ = gpu
    rng = np.random.default_rng(hq * hd + norm)
    hidden, qkv_rows = 96 if hd == 24 else 256, (hq + 2 * kvh) * hd
    w_nat = ref.from_bf16_bits(ref.to_bf16_bits((rng.standard_normal((qkv_rows, hidden)) / 16).astype(np.float32)))
    w_dev = ref.to_bf16_bits(layouts.permute_rows(w_nat, layouts.qkv_rope_row_order(hq, kvh, hd)))
    qkv_rope_case(kn, gpu, ga.to_gpu(w_dev), w_nat, hq, kvh, hd, rng, norm,
                  f"gemv QKV_ROPE {hq}/{kvh}x{hd} norm={norm}", _close)


def test_gemv_rejects_bad_arguments(kn, gpu):
    ga, stream = gpu
    from vla_edge_ros.model.cuda_kernels import MODE_QKV_ROPE, MODE_STORE, MODE_SWIGLU, KernelError
    w = ga.to_gpu(np.zeros((32, 64), np.uint16))
    x, out = ga.zeros((1, 64), np.float32), ga.zeros((1, 32), np.float32)
    with pytest.raises(KernelError, match="rope target missing"):
        kn.gemv(w, x, out, MODE_QKV_ROPE, stream)
    with pytest.raises(KernelError, match="norm weight: 32 values"):
        kn.gemv(w, x, out, MODE_STORE, stream, norm_w=ga.zeros((32,), np.float32))
    with pytest.raises(KernelError, match="dtype float32, expected uint16"):
        kn.gemv(ga.zeros((32, 64), np.float32), x, out, MODE_STORE, stream)
    with pytest.raises(KernelError, match="multiple of 16"):
        kn.gemv(ga.to_gpu(np.zeros((24, 64), np.uint16)), x, out, MODE_SWIGLU, stream)
    with pytest.raises(KernelError, match="x: row 1"):
        kn.gemv(w, x, out, MODE_STORE, stream, x_row0=1)


@pytest.mark.parametrize("blocks_per_sm", [1, 2])
def test_gemv_items_loop_gives_the_same_sums(kn, gpu, blocks_per_sm):
    """gemv_bf16_items (a grid of blocks_per_sm per SM looping over the 8-row items, the activations staged
    once per block) writes what gemv_bf16 writes, bit for bit: STORE with a bias and the RMSNorm prologue, ADD,
    SWIGLU with ragged outputs, on more items than the grid has blocks and a last item with missing rows."""
    ga, _ = gpu
    rows, k = 16 * (kn.num_sms * 3 // 2) + 8, 264            # ~3 items per SM: some blocks take 2, 3 or 4 items
    rng = np.random.default_rng(rows + blocks_per_sm)
    w = ga.to_gpu(ref.to_bf16_bits((rng.standard_normal((rows, k)) / np.sqrt(k)).astype(np.float32)))
    items_loop_case(kn, gpu, w, rows, k, rng, blocks_per_sm)


def test_long_context_splits_give_the_same_cycle(tiny_weights):
    """KernelPlan.long_context_blocks_per_sm (lab +lcs2 / +lcs4): more splits per KV head over a context long enough
    that each split walks several 64-slot chunks at 1 block per SM (the tiny model's 2 KV heads: 66 splits per head
    on the H200, ~4200 slots; the context here is 9000). The same attention summed in other splits: the prefill
    logits within rounding, the tokens those of one split count (a near tie may flip one)."""
    from gpu_cases import one_cycle
    from vla_edge_ros.model.cuda_backend import CudaBackend
    from vla_edge_ros.model.cuda_kernel_plan import KernelPlan
    spec, weights = tiny_weights
    b = CudaBackend(spec, weights, 9200, "bfloat16", plan=KernelPlan())
    try:
        base = one_cycle(b, spec.vocab_size, n_ctx=9000, n_prefill=32, seed=7)
        for n in (2, 4):
            assert b.use_kernel_plan(KernelPlan(long_context_blocks_per_sm=n)).long_context_blocks_per_sm == n
            got = one_cycle(b, spec.vocab_size, n_ctx=9000, n_prefill=32, seed=7)
            assert np.sum(got[0] == base[0]) >= len(base[0]) - 1, (n, got[0], base[0])
            assert_close(got[1], base[1], rtol=1e-4, atol=1e-4 * peak(base[1]), what=f"prefill logits, lcs{n}")
    finally:
        b.close()


def test_decode_variants_give_the_same_cycle(tiny_weights):
    """The backend's decode variants (both defaults): two warps per decode attention slot group picks the same
    tokens as one; with the decode projections' grid capped at 4 blocks per SM, too. (The tiny model's gate/up
    has 88 items, fewer than any such grid, so here only the switch is exercised; the loop itself is
    test_gemv_items_loop_gives_the_same_sums. The prefill logits are compared within rounding: the prefill's
    split-K atomics may order their sums differently between runs.)"""
    from gpu_cases import one_cycle
    from vla_edge_ros.model.cuda_backend import CudaBackend
    from vla_edge_ros.model.cuda_kernel_plan import KernelPlan
    spec, weights = tiny_weights
    plan = KernelPlan(decode_attention_head_split=1, decode_gemv_blocks_per_sm=0)
    b = CudaBackend(spec, weights, 300, "bfloat16", plan=plan)
    try:
        base = one_cycle(b, spec.vocab_size, n_ctx=100, n_prefill=32, seed=6)
        plan = dataclasses.replace(plan, decode_attention_head_split=2)
        assert b.use_kernel_plan(plan).decode_attention_head_split == 2
        split_heads = one_cycle(b, spec.vocab_size, n_ctx=100, n_prefill=32, seed=6)
        np.testing.assert_array_equal(base[0], split_heads[0])
        assert_close(split_heads[1], base[1], rtol=1e-5, atol=1e-5 * peak(base[1]), what="prefill logits, h2")
        in_effect = b.use_kernel_plan(dataclasses.replace(plan, decode_gemv_blocks_per_sm=4))
        assert in_effect.decode_gemv_blocks_per_sm == 4
        looped = one_cycle(b, spec.vocab_size, n_ctx=100, n_prefill=32, seed=6)
        np.testing.assert_array_equal(base[0], looped[0])
        assert_close(looped[1], base[1], rtol=1e-5, atol=1e-5 * peak(base[1]), what="prefill logits, h2 + loop4")
        # The INT4 decode grid is for INT4 weights: a bf16 backend runs gemv.cu's and says so in the plan in effect.
        in_effect = b.use_kernel_plan(dataclasses.replace(plan, int4_gemv_items_per_block=4, int4_gemv_rows_per_warp=2))
        assert (in_effect.int4_gemv_items_per_block, in_effect.int4_gemv_rows_per_warp) == (0, 1)
        np.testing.assert_array_equal(base[0], one_cycle(b, spec.vocab_size, n_ctx=100, n_prefill=32, seed=6)[0])
        with pytest.raises(ValueError, match="decode_gemv_blocks_per_sm must be in"):
            b.use_kernel_plan(dataclasses.replace(plan, decode_gemv_blocks_per_sm=9))
        with pytest.raises(ValueError, match="needs a cuda_kernel_plan.KernelPlan"):
            b.use_kernel_plan({"decode_gemv_blocks_per_sm": 4})
    finally:
        b.close()
