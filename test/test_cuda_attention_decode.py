"""attention_decode.cu (the decode rows' attention) against its numpy reference, and a decode step
launched with programmatic dependent launch against the same step launched ordinarily.

GPU only (marker `gpu`). Fresh random inputs per case, outputs poisoned with NaN, slot lists that are
permutations of the arena (holes everywhere, order unrelated to slot numbers), lengths on and off the
64-entry chunk edges.
"""
import numpy as np
import pytest

from gpu_cases import attention_inputs, on_arena, one_cycle

pytestmark = pytest.mark.gpu


def assert_close(got, expected, rtol, atol, what):
    """|got - expected| <= atol + rtol |expected| element by element; names the worst element."""
    assert np.all(np.isfinite(got)), f"{what}: unwritten or non-finite elements at {np.argwhere(~np.isfinite(got))[:3]}"
    err = np.abs(got.astype(np.float64) - expected)
    excess = err - (atol + rtol * np.abs(expected))
    worst = np.unravel_index(np.argmax(excess), excess.shape)
    assert excess[worst] <= 0, (f"{what}: element {worst} = {got[worst]!r}, reference {expected[worst]!r} "
                                f"(|diff| {err[worst]:.3g} > atol {atol:.3g} + rtol {rtol:.3g} |ref|)")


# (q heads, kv heads, head_dim, cached context, rows, arena capacity)
CASES = [(12, 2, 128, 4064, 1, 4104), (12, 2, 128, 300, 2, 512), (12, 2, 128, 0, 1, 512), (4, 1, 32, 60, 1, 512),
         (4, 1, 32, 61, 2, 512), (8, 1, 64, 65, 1, 512), (4, 1, 24, 70, 2, 512), (4, 2, 256, 200, 2, 512),
         (8, 8, 64, 95, 1, 200), (16, 2, 256, 127, 1, 300)]


def decode_case(ga, hq, kvh, hd, ctx, n, cap):
    """gpu_cases.attention_inputs for one attention_decode call, the split partial sums poisoned too."""
    return attention_inputs(ga, hq, kvh, hd, ctx, n, cap, seed=ctx * 7 + n + hd, row_offset=3, poison_partials=True)


@pytest.mark.parametrize("head_split", [1, 2])
@pytest.mark.parametrize("hq,kvh,hd,ctx,n,cap", CASES)
def test_attention_decode_over_slot_list_with_holes(kn, gpu, hq, kvh, hd, ctx, n, cap, head_split):
    ga, stream = gpu
    args, _arena, expected = decode_case(ga, hq, kvh, hd, ctx, n, cap)
    kn.attention_decode(*args, stream, head_split=head_split)
    stream.synchronize()
    out = args[7]
    # fp32 dot products of <= 256 terms and a softmax over <= 4k entries: the outputs are convex
    # combinations of N(0, 1) values (|out| <= ~4), so a few 1e-6 of that is rounding.
    assert_close(out.get(), expected, rtol=1e-5, atol=2e-6 * max(1.0, np.abs(expected).max()), what="attention_decode")


@pytest.mark.parametrize("max_splits", [1, 3, 7, 64])
@pytest.mark.parametrize("hq,kvh,hd,ctx,n,cap", [CASES[0], CASES[1], CASES[3], CASES[7]])
def test_fewer_splits_walk_several_chunks(kn, gpu, hq, kvh, hd, ctx, n, cap, max_splits):
    """Splits that each walk several 64-entry chunks (long context) give the reference's output, and the
    merge reads exactly the splits written: the unwritten rest of the poisoned partial sums stays out."""
    ga, stream = gpu
    args, _arena, expected = decode_case(ga, hq, kvh, hd, ctx, n, cap)
    kn.attention_decode(*args, stream, head_split=2, max_splits=max_splits)
    stream.synchronize()
    assert_close(args[7].get(), expected, rtol=1e-5, atol=2e-6 * max(1.0, np.abs(expected).max()),
                 what=f"attention_decode, at most {max_splits} splits")


@pytest.mark.parametrize("hq,kvh,hd,ctx,n,cap", [CASES[0], CASES[7], CASES[9]])
def test_head_splits_agree_bit_for_bit(kn, gpu, hq, kvh, hd, ctx, n, cap):
    """Two warps per slot group, each with half of the query heads, compute every head as one warp does."""
    ga, stream = gpu
    args, _arena, _expected = decode_case(ga, hq, kvh, hd, ctx, n, cap)
    outs = []
    for head_split in (1, 2):
        kn.attention_decode(*args, stream, head_split=head_split)
        outs.append((args[7].get(), args[5].get(), args[6].get()))
    for what, a, b in zip(("out", "part_o", "part_ml"), *outs):
        assert np.array_equal(a, b, equal_nan=True), f"{what} differs between head splits 1 and 2"


@pytest.mark.parametrize("max_splits", [None, 4])
@pytest.mark.parametrize("hq,kvh,hd,ctx,n,cap", [(8, 8, 64, 95, 1, 200), (4, 4, 128, 4064, 1, 4104),
                                                 (4, 4, 256, 130, 2, 300), (32, 32, 128, 700, 1, 768)])
def test_the_one_head_entry_gives_the_same_bits_without_grouped_queries(kn, gpu, hq, kvh, hd, ctx, n, cap, max_splits):
    """The _g1 entries (KernelPlan.decode_attention_one_head_entry; registers for one query head, for a model whose
    group is 1, as Llama-2-7B's): every output and partial sum equal to the entries for any group, which stay
    within the reference's bound; with the splits covering the arena and with 4 splits each walking many chunks."""
    ga, stream = gpu
    args, _arena, expected = decode_case(ga, hq, kvh, hd, ctx, n, cap)
    outs = []
    for head_split, one_head in ((1, True), (1, False), (2, False)):
        kn.attention_decode(*args, stream, head_split=head_split, max_splits=max_splits, one_head=one_head)
        outs.append((args[7].get(), args[5].get(), args[6].get()))
    for other in outs[1:]:
        for what, a, b in zip(("out", "part_o", "part_ml"), outs[0], other):
            assert np.array_equal(a, b, equal_nan=True), f"{what}: the one-head entry differs"
    assert_close(outs[0][0], expected, rtol=1e-5, atol=2e-6 * max(1.0, np.abs(expected).max()),
                 what="attention_decode, one-head entry")


@pytest.mark.parametrize("arena", ["float32", "bfloat16"])
@pytest.mark.parametrize("max_splits", [None, 1, 3])
@pytest.mark.parametrize("hq,kvh,hd,ctx,n,cap", [CASES[0], CASES[1], CASES[4], CASES[7], CASES[9],
                                                 (32, 32, 128, 700, 1, 768), (8, 8, 64, 95, 1, 200)])
def test_the_prefetching_entries_give_the_same_bits(kn, kn16, gpu, hq, kvh, hd, ctx, n, cap, max_splits, arena):
    """The _pf entries (KernelPlan.decode_attention_prefetch: the next pass's K/V loads issued before a pass is
    computed) walk the same passes in the same order as the entries without: every output and partial sum equal,
    on both arena types, with splits of one chunk and splits walking many (max_splits 1: one split takes the whole
    list), head_dim 256 (two float4s a lane, two passes per 8-slot group) and 2 rows; the one-head entry for a
    model without grouped queries too."""
    ga, stream = gpu
    args, arena_f32, expected = decode_case(ga, hq, kvh, hd, ctx, n, cap)
    kernels, args, _kv16 = on_arena(ga, kn, kn16, args, arena_f32, arena)
    entries = [dict(one_head=False)] + ([dict(one_head=True)] if hq == kvh else [])
    for entry in entries:
        outs = []
        for prefetch in (False, True):
            for a in (args[5], args[6], args[7]):
                a.fill(np.float32(np.nan))
            kernels.attention_decode(*args, stream, head_split=1, max_splits=max_splits, prefetch=prefetch, **entry)
            stream.synchronize()
            outs.append((args[7].get(), args[5].get(), args[6].get()))
        for what, a, b in zip(("out", "part_o", "part_ml"), *outs):
            assert np.array_equal(a, b, equal_nan=True), f"{what}: the prefetching entry ({entry}) differs"
    if arena == "float32":
        assert_close(outs[1][0], expected, rtol=1e-5, atol=2e-6 * max(1.0, np.abs(expected).max()),
                     what="attention_decode, prefetching entry")


@pytest.mark.parametrize("arena", ["float32", "bfloat16"])
@pytest.mark.parametrize("max_splits", [None, 1, 3])
@pytest.mark.parametrize("hq,kvh,hd,ctx,n,cap", [CASES[0], CASES[1], (4, 2, 32, 130, 1, 256), CASES[3], CASES[4],
                                                 (8, 2, 64, 700, 1, 768), (9, 3, 64, 200, 2, 512)])
def test_the_exact_group_entries_give_the_same_bits(kn, kn16, gpu, hq, kvh, hd, ctx, n, cap, max_splits, arena):
    """The _x<G> entries (KernelPlan.decode_attention_exact_group: no test between a warp's heads, so their chains
    interleave) fold each head with the arithmetic of the entries for any group: every output and partial sum
    equal, with two warps per slot group (even groups: 6 as the 1.5B's, 2, 4) and with one warp and the prefetch
    (also 3, SmolLM2's), on both arena types, splits of one chunk and splits walking many, one and two rows."""
    from vla_edge_ros.model.cuda_attention_launchers import exact_group_entry
    ga, stream = gpu
    args, arena_f32, expected = decode_case(ga, hq, kvh, hd, ctx, n, cap)
    kernels, args, _kv16 = on_arena(ga, kn, kn16, args, arena_f32, arena)
    compared = 0
    for head_split, prefetch in ((2, False), (1, True)):
        if not exact_group_entry(hq // kvh, hd, head_split, prefetch):
            continue
        outs = []
        for exact in (False, True):
            for a in (args[5], args[6], args[7]):
                a.fill(np.float32(np.nan))
            kernels.attention_decode(*args, stream, head_split=head_split, max_splits=max_splits, prefetch=prefetch,
                                     exact_group=exact)
            stream.synchronize()
            outs.append((args[7].get(), args[5].get(), args[6].get()))
        for what, a, b in zip(("out", "part_o", "part_ml"), *outs):
            assert np.array_equal(a, b, equal_nan=True), \
                f"{what}: the exact-group entry (head_split {head_split}, prefetch {prefetch}) differs"
        compared += 1
        if arena == "float32":
            assert_close(outs[1][0], expected, rtol=1e-5, atol=2e-6 * max(1.0, np.abs(expected).max()),
                         what=f"attention_decode, exact-group entry, head_split {head_split}")
    assert compared == (1 if hq // kvh == 3 else 2)


def test_a_cycle_with_the_exact_group_entries_picks_the_same_tokens(tmp_path):
    """The default (lab "+xg") on tiny (group 2: the _v1_h2_x2 entry) and llama-tiny (group 4: _v1_h2_x4): the captured
    cycle picks the tokens the entries for any group ("+noxg") pick, and the plan in effect names the entry;
    llama-tiny-mha (group 1) keeps its one-head entry whatever the plan asks."""
    from vla_edge_ros.bench import kernel_lab
    from vla_edge_ros.model.cuda_backend import CudaBackend
    from vla_edge_ros.model.make_model import make_model
    from vla_edge_ros.model.spec import ModelSpec
    from vla_edge_ros.model.weights import load_weights
    for kind, takes_it in (("tiny", True), ("llama-tiny", True), ("llama-tiny-mha", False)):
        path = make_model(kind, tmp_path / kind, seed=13)
        spec = ModelSpec.from_dir(path)
        b = CudaBackend(spec, load_weights(path, spec), 300, "bfloat16")
        assert b.kernel_plan.decode_attention_exact_group is takes_it        # the default where an entry exists
        exact = one_cycle(b, spec.vocab_size, n_ctx=100, n_prefill=32, seed=8)
        assert kernel_lab.apply_launch_mode(b, "plain+noxg") == "plain+noxg"     # off in effect for every model
        assert b.kernel_plan.decode_attention_exact_group is False
        any_group = one_cycle(b, spec.vocab_size, n_ctx=100, n_prefill=32, seed=8)
        np.testing.assert_array_equal(any_group[0], exact[0], err_msg=kind)
        b.close()


def test_a_model_without_grouped_queries_takes_the_one_head_entry(tmp_path):
    """KernelPlan.decode_attention_one_head_entry (the default; lab "+nog1" turns it off): llama-tiny-mha (group 1)
    takes the one-head entry with one warp per slot group, and its captured cycle picks the tokens the entries for
    any group pick; tiny (group 2) keeps those entries whatever the plan asks, so "+g1" takes no effect there."""
    from vla_edge_ros.bench import kernel_lab
    from vla_edge_ros.model.cuda_backend import CudaBackend
    from vla_edge_ros.model.make_model import make_model
    from vla_edge_ros.model.spec import ModelSpec
    from vla_edge_ros.model.weights import load_weights
    for kind, takes_it in (("llama-tiny-mha", True), ("tiny", False)):
        path = make_model(kind, tmp_path / kind, seed=11)
        spec = ModelSpec.from_dir(path)
        b = CudaBackend(spec, load_weights(path, spec), 300, "bfloat16")
        assert b.kernel_plan.decode_attention_one_head_entry is takes_it
        assert b.kernel_plan.decode_attention_head_split == (1 if takes_it else 2)
        default = one_cycle(b, spec.vocab_size, n_ctx=100, n_prefill=32, seed=6)
        assert kernel_lab.apply_launch_mode(b, "plain+nog1") == "plain+nog1"
        assert (b.kernel_plan.decode_attention_one_head_entry, b.kernel_plan.decode_attention_head_split) == (False, 2)
        without = one_cycle(b, spec.vocab_size, n_ctx=100, n_prefill=32, seed=6)
        np.testing.assert_array_equal(default[0], without[0], err_msg=kind)
        assert kernel_lab.apply_launch_mode(b, "plain+g1") == ("plain+g1" if takes_it else "plain")
        b.close()


def test_attention_decode_rejects_what_it_cannot_do(kn, gpu):
    ga, stream = gpu
    from vla_edge_ros.model.cuda_kernels import KernelError
    qkv, ctl, lst = ga.zeros((1, 1024), np.float32), ga.zeros((4,), np.int32), ga.zeros((64,), np.int32)
    part_o, part_ml, out = ga.zeros((1, 4, 2, 128), np.float32), ga.zeros((1, 4, 2, 2), np.float32), ga.zeros((1, 512), np.float32)
    with pytest.raises(KernelError, match="do not cover"):
        kn.attention_decode(qkv, 0, 0, lst, ctl, part_o, part_ml, out, 1, 4, 1, 128, 200, 2, 1.0, stream)
    with pytest.raises(KernelError, match="head_dim 130"):
        kn.attention_decode(qkv, 0, 0, lst, ctl, part_o, part_ml, out, 1, 4, 1, 130, 64, 2, 1.0, stream)
    with pytest.raises(KernelError, match="group 16"):
        kn.attention_decode(qkv, 0, 0, lst, ctl, part_o, part_ml, out, 1, 16, 1, 32, 64, 2, 1.0, stream)
    with pytest.raises(KernelError, match="max_splits 0"):
        kn.attention_decode(qkv, 0, 0, lst, ctl, part_o, part_ml, out, 1, 4, 1, 128, 64, 2, 1.0, stream, max_splits=0)
    with pytest.raises(KernelError, match="head_split 3"):
        kn.attention_decode(qkv, 0, 0, lst, ctl, part_o, part_ml, out, 1, 4, 1, 128, 64, 2, 1.0, stream, head_split=3)
    with pytest.raises(KernelError, match="one-head entry serves a group of 1"):      # group 4
        kn.attention_decode(qkv, 0, 0, lst, ctl, part_o, part_ml, out, 1, 4, 1, 128, 64, 2, 1.0, stream, one_head=True)


@pytest.mark.parametrize("programmatic", [True, False], ids=["pdl", "plain"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_device_cycles_agree_with_numpy_in_both_launch_modes(tiny_weights, programmatic, dtype):
    """The captured cycle (graphs), with the decode kernels launched programmatically or ordinarily, chooses
    the same tokens as the numpy backend stepping token by token (every token in fp32), cycle after cycle."""
    from vla_edge_ros.model.cuda_backend import CudaBackend
    from vla_edge_ros.model.cuda_kernel_plan import KernelPlan
    from vla_edge_ros.model.numpy_backend import NumpyBackend
    spec, weights = tiny_weights
    cap, lo, n_tokens = 300, spec.vocab_size - 256, 9
    cuda = CudaBackend(spec, weights, cap, dtype, plan=KernelPlan(programmatic_launch=programmatic))
    host = NumpyBackend(spec, weights, cap, dtype)
    assert (cuda.kernels.programmatic is not None) == programmatic, "launch mode not in effect"
    rng = np.random.default_rng(8)
    ctx_ids = rng.integers(0, spec.vocab_size, size=60)
    ctx_slots = rng.permutation(cap)[:60]
    for b in (cuda, host):
        b.forward(b.embed(ctx_ids), np.arange(60), ctx_slots, np.array([], np.int64), logits="none")
    agree = []
    for cycle in range(3):
        p_ids = rng.integers(0, spec.vocab_size, size=12)
        free = np.setdiff1d(np.arange(cap), ctx_slots)
        w_slots, d_slots = free[:12], free[12:20]
        pos = 60 + np.arange(12) + cycle * 40
        d_pos = pos[-1] + 1 + np.arange(8)
        got = cuda.run_cycle_tokens(cuda.embed(p_ids), pos, w_slots, ctx_slots, d_slots, d_pos, lo, n_tokens)
        logits = host.forward(host.embed(p_ids), pos, w_slots, ctx_slots).logits[0]
        expected = [lo + int(np.argmax(logits[lo:]))]
        ctx = np.concatenate([ctx_slots, w_slots])
        for j in range(n_tokens - 1):
            # teacher forcing with the device's own tokens: one early disagreement must not cascade
            logits = host.forward(host.embed(got[j:j + 1]), d_pos[j:j + 1], d_slots[j:j + 1], ctx).logits[0]
            ctx = np.concatenate([ctx, d_slots[j:j + 1]])
            expected.append(lo + int(np.argmax(logits[lo:])))
        agree.append(np.mean(got == np.array(expected)))
    assert min(agree) == 1.0 if dtype == "float32" else np.mean(agree) >= 0.9, agree
    cuda.close()
