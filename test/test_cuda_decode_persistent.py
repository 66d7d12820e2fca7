"""decode_persistent.cu (model.persistent_decode): every layer of a bf16 decode step in one cooperative launch.

Its stages run the device code of gemv.cu, attention_decode.cu and attention.cu's merge, so a decode step through
it must give the launched pipeline's results bit for bit: the same tokens, the same residual stream and the same KV
written. Checked on the tiny model (head_dim 32, several attention splits) and on two layers of the Qwen2.5-1.5B
shape (head_dim 128, group 6, inter 8960: the shapes the robot runs), in both grid sizes, with and without the L2
prefetch, over several cycles so the grid barrier's counters are reused.
"""
import numpy as np
import pytest

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def qwen15_two_layers(tmp_path_factory):
    """(ModelSpec, snapshot dir) of the first two layers of the Qwen2.5-1.5B-shaped random model, bf16."""
    from vla_edge_ros.model.make_model import make_model
    from vla_edge_ros.model.spec import ModelSpec
    out = make_model("qwen2.5-1.5b-random", tmp_path_factory.mktemp("q15") / "m", seed=2, dtype="bf16", layers=2)
    return ModelSpec.from_dir(out), out


def _cycles(spec, weights, variant, n_ctx: int, cycles: int = 3):
    """Tokens, final residual row and the KV of every written slot after `cycles` cycles of one backend,
    decoding with `variant` (None: launched pipeline; (blocks per SM, L2 prefetch bytes): persistent)."""
    from vla_edge_ros.model.cuda_backend import CudaBackend
    cap = n_ctx + 48
    lo = spec.vocab_size - 256
    rng = np.random.default_rng(11)
    b = CudaBackend(spec, weights, cap, "bfloat16")
    try:
        if variant is not None:
            assert b.set_persistent_decode(True, *variant)
        ctx = rng.integers(0, spec.vocab_size, size=n_ctx)
        b.forward(b.embed(ctx), np.arange(n_ctx), np.arange(n_ctx), np.array([], np.int64), logits="none")
        rows, dec = np.arange(n_ctx, n_ctx + 32), np.arange(n_ctx + 32, n_ctx + 40)
        tokens = []
        for c in range(cycles):
            # Each cycle attends to the context and rewrites the same slots at later positions.
            frame = rng.integers(0, spec.vocab_size, size=32)
            shift = 40 * c
            tokens.append(b.run_cycle_tokens(b.embed(frame), rows + shift, rows, np.arange(n_ctx), dec, dec + shift,
                                             lo, 9))
        with b.device.bound():
            resid = b._get(b.resid, 1)
        kv = b.read_kv(np.arange(n_ctx + 40))
        return np.stack(tokens), resid, kv
    finally:
        b.close()


@pytest.mark.parametrize("variant", [(1, 0), (2, 0), (1, 8 << 20)], ids=["b1", "b2", "b1-l2"])
def test_persistent_decode_matches_the_launched_pipeline_on_tiny(tiny_weights, variant):
    spec, weights = tiny_weights
    ref = _cycles(spec, weights, None, n_ctx=200)
    got = _cycles(spec, weights, variant, n_ctx=200)
    np.testing.assert_array_equal(got[0], ref[0], err_msg="tokens")
    np.testing.assert_array_equal(got[1], ref[1], err_msg="final residual row of the last decode step")
    np.testing.assert_array_equal(got[2], ref[2], err_msg="KV of the context and the cycles' rows")


@pytest.mark.parametrize("variant", [(1, 24 << 20), (2, 0)], ids=["b1-l2", "b2"])
def test_persistent_decode_matches_the_launched_pipeline_on_the_1_5b_shape(qwen15_two_layers, variant):
    spec, model_dir = qwen15_two_layers
    ref = _cycles(spec, model_dir, None, n_ctx=700)
    got = _cycles(spec, model_dir, variant, n_ctx=700)
    np.testing.assert_array_equal(got[0], ref[0], err_msg="tokens")
    np.testing.assert_array_equal(got[1], ref[1], err_msg="final residual row of the last decode step")
    np.testing.assert_array_equal(got[2], ref[2], err_msg="KV of the context and the cycles' rows")


def test_persistent_decode_is_refused_for_fp32_weights(tiny_weights):
    from vla_edge_ros.model.cuda_backend import CudaBackend
    spec, weights = tiny_weights
    b = CudaBackend(spec, weights, 64, "float32", persistent_decode=True)
    try:
        assert b.persistent_decode is False
    finally:
        b.close()


def test_decode_layers_rejects_a_bad_layer_table(kn, gpu):
    ga, stream = gpu
    from vla_edge_ros.model.cuda_kernels import KernelError
    f = ga.zeros((1, 64), np.float32)
    i = ga.zeros((64,), np.int32)
    with pytest.raises(KernelError, match="pointers per layer"):
        kn.decode_layers(ga.zeros((2, 5), np.uint64), f, f, f, f, f, f, i, i, i, i, ga.zeros((8,), np.float32),
                         ga.zeros((2,), np.uint32), qkv_rows=128, inter=64, gate_up_rows=128, n_q_heads=2,
                         n_kv_heads=1, head_dim=32, capacity=64, n_splits=1, eps=1e-6, scale=0.1, stream=stream)
    with pytest.raises(KernelError, match="blocks_per_sm 3"):
        kn.prepare_decode_layers(64, 64, 2, 1, 32, blocks_per_sm=3)
