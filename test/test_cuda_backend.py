"""The PyCUDA backend against the numpy backend on real (seeded) model snapshots.

GPU only (marker `gpu`). HuggingFace itself is the oracle of `vla-edge verify
--backend pycuda` (run by scripts/gpu_session.sh); here the numpy reference
backend checks what verify does not: holes in the slot list, prefill-then-
decode against one forward, the on-device cycle path (CUDA graphs), KV slot
moves and the VRAM ceiling.
"""
import numpy as np
import pytest

from engine_oracle import cosine
from gpu_cases import cycles_match_host_greedy
from kernel_compare import rel_norm

pytestmark = pytest.mark.gpu

BINS = 256


@pytest.fixture(scope="module", params=["tiny", "llama-tiny", "llama-tiny-mha"])
def model(request, tmp_path_factory):
    from vla_edge_ros.model.make_model import make_model
    from vla_edge_ros.model.spec import ModelSpec
    from vla_edge_ros.model.weights import load_weights
    path = make_model(request.param, tmp_path_factory.mktemp(request.param), seed=11)
    spec = ModelSpec.from_dir(path)
    return spec, load_weights(path, spec)


def _backends(model, dtype, capacity=300, **kw):
    from vla_edge_ros.model.cuda_backend import CudaBackend
    from vla_edge_ros.model.numpy_backend import NumpyBackend
    spec, weights = model
    return CudaBackend(spec, weights, capacity, dtype, **kw), NumpyBackend(spec, weights, capacity, dtype)


TOL = {"float32": 1e-5, "bfloat16": 1e-4}
# Elementwise bound on the KV the forward wrote (absolute; relative 1e-4 on top). With bf16 weights one element of
# 53760 (llama-tiny-mha, |k| = 0.047) was 1.16e-4 off on the H200 on 2026-12-04, with this session's code and with
# the code before it alike: consistent with fp32 rounding through two layers in the reference's and the kernels'
# different summation orders, not with a slot or hole error (which would be of the order of the values).
KV_ATOL = {"float32": 1e-4, "bfloat16": 2e-4}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_forward_with_holes_matches_numpy(model, dtype):
    spec = model[0]
    cuda, ref = _backends(model, dtype)
    rng = np.random.default_rng(2)
    slots = rng.permutation(300)                              # scattered slots: holes between them
    ids = rng.integers(0, spec.vocab_size, size=70)
    x = ref.embed(ids)
    np.testing.assert_array_equal(cuda.embed(ids), x)
    pos = np.arange(70) * 3 + 5                               # gaps in the positions too
    first = [b.forward(x[:40], pos[:40], slots[:40], np.array([], np.int64), logits="all", return_hidden=True)
             for b in (cuda, ref)]
    assert len(first[0].hidden_states) == spec.num_layers + 1
    for got, exp in zip(first[0].hidden_states, first[1].hidden_states):
        assert rel_norm(got, exp) < TOL[dtype]
    assert rel_norm(first[0].logits, first[1].logits) < TOL[dtype]
    # the next 30 rows attend to every other cached slot except a few evicted ones (holes in the list)
    ctx = np.delete(slots[:40], [3, 17, 18])
    second = [b.forward(x[40:], pos[40:], slots[40:70], ctx, logits="all") for b in (cuda, ref)]
    assert rel_norm(second[0].logits, second[1].logits) < TOL[dtype]
    np.testing.assert_allclose(cuda.read_kv(slots[:70]), ref_kv(ref, slots[:70]), rtol=1e-4, atol=KV_ATOL[dtype])


def ref_kv(ref, slots):
    spec = ref.spec
    return np.stack([ref._k[:, slots], ref._v[:, slots]]).reshape(2, spec.num_layers, len(slots), spec.kv_dim)


def test_prefill_then_decode_equals_one_forward(model):
    spec = model[0]
    cuda, _ = _backends(model, "float32")
    rng = np.random.default_rng(4)
    ids = rng.integers(0, spec.vocab_size, size=24)
    x = cuda.embed(ids)
    pos, slots = np.arange(24), np.arange(24) + 100
    full = cuda.forward(x, pos, slots, np.array([], np.int64), logits="all").logits
    steps = [cuda.forward(x[:16], pos[:16], slots[:16], np.array([], np.int64), logits="last").logits]
    for i in range(16, 24):
        steps.append(cuda.forward(x[i:i + 1], pos[i:i + 1], slots[i:i + 1], slots[:i], logits="last").logits)
    assert cosine(np.concatenate(steps), full[15:]) > 0.999999
    assert rel_norm(np.concatenate(steps), full[15:]) < 1e-5


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_device_cycle_tokens_match_host_greedy(model, dtype):
    """The captured prefill + decode graphs pick the same restricted-argmax tokens as the numpy backend."""
    spec = model[0]
    cuda, ref = _backends(model, dtype)
    eager, _ = _backends(model, dtype, use_graphs=False)
    cycles_match_host_greedy(cuda, ref, eager, spec.vocab_size, 12, exact=dtype == "float32", n_bins=BINS)
    # one prefill graph + one decode graph, and the layers graph of the 50-row context forward
    assert sorted(key[0] for key in cuda._graphs) == ["decode", "layers", "prefill"]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_forward_without_logits_replays_one_graph_per_row_count(model, dtype):
    """forward() without hidden states (frames written into the arena: the reconciler's steps, a RoPE re-base)
    runs its layers as a captured graph per row count; replayed with other positions, slots and context it writes
    the KV the numpy backend writes, as the next call's logits show."""
    spec = model[0]
    cuda, ref = _backends(model, dtype)
    rng = np.random.default_rng(9)
    slots = rng.permutation(300)
    for rnd in range(3):                                      # the same 32-row shape, new tables each time
        ids = rng.integers(0, spec.vocab_size, size=32)
        w = slots[32 * rnd: 32 * rnd + 32]
        ctx = slots[:32 * rnd]
        pos = np.arange(32) + 40 * rnd
        for b in (cuda, ref):
            b.forward(b.embed(ids), pos, w, ctx, logits="none")
        q = rng.integers(0, spec.vocab_size, size=1)
        q_slot, q_pos = slots[250:251], pos[-1:] + 1
        got, exp = (b.forward(b.embed(q), q_pos, q_slot, slots[:32 * rnd + 32], logits="last").logits for b in (cuda, ref))
        assert rel_norm(got, exp) < TOL[dtype], rnd
    assert sorted(key for key in cuda._graphs if key[0] == "layers") == [("layers", 1), ("layers", 32)]


def test_greedy_32_tokens_identical_in_fp32(model):
    spec = model[0]
    cuda, ref = _backends(model, "float32")
    prompt = np.random.default_rng(8).integers(0, spec.vocab_size, size=20)
    outs = []
    for b in (cuda, ref):
        logits = b.forward(b.embed(prompt), np.arange(20), np.arange(20), np.array([], np.int64)).logits[0]
        tokens = [int(np.argmax(logits))]
        for i in range(31):
            logits = b.forward(b.embed(np.array(tokens[-1:])), np.array([20 + i]), np.array([20 + i]),
                               np.arange(20 + i)).logits[0]
            tokens.append(int(np.argmax(logits)))
        outs.append(tokens)
    assert outs[0] == outs[1]


def test_copy_and_write_slots_match_numpy(model):
    cuda, ref = _backends(model, "float32", capacity=200)
    spec = model[0]
    rng = np.random.default_rng(10)
    ids = rng.integers(0, spec.vocab_size, size=30)
    for b in (cuda, ref):
        b.forward(b.embed(ids), np.arange(30), np.arange(30), np.array([], np.int64), logits="none")
    src, dst = np.arange(10, 30), np.arange(0, 20)            # overlapping sets, as a compaction does
    cuda.copy_slots(src, dst)
    ref.copy_slots(src, dst)
    np.testing.assert_allclose(cuda.read_kv(np.arange(30)), ref_kv(ref, np.arange(30)), rtol=1e-5, atol=1e-5)
    kv = rng.standard_normal((2, spec.num_layers, 3, spec.kv_dim)).astype(np.float32)
    cuda.write_kv(np.array([150, 3, 199]), kv)
    np.testing.assert_array_equal(cuda.read_kv(np.array([150, 3, 199])), kv)


def test_vram_ceiling_and_bad_inputs_are_named(model):
    from vla_edge_ros.model.cuda_backend import CudaBackend, DeviceMemoryError
    spec, weights = model
    with pytest.raises(DeviceMemoryError, match="VRAM ceiling"):
        CudaBackend(spec, weights, 300, "bfloat16", vram_ceiling_bytes=1024)
    cuda = CudaBackend(spec, weights, 64, "float32")
    x = np.zeros((2, spec.hidden_size), np.float32)
    with pytest.raises(ValueError, match="write_slots out of range"):
        cuda.forward(x, np.arange(2), np.array([0, 64]), np.array([], np.int64))
    with pytest.raises(ValueError, match="overlap context_slots"):
        cuda.forward(x, np.arange(2), np.array([0, 1]), np.array([1, 5]))
    with pytest.raises(ValueError, match="x must be float32"):
        cuda.forward(x.astype(np.float64), np.arange(2), np.array([0, 1]), np.array([], np.int64))
    assert cuda.memory_bytes() >= cuda.weight_bytes + cuda.kv_bytes
