"""The PyCUDA backend on INT4 snapshots against the numpy backend on the same snapshot (model.weights: int4).

GPU only (marker `gpu`). Seeded tiny and llama-tiny models written straight to INT4 (`make-model --weights
int4`, groups of 32: their input dimensions 352 and 96 take no larger group); both compute with
w_hat = q * fp16 scale (numpy: dequantized float32, never rounded to bf16; CUDA: q and the scale in the
kernels), so they differ by fp32 summation order and the tensor cores' hi/lo activations only. Checked: the
device cycle (prefill + decode graphs, and eager) picks the numpy backend's tokens; chunked forwards equal
one-shot ones and numpy's, KV included; long forwards (rows >= bulk_prefill_min_rows, several passes) match
numpy; the measured-best plan runs with the variants that have no INT4 kernel forced off, and the variants
that have one give the same tokens; the factory builds it; memory is counted as packed + scales.

Tolerances: logits and KV rel_norm 1e-4 (the bf16 tolerance of test_cuda_backend.py: the INT4 prefill
projections take the activations as bf16 hi/lo pairs, ~1e-5 relative, whatever the dtype); token agreement as
there: exact with float32 embeddings and head, >= 7/9 with bf16 ones (the tiny models' random logits hold
near-ties that a 1e-5 difference may flip).
"""
import dataclasses

import numpy as np
import pytest

from gpu_cases import cycles_match_host_greedy, one_cycle
from kernel_compare import rel_norm

pytestmark = pytest.mark.gpu

BINS = 256
GROUP = 32
TOL = 1e-4


@pytest.fixture(scope="module", params=["tiny", "llama-tiny"])
def int4_model(request, tmp_path_factory):
    from vla_edge_ros.model.make_model import make_model
    from vla_edge_ros.model.spec import ModelSpec
    path = make_model(request.param, tmp_path_factory.mktemp(request.param) / "int4", seed=11,
                      int4_group_size=GROUP)
    return ModelSpec.from_dir(path), path


def _backends(int4_model, dtype, capacity=300, **kw):
    from vla_edge_ros.model.cuda_backend import CudaBackend
    from vla_edge_ros.model.factory import create_backend
    spec, path = int4_model
    cuda = CudaBackend(spec, path, capacity, dtype, **kw)
    assert cuda.int4 and cuda.int4_group == GROUP
    return cuda, create_backend("numpy", path, capacity, dtype=dtype, weights="int4")


def _ref_kv(ref, slots):
    spec = ref.spec
    return np.stack([ref._k[:, slots], ref._v[:, slots]]).reshape(2, spec.num_layers, len(slots), spec.kv_dim)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_int4_device_cycle_picks_numpys_tokens(int4_model, dtype):
    """The captured prefill + decode graphs (gemv_int4.cu's decode, projection_int4.cu's prefill) against the
    numpy backend's host greedy loop, and against the same cycle launched eagerly."""
    spec = int4_model[0]
    cuda, ref = _backends(int4_model, dtype)
    eager, _ = _backends(int4_model, dtype, use_graphs=False)
    cycles_match_host_greedy(cuda, ref, eager, spec.vocab_size, 32, exact=dtype == "float32", n_bins=BINS)
    assert sorted(key[0] for key in cuda._graphs) == ["decode", "layers", "prefill"]
    for b in (cuda, eager):
        b.close()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_int4_forwards_chunked_equal_one_shot_and_numpy(int4_model, dtype):
    """70 rows at once, or 40 + 30 (with holes in the context), or 24 + one-row decode steps (the fused
    gemv_int4 pipeline): the logits and the KV the numpy backend computes."""
    spec = int4_model[0]
    cuda, ref = _backends(int4_model, dtype)
    rng = np.random.default_rng(2)
    slots = rng.permutation(300)
    ids = rng.integers(0, spec.vocab_size, size=70)
    x = ref.embed(ids)
    np.testing.assert_array_equal(cuda.embed(ids), x)
    pos = np.arange(70) * 3 + 5
    one = [b.forward(x, pos, slots[:70], np.array([], np.int64), logits="all").logits for b in (cuda, ref)]
    assert rel_norm(one[0], one[1]) < TOL
    kv_one = cuda.read_kv(slots[:70])
    np.testing.assert_allclose(kv_one, _ref_kv(ref, slots[:70]), rtol=TOL, atol=TOL)
    first = [b.forward(x[:40], pos[:40], slots[100:140], np.array([], np.int64), logits="all").logits
             for b in (cuda, ref)]
    ctx = np.delete(slots[100:140], [3, 17, 18])              # a few evicted: holes in the list
    second = [b.forward(x[40:], pos[40:], slots[140:170], ctx, logits="all").logits for b in (cuda, ref)]
    assert rel_norm(first[0], first[1]) < TOL and rel_norm(second[0], second[1]) < TOL
    np.testing.assert_allclose(cuda.read_kv(slots[100:140]), kv_one[:, :, :40], rtol=TOL, atol=TOL)
    steps = [cuda.forward(x[:24], pos[:24], slots[200:224], np.array([], np.int64)).logits]
    for i in range(24, 32):                                   # one-row calls: the decode pipeline
        steps.append(cuda.forward(x[i:i + 1], pos[i:i + 1], slots[200 + i:201 + i], slots[200:200 + i]).logits)
    assert rel_norm(np.concatenate(steps), one[1][23:32]) < TOL
    cuda.close()


def test_int4_long_forwards_match_numpy(int4_model):
    """Rows >= bulk_prefill_min_rows: an INT4 backend keeps the bulk GEMMs off and runs projection_int4.cu in
    passes of max_rows (here 48: a 150-row forward is 4 passes); logits and KV as numpy's."""
    spec = int4_model[0]
    cuda, ref = _backends(int4_model, "bfloat16", capacity=400, max_rows=48, bulk_prefill_min_rows=64)
    assert (cuda.bulk_min_rows, cuda.bulk_max_rows) == (0, 0)
    assert [n for _, n, bulk in cuda._passes(150)] == [48, 48, 48, 6] and not any(b for *_, b in cuda._passes(150))
    rng = np.random.default_rng(12)
    ids = rng.integers(0, spec.vocab_size, size=150)
    slots = rng.permutation(400)[:150]
    got, exp = (b.forward(b.embed(ids), np.arange(150), slots, np.array([], np.int64), logits="all").logits
                for b in (cuda, ref))
    assert rel_norm(got, exp) < TOL
    np.testing.assert_allclose(cuda.read_kv(slots), _ref_kv(ref, slots), rtol=TOL, atol=TOL)
    cuda.close()


def test_int4_kernel_plan_variants(int4_model):
    """MEASURED_BEST runs INT4 with staged projections and the persistent decode forced off (no INT4 kernel);
    asking for the persistent decode changes nothing; the decode variants INT4 has (the looped items, two
    warps per attention group, programmatic launch, int4_gemv_items_per_block with one or two rows per warp, the
    lean entries) pick the tokens of the plain plan."""
    from vla_edge_ros.model.cuda_kernel_plan import MEASURED_BEST, KernelPlan
    spec = int4_model[0]
    cuda, _ = _backends(int4_model, "bfloat16")
    assert cuda.kernel_plan.staged_prefill_projections is False and cuda.kernel_plan.persistent_decode is False
    plain = cuda.use_kernel_plan(KernelPlan(decode_gemv_blocks_per_sm=0, decode_attention_head_split=1))
    base = one_cycle(cuda, spec.vocab_size, n_ctx=100, n_prefill=32, seed=6)
    variants = [dataclasses.replace(MEASURED_BEST, persistent_decode=True), MEASURED_BEST,
                dataclasses.replace(plain, decode_gemv_blocks_per_sm=1),
                dataclasses.replace(MEASURED_BEST, programmatic_launch=True),
                # The INT4 decode grid (off by default, not measured): every projection looped, two rows per warp.
                dataclasses.replace(MEASURED_BEST, int4_gemv_items_per_block=4),
                dataclasses.replace(MEASURED_BEST, int4_gemv_items_per_block=3, int4_gemv_rows_per_warp=2),
                # gemv_int4.cu's lean entries (off by default, not measured): groups of 32 take them.
                dataclasses.replace(MEASURED_BEST, int4_decode_lean_loop=True),
                dataclasses.replace(MEASURED_BEST, int4_decode_lean_loop=True, int4_gemv_items_per_block=3,
                                    int4_gemv_rows_per_warp=2),
                # The lean entries of the projections of many rows (off by default, not measured): staged, unstaged.
                dataclasses.replace(MEASURED_BEST, int4_prefill_lean_loop=True),
                dataclasses.replace(MEASURED_BEST, int4_prefill_lean_loop=True, staged_int4_prefill_projections=False)]
    for plan in variants:
        in_effect = cuda.use_kernel_plan(plan)
        assert not in_effect.persistent_decode and not in_effect.staged_prefill_projections
        assert (in_effect.int4_gemv_items_per_block, in_effect.int4_gemv_rows_per_warp,
                in_effect.int4_decode_lean_loop, in_effect.int4_prefill_lean_loop) == (
            plan.int4_gemv_items_per_block, plan.int4_gemv_rows_per_warp, plan.int4_decode_lean_loop,
            plan.int4_prefill_lean_loop), "an INT4 backend keeps its grid and entries"
        tokens, logits = one_cycle(cuda, spec.vocab_size, n_ctx=100, n_prefill=32, seed=6)
        np.testing.assert_array_equal(tokens, base[0], err_msg=str(plan))
        assert rel_norm(logits, base[1]) < 1e-5, plan        # split-K atomics may order sums differently
    cuda.close()


def test_int4_factory_and_memory_counts(int4_model, tmp_path):
    """create_backend('pycuda', ..., weights='int4') builds it; its weight bytes are packed + scales (the decode
    floor the bench reports), 4.125 bits per projection weight against a bf16 upload's 16."""
    from vla_edge_ros.model import int4
    from vla_edge_ros.model.factory import create_backend
    from vla_edge_ros.model.int4_snapshot import load_int4_weights
    spec, path = int4_model
    cuda = create_backend("pycuda", path, 64, dtype="bfloat16", weights="int4")
    weights = load_int4_weights(path, spec)
    projections = sum(int4.device_bytes(arr.size, GROUP) for name, arr in weights.named_tensors()
                      if name in weights.int4_names)
    norms = spec.num_layers * (2 * spec.hidden_size + (spec.q_dim + 2 * spec.kv_dim if spec.qkv_bias else 0)) * 4
    assert cuda.layer_weight_bytes == projections + norms
    assert cuda.decode_stream_bytes(BINS) == cuda.layer_weight_bytes + BINS * spec.hidden_size * 2
    assert cuda.memory_bytes() >= cuda.weight_bytes + cuda.kv_bytes
    cuda.close()
