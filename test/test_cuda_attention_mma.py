"""attention_mma.cu (prefill attention partials on the tensor cores, KernelPlan.tensor_core_attention) against the
numpy reference, beside attention_tiled.cu, and a backend cycle with it.

GPU only (marker `gpu`). The kernel takes K, V, the scaled q and the softmax weights into the mma as bf16 hi/lo
pairs (three products per pair of operands, the lo.lo term dropped: ~2^-16 of each product), so it is held to
1e-4 of the output's scale where the fp32 kernels are held to 1e-5. A kernel fed plain bf16 (q, K, V rounded
once, ~2^-9 each) would miss that by an order of magnitude, so the bound checks the split too. Cases: holes and a permuted attend list,
rows that see only part of a chunk (causal within the call), partial 16-row tiles, several row blocks
(rows_per_block), both entries of head_dim 128, fewer splits than chunks (max_splits: several chunks a split), and
the _ma and _hs entries bit for bit against the entries they vary.
"""
import numpy as np
import pytest

from gpu_cases import attention_case, attention_inputs, on_arena, one_cycle
from kernel_compare import assert_close, peak

pytestmark = pytest.mark.gpu

# (q heads, KV heads, head_dim, cached context, rows of the call)
CASES = [(12, 2, 128, 300, 32), (12, 2, 128, 130, 9), (4, 1, 32, 0, 6), (4, 2, 32, 61, 13), (8, 1, 64, 100, 12),
         (12, 2, 128, 0, 1), (12, 2, 128, 400, 1)]       # the last two: a decode row (decode_attention_tensor_cores)


def _run(kn, gpu, hq, kvh, hd, ctx, n, **variant):
    return attention_case(kn, gpu, hq, kvh, hd, ctx, n, seed=ctx * 3 + n + hd, **variant)


@pytest.mark.parametrize("hq,kvh,hd,ctx,n", CASES)
def test_tensor_core_attention_matches_the_reference(kn, gpu, hq, kvh, hd, ctx, n):
    variants = [{}, {"rows_per_block": 3}, {"rows_per_block": 32}]        # 32 rows: up to 12 tiles on 8 warps
    # fewer splits than chunks: each split walks several chunks with a running softmax (long context)
    variants += [{"max_splits": 1}, {"max_splits": 2, "rows_per_block": 3}, {"max_splits": 4, "rows_per_block": 32}]
    if hd == 128:
        variants += [{"blocks_per_sm": 2}, {"blocks_per_sm": 2, "max_splits": 3}]
    for variant in variants:
        got, expected = _run(kn, gpu, hq, kvh, hd, ctx, n, tensor_cores=True, **variant)
        assert not np.isnan(got).any(), f"{variant}: rows left unwritten"
        what = f"attention_mma {hq}/{kvh}x{hd} ctx={ctx} n={n} {variant}"
        assert_close(got, expected, rtol=1e-4, atol=2e-4 * peak(expected), what=what, norm_rtol=1e-4)


def _same_bits_under(kernels, args, stream, switch: str, variant: dict) -> list:
    """The tensor-core attention with the launcher keyword `switch` off, then on (partial sums poisoned with NaN
    before each): every output and partial sum must be the same bits; returns [(out, part_o, part_ml)] off, on."""
    outs = []
    for on in (False, True):
        for a in (args[5], args[6], args[7]):
            a.fill(np.float32(np.nan))
        kernels.attention(*args, stream, tensor_cores=True, **{switch: on}, **variant)
        stream.synchronize()
        outs.append((args[7].get(), args[5].get(), args[6].get()))
    for what, a, b in zip(("out", "part_o", "part_ml"), *outs):
        assert np.array_equal(a, b, equal_nan=True), f"{what} differs with {switch} ({variant})"
    return outs


@pytest.mark.parametrize("arena", ["float32", "bfloat16"])
@pytest.mark.parametrize("hq,kvh,hd,ctx,n", [c for c in CASES if c[2] == 128])
def test_the_masked_softmax_entries_give_the_same_bits(kn, kn16, gpu, hq, kvh, hd, ctx, n, arena):
    """attention_mma.cu's _ma entries (KernelPlan.attention_masked_softmax: unseen slots enter the softmax as -inf
    instead of being tested) give every output and partial sum of the entries without, on both arenas, both blocks
    per SM, rows that see part of a chunk, and splits walking several chunks."""
    ga, stream = gpu
    args, arena_f32, expected = attention_inputs(ga, hq, kvh, hd, ctx, n, cap=512, seed=ctx + n, row_offset=2,
                                                 poison_partials=True)
    kernels, args, _kv16 = on_arena(ga, kn, kn16, args, arena_f32, arena)
    for variant in ({}, {"blocks_per_sm": 2}, {"max_splits": 3}, {"blocks_per_sm": 2, "max_splits": 2,
                                                                   "rows_per_block": 3}):
        outs = _same_bits_under(kernels, args, stream, "masked_softmax", variant)
        if arena == "float32":
            assert_close(outs[1][0], expected, rtol=1e-4, atol=2e-4 * peak(expected), what=f"masked {variant}",
                         norm_rtol=1e-4)


# head_dim 128 beyond the 1.5B's group of 6: a 7B-like model without grouped queries (group 1: 64-row blocks, a
# partial tile) and a group of 8
HS_CASES = [c for c in CASES if c[2] == 128] + [(4, 4, 128, 130, 9), (8, 1, 128, 100, 12)]


@pytest.mark.parametrize("arena", ["float32", "bfloat16"])
@pytest.mark.parametrize("hq,kvh,hd,ctx,n", HS_CASES)
def test_the_head_halves_entry_gives_the_same_bits(kn, kn16, gpu, hq, kvh, hd, ctx, n, arena):
    """attention_mma.cu's _hs entry (KernelPlan.attention_head_halves: two warps per tile, each keeping half of the
    head's P.V sums) gives every output and partial sum of the _b2 entry it splits, on both arenas, with its own
    row blocks and with the _b2 entry's, with splits walking several chunks, and with blocks of more query vectors
    than one round of 4 tiles serves (16 and 32 rows at a group of 6: two and three rounds, a chunk gathered again
    after the last one of the round before)."""
    ga, stream = gpu
    args, arena_f32, expected = attention_inputs(ga, hq, kvh, hd, ctx, n, cap=512, seed=ctx + n + 1, row_offset=2,
                                                 poison_partials=True)
    kernels, args, _kv16 = on_arena(ga, kn, kn16, args, arena_f32, arena)
    for variant in ({}, {"max_splits": 3}, {"max_splits": 1}, {"rows_per_block": 3}, {"rows_per_block": 10},
                    {"rows_per_block": 16}, {"rows_per_block": 16, "max_splits": 3},
                    {"rows_per_block": 32, "max_splits": 2}):
        outs = _same_bits_under(kernels, args, stream, "head_halves", {"blocks_per_sm": 2, **variant})
        if arena == "float32":
            assert_close(outs[1][0], expected, rtol=1e-4, atol=2e-4 * peak(expected), what=f"halves {variant}",
                         norm_rtol=1e-4)


def test_tensor_core_attention_refuses_what_it_has_no_entry_for(kn, gpu):
    from vla_edge_ros.model.cuda_kernels import KernelError
    with pytest.raises(KernelError, match="head_dim 24 not in"):
        _run(kn, gpu, 4, 1, 24, 70, 3, tensor_cores=True)
    with pytest.raises(KernelError, match="no entry attention_partial_mma_hd64_b2"):
        _run(kn, gpu, 8, 1, 64, 10, 4, tensor_cores=True, blocks_per_sm=2)
    with pytest.raises(KernelError, match="query vectors per block"):
        _run(kn, gpu, 12, 2, 128, 10, 48, tensor_cores=True, rows_per_block=48)   # 288 query vectors
    with pytest.raises(KernelError, match="max_splits needs tensor_cores"):
        _run(kn, gpu, 12, 2, 128, 10, 4, max_splits=2)
    with pytest.raises(KernelError, match="no entry attention_partial_mma_hd64_b1_ma"):
        _run(kn, gpu, 8, 1, 64, 10, 4, tensor_cores=True, masked_softmax=True)
    with pytest.raises(KernelError, match="masked_softmax is an entry of attention_mma.cu"):
        _run(kn, gpu, 12, 2, 128, 10, 4, masked_softmax=True)
    with pytest.raises(KernelError, match="no entry attention_partial_mma_hd128_b1_hs"):
        _run(kn, gpu, 12, 2, 128, 10, 4, tensor_cores=True, head_halves=True)


def _cycles_under(tiny_weights, field: str, seed: int) -> list:
    """One bf16 cycle (graphs) of the tiny model under KernelPlan(field=False), then (field=True): [(tokens, prefill
    logits)] in that order, each plan checked to be in effect."""
    from vla_edge_ros.model.cuda_backend import CudaBackend
    from vla_edge_ros.model.cuda_kernel_plan import KernelPlan
    spec, weights = tiny_weights
    results = []
    for on in (False, True):
        b = CudaBackend(spec, weights, 300, "bfloat16", plan=KernelPlan(**{field: on}))
        try:
            assert getattr(b.kernel_plan, field) == on
            results.append(one_cycle(b, spec.vocab_size, n_ctx=100, n_prefill=32, seed=seed))
        finally:
            b.close()
    return results


def test_a_backend_with_tensor_core_attention_gives_the_same_cycle(tiny_weights):
    """A bf16 cycle (graphs) with its prefill attention on the tensor cores picks the same tokens as with
    attention_tiled.cu, and its prefill logits agree to the split's rounding."""
    (tokens_off, logits_off), (tokens_on, logits_on) = _cycles_under(tiny_weights, "tensor_core_attention", seed=4)
    np.testing.assert_array_equal(tokens_off, tokens_on)
    assert_close(logits_on, logits_off, rtol=1e-4, atol=1e-4 * peak(logits_off), what="prefill logits")


def test_the_decode_row_on_the_tensor_cores_picks_the_same_tokens(tiny_weights):
    """KernelPlan.decode_attention_tensor_cores (off by default until measured) sends the decode row's attention
    through attention_mma.cu: the cycle's action tokens (decode steps captured as graphs) are those of
    attention_decode.cu. It follows the prefill attention: without the tensor cores there, not here either."""
    from vla_edge_ros.model.cuda_backend import CudaBackend
    from vla_edge_ros.model.cuda_kernel_plan import KernelPlan
    (tokens_off, _), (tokens_on, _) = _cycles_under(tiny_weights, "decode_attention_tensor_cores", seed=5)
    np.testing.assert_array_equal(tokens_off, tokens_on)
    spec, weights = tiny_weights
    b = CudaBackend(spec, weights, 64, "bfloat16",
                    plan=KernelPlan(tensor_core_attention=False, decode_attention_tensor_cores=True))
    try:
        assert b.kernel_plan.decode_attention_tensor_cores is False
    finally:
        b.close()


def test_fp32_weights_keep_the_fp32_attention(tiny_weights):
    """tensor_core_attention is a bf16 switch: an fp32 backend asked for it keeps attention_tiled.cu."""
    from vla_edge_ros.model.cuda_backend import CudaBackend
    from vla_edge_ros.model.cuda_kernel_plan import KernelPlan
    spec, weights = tiny_weights
    b = CudaBackend(spec, weights, 64, "float32", plan=KernelPlan(tensor_core_attention=True))
    try:
        assert b.kernel_plan.tensor_core_attention is False
    finally:
        b.close()
