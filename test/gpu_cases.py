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
cycles_match_host_greedy: three device cycles (graphs captured once, replayed after) against the numpy
                backend's host greedy loop and the same cycles launched eagerly (bf16 or INT4 weights alike).
qkv_rope_case:  one decode GEMV in QKV_ROPE mode (bf16 or INT4 weights) against RMSNorm -> the natural q|k|v
                projection + bias -> rope_store_ref: q in the output, k and v in their arena slots.
int4_quantized, int4_device: a random matrix quantized by model/int4.py (packed, scales, w_hat), and its upload.
int4_gemv_modes_case: one-row INT4 decode GEMVs (gemv_int4.cu: STORE with bias, ADD, a row slice, SWIGLU on the
                interleaved gate/up) against kernel_reference on w_hat, with or without the RMSNorm prologue.
items_loop_case: a decode GEMV's looped-items launch against a block per item, bit for bit, in STORE (norm,
                bias), ADD and SWIGLU (norm, ragged out_cols), for any weight format the launcher takes.
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


def on_arena(ga, kn, kn16, args, arena_f32, arena):
    """(kernels, args, arrays to keep alive) of attention_inputs' case on an arena of `arena`'s type: for bfloat16 the
    kernels built for it and the case's K/V rounded to bf16 in arrays of their own (held by the caller)."""
    if arena == "float32":
        return kn, args, ()
    from vla_edge_ros.model.weights import float32_to_bf16_bits
    k16, v16 = (ga.to_gpu(float32_to_bf16_bits(a.get())) for a in arena_f32)
    return kn16, (args[0], int(k16.gpudata), int(v16.gpudata), *args[3:]), (k16, v16)


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


def host_greedy(b, x, pos, w_slots, ctx_slots, d_slots, d_pos, lo, n_tokens):
    """The restricted-argmax tokens of one cycle by host forwards: the prefill, then n_tokens - 1 decode steps."""
    logits = b.forward(x, pos, w_slots, ctx_slots).logits[0]
    tokens = [lo + int(np.argmax(logits[lo:]))]
    ctx = np.concatenate([ctx_slots, w_slots])
    for j in range(n_tokens - 1):
        logits = b.forward(b.embed(np.array([tokens[-1]])), d_pos[j:j + 1], d_slots[j:j + 1], ctx).logits[0]
        ctx = np.concatenate([ctx, d_slots[j:j + 1]])
        tokens.append(lo + int(np.argmax(logits[lo:])))
    return np.array(tokens)


def cycles_match_host_greedy(cuda, ref_backend, eager, vocab_size, n_prefill, exact, n_bins=256):
    """Three cycles of n_prefill rows + 8 decode steps after a 50-row context (300 slots, holes): the captured
    graphs pick what the eager launches pick, and what the host greedy loop of `ref_backend` picks: all 9
    tokens when `exact` (fp32), at least 7 of 9 otherwise (bf16 rounding may flip a near tie)."""
    rng = np.random.default_rng(6)
    lo = vocab_size - n_bins
    ctx_ids = rng.integers(0, vocab_size, size=50)
    ctx_slots = rng.permutation(300)[:50]
    for b in (cuda, ref_backend, eager):
        b.forward(b.embed(ctx_ids), np.arange(50), ctx_slots, np.array([], np.int64), logits="none")
    for cycle in range(3):                                    # graphs captured once, replayed after
        p_ids = rng.integers(0, vocab_size, size=n_prefill)
        free = np.setdiff1d(np.arange(300), ctx_slots)
        w_slots, d_slots = free[:n_prefill], free[n_prefill:n_prefill + 8]
        pos = 50 + np.arange(n_prefill) + cycle * 100
        d_pos = pos[-1] + 1 + np.arange(8)
        expected = host_greedy(ref_backend, ref_backend.embed(p_ids), pos, w_slots, ctx_slots, d_slots, d_pos, lo, 9)
        got = cuda.run_cycle_tokens(cuda.embed(p_ids), pos, w_slots, ctx_slots, d_slots, d_pos, lo, 9, n_bins)
        got_eager = eager.run_cycle_tokens(eager.embed(p_ids), pos, w_slots, ctx_slots, d_slots, d_pos, lo, 9,
                                           n_bins)
        np.testing.assert_array_equal(got, got_eager)
        agree = np.mean(got == expected)
        assert agree == 1.0 if exact else agree >= 7 / 9, (got, expected)


def items_loop_case(kn, gpu, W, rows, k, rng, blocks_per_sm):
    """CudaKernels.gemv with `W` (bf16 bits or an Int4Matrix) looping its 8-row items over blocks_per_sm blocks
    per SM writes what a block per item writes, bit for bit: STORE with a bias and the RMSNorm prologue, ADD,
    SWIGLU with ragged outputs, and a last item with missing rows (rows - 5, rows - 8)."""
    from vla_edge_ros.model.cuda_kernels import MODE_ADD, MODE_STORE, MODE_SWIGLU
    ga, stream = gpu
    x = ga.to_gpu((rng.standard_normal((1, k)) * 2).astype(np.float32))
    norm_w = ga.to_gpu(rng.standard_normal(k).astype(np.float32))
    bias = ga.to_gpu(rng.standard_normal(rows).astype(np.float32))
    base = rng.standard_normal((1, rows)).astype(np.float32)
    cases = [("STORE", MODE_STORE, dict(norm_w=norm_w, eps=1e-6, bias=bias), rows - 5, None),
             ("ADD", MODE_ADD, {}, rows, base),
             ("SWIGLU", MODE_SWIGLU, dict(norm_w=norm_w, eps=1e-6, out_cols=(rows - 8) // 2 - 3), rows - 8, None)]
    for what, mode, kw, n_rows, init in cases:
        got = []
        for bps in (0, blocks_per_sm):
            out = ga.to_gpu(init.copy() if init is not None else np.full((1, rows), np.nan, np.float32))
            kn.gemv(W, x, out, mode, stream, rows=n_rows, blocks_per_sm=bps, **kw)
            stream.synchronize()
            got.append(out.get())
        assert np.isfinite(got[0][:, :kw.get("out_cols", n_rows)]).all(), f"{what}: outputs left unwritten"
        np.testing.assert_array_equal(got[1], got[0], err_msg=f"{what}: looped items differ from a block per item")


def qkv_rope_case(kn, gpu, W, w_ref, hq, kvh, hd, rng, norm, case, close):
    """CudaKernels.gemv in QKV_ROPE mode with `W` (the device weights, rows in qkv_rope_row_order) on a fresh
    bias, activation row, positions and slots drawn from `rng`, against kernel_reference on `w_ref` (the same
    weights as float32, natural row order [q|k|v rows, hidden]): q in the output (its other columns untouched),
    k and v stored after RoPE in their arena slots. close(got, expected, what): the calling file's bound."""
    from vla_edge_ros.model import weight_layouts as layouts
    from vla_edge_ros.model.cuda_kernels import MODE_QKV_ROPE, MODE_STORE
    from vla_edge_ros.model.cuda_projection_launchers import RopeTarget
    ga, stream = gpu
    qkv_rows, hidden = w_ref.shape
    cap, row_offset = 64, 3
    bias = rng.standard_normal(qkv_rows).astype(np.float32)
    x = (rng.standard_normal((1, hidden)) * 2).astype(np.float32)
    norm_w = rng.standard_normal(hidden).astype(np.float32) if norm else None
    pos = rng.integers(0, 30000, size=row_offset + 1).astype(np.int32)
    slots = rng.permutation(cap)[:row_offset + 1].astype(np.int32)
    inv = layouts.rope_inv_freq(1e6, hd)
    ctl = np.array([row_offset, 0, 0, -1], np.int32)
    k0 = np.full((kvh, cap, hd), 7.0, np.float32)
    k_d, v_d = ga.to_gpu(k0), ga.to_gpu(k0.copy())
    out = ga.to_gpu(np.full((1, qkv_rows), np.nan, np.float32))
    rope = RopeTarget(ga.to_gpu(pos), ga.to_gpu(slots), ga.to_gpu(ctl), ga.to_gpu(inv), int(k_d.gpudata),
                      int(v_d.gpudata), hq, kvh, hd, cap)
    kn.gemv(W, ga.to_gpu(x), out, MODE_QKV_ROPE, stream, norm_w=ga.to_gpu(norm_w) if norm else None, eps=1e-6,
            bias=ga.to_gpu(bias), rope=rope)
    stream.synchronize()
    pre = ref.folded_projection_ref(w_ref, x, MODE_STORE, norm_w=norm_w, eps=1e-6, bias=bias)   # [1, q+2kv]
    e_qkv, e_k, e_v = ref.rope_store_ref(pre, pos, slots, ctl, inv, k0, k0.copy(), hq, kvh, hd)
    got = out.get()
    close(got[:, :hq * hd], e_qkv[:, :hq * hd], f"{case} q")
    assert np.isnan(got[:, hq * hd:]).all(), "QKV_ROPE writes only the q columns of its output"
    close(k_d.get(), e_k, f"{case} k cache")
    close(v_d.get(), e_v, f"{case} v cache")


def int4_quantized(rng, rows, k, group):
    """(packed, scales, w_hat float32) of a random [rows, k] matrix quantized in groups of `group` (model/int4.py)."""
    from vla_edge_ros.model import int4
    packed, scales = int4.quantize((rng.standard_normal((rows, k)) / np.sqrt(k)).astype(np.float32), group)
    return packed, scales, int4.dequantize(packed, scales)


def int4_device(ga, packed, scales, group):
    """The Int4Matrix of packed / scales on the device."""
    from vla_edge_ros.model.cuda_int4_launchers import Int4Matrix
    return Int4Matrix(ga.to_gpu(np.ascontiguousarray(packed)), ga.to_gpu(np.ascontiguousarray(scales).view(np.uint16)),
                      group)


def int4_projection_variant_case(gpu, launch, rows, k, n, group, rng, case, base, variant):
    """An INT4 projection of many rows with the launcher keywords `variant` against `base` (launch(W, x, out, n,
    mode, stream, **keywords): CudaKernels.projection or projection_int4_staged) on a random [rows, k] matrix in
    groups of `group` and n activation rows: STORE with a bias, ADD in one K part and SWIGLU (gate / up interleaved,
    ragged) bit for bit; ADD over the default K split to rounding (its atomics land in any order)."""
    from kernel_compare import assert_close, peak
    from vla_edge_ros.model import weight_layouts as layouts
    from vla_edge_ros.model.cuda_kernels import MODE_ADD, MODE_STORE, MODE_SWIGLU
    ga, stream = gpu
    packed, scales, _ = int4_quantized(rng, rows, k, group)
    W = int4_device(ga, packed, scales, group)
    x_dev = ga.to_gpu(rng.standard_normal((n, k)).astype(np.float32))
    bias = ga.to_gpu(rng.standard_normal(rows).astype(np.float32))
    out_base = rng.standard_normal((n, rows)).astype(np.float32)

    def both(W, out_like, mode, **kw):
        outs = []
        for choice in (base, variant):
            out = ga.to_gpu(out_like)
            launch(W, x_dev, out, n, mode, stream, **choice, **kw)
            stream.synchronize()
            outs.append(out.get())
        return outs

    plain, other = both(W, np.full((n, rows), np.nan, np.float32), MODE_STORE, bias=bias)
    assert np.isfinite(plain).all(), f"{case}: STORE left outputs unwritten"
    np.testing.assert_array_equal(other, plain, err_msg=f"{case} STORE")
    plain, other = both(W, out_base, MODE_ADD, ksplit=1)
    np.testing.assert_array_equal(other, plain, err_msg=f"{case} ADD ksplit=1")
    plain, other = both(W, out_base, MODE_ADD)
    assert_close(other, plain, rtol=1e-6, atol=1e-6 * peak(plain), what=f"{case} ADD, default split")
    if rows % 16 == 0:
        inter, half = rows // 2 - 3, rows // 2
        gu_packed, gu_scales = layouts.interleave_gate_up_int4((packed[:inter], scales[:inter]),
                                                               (packed[half:half + inter], scales[half:half + inter]))
        plain, other = both(int4_device(ga, gu_packed, gu_scales, group), np.full((n, inter), np.nan, np.float32),
                            MODE_SWIGLU, out_cols=inter)
        np.testing.assert_array_equal(other, plain, err_msg=f"{case} SWIGLU")


def int4_gemv_modes_case(kn, gpu, rows, k, group, norm, rng, case, close):
    """CudaKernels.gemv on a random INT4 [rows, k] matrix in groups of `group`, activation row 1 of 3, with the
    RMSNorm prologue if `norm`, against kernel_reference on w_hat: STORE with a bias, ADD onto a random row, STORE
    of the row slice [17, 17 + rows / 2), and where rows % 16 == 0 SWIGLU on gate / up interleaved with a ragged
    last tile. close(got, expected, what): the calling file's bound."""
    from vla_edge_ros.model import weight_layouts as layouts
    from vla_edge_ros.model.cuda_kernels import MODE_ADD, MODE_STORE, MODE_SWIGLU
    ga, stream = gpu
    packed, scales, w_hat = int4_quantized(rng, rows, k, group)
    W = int4_device(ga, packed, scales, group)
    x = (rng.standard_normal((3, k)) * 2).astype(np.float32)            # row 1 is the one projected
    norm_w = rng.standard_normal(k).astype(np.float32) if norm else None
    nw = ga.to_gpu(norm_w) if norm else None
    bias = rng.standard_normal(rows).astype(np.float32)
    eps, x_dev = 1e-6, ga.to_gpu(x)

    def nan(shape):
        return ga.to_gpu(np.full(shape, np.nan, np.float32))

    out = nan((1, rows))
    kn.gemv(W, x_dev, out, MODE_STORE, stream, norm_w=nw, eps=eps, bias=ga.to_gpu(bias), x_row0=1)
    stream.synchronize()
    close(out.get(), ref.folded_projection_ref(w_hat, x[1:2], MODE_STORE, norm_w=norm_w, eps=eps, bias=bias),
          f"{case} STORE")

    base = rng.standard_normal((1, rows)).astype(np.float32)
    acc = ga.to_gpu(base)
    kn.gemv(W, x_dev, acc, MODE_ADD, stream, norm_w=nw, eps=eps, x_row0=1)
    stream.synchronize()
    close(acc.get(), ref.folded_projection_ref(w_hat, x[1:2], MODE_ADD, out=base, norm_w=norm_w, eps=eps),
          f"{case} ADD")

    lo, n = 17, rows // 2                                                # a slice of rows [w_row0, w_row0 + n)
    out = nan((1, n))
    kn.gemv(W, x_dev, out, MODE_STORE, stream, norm_w=nw, eps=eps, w_row0=lo, rows=n, x_row0=1)
    stream.synchronize()
    close(out.get(), ref.folded_projection_ref(w_hat[lo:lo + n], x[1:2], MODE_STORE, norm_w=norm_w, eps=eps),
          f"{case} STORE rows [{lo}, {lo + n})")

    if rows % 16 == 0:
        inter = rows // 2 - 3                                            # ragged: the last tile has padding rows
        gate = (packed[:inter], scales[:inter])
        up = (packed[rows // 2: rows // 2 + inter], scales[rows // 2: rows // 2 + inter])
        gu_packed, gu_scales = layouts.interleave_gate_up_int4(gate, up)
        act = nan((1, inter))
        kn.gemv(int4_device(ga, gu_packed, gu_scales, group), x_dev, act, MODE_SWIGLU, stream, norm_w=nw, eps=eps,
                out_cols=inter, x_row0=1)
        stream.synchronize()
        w_gu = layouts.interleave_gate_up(w_hat[:inter], w_hat[rows // 2: rows // 2 + inter])
        close(act.get(), ref.folded_projection_ref(w_gu, x[1:2], MODE_SWIGLU, norm_w=norm_w, eps=eps,
                                                   out_cols=inter), f"{case} SWIGLU")
