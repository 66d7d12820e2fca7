"""Inputs and runs that several GPU test files share, so each file keeps only its own variants and bounds.

attention_inputs: random fp32 K/V in an arena behind a permuted slot list (holes everywhere, order unrelated
                to slot number), q rows attending causally after a cached context, the output poisoned
                with NaN: the arguments of one attention launch and kernel_reference.attention_ref's answer.
attention_case: one `CudaKernels.attention` call on them; returns (ours, the reference).
kv_round_trip:  one kv_gather into a poisoned staging buffer, one kv_scatter back to other slots, each checked bit
                for bit against kernel_reference; for an arena of any element type.
one_cycle:      a backend's context forward, then one cycle (prefill + 8 decode steps, argmax over the 256
                action bins; on the device for a CudaBackend, a host loop for the numpy one); returns (tokens,
                prefill logits).
"""
import numpy as np

from vla_edge_ros.model import kernel_reference as ref


def attention_inputs(ga, hq, kvh, hd, ctx, n, cap, seed, row_offset, poison_partials=False):
    """-> (the launch arguments of CudaKernels.attention / attention_decode up to `stream`, the device K/V arena
    they point into (keep it alive), the reference output). poison_partials: the split partial sums start as
    NaN too (else zeros)."""
    from vla_edge_ros.model.cuda_attention_launchers import ATTN_CHUNK
    rng = np.random.default_rng(seed)
    n_splits = -(-cap // ATTN_CHUNK)
    k = rng.standard_normal((kvh, cap, hd)).astype(np.float32)
    v = rng.standard_normal((kvh, cap, hd)).astype(np.float32)
    qkv = (rng.standard_normal((n, (hq + 2 * kvh) * hd)) * 2).astype(np.float32)
    attend = rng.permutation(cap)[:ctx + row_offset + n].astype(np.int32)
    ctl = np.array([row_offset, ctx, 0, -1], np.int32)
    out = ga.to_gpu(np.full((n, hq * hd), np.nan, np.float32))
    fill = np.nan if poison_partials else 0.0
    part_o = ga.to_gpu(np.full((n, hq, n_splits, hd), fill, np.float32))
    part_ml = ga.to_gpu(np.full((n, hq, n_splits, 2), fill, np.float32))
    k_d, v_d = ga.to_gpu(k), ga.to_gpu(v)
    scale = hd ** -0.5
    args = (ga.to_gpu(qkv), int(k_d.gpudata), int(v_d.gpudata), ga.to_gpu(attend), ga.to_gpu(ctl), part_o, part_ml,
            out, n, hq, kvh, hd, cap, n_splits, scale)
    return args, (k_d, v_d), ref.attention_ref(qkv, k, v, attend, ctl, hq, kvh, hd, scale)


def attention_case(kn, gpu, hq, kvh, hd, ctx, n, seed, **variant):
    ga, stream = gpu
    args, _arena, expected = attention_inputs(ga, hq, kvh, hd, ctx, n, cap=512, seed=seed, row_offset=2)
    kn.attention(*args, stream, **variant)
    stream.synchronize()
    return args[7].get(), expected


def kv_round_trip(kernels, gpu, k, v, n_max, poison):
    """k, v: host arenas [layers, KVH, capacity, hd] of the kernels' element type; poison: the staging fill.
    Returns the device arenas (after the scatter) and the staging buffer."""
    ga, stream = gpu
    layers, kvh, cap, hd = k.shape
    k_d, v_d = ga.to_gpu(k), ga.to_gpu(v)
    slots = np.array([cap - 1, 0, 17, 5, 22], np.int32)
    staging = ga.to_gpu(np.full((2, layers, n_max, kvh * hd), poison, k.dtype))
    kernels.kv_move("gather", k_d, v_d, ga.to_gpu(slots), staging, 5, layers, kvh, cap, hd, stream)
    stream.synchronize()
    np.testing.assert_array_equal(staging.get()[:, :, :5], ref.kv_gather_ref(k, v, slots))
    dst = np.array([1, 2, 3, 4, 6], np.int32)
    kernels.kv_move("scatter", k_d, v_d, ga.to_gpu(dst), staging, 5, layers, kvh, cap, hd, stream)
    stream.synchronize()
    e_k, e_v = ref.kv_scatter_ref(k, v, dst, staging.get())
    np.testing.assert_array_equal(k_d.get(), e_k)
    np.testing.assert_array_equal(v_d.get(), e_v)
    return k_d, v_d, staging


def one_cycle(backend, vocab_size, n_ctx, n_prefill, seed):
    rng = np.random.default_rng(seed)
    ctx_ids = rng.integers(0, vocab_size, size=n_ctx)
    p_ids = rng.integers(0, vocab_size, size=n_prefill)
    b, end = backend, n_ctx + n_prefill
    b.forward(b.embed(ctx_ids), np.arange(n_ctx), np.arange(n_ctx), np.array([], np.int64), logits="none")
    tokens = b.run_cycle_tokens(b.embed(p_ids), np.arange(n_ctx, end), np.arange(n_ctx, end), np.arange(n_ctx),
                                np.arange(end, end + 8), np.arange(end, end + 8), vocab_size - 256, 9, 256)
    return tokens, b.prefill_logits()
