"""Inputs and runs that several GPU test files share, so each file keeps only its own variants and bounds.

attention_case: one `CudaKernels.attention` call over random fp32 K/V behind a permuted slot list (holes
                everywhere, order unrelated to slot number), causal rows after a cached context, outputs
                poisoned with NaN; returns (ours, kernel_reference.attention_ref).
one_cycle:      a backend's context forward, then one device cycle (prefill + 8 decode steps, argmax over
                the 256 action bins); returns (tokens, prefill logits).
"""
import numpy as np

from vla_edge_ros.model import kernel_reference as ref


def attention_case(kn, gpu, hq, kvh, hd, ctx, n, seed, **variant):
    ga, stream = gpu
    from vla_edge_ros.model.cuda_kernels import ATTN_CHUNK
    rng = np.random.default_rng(seed)
    cap = 512
    n_splits = -(-cap // ATTN_CHUNK)
    k = rng.standard_normal((kvh, cap, hd)).astype(np.float32)
    v = rng.standard_normal((kvh, cap, hd)).astype(np.float32)
    qkv = (rng.standard_normal((n, (hq + 2 * kvh) * hd)) * 2).astype(np.float32)
    row_offset = 2
    attend = rng.permutation(cap)[:ctx + row_offset + n].astype(np.int32)
    ctl = np.array([row_offset, ctx, 0, -1], np.int32)
    out = ga.to_gpu(np.full((n, hq * hd), np.nan, np.float32))
    part_o = ga.zeros((n, hq, n_splits, hd), np.float32)
    part_ml = ga.zeros((n, hq, n_splits, 2), np.float32)
    k_d, v_d = ga.to_gpu(k), ga.to_gpu(v)
    scale = hd ** -0.5
    kn.attention(ga.to_gpu(qkv), int(k_d.gpudata), int(v_d.gpudata), ga.to_gpu(attend), ga.to_gpu(ctl), part_o, part_ml,
                 out, n, hq, kvh, hd, cap, n_splits, scale, stream, **variant)
    stream.synchronize()
    return out.get(), ref.attention_ref(qkv, k, v, attend, ctl, hq, kvh, hd, scale)


def one_cycle(backend, vocab_size, n_ctx, n_prefill, seed):
    rng = np.random.default_rng(seed)
    ctx_ids = rng.integers(0, vocab_size, size=n_ctx)
    p_ids = rng.integers(0, vocab_size, size=n_prefill)
    b, end = backend, n_ctx + n_prefill
    b.forward(b.embed(ctx_ids), np.arange(n_ctx), np.arange(n_ctx), np.array([], np.int64), logits="none")
    tokens = b.run_cycle_tokens(b.embed(p_ids), np.arange(n_ctx, end), np.arange(n_ctx, end), np.arange(n_ctx),
                                np.arange(end, end + 8), np.arange(end, end + 8), vocab_size - 256, 9)
    return tokens, b.prefill_logits()
