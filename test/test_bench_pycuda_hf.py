"""The HF baselines of bench/pycuda_cycle on CPU: the static-cache + torch.compile cycle against the eager one.

The bench runs them on the GPU in bf16 with inductor and CUDA graphs; here the tiny shape in float32 with
torch.compile's "eager" backend (dynamo traces the same graphs, no C++ build), so it runs in seconds.
"""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from vla_edge_ros.bench import cycle_report  # noqa: E402
from vla_edge_ros.bench import pycuda_cycle as pc  # noqa: E402

N_CACHED = 64
# dynamic=False as in the bench; fullgraph=True here so that a graph break (which would split the CUDA graphs on
# the GPU) fails the test instead of passing silently.
CPU_COMPILE = {"backend": "eager", "fullgraph": True, "dynamic": False}


@pytest.fixture(scope="module")
def models():
    torch.manual_seed(0)
    eager, cfg = pc._hf_model("tiny", device="cpu", dtype="float32")
    sdpa = pc._hf_twin(eager, "tiny", "sdpa")
    return eager, sdpa, pc.hf_config("tiny")["vocab_size"] - pc.BINS


def test_twin_shares_the_weights_not_the_attention(models):
    eager, sdpa, _ = models
    assert eager.config._attn_implementation == "eager" and sdpa.config._attn_implementation == "sdpa"
    for (name, a), (_, b) in zip(eager.state_dict().items(), sdpa.state_dict().items()):
        assert torch.equal(a, b), name


def test_compiled_static_cycles_choose_the_eager_tokens_and_rewrite_the_same_slots(models):
    eager, sdpa, lo = models
    rng = np.random.default_rng(0)
    ctx = torch.as_tensor(rng.integers(0, lo, size=(1, N_CACHED)))
    frames = [torch.as_tensor(rng.integers(0, lo + pc.BINS, size=(1, pc.PREFILL_ROWS))) for _ in range(3)]
    torch._dynamo.reset()
    with torch.no_grad():
        dynamic = transformers.DynamicCache()
        eager(input_ids=ctx, past_key_values=dynamic, use_cache=True)
        expected = [pc._hf_eager_cycle(eager, dynamic, eager.get_input_embeddings()(ids), lo)[0] for ids in frames]

        run = pc.HFStaticCycle(sdpa, N_CACHED, lo, CPU_COMPILE)
        run.fill(ctx)
        got = [run.cycle(sdpa.get_input_embeddings()(ids))[0].tolist() for ids in frames]
        assert got == expected
        assert all(int(layer.cumulative_length) == N_CACHED for layer in run.cache.layers)

        # The last cycle's K/V in slots [N_CACHED, N_CACHED + 40) are those of the context + frame + decoded tokens
        # run through a fresh DynamicCache: every row went to its own slot at its own rotary position.
        reference = transformers.DynamicCache()
        eager(input_ids=ctx, past_key_values=reference, use_cache=True)
        eager(inputs_embeds=eager.get_input_embeddings()(frames[-1]), past_key_values=reference, use_cache=True)
        for token in got[-1][:-1]:
            eager(input_ids=torch.tensor([[token]]), past_key_values=reference, use_cache=True)
    for static_layer, ref_layer in zip(run.cache.layers, reference.layers):
        torch.testing.assert_close(static_layer.keys, ref_layer.keys, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(static_layer.values, ref_layer.values, atol=1e-4, rtol=1e-4)


def test_time_hf_compiled_reports_like_time_hf(models):
    eager, sdpa, lo = models
    spec = type("Spec", (), {"vocab_size": lo + pc.BINS})
    compiled = pc._time_hf_compiled(sdpa, spec, N_CACHED, 2, np.random.default_rng(1), CPU_COMPILE)
    plain = pc._time_hf(eager, spec, N_CACHED, 2, np.random.default_rng(1))
    assert set(plain) <= set(compiled)
    assert compiled["cycles"] == 2 and compiled["cycle_ms"]["p50"] > 0 and compiled["compile_s"] > 0


def test_a_failed_compile_is_recorded_and_printed_as_na(monkeypatch, capsys):
    def fail(*args, **kwargs):
        raise RuntimeError("inductor: no C++ compiler\nmore detail")
    monkeypatch.setattr(pc, "_time_hf_compiled", fail)
    column = pc._time_hf_compiled_or_error(None, None, N_CACHED, 2, None)
    assert column == {"error": "RuntimeError: inductor: no C++ compiler\nmore detail"}
    assert cycle_report.ratio(column, {"cycle_ms": {"p50": 1.0}}, "p50") is None

    timings = {"cycle_ms": {"p50": 2.0, "p99": 3.0}, "prefill_ms": 1.0, "decode_ms_per_token": 0.1, "cycles": 2}
    row = {"cached": 256, "variant": "mma:chunk", "ours": {**timings, "breakdown_ms": {}},
           "hf_eager_bf16": timings, "hf_compiled_static": column, "ratio_p50": 1.0, "ratio_p99": 1.0,
           "ratio_p50_compiled": None, "ratio_p99_compiled": None, "decode_vs_floor": 2.0}
    cycle_report.print_report({"cycle": "c", "shape": "tiny", "machine": {}, "cycles": [row],
                               "copy_bandwidth_gbs": 1.0, "decode_stream_bytes": 1, "floor_decode_ms": 1.0,
                               "weight_bytes": 1, "floor_full_weights_ms": 1.0, "device_memory_bytes": 1,
                               "kv_capacity": 296, "kv_dtype": "float32"})
    out = capsys.readouterr().out
    assert "n/a" in out and "compiled baseline failed: RuntimeError: inductor: no C++ compiler" in out
