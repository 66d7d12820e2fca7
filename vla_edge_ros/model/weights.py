"""Load the tensors of a HuggingFace snapshot directory into float32 numpy arrays.

A snapshot holds config.json (read by ModelSpec.from_dir), the weights as one
`model.safetensors` or as shards `model-0000X-of-0000N.safetensors` listed in
`model.safetensors.index.json`, and `tokenizer.json`. Tensor names follow the
HF Qwen2 / Llama convention (`model.layers.{i}.self_attn.q_proj.weight`, ...).

safetensors layout (the part we validate ourselves so errors name the file
and tensor): 8 bytes little-endian header length n, n bytes of JSON
{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}},
then the data block; offsets are relative to the start of the data block.
numpy has no bfloat16, so BF16 tensors are read as raw uint16 and widened
(a bf16 value is the upper half of the float32 with the same bits).
"""
from __future__ import annotations

import json
import logging
import struct
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterator

import numpy as np

from .spec import ModelFormatError, ModelSpec

logger = logging.getLogger(__name__)

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
TOKENIZER_FILE = "tokenizer.json"

# safetensors dtype tag -> (bytes per element, numpy dtype; None = BF16, converted by hand)
SAFETENSORS_DTYPES = {"F32": (4, np.float32), "F16": (2, np.float16), "BF16": (2, None), "F64": (8, np.float64),
                      # integer tensors of INT4 snapshots: packed nibbles (U8, ours; I32, compressed-tensors)
                      # and compressed-tensors' weight_shape (I64); read with read_stored, not read
                      "U8": (1, np.uint8), "I32": (4, np.int32), "I64": (8, np.int64)}
INTEGER_TAGS = ("U8", "I32", "I64")

# Canonical compute/storage precisions a backend may be asked for.
DTYPE_ALIASES = {"float32": "float32", "fp32": "float32", "f32": "float32",
                 "bfloat16": "bfloat16", "bf16": "bfloat16"}

# ModelWeights/LayerWeights field -> HF tensor name
GLOBAL_TENSOR_NAMES = {"embed": "model.embed_tokens.weight", "final_norm": "model.norm.weight",
                       "lm_head": "lm_head.weight"}
LAYER_TENSOR_NAMES = {
    "input_norm": "model.layers.{i}.input_layernorm.weight",
    "q_proj": "model.layers.{i}.self_attn.q_proj.weight",
    "k_proj": "model.layers.{i}.self_attn.k_proj.weight",
    "v_proj": "model.layers.{i}.self_attn.v_proj.weight",
    "q_bias": "model.layers.{i}.self_attn.q_proj.bias",
    "k_bias": "model.layers.{i}.self_attn.k_proj.bias",
    "v_bias": "model.layers.{i}.self_attn.v_proj.bias",
    "o_proj": "model.layers.{i}.self_attn.o_proj.weight",
    "post_norm": "model.layers.{i}.post_attention_layernorm.weight",
    "gate_proj": "model.layers.{i}.mlp.gate_proj.weight",
    "up_proj": "model.layers.{i}.mlp.up_proj.weight",
    "down_proj": "model.layers.{i}.mlp.down_proj.weight",
}
BIAS_FIELDS = ("q_bias", "k_bias", "v_bias")


@dataclass
class LayerWeights:
    input_norm: np.ndarray            # [hidden]
    q_proj: np.ndarray                # [q_dim, hidden]
    k_proj: np.ndarray                # [kv_dim, hidden]
    v_proj: np.ndarray                # [kv_dim, hidden]
    o_proj: np.ndarray                # [hidden, q_dim]
    post_norm: np.ndarray             # [hidden]
    gate_proj: np.ndarray             # [inter, hidden]
    up_proj: np.ndarray               # [inter, hidden]
    down_proj: np.ndarray             # [hidden, inter]
    q_bias: np.ndarray | None = None  # [q_dim]   (Qwen2 only)
    k_bias: np.ndarray | None = None  # [kv_dim]  (Qwen2 only)
    v_bias: np.ndarray | None = None  # [kv_dim]  (Qwen2 only)


@dataclass
class ModelWeights:
    embed: np.ndarray                 # [vocab, hidden]
    layers: list                      # num_layers x LayerWeights
    final_norm: np.ndarray            # [hidden]
    lm_head: np.ndarray               # [vocab, hidden]; the very same array as `embed` when tied
    tied: bool                        # lm_head is embed (tie_word_embeddings)
    source_dtype: str = "F32"         # on-disk dtype tag(s) before the float32 upcast, e.g. "BF16" or "BF16+F32"
    # INT4 snapshots (int4_snapshot.py): the HF names whose arrays above are dequantized INT4 values
    # (q * fp16 scale, in float32), and the weights per scale of their groups; empty / 0 for float weights.
    int4_names: frozenset = frozenset()
    int4_group_size: int = 0

    def named_tensors(self) -> Iterator[tuple[str, np.ndarray]]:
        """(HF name, array) of every distinct tensor; lm_head is skipped when tied."""
        yield GLOBAL_TENSOR_NAMES["embed"], self.embed
        for i, layer in enumerate(self.layers):
            for fname, template in LAYER_TENSOR_NAMES.items():
                arr = getattr(layer, fname)
                if arr is not None:
                    yield template.format(i=i), arr
        yield GLOBAL_TENSOR_NAMES["final_norm"], self.final_norm
        if not self.tied:
            yield GLOBAL_TENSOR_NAMES["lm_head"], self.lm_head

    def nbytes(self) -> int:
        return sum(a.nbytes for _, a in self.named_tensors())

    def num_parameters(self) -> int:
        return sum(a.size for _, a in self.named_tensors())

    def map(self, fn) -> "ModelWeights":
        """A copy with `fn` applied to every tensor (the tie is kept)."""
        embed = fn(self.embed)
        layers = [replace(layer, **{f: fn(getattr(layer, f)) for f in LAYER_TENSOR_NAMES
                                    if getattr(layer, f) is not None})
                  for layer in self.layers]
        lm_head = embed if self.tied else fn(self.lm_head)
        return ModelWeights(embed=embed, layers=layers, final_norm=fn(self.final_norm), lm_head=lm_head,
                            tied=self.tied, source_dtype=self.source_dtype, int4_names=self.int4_names,
                            int4_group_size=self.int4_group_size)

    def rounded_to_bf16(self) -> "ModelWeights":
        """A copy whose float32 values are exactly representable in bfloat16 (round to nearest even), except the
        INT4 tensors (int4_names): their w_hat = q * fp16 scale is what a bf16 model on a device computes with
        (the CUDA INT4 kernels multiply q and the scale exactly), so rounding it again would model no device."""
        rounded = self.map(round_to_bf16)
        if not self.int4_names:
            return rounded
        rounded.layers = [replace(layer, **{f: getattr(orig, f) for f, name in LAYER_TENSOR_NAMES.items()
                                            if name.format(i=i) in self.int4_names})
                          for i, (layer, orig) in enumerate(zip(rounded.layers, self.layers))]
        return rounded


# ----------------------------------------------------------------------------
# Public API


def canonical_dtype(dtype) -> str:
    """'fp32' | 'float32' | np.float32 | 'bf16' | 'bfloat16' -> 'float32' | 'bfloat16'."""
    if dtype is np.float32 or (isinstance(dtype, np.dtype) and dtype == np.float32):
        return "float32"
    key = str(dtype).lower()
    if key not in DTYPE_ALIASES:
        raise ValueError(f"dtype {dtype!r} not supported; use one of {sorted(DTYPE_ALIASES)}")
    return DTYPE_ALIASES[key]


def load_weights(model_dir: str | Path, spec: ModelSpec | None = None) -> ModelWeights:
    """Read every tensor the spec needs from `model_dir`, as float32, shape- and NaN-checked."""
    model_dir = Path(model_dir)
    spec = spec or ModelSpec.from_dir(model_dir)
    entries = check_snapshot(model_dir, spec)     # names and shapes from the headers, before reading data
    tensors: dict[str, np.ndarray] = {}
    by_file: dict[Path, list[str]] = {}
    for name, (path, _, _) in entries.items():
        by_file.setdefault(path, []).append(name)
    for path, names in by_file.items():
        reader = SafetensorsFile(path)
        for name in names:
            arr, _ = reader.read(name)
            _check_values(path, name, arr)
            tensors[name] = arr
    source_dtype = "+".join(sorted({tag for _, tag, _ in entries.values()}))
    return assemble_weights(spec, tensors, source_dtype)


def check_snapshot(model_dir: str | Path, spec: ModelSpec | None = None) -> dict[str, tuple[Path, str, tuple]]:
    """Header-only check that every tensor the spec needs exists with its expected shape.

    Returns HF name -> (file, safetensors dtype tag, shape); reads no tensor data, so it is
    cheap even for a multi-GB snapshot. Unused tensors are logged, not silently dropped.
    """
    model_dir = Path(model_dir)
    spec = spec or ModelSpec.from_dir(model_dir)
    locations = tensor_locations(model_dir)
    expected = expected_shapes(spec)
    if spec.tie_word_embeddings and GLOBAL_TENSOR_NAMES["lm_head"] in locations:
        logger.warning("%s: tie_word_embeddings is true, so lm_head.weight in the file is ignored (as HF does)",
                       model_dir)
    extra = sorted(set(locations) - set(expected) - {GLOBAL_TENSOR_NAMES["lm_head"]})
    if extra:
        logger.warning("%s: ignoring %d tensors this architecture does not use: %s", model_dir, len(extra),
                       ", ".join(extra[:8]) + (" ..." if len(extra) > 8 else ""))
    missing = [name for name in expected if name not in locations]
    if missing:
        raise ModelFormatError(f"{model_dir}: missing tensor {missing[0]!r}"
                               + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    headers: dict[Path, SafetensorsFile] = {}
    entries = {}
    for name, shape in expected.items():
        path = locations[name]
        if path not in headers:
            headers[path] = SafetensorsFile(path)
        if name not in headers[path].entries:
            raise ModelFormatError(f"{path}: the index places tensor {name!r} in this file, but it is not there")
        tag, got, _, _ = headers[path].entries[name]
        if tuple(got) != tuple(shape):
            raise ModelFormatError(f"{path}: tensor {name!r} has shape {list(got)}, expected {list(shape)}")
        entries[name] = (path, tag, tuple(got))
    return entries


def load_tokenizer(model_dir: str | Path):
    """The snapshot's tokenizer.json as a `tokenizers.Tokenizer`."""
    from tokenizers import Tokenizer

    path = Path(model_dir) / TOKENIZER_FILE
    if not path.is_file():
        raise ModelFormatError(f"{path}: no tokenizer.json in model directory")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # noqa: BLE001 - tokenizers raises a bare Exception on parse errors
        raise ModelFormatError(f"{path}: not a valid tokenizer.json ({exc})") from exc


def tensor_locations(model_dir: Path) -> dict[str, Path]:
    """tensor name -> safetensors file holding it (single file, or from the shard index)."""
    index = model_dir / INDEX_FILE
    single = model_dir / SINGLE_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except json.JSONDecodeError as exc:
            raise ModelFormatError(f"{index}: not valid JSON ({exc})") from exc
        except KeyError as exc:
            raise ModelFormatError(f"{index}: missing key 'weight_map'") from exc
        locations = {}
        for name, shard in weight_map.items():
            path = model_dir / shard
            if not path.is_file():
                raise ModelFormatError(f"{index}: tensor {name!r} is in shard {shard!r}, "
                                       f"which does not exist in {model_dir}")
            locations[name] = path
        return locations
    if single.is_file():
        return {name: single for name in SafetensorsFile(single).names()}
    raise ModelFormatError(f"{model_dir}: no {SINGLE_FILE} and no {INDEX_FILE}")


def expected_shapes(spec: ModelSpec) -> dict[str, tuple]:
    """HF tensor name -> shape, for every tensor this spec needs (lm_head only when untied)."""
    h, q, kv, inter = spec.hidden_size, spec.q_dim, spec.kv_dim, spec.intermediate_size
    layer_shapes = {"input_norm": (h,), "q_proj": (q, h), "k_proj": (kv, h), "v_proj": (kv, h),
                    "q_bias": (q,), "k_bias": (kv,), "v_bias": (kv,), "o_proj": (h, q), "post_norm": (h,),
                    "gate_proj": (inter, h), "up_proj": (inter, h), "down_proj": (h, inter)}
    shapes = {GLOBAL_TENSOR_NAMES["embed"]: (spec.vocab_size, h)}
    for i in range(spec.num_layers):
        for fname, shape in layer_shapes.items():
            if fname in BIAS_FIELDS and not spec.qkv_bias:
                continue
            shapes[LAYER_TENSOR_NAMES[fname].format(i=i)] = shape
    shapes[GLOBAL_TENSOR_NAMES["final_norm"]] = (h,)
    if not spec.tie_word_embeddings:
        shapes[GLOBAL_TENSOR_NAMES["lm_head"]] = (spec.vocab_size, h)
    return shapes


def bf16_bits_to_float32(bits: np.ndarray) -> np.ndarray:
    """uint16 bfloat16 bit patterns -> float32 with the same value (exact)."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def float32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> uint16 bfloat16 bit patterns, round to nearest even (NaN stays NaN)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    # round to nearest even on the 16 dropped bits: add 0x7FFF + (lowest kept bit), then truncate
    bits = u >> 16
    bits &= 1
    bits += 0x7FFF
    bits += u
    bits >>= 16
    out = bits.astype(np.uint16)
    nan = np.isnan(x)
    if nan.any():
        # the rounding carry could turn a NaN payload into Inf: keep NaNs quiet NaNs instead
        out[nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)
    return out


def round_to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 array rounded to the nearest bfloat16 value, still float32."""
    return bf16_bits_to_float32(float32_to_bf16_bits(x)).reshape(np.shape(x))


# ----------------------------------------------------------------------------
# Internal helpers


class SafetensorsFile:
    """Header of one .safetensors file, validated against its size; reads tensors as float32."""

    def __init__(self, path: Path):
        self.path = Path(path)
        try:
            size = self.path.stat().st_size
            with open(self.path, "rb") as f:
                head = f.read(8)
                if len(head) < 8:
                    raise ModelFormatError(f"{self.path}: truncated safetensors file ({size} bytes, no header)")
                (header_len,) = struct.unpack("<Q", head)
                if 8 + header_len > size:
                    raise ModelFormatError(f"{self.path}: truncated or corrupt safetensors file (header says "
                                           f"{header_len} header bytes, file has {size})")
                raw_header = f.read(header_len)
        except OSError as exc:
            raise ModelFormatError(f"{self.path}: cannot read safetensors file ({exc})") from exc
        try:
            header = json.loads(raw_header)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ModelFormatError(f"{self.path}: corrupt safetensors header ({exc})") from exc
        if not isinstance(header, dict):
            raise ModelFormatError(f"{self.path}: corrupt safetensors header (not a JSON object)")
        header.pop("__metadata__", None)
        self.data_start = 8 + header_len
        data_len = size - self.data_start
        self.entries = {}
        for name, entry in header.items():
            try:
                tag, shape, (begin, end) = entry["dtype"], tuple(entry["shape"]), entry["data_offsets"]
            except (KeyError, TypeError, ValueError) as exc:
                raise ModelFormatError(f"{self.path}: corrupt header entry for tensor {name!r} ({exc!r})") from exc
            if not all(type(d) is int and d >= 0 for d in (*shape, begin, end)):
                raise ModelFormatError(f"{self.path}: corrupt header entry for tensor {name!r} (shape {list(shape)}, "
                                       f"data_offsets {[begin, end]}: not whole numbers >= 0)")
            if tag not in SAFETENSORS_DTYPES:
                raise ModelFormatError(f"{self.path}: tensor {name!r} has dtype {tag}, "
                                       f"supported: {sorted(SAFETENSORS_DTYPES)}")
            nbytes = int(np.prod(shape, dtype=np.int64)) * SAFETENSORS_DTYPES[tag][0]
            if end - begin != nbytes or begin < 0:
                raise ModelFormatError(f"{self.path}: tensor {name!r} {tag}{list(shape)} needs {nbytes} bytes but its "
                                       f"data_offsets span {end - begin}")
            if end > data_len:
                raise ModelFormatError(f"{self.path}: truncated safetensors file: tensor {name!r} ends at byte {end} "
                                       f"of the data block, which has only {data_len} bytes")
            self.entries[name] = (tag, shape, begin, end)
        # Tensors own disjoint byte ranges (the format's rule, which safe_open enforces; the tensors read here with
        # np.fromfile never pass through it): a header pointing two tensors at the same bytes loaded one's data as
        # the other's, silently.
        spans = sorted((b, e, n) for n, (_t, _s, b, e) in self.entries.items() if e > b)
        for (_b0, e0, first), (b1, _e1, second) in zip(spans, spans[1:]):
            if b1 < e0:
                raise ModelFormatError(f"{self.path}: corrupt safetensors header: tensors {first!r} and {second!r} "
                                       f"share bytes of the data block")
        self._handle = None

    def names(self) -> list[str]:
        return list(self.entries)

    def read_stored(self, name: str) -> tuple[np.ndarray, str]:
        """(array, dtype tag) of one tensor in its stored dtype (little-endian), except BF16, widened to float32
        exactly: for integer tensors (packed INT4 weights) and fp16 scales, which read() would turn into float32."""
        tag, shape, begin, end = self.entries[name]
        if tag == "BF16":
            return self.read(name)
        itemsize, np_dtype = SAFETENSORS_DTYPES[tag]
        count = (end - begin) // itemsize
        arr = np.fromfile(self.path, dtype=np.dtype(np_dtype).newbyteorder("<"), count=count,
                          offset=self.data_start + begin)
        if arr.size != count:
            raise ModelFormatError(f"{self.path}: tensor {name!r} is truncated ({arr.size} of {count} values read)")
        return arr.astype(arr.dtype.newbyteorder("="), copy=False).reshape(shape), tag

    def read(self, name: str) -> tuple[np.ndarray, str]:
        """(float32 array, on-disk dtype tag) of one float tensor; an integer one (packed data: read_stored) is
        refused rather than converted into float weights."""
        tag, shape, begin, end = self.entries[name]
        if tag in INTEGER_TAGS:
            raise ModelFormatError(f"{self.path}: tensor {name!r} is {tag}, where float weights are expected")
        if tag == "BF16":
            bits = np.fromfile(self.path, dtype="<u2", count=(end - begin) // 2, offset=self.data_start + begin)
            return bf16_bits_to_float32(bits).reshape(shape), tag
        from safetensors import SafetensorError, safe_open

        try:
            if self._handle is None:
                self._handle = safe_open(str(self.path), framework="np")
            arr = self._handle.get_tensor(name)
        except SafetensorError as exc:
            raise ModelFormatError(f"{self.path}: cannot read tensor {name!r} ({exc})") from exc
        return np.ascontiguousarray(arr, dtype=np.float32), tag


def _check_values(path: Path, name: str, arr: np.ndarray) -> None:
    finite = np.isfinite(arr)
    if not finite.all():
        bad = arr.size - int(np.count_nonzero(finite))
        nans = int(np.count_nonzero(np.isnan(arr)))
        raise ModelFormatError(f"{path}: tensor {name!r} has {bad} non-finite values ({nans} NaN, {bad - nans} Inf) "
                               f"out of {arr.size}")


def assemble_weights(spec: ModelSpec, tensors: dict, source_dtype: str) -> ModelWeights:
    """ModelWeights of `tensors` {HF name: float32 array} (every name expected_shapes(spec) lists)."""
    layers = []
    for i in range(spec.num_layers):
        kwargs = {}
        for fname, template in LAYER_TENSOR_NAMES.items():
            if fname in BIAS_FIELDS and not spec.qkv_bias:
                continue
            kwargs[fname] = tensors[template.format(i=i)]
        layers.append(LayerWeights(**kwargs))
    embed = tensors[GLOBAL_TENSOR_NAMES["embed"]]
    lm_head = embed if spec.tie_word_embeddings else tensors[GLOBAL_TENSOR_NAMES["lm_head"]]
    return ModelWeights(embed=embed, layers=layers, final_norm=tensors[GLOBAL_TENSOR_NAMES["final_norm"]],
                        lm_head=lm_head, tied=spec.tie_word_embeddings, source_dtype=source_dtype)
