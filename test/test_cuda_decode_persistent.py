"""decode_persistent.cu (KernelPlan.persistent_decode, built by bench/kernel_lab.py): every layer of a bf16 decode step in one cooperative launch.

Its stages run the device code of gemv.cu, attention_decode.cu and attention.cu's merge, so a decode step through
it must give the launched pipeline's results bit for bit: the same tokens, the same residual stream and the same KV
written. Checked on the tiny model (head_dim 32, several attention splits) and on two layers of the Qwen2.5-1.5B
shape (head_dim 128, group 6, inter 8960: the shapes the robot runs), in both grid sizes, with and without the L2
prefetch, over 8 decode steps (the grid barrier's counters are reset and reused by each launch). Every variant starts
from one device snapshot taken after the prefill: the prefill's split-K atomic adds make two prefills differ in the
last bits, which would hide what is compared here.
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


def _decode_ways(spec, weights, variants, n_ctx: int, steps: int = 8):
    """One prefill, then `steps` decode steps from that same device state once per variant (None: the launched
    pipeline; (blocks per SM, L2 prefetch bytes): persistent). Per variant: tokens, final residual row, KV."""
    from vla_edge_ros.bench import kernel_lab
    from vla_edge_ros.model.cuda_backend import CudaBackend
    from vla_edge_ros.model.cuda_kernel_plan import MEASURED_BEST
    cap, lo = n_ctx + 48, spec.vocab_size - 256
    rng = np.random.default_rng(11)
    b = CudaBackend(spec, weights, cap, "bfloat16")
    try:
        ctx = rng.integers(0, spec.vocab_size, size=n_ctx)
        b.forward(b.embed(ctx), np.arange(n_ctx), np.arange(n_ctx), np.array([], np.int64), logits="none")
        rows, dec = np.arange(n_ctx, n_ctx + 32), np.arange(n_ctx + 32, n_ctx + 32 + steps)
        b.begin_cycle(b.embed(rng.integers(0, spec.vocab_size, size=32)), rows, rows, np.arange(n_ctx), dec, dec,
                      steps + 1)
        b.launch_prefill(32, lo, 256)
        start = kernel_lab.decode_state(b)
        out = []
        for variant in variants:
            kernel_lab.restore_decode_state(b, start)
            plan = MEASURED_BEST if variant is None else kernel_lab.persistent_plan(*variant)
            assert b.use_kernel_plan(plan).persistent_decode == (variant is not None)
            for _ in range(steps):
                b.launch_decode_step(lo, 256)
            tokens = b.finish_cycle(steps + 1)
            with b.device.bound():
                resid = b._get(b.resid, 1)
            out.append((tokens, resid, b.read_kv(np.arange(n_ctx + 32 + steps))))
        return out
    finally:
        b.close()


def _assert_same(ref, got, what):
    np.testing.assert_array_equal(got[0], ref[0], err_msg=f"{what}: tokens")
    np.testing.assert_array_equal(got[1], ref[1], err_msg=f"{what}: final residual row of the last decode step")
    np.testing.assert_array_equal(got[2], ref[2], err_msg=f"{what}: KV of the context and the cycle's rows")


def test_persistent_decode_matches_the_launched_pipeline_on_tiny(tiny_weights):
    spec, weights = tiny_weights
    variants = [None, (1, 0), (2, 0), (1, 8 << 20), None]
    ref, *rest = _decode_ways(spec, weights, variants, n_ctx=200)
    for variant, got in zip(variants[1:], rest):
        _assert_same(ref, got, f"tiny {variant}")


def test_persistent_decode_matches_the_launched_pipeline_on_the_1_5b_shape(qwen15_two_layers):
    spec, model_dir = qwen15_two_layers
    variants = [None, (1, 0), (2, 24 << 20), None]
    ref, *rest = _decode_ways(spec, model_dir, variants, n_ctx=700)
    for variant, got in zip(variants[1:], rest):
        _assert_same(ref, got, f"1.5B shape {variant}")


def test_persistent_decode_is_refused_for_fp32_weights(tiny_weights):
    from vla_edge_ros.bench.kernel_lab import persistent_plan
    from vla_edge_ros.model.cuda_backend import CudaBackend
    spec, weights = tiny_weights
    b = CudaBackend(spec, weights, 64, "float32", plan=persistent_plan())
    try:
        assert b.kernel_plan.persistent_decode is False
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
