"""compressed-tensors W4A16 checkpoints: the library itself writes one (symmetric INT4, groups of 128,
pack-quantized) from a small Llama, our loader reads it, and HF transformers, loading the same checkpoint
through compressed-tensors, is the oracle for its weights and its logits."""
import json
import shutil

import numpy as np
import pytest

from vla_edge_ros.model import hf_oracle
from vla_edge_ros.model.factory import create_backend
from vla_edge_ros.model.int4_snapshot import load_int4_weights, projection_names, weight_format
from vla_edge_ros.model.spec import ModelFormatError, ModelSpec

pytest.importorskip("compressed_tensors")

GROUP = 128


@pytest.fixture(scope="module")
def ct_checkpoint(tmp_path_factory):
    """A W4A16 checkpoint saved by compressed-tensors (as llm-compressor does): scales from each group's range
    by the library's own calculate_qparams, weights quantized and packed by its pack-quantized compressor."""
    import torch
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import QuantizationConfig, apply_quantization_config, preset_name_to_scheme
    from compressed_tensors.quantization.utils.helpers import calculate_qparams
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    # Input dimensions 128 and 384: whole groups of 128, as the W4A16 preset uses.
    config = LlamaConfig(hidden_size=128, intermediate_size=384, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=512, tie_word_embeddings=False, rms_norm_eps=1e-5)
    model = LlamaForCausalLM(config).float().eval()
    with torch.no_grad():
        for p in model.parameters():        # HF's std 0.02 init barely moves the logits: widen it
            p.mul_(4.0 if p.ndim == 2 else 1.0)
    scheme = preset_name_to_scheme("W4A16", ["Linear"])
    assert scheme.weights.group_size == GROUP and scheme.weights.symmetric and scheme.weights.num_bits == 4
    apply_quantization_config(model, QuantizationConfig(config_groups={"group_0": scheme}, ignore=["lm_head"],
                                                        quantization_status="frozen"))
    for module in model.modules():
        if hasattr(module, "weight_scale"):
            w = module.weight.data
            groups = w.reshape(w.shape[0], -1, GROUP)                                 # [out, in / G, G]
            scale, _ = calculate_qparams(groups.amin(-1), groups.amax(-1), module.quantization_scheme.weights)
            module.weight_scale.data.copy_(scale)
    compressor = ModelCompressor.from_pretrained_model(model, "pack-quantized")
    compressor.compress_model(model)
    out = tmp_path_factory.mktemp("ct") / "llama-w4a16"
    model.save_pretrained(out)
    compressor.update_config(str(out))
    return out


def test_the_library_wrote_what_vllm_serves(ct_checkpoint):
    qc = json.loads((ct_checkpoint / "config.json").read_text())["quantization_config"]
    assert qc["quant_method"] == "compressed-tensors" and qc["format"] == "pack-quantized"
    assert weight_format(ct_checkpoint) == "int4"


def test_our_loader_reads_the_weights_hf_decompresses_and_the_logits_agree(ct_checkpoint):
    spec = ModelSpec.from_dir(ct_checkpoint)
    ours = load_int4_weights(ct_checkpoint, spec)
    assert ours.int4_names == frozenset(projection_names(spec)) and ours.int4_group_size == GROUP
    hf = hf_oracle.load_hf_model(ct_checkpoint)
    ids = np.arange(3, 40) % spec.vocab_size                                             # [N]
    reference = hf_oracle.hf_forward(hf, ids)            # the first forward decompresses HF's modules
    hf_state = {k: v.detach().float().numpy() for k, v in hf.state_dict().items()}
    for name, arr in ours.named_tensors():
        assert np.array_equal(arr, hf_state[name]), name
    backend = create_backend("numpy", ct_checkpoint, capacity=ids.size, weights="int4")
    n = ids.size
    logits = backend.forward(backend.embed(ids), np.arange(n), np.arange(n), np.zeros(0, np.int64),
                             logits="all").logits                                        # [N, vocab]
    cos = np.sum(logits * reference.logits, 1) / (np.linalg.norm(logits, axis=1) *
                                                  np.linalg.norm(reference.logits, axis=1))
    assert cos.min() >= 0.99999
    assert np.array_equal(logits.argmax(1), reference.logits.argmax(1))


@pytest.mark.parametrize("edit, fragment", [
    (lambda g: g["weights"].__setitem__("symmetric", False), "weights.symmetric is False"),
    (lambda g: g["weights"].__setitem__("num_bits", 8), "weights.num_bits is 8"),
    (lambda g: g.__setitem__("input_activations", {"num_bits": 8}), "quantizes activations"),
    # columns grouped by weight_g_idx (activation order): read as column // G every weight takes another scale
    (lambda g: g["weights"].__setitem__("actorder", "group"), "actorder 'group'"),
])
def test_other_compressed_tensors_schemes_are_refused_not_misread(ct_checkpoint, tmp_path, edit, fragment):
    bad = tmp_path / "bad"
    shutil.copytree(ct_checkpoint, bad)
    config = json.loads((bad / "config.json").read_text())
    edit(config["quantization_config"]["config_groups"]["group_0"])
    (bad / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelFormatError, match=fragment):
        load_int4_weights(bad)


@pytest.mark.parametrize("key, value", [("transform_config", {"config_groups": {"u": {"type": "hadamard"}}}),
                                        ("sparsity_config", {"format": "sparse-24-bitmask"})])
def test_transformed_or_sparse_checkpoints_are_refused(ct_checkpoint, tmp_path, key, value):
    bad = tmp_path / "bad"
    shutil.copytree(ct_checkpoint, bad)
    config = json.loads((bad / "config.json").read_text())
    config["quantization_config"][key] = value
    (bad / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelFormatError, match=key):
        load_int4_weights(bad)


def _edit_tensors(src, dst, edit):
    from safetensors.numpy import load_file, save_file
    shutil.copytree(src, dst)
    files = sorted(dst.glob("*.safetensors"))
    for f in files:
        tensors = load_file(str(f))
        edit(tensors)
        save_file(tensors, str(f), metadata={"format": "pt"})


def test_tensors_that_contradict_a_symmetric_static_scheme_are_refused(ct_checkpoint, tmp_path):
    """Whatever the config says: nonzero zero points (asymmetric weights), a g_idx that is not column // G
    (activation order), scales of an integer type or beyond fp16 (a corrupt file loaded as Inf weights)."""
    import numpy as np

    def first(tensors, suffix):
        return next(k for k in sorted(tensors) if k.endswith(suffix))

    def zero_points(t):
        name = first(t, ".weight_scale")
        t[name.replace(".weight_scale", ".weight_zero_point")] = np.ones(t[name].shape, np.int32)

    def g_idx(t):
        name = first(t, ".weight_shape")
        cols = int(t[name].reshape(-1)[1])
        t[name.replace(".weight_shape", ".weight_g_idx")] = np.random.default_rng(0).permutation(cols).astype(np.int32) // 32

    def int_scales(t):
        name = first(t, ".weight_scale")
        t[name] = np.ones(t[name].shape, np.int32)

    def huge_scale(t):
        name = first(t, ".weight_scale")
        t[name] = t[name].astype(np.float32)
        t[name].reshape(-1)[0] = 1e38

    for label, edit, fragment in (("zp", zero_points, "nonzero zero points"), ("gidx", g_idx, "other groups"),
                                  ("ints", int_scales, "scales are floats"), ("huge", huge_scale, "beyond fp16")):
        bad = tmp_path / label
        _edit_tensors(ct_checkpoint, bad, edit)
        with pytest.raises(ModelFormatError, match=fragment):
            load_int4_weights(bad)
    # a zero point of all zeros, and a g_idx that is column // G, say nothing new: read as without them
    def harmless(t):
        name = first(t, ".weight_scale")
        t[name.replace(".weight_scale", ".weight_zero_point")] = np.zeros(t[name].shape, np.int32)
    _edit_tensors(ct_checkpoint, tmp_path / "ok", harmless)
    load_int4_weights(tmp_path / "ok")
