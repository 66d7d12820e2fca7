"""NumpyBackend against HuggingFace transformers (fp32, eager) on the seeded tiny, llama-tiny and llama-tiny-mha
(multi-head attention, as Llama-2-7B) models."""

import numpy as np
import pytest

from vla_edge_ros.model import hf_oracle
from vla_edge_ros.model.factory import create_backend, load_model
from vla_edge_ros.model.make_model import make_model
from vla_edge_ros.model.numpy_backend import NumpyBackend
from vla_edge_ros.model.weights import round_to_bf16

KINDS = ("tiny", "llama-tiny", "llama-tiny-mha")
RTOL, ATOL = 1e-4, 2e-5          # fp32 vs fp32: only summation order differs
EMPTY = np.zeros(0, dtype=np.int64)


@pytest.fixture(scope="module", autouse=True)
def torch_one_thread():
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)   # shared CPU: torch's spinning workers would slow the numpy side
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """kind -> (spec, weights, tokenizer, HF model), generated once."""
    out = {}
    for kind in KINDS:
        model_dir = make_model(kind, tmp_path_factory.mktemp(kind), seed=11)
        spec, weights, tokenizer = load_model(model_dir)
        out[kind] = (spec, weights, tokenizer, hf_oracle.load_hf_model(model_dir), model_dir)
    return out


def _ids(tokenizer, text="You control a robot arm. Answer each camera frame with one action. pick up the red block"):
    return np.asarray(tokenizer.encode(text).ids, dtype=np.int64)


def _close(ours, theirs, what):
    np.testing.assert_allclose(ours, theirs, rtol=RTOL, atol=ATOL, err_msg=what)


@pytest.mark.parametrize("kind", KINDS)
def test_full_forward_matches_hf_logits_and_every_hidden_state(models, kind):
    spec, weights, tok, hf, _ = models[kind]
    ids = _ids(tok)
    n = len(ids)
    backend = NumpyBackend(spec, weights, capacity=n)
    ours = backend.forward(backend.embed(ids), np.arange(n), np.arange(n), EMPTY, logits="all", return_hidden=True)
    ref = hf_oracle.hf_forward(hf, ids)
    assert ours.logits.shape == ref.logits.shape == (n, spec.vocab_size)
    _close(ours.logits, ref.logits, "logits")
    assert len(ours.hidden_states) == len(ref.hidden_states) == spec.num_layers + 1
    for layer, (a, b) in enumerate(zip(ours.hidden_states, ref.hidden_states)):
        _close(a, b, f"hidden state {layer}")
    # the layers must actually do something, or the comparison above proves little
    assert np.abs(ref.hidden_states[-2] - ref.hidden_states[0]).max() > 0.5


@pytest.mark.parametrize("kind", KINDS)
def test_prefill_then_decode_equals_one_full_forward(models, kind):
    spec, weights, tok, hf, _ = models[kind]
    ids = _ids(tok)
    n, steps = len(ids), 4
    backend = NumpyBackend(spec, weights, capacity=n)
    head = n - steps
    rows = [backend.forward(backend.embed(ids[:head]), np.arange(head), np.arange(head), EMPTY).logits[-1]]
    for pos in range(head, n - 1):
        step = backend.forward(backend.embed(ids[pos:pos + 1]), np.array([pos]), np.array([pos]), np.arange(pos))
        assert step.logits.shape == (1, spec.vocab_size)
        rows.append(step.logits[0])
    full = hf_oracle.hf_forward(hf, ids).logits[head - 1:n - 1]     # predictions for the same positions
    _close(np.stack(rows), full, "decode-step logits vs HF full forward")


@pytest.mark.parametrize("kind", KINDS)
def test_chunked_prefill_equals_one_prefill(models, kind):
    spec, weights, tok, _, _ = models[kind]
    ids = _ids(tok)
    n = len(ids)
    backend = NumpyBackend(spec, weights, capacity=n)
    one = backend.forward(backend.embed(ids), np.arange(n), np.arange(n), EMPTY, logits="all", return_hidden=True)
    cuts = [0, 5, 6, n]     # chunks of 5, 1 and the rest
    logits, hidden = [], []
    for lo, hi in zip(cuts[:-1], cuts[1:]):
        r = backend.forward(backend.embed(ids[lo:hi]), np.arange(lo, hi), np.arange(lo, hi), np.arange(lo),
                            logits="all", return_hidden=True)
        logits.append(r.logits)
        hidden.append(r.hidden_states[-1])
    _close(np.concatenate(logits), one.logits, "chunked logits")
    _close(np.concatenate(hidden), one.hidden_states[-1], "chunked final hidden")


@pytest.mark.parametrize("kind", KINDS)
def test_slot_list_with_holes_equals_dense_forward_with_same_positions(models, kind):
    spec, weights, tok, hf, _ = models[kind]
    ids = _ids(tok)
    context_ids, new_ids = ids[:12], ids[12:17]
    # logical order with gaps in the positions (as after evictions)
    context_pos = np.array([0, 1, 2, 3, 40, 41, 42, 43, 90, 91, 92, 93])
    new_pos = np.arange(150, 155)
    capacity = 48
    rng = np.random.default_rng(7)
    physical = rng.permutation(capacity)
    context_slots, new_slots, garbage_slots = physical[:12], physical[12:17], physical[17:]
    backend = NumpyBackend(spec, weights, capacity=capacity)
    # garbage everywhere first, so an attended hole would change the result
    noise = (rng.standard_normal((capacity, spec.hidden_size)) * 3).astype(np.float32)
    backend.forward(noise, rng.integers(0, 500, capacity), np.arange(capacity), EMPTY, logits="none")
    backend.forward(backend.embed(context_ids), context_pos, context_slots, EMPTY, logits="none")
    backend.forward(noise[:len(garbage_slots)], np.arange(len(garbage_slots)), garbage_slots, EMPTY, logits="none")
    shuffled_context = context_slots[rng.permutation(12)]       # attention must not depend on slot order
    ours = backend.forward(backend.embed(new_ids), new_pos, new_slots, shuffled_context, logits="all",
                           return_hidden=True)
    ref = hf_oracle.hf_forward(hf, np.concatenate([context_ids, new_ids]),
                               position_ids=np.concatenate([context_pos, new_pos]))
    _close(ours.logits, ref.logits[12:], "logits with holes")
    for layer, (a, b) in enumerate(zip(ours.hidden_states, ref.hidden_states)):
        _close(a, b[12:], f"hidden state {layer} with holes")
    # and the gaps matter: contiguous positions give different logits
    dense = hf_oracle.hf_forward(hf, np.concatenate([context_ids, new_ids])).logits[12:]
    assert np.abs(dense - ref.logits[12:]).max() > 1e-3


def test_copy_slots_moves_kv_between_slots(models):
    spec, weights, tok, _, _ = models["llama-tiny"]
    ids = _ids(tok)[:10]
    backend = NumpyBackend(spec, weights, capacity=32)
    backend.forward(backend.embed(ids[:9]), np.arange(9), np.arange(9), EMPTY, logits="none")
    expected = backend.forward(backend.embed(ids[9:]), np.array([9]), np.array([9]), np.arange(9)).logits
    backend.copy_slots(np.arange(9), np.arange(20, 29))
    backend.forward(np.ones((9, spec.hidden_size), np.float32), np.arange(9), np.arange(9), EMPTY, logits="none")
    moved = backend.forward(backend.embed(ids[9:]), np.array([9]), np.array([30]), np.arange(20, 29)).logits
    np.testing.assert_array_equal(moved, expected)


def test_logits_modes_and_factory(models):
    spec, _, tok, _, model_dir = models["tiny"]
    backend = create_backend("numpy", model_dir, capacity=64)
    ids = _ids(tok)[:9]
    args = (backend.embed(ids), np.arange(9), np.arange(9), EMPTY)
    all_rows = backend.forward(*args, logits="all").logits
    last = backend.forward(*args, logits="last")
    none = backend.forward(*args, logits="none")
    assert all_rows.shape == (9, spec.vocab_size) and last.logits.shape == (1, spec.vocab_size)
    np.testing.assert_allclose(last.logits[0], all_rows[-1], rtol=1e-5, atol=1e-6)   # GEMV vs GEMM rounding
    assert none.logits is None and none.hidden_states == []


def test_memory_bytes_counts_weights_and_arena(models):
    spec, weights, _, _, _ = models["llama-tiny"]
    small, large = NumpyBackend(spec, weights, 100), NumpyBackend(spec, weights, 300)
    assert large.memory_bytes() - small.memory_bytes() == spec.kv_bytes_per_token(4) * 200
    assert small.memory_bytes() >= weights.nbytes() + spec.kv_bytes_per_token(4) * 100


def test_memory_bytes_counts_a_bf16_arena_at_two_bytes_per_element(models):
    spec, weights, _, _, _ = models["llama-tiny"]
    small, large = (NumpyBackend(spec, weights, n, kv_dtype="bfloat16") for n in (100, 300))
    assert large.memory_bytes() - small.memory_bytes() == spec.kv_bytes_per_token(2) * 200
    # Same weights, half the arena: a fp32 arena of 100 slots minus a bf16 one is half the fp32 arena.
    assert NumpyBackend(spec, weights, 100).memory_bytes() - small.memory_bytes() == spec.kv_bytes_per_token(2) * 100


def _kv_backends(spec, weights, capacity, dtype="float32"):
    """(fp32-KV, bf16-KV) backends on the same weights."""
    return (NumpyBackend(spec, weights, capacity, dtype=dtype),
            NumpyBackend(spec, weights, capacity, dtype=dtype, kv_dtype="bfloat16"))


def test_bf16_kv_stores_the_rounded_values_of_the_fp32_kv(models):
    spec, weights, tok, _, _ = models["tiny"]
    ids = _ids(tok)
    n = len(ids)
    fp32, bf16 = _kv_backends(spec, weights, n)
    assert (fp32.kv_dtype, bf16.kv_dtype) == ("float32", "bfloat16")
    for backend in (fp32, bf16):
        backend.forward(backend.embed(ids), np.arange(n), np.arange(n), EMPTY, logits="none")
    ours, full = bf16.read_kv(np.arange(n)), fp32.read_kv(np.arange(n))   # [2, layers, n, kv_dim]
    assert ours.dtype == np.float32
    np.testing.assert_array_equal(round_to_bf16(ours), ours)              # every stored value is a bf16 value
    # Layer 0's K/V come from the inputs alone; later layers' depend on attention over rounded K/V.
    np.testing.assert_array_equal(ours[:, 0], round_to_bf16(full[:, 0]))
    assert not np.array_equal(ours[:, 0], full[:, 0])                     # the rounding changed something
    np.testing.assert_allclose(ours, full, rtol=0.05, atol=0.05)          # and nothing more than rounding did


def test_write_kv_into_a_bf16_arena_rounds_what_it_stores(models):
    spec, weights, _, _, _ = models["tiny"]
    _, bf16 = _kv_backends(spec, weights, 16)
    slots = np.array([3, 7, 11])
    kv = np.random.default_rng(5).standard_normal((2, spec.num_layers, slots.size, spec.kv_dim)).astype(np.float32)
    bf16.write_kv(slots, kv)
    np.testing.assert_array_equal(bf16.read_kv(slots), round_to_bf16(kv))
    assert not np.array_equal(round_to_bf16(kv), kv)


def test_bf16_kv_changes_the_logits_of_prefill_and_decode_but_only_a_little(models):
    """Not a no-op over a whole sequence (prefill, then decode steps reading the earlier calls' KV)."""
    spec, weights, tok, _, _ = models["tiny"]
    ids = _ids(tok)
    n, steps = len(ids), 4
    head = n - steps
    rows = []
    for backend in _kv_backends(spec, weights, n, dtype="bfloat16"):
        logits = [backend.forward(backend.embed(ids[:head]), np.arange(head), np.arange(head), EMPTY).logits[-1]]
        for pos in range(head, n - 1):
            step = backend.forward(backend.embed(ids[pos:pos + 1]), np.array([pos]), np.array([pos]), np.arange(pos))
            logits.append(step.logits[0])
        rows.append(np.stack(logits))                                     # [steps, vocab]
    fp32_kv, bf16_kv = rows
    assert np.abs(fp32_kv - bf16_kv).max() > 1e-4
    cosine = np.sum(fp32_kv * bf16_kv, axis=1) / (np.linalg.norm(fp32_kv, axis=1) * np.linalg.norm(bf16_kv, axis=1))
    assert cosine.min() > 0.999                                           # verify's bf16 logits criterion


def test_bf16_kv_backend_matches_hf_whose_attention_reads_bf16_kv(models):
    """The oracle verify --kv-dtype bfloat16 uses: much closer to a bf16 arena than HF on its fp32 K/V."""
    spec, weights, tok, hf, model_dir = models["tiny"]
    ids = _ids(tok)
    n = len(ids)
    backend = NumpyBackend(spec, weights, n, kv_dtype="bfloat16")
    ours = backend.forward(backend.embed(ids), np.arange(n), np.arange(n), EMPTY, logits="all").logits
    rounding = hf_oracle.hf_forward(hf_oracle.load_hf_model(model_dir, round_kv_to_bf16=True), ids).logits
    plain = hf_oracle.hf_forward(hf, ids).logits
    # What is left is fp32 arithmetic moving a few values across a bf16 rounding boundary.
    assert np.abs(ours - rounding).max() < 0.1 * np.abs(ours - plain).max()


def test_unknown_kv_dtype_is_refused_with_the_choices(models):
    spec, weights, _, _, model_dir = models["tiny"]
    with pytest.raises(ValueError, match=r"kv_dtype must be one of \('float32', 'bfloat16'\), got 'float16'"):
        NumpyBackend(spec, weights, 16, kv_dtype="float16")
    assert create_backend("numpy", model_dir, capacity=16, kv_dtype="bfloat16").kv_dtype == "bfloat16"


def test_bf16_backend_matches_hf_on_rounded_weights(models):
    spec, weights, tok, _, model_dir = models["tiny"]
    ids = _ids(tok)
    n = len(ids)
    backend = NumpyBackend(spec, weights, n, dtype="bfloat16")
    ours = backend.forward(backend.embed(ids), np.arange(n), np.arange(n), EMPTY, logits="all").logits
    rounded = hf_oracle.hf_forward(hf_oracle.load_hf_model(model_dir, round_to_bf16=True), ids).logits
    _close(ours, rounded, "bf16-rounded logits")
    fp32 = NumpyBackend(spec, weights, n).forward(backend.embed(ids), np.arange(n), np.arange(n), EMPTY,
                                                  logits="all").logits
    assert np.abs(fp32 - ours).max() > 1e-4      # the rounding is really applied


@pytest.mark.parametrize("bad, message", [
    (dict(x=np.zeros((3, 7), np.float32)), r"x must be \[N > 0, hidden=128\], got shape \(3, 7\)"),
    (dict(x=np.zeros((3, 128), np.float64)), "x must be float32, got float64"),
    (dict(positions=np.arange(2)), r"positions must be an integer array of shape \(3,\)"),
    (dict(write_slots=np.array([0, 1, 1])), "write_slots contains duplicates"),
    (dict(write_slots=np.array([4, 5, 6]), context_slots=np.array([6, 7])), "write_slots overlap context_slots"),
    (dict(context_slots=np.array([9, 9])), "context_slots contains duplicates"),
    (dict(write_slots=np.array([0, 1, 64])), r"write_slots out of range \[0, 64\)"),
    (dict(logits="first"), "logits must be one of"),
])
def test_bad_inputs_are_named(models, bad, message):
    spec, weights, _, _, _ = models["tiny"]
    backend = NumpyBackend(spec, weights, capacity=64)
    args = dict(x=np.zeros((3, spec.hidden_size), np.float32), positions=np.arange(3), write_slots=np.arange(3),
                context_slots=EMPTY, logits="last")
    args.update(bad)
    with pytest.raises(ValueError, match=message):
        backend.forward(**args)
    with pytest.raises(ValueError, match=r"token_ids out of range \[0, 1024\)"):
        backend.embed(np.array([1, 1024]))


@pytest.mark.parametrize("kind, kv_dtype", [("tiny", "float32"), ("llama-tiny", "float32"), ("tiny", "bfloat16")])
def test_cycle_with_the_context_gathered_once_equals_the_loop_of_forward_calls(models, kind, kv_dtype):
    """run_cycle_tokens (the context's K/V gathered once per cycle) against host_cycle.py's loop of forward calls
    (the reference): same tokens, same prefill logits, same K/V written, on a context scattered over the arena."""
    from vla_edge_ros.model.host_cycle import run_cycle_on_host
    spec, weights, _, _, _ = models[kind]
    rng = np.random.default_rng(5)
    backends = [NumpyBackend(spec, weights, capacity=256, kv_dtype=kv_dtype) for _ in range(2)]
    order = rng.permutation(256)
    context, writes, decode = order[:150], order[150:190], order[190:197]
    past = rng.standard_normal((150, spec.hidden_size)).astype(np.float32)
    x = rng.standard_normal((40, spec.hidden_size)).astype(np.float32)
    lo, n_bins = spec.vocab_size - 256, 256
    args = (x, np.arange(150, 190), writes, context, decode, np.arange(190, 197), lo, 8, n_bins)
    for b in backends:
        b.forward(past, np.arange(150), context, EMPTY, logits="none")
    reference = run_cycle_on_host(backends[0], *args)
    tokens = backends[1].run_cycle_tokens(*args)
    np.testing.assert_array_equal(tokens, reference.tokens)
    _close(backends[1].prefill_logits(), reference.prefill_logits, "prefill logits")
    written = np.concatenate([writes, decode])
    _close(backends[1].read_kv(written), backends[0].read_kv(written), "K/V written by the cycle")
    prefill_ms, decode_ms = backends[1].last_cycle_ms
    assert prefill_ms > 0 and decode_ms > 0


def test_cycle_refuses_decode_slots_that_clash_with_the_prefill(models):
    spec, weights, _, _, _ = models["tiny"]
    backend = NumpyBackend(spec, weights, capacity=64)
    x = np.zeros((3, spec.hidden_size), np.float32)
    with pytest.raises(ValueError, match="write_slots overlap context_slots|write_slots contains duplicates"):
        backend.run_cycle_tokens(x, np.arange(3), np.arange(3), np.arange(3, 10), np.array([2, 20]),
                                 np.array([3, 4]), 768, 3, 256)
    with pytest.raises(ValueError, match="2 decode steps need as many"):
        backend.run_cycle_tokens(x, np.arange(3), np.arange(3), EMPTY, np.array([20]), np.array([3]), 768, 3, 256)


def test_a_cycle_asked_to_give_up_stops_before_the_next_decode_step_with_the_tokens_so_far(models):
    """give_up (Backend.run_cycle_tokens) is asked before every decode step with (steps done, steps left, decode
    ms so far); True stops there. The tokens returned are the full cycle's first ones, for both host loops."""
    from vla_edge_ros.model.host_cycle import run_cycle_on_host
    spec, weights, _, _, _ = models["tiny"]
    rng = np.random.default_rng(6)
    x = rng.standard_normal((20, spec.hidden_size)).astype(np.float32)
    lo = spec.vocab_size - 256
    args = (x, np.arange(20), np.arange(20), EMPTY, np.arange(20, 27), np.arange(20, 27), lo, 8, 256)
    full = NumpyBackend(spec, weights, capacity=64).run_cycle_tokens(*args)
    asked = []

    def give_up(done, left, decode_ms):
        asked.append((done, left))
        assert decode_ms >= 0.0
        return done == 3
    partial = NumpyBackend(spec, weights, capacity=64).run_cycle_tokens(*args, give_up=give_up)
    assert asked == [(0, 7), (1, 6), (2, 5), (3, 4)]
    np.testing.assert_array_equal(partial, full[:4])
    on_host = run_cycle_on_host(NumpyBackend(spec, weights, capacity=64), *args, give_up=lambda done, left, ms: True)
    np.testing.assert_array_equal(on_host.tokens, full[:1])          # after the prefill: its token only
