"""INT4 snapshot directories: which tensors are INT4, their names on disk, reading and (streamed) writing.

A vla-edge INT4 snapshot is a HF snapshot directory (weights.py) whose
config.json carries the marker

    "vla_edge_int4": {"format": "vla-edge-int4", "bits": 4, "group_size": G, "scale_dtype": "float16",
                      "packing": "...", "quantized": [...]}

and whose safetensors files hold, for each of the seven projections of every
layer (q/k/v/o_proj, gate/up/down_proj; `P` = e.g. `model.layers.3.mlp.up_proj`),
instead of `P.weight` [out, in]:

    P.weight_int4        U8   [out, in / 2]   int4.py's packed nibbles (column 2j low, q + 8)
    P.weight_int4_scale  F16  [out, in / G]   one fp16 scale per G input columns

Every other tensor keeps its float dtype (F32 or BF16) and HF name: the
embedding (a row gather per token, not a weight stream: INT4 would save no
time and cost the table's accuracy), the output head (read once per step,
1-2% of a 7B model's bytes, and the most sensitive matrix: compressed-tensors
leaves `lm_head` out by default for the same reason), the RMSNorm weights and
the q/k/v biases (vectors: noise in the byte count, and their errors are not
averaged over a dot product). The projections are >98% of a 1.5B or 7B model's
decoder bytes, where a decode step's time goes.

compressed-tensors W4A16 checkpoints (compressed_tensors_layout.py) are read
here too, into the same dequantized ModelWeights; `weight_format` tells a
directory's format from its config.json, which states it either way.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from . import compressed_tensors_layout as ct
from . import int4
from .safetensors_writer import PlannedTensor, write_tensors
from .spec import ModelFormatError, ModelSpec
from .weights import (INDEX_FILE, LAYER_TENSOR_NAMES, ModelWeights, SafetensorsFile,
                      assemble_weights, check_snapshot, expected_shapes, float32_to_bf16_bits, tensor_locations)

logger = logging.getLogger(__name__)

MARKER = "vla_edge_int4"
FORMAT_NAME = "vla-edge-int4"
PACKED_SUFFIX = ".weight_int4"
SCALE_SUFFIX = ".weight_int4_scale"
QUANTIZED_FIELDS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
ROW_BLOCK_WEIGHTS = 1 << 22     # weights quantized per block of rows: bounds the float64 temporaries (~100 MB)
# Row blocks quantized at once on threads (numpy's ufuncs release the GIL): one core took ~85 ns a weight, so the
# 6.5 G projection weights of the 7B shape took ~9 minutes; at most this many blocks' temporaries (~1 GB) live at once.
QUANTIZE_THREADS = min(8, os.cpu_count() or 1)
CONFIG_FILE = "config.json"


@dataclass(frozen=True)
class Int4Layout:
    kind: str          # "vla-edge" | "compressed-tensors"
    group_size: int


# ----------------------------------------------------------------------------
# Public API


def read_config(model_dir: str | Path) -> dict:
    path = Path(model_dir) / CONFIG_FILE
    try:
        return json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise ModelFormatError(f"{path}: no config.json in model directory") from exc
    except json.JSONDecodeError as exc:
        raise ModelFormatError(f"{path}: not valid JSON ({exc})") from exc


def layout_of(config: dict) -> Int4Layout | None:
    """The INT4 layout a config.json states, or None for float weights."""
    if MARKER in config:
        marker = config[MARKER]
        group = marker.get("group_size") if isinstance(marker, dict) else None
        if not isinstance(marker, dict) or marker.get("format") != FORMAT_NAME or marker.get("bits") != 4:
            raise ModelFormatError(f"config.json: {MARKER} is {marker!r}, not a {FORMAT_NAME} 4-bit marker")
        if not isinstance(group, int) or group <= 0 or group % 2:
            raise ModelFormatError(f"config.json: {MARKER}.group_size {group!r} is not a positive even number")
        return Int4Layout("vla-edge", group)
    if ct.is_compressed_tensors(config):
        return Int4Layout("compressed-tensors", ct.read_scheme(config).group_size)
    qc = config.get("quantization_config")
    if qc:                                # gptq, awq, fp8, bitsandbytes, ...: packed data this package cannot read
        method = qc.get("quant_method") if isinstance(qc, dict) else qc
        raise ModelFormatError(f"config.json: quantization method {method!r} is not read; this package reads float "
                               f"weights, its own INT4 snapshots and compressed-tensors W4A16 (pack-quantized)")
    return None


def weight_format(model_dir: str | Path) -> str:
    """'int4' or 'float': what the snapshot's config.json says its projections are."""
    return "int4" if layout_of(read_config(model_dir)) else "float"


def projection_names(spec: ModelSpec) -> list[str]:
    """HF weight names of the tensors an INT4 snapshot quantizes (seven per layer)."""
    return [LAYER_TENSOR_NAMES[f].format(i=i) for i in range(spec.num_layers) for f in QUANTIZED_FIELDS]


def load_int4_weights(model_dir: str | Path, spec: ModelSpec | None = None) -> ModelWeights:
    """ModelWeights of an INT4 snapshot (ours or compressed-tensors W4A16): the projections dequantized
    (w_hat = q * scale, float32), everything else as stored (float32); shapes, scales and values checked."""
    model_dir = Path(model_dir)
    spec = spec or ModelSpec.from_dir(model_dir)
    layout = layout_of(read_config(model_dir))
    if layout is None:
        raise ModelFormatError(f"{model_dir}: config.json states no INT4 weights (no {MARKER} marker, no "
                               f"compressed-tensors quantization_config); set model.weights: float or run "
                               f"`vla-edge quantize`")
    reader = _TensorReader(model_dir)
    quantized = set(projection_names(spec))
    tensors, int4_names, tags = {}, set(), set()
    for name, shape in expected_shapes(spec).items():
        packed_scale = _read_int4_pair(reader, layout, name) if name in quantized else None
        if packed_scale is not None:
            packed, scales = packed_scale
            _, _, group = int4.check_pair(packed, scales, f"{model_dir}: {name}", expected_shape=shape)
            if group != layout.group_size:
                raise ModelFormatError(f"{model_dir}: {name} has groups of {group} weights, config.json states "
                                       f"{layout.group_size}")
            tensors[name] = int4.dequantize(packed, scales)                     # [out, in] float32
            int4_names.add(name)
            tags.add("INT4")
            continue
        if name in quantized and layout.kind == "vla-edge":
            raise ModelFormatError(f"{model_dir}: missing tensor {name.removesuffix('.weight') + PACKED_SUFFIX!r} (an INT4 snapshot "
                                   f"stores every projection in INT4)")
        arr, tag = reader.read_float(name)
        if tuple(arr.shape) != tuple(shape):
            raise ModelFormatError(f"{model_dir}: tensor {name!r} has shape {list(arr.shape)}, expected {list(shape)}")
        tensors[name] = arr
        tags.add(tag)
    weights = assemble_weights(spec, tensors, "+".join(sorted(tags)))
    weights.int4_names = frozenset(int4_names)
    weights.int4_group_size = layout.group_size
    return weights


def int4_entries(model_dir: str | Path, spec: ModelSpec | None = None) -> dict[str, tuple[Path, str, tuple]]:
    """Header-only check of a vla-edge INT4 snapshot, as weights.check_snapshot for float ones: HF weight name
    -> (file, dtype tag, logical shape), with tag "INT4" and the [out, in] matrix for a quantized projection."""
    model_dir = Path(model_dir)
    spec = spec or ModelSpec.from_dir(model_dir)
    layout = layout_of(read_config(model_dir))
    if layout is None or layout.kind != "vla-edge":
        raise ModelFormatError(f"{model_dir}: config.json has no {MARKER} marker")
    reader = _TensorReader(model_dir)
    quantized = set(projection_names(spec))
    entries = {}
    for name, shape in expected_shapes(spec).items():
        stored = ({name.removesuffix(".weight") + PACKED_SUFFIX: (shape[0], shape[1] // 2),
                   name.removesuffix(".weight") + SCALE_SUFFIX: (shape[0], shape[1] // layout.group_size)}
                  if name in quantized else {name: shape})
        for stored_name, want in stored.items():
            if not reader.has(stored_name):
                raise ModelFormatError(f"{model_dir}: missing tensor {stored_name!r}")
            tag, got, _, _ = reader.header(stored_name)
            if tuple(got) != tuple(want):
                raise ModelFormatError(f"{model_dir}: tensor {stored_name!r} has shape {list(got)}, expected "
                                       f"{list(want)}")
        entries[name] = (reader.locations[next(iter(stored))], "INT4" if name in quantized else tag, tuple(shape))
    return entries


class Int4Projections:
    """The INT4 projections of a vla-edge snapshot read one at a time, as stored (the CUDA backend uploads them
    so: weight_stream.Int4SnapshotTensors). compressed-tensors checkpoints are refused: their scales may be
    bf16 or fp32, which the device kernels (fp16 scales) would have to round."""

    def __init__(self, model_dir: str | Path, spec: ModelSpec):
        self.model_dir = Path(model_dir)
        layout = layout_of(read_config(self.model_dir))
        if layout is None or layout.kind != "vla-edge":
            what = "no INT4 weights" if layout is None else "a compressed-tensors checkpoint"
            raise ModelFormatError(f"{self.model_dir}: config.json states {what}; the CUDA backend reads vla-edge "
                                   f"INT4 snapshots (`vla-edge quantize` writes one; the numpy backend reads both)")
        self.group_size = layout.group_size
        self.names = frozenset(projection_names(spec))
        self._shapes = expected_shapes(spec)
        self._reader = _TensorReader(self.model_dir)
        self._layout = layout

    def read(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """(packed uint8 [out, in / 2], scales float16 [out, in / G]) of projection `name` (HF weight name),
        shapes, group and scale values checked."""
        if name not in self.names:
            raise KeyError(f"{name} is not one of the INT4 projections")
        pair = _read_int4_pair(self._reader, self._layout, name)
        if pair is None:
            raise ModelFormatError(f"{self.model_dir}: missing tensor {name.removesuffix('.weight') + PACKED_SUFFIX!r}")
        packed, scales = pair
        _, _, group = int4.check_pair(packed, scales, f"{self.model_dir}: {name}", expected_shape=self._shapes[name])
        if group != self.group_size:
            raise ModelFormatError(f"{self.model_dir}: {name} has groups of {group} weights, config.json states "
                                   f"{self.group_size}")
        return packed, scales


def quantize_snapshot(src: str | Path, out: str | Path, group_size: int, max_shard_bytes: int) -> Path:
    """Write `src` (a float snapshot) to `out` as a vla-edge INT4 snapshot, one tensor at a time."""
    src, out = Path(src), Path(out)
    config = read_config(src)
    if layout_of(config) is not None:
        raise ModelFormatError(f"{src}: already holds INT4 weights")
    if src.resolve() == out.resolve():
        raise ValueError(f"{out}: the output directory must differ from the input")
    spec = ModelSpec.from_hf_config(config)
    entries = check_snapshot(src, spec)                       # name -> (file, tag, shape), headers only
    check_group_size(spec, group_size)
    files: dict[Path, SafetensorsFile] = {}

    def read_float(name: str) -> np.ndarray:
        path = entries[name][0]
        f = files.setdefault(path, SafetensorsFile(path))
        arr, _ = f.read(name)
        if not np.isfinite(arr).all():
            raise ModelFormatError(f"{path}: tensor {name!r} has NaN or Inf values")
        return arr

    listing = [(name, shape, "BF16" if tag == "BF16" else "F32") for name, (_, tag, shape) in entries.items()]
    if out.exists() and not out.is_dir():
        raise ValueError(f"{out}: exists and is not a directory")
    # Written beside `out` and moved into place whole: a run that fails (a NaN in layer 3) left the old config.json
    # next to a half-written model.safetensors; now `out` is the new snapshot or stays as it was.
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.parent / f".{out.name}.partial-{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    try:
        write_int4_tensors(partial, listing, set(projection_names(spec)), read_float, group_size, max_shard_bytes)
        for item in src.iterdir():                           # tokenizer files, generation_config.json, ...
            if item.is_file() and not item.name.endswith(".safetensors") and item.name not in (INDEX_FILE,
                                                                                                CONFIG_FILE):
                shutil.copy2(item, partial / item.name)
        (partial / CONFIG_FILE).write_text(json.dumps(marked_config(config, group_size), indent=2) + "\n")
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    if out.exists():
        replaced = out.parent / f".{out.name}.replaced-{os.getpid()}"
        out.rename(replaced)
        partial.rename(out)
        shutil.rmtree(replaced, ignore_errors=True)
    else:
        partial.rename(out)
    logger.info("quantized %s -> %s (INT4, groups of %d)", src, out, group_size)
    return out


def write_int4_tensors(out: Path, listing: list, quantized: set, read_float: Callable[[str], np.ndarray],
                       group_size: int, max_shard_bytes: int) -> None:
    """Stream `listing` [(HF name, shape, float tag F32|BF16)] into `out`: names in `quantized` as INT4
    (packed + scales), the rest as float of their tag. read_float(name) gives one float32 tensor; it is
    called once per tensor, in order, and dropped after use."""
    plan = []
    for name, shape, tag in listing:
        if name in quantized:
            out_dim, in_dim = shape
            plan += [PlannedTensor(name.removesuffix(".weight") + PACKED_SUFFIX, "U8", (out_dim, in_dim // 2)),
                     PlannedTensor(name.removesuffix(".weight") + SCALE_SUFFIX, "F16", (out_dim, in_dim // group_size))]
        else:
            plan.append(PlannedTensor(name, tag, tuple(shape)))
    pending_scales: list[np.ndarray] = []

    def produce(tensor: PlannedTensor):
        if tensor.name.endswith(SCALE_SUFFIX):
            yield from pending_scales                          # quantized with the packed tensor just written
            pending_scales.clear()
            return
        if tensor.name.endswith(PACKED_SUFFIX):
            w = read_float(tensor.name.removesuffix(PACKED_SUFFIX) + ".weight")       # [out, in] float32
            for packed, scales in quantize_row_blocks(w, group_size, pool):          # [rows, in/2], [rows, in/G]
                pending_scales.append(scales)
                yield packed
            return
        arr = read_float(tensor.name)
        if tensor.tag != "BF16":
            yield arr
            return
        flat = arr.reshape(-1)                                 # bf16 rounding in blocks: its temporaries stay small
        for lo in range(0, flat.size, ROW_BLOCK_WEIGHTS):
            yield float32_to_bf16_bits(flat[lo:lo + ROW_BLOCK_WEIGHTS])

    with ThreadPoolExecutor(max_workers=QUANTIZE_THREADS) as pool:
        write_tensors(out, plan, produce, max_shard_bytes)


def quantize_row_blocks(w: np.ndarray, group_size: int, pool: ThreadPoolExecutor):
    """int4.quantize of w [out, in] by blocks of rows, QUANTIZE_THREADS blocks at a time, in row order: (packed,
    scales) per block. A row's scales and nibbles depend on that row alone, so the blocks are the whole matrix's."""
    rows = max(1, ROW_BLOCK_WEIGHTS // w.shape[1])
    starts = list(range(0, w.shape[0], rows))
    for k in range(0, len(starts), QUANTIZE_THREADS):       # a wave at a time: the temporaries stay bounded
        wave = starts[k:k + QUANTIZE_THREADS]
        yield from pool.map(lambda r0: int4.quantize(w[r0:r0 + rows], group_size), wave)


def marked_config(config: dict, group_size: int) -> dict:
    """config.json contents stating a vla-edge INT4 snapshot with groups of `group_size`."""
    marked = {k: v for k, v in config.items() if k != "quantization_config"}
    marked[MARKER] = {"format": FORMAT_NAME, "bits": 4, "group_size": group_size, "scale_dtype": "float16",
                      "packing": "uint8 [out, in/2]: column 2j in the low nibble, 2j+1 in the high, each q + 8",
                      "quantized": [f"*.{f}" for f in QUANTIZED_FIELDS],
                      "tensors": f"P{PACKED_SUFFIX} (U8), P{SCALE_SUFFIX} (F16) for each quantized P"}
    return marked


def write_dequantized_snapshot(src: str | Path, out: str | Path) -> Path:
    """A float32 snapshot of an INT4 one's dequantized values (what HF runs as the oracle); tokenizer copied."""
    src, out = Path(src), Path(out)
    spec = ModelSpec.from_dir(src)
    weights = load_int4_weights(src, spec)
    arrays = dict(weights.named_tensors())
    plan = [PlannedTensor(name, "F32", tuple(arr.shape)) for name, arr in arrays.items()]
    write_tensors(out, plan, lambda t: [arrays[t.name]], max_shard_bytes=1 << 62)
    config = {k: v for k, v in read_config(src).items() if k not in (MARKER, "quantization_config")}
    config["dtype"] = "float32"
    (out / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    for item in src.iterdir():
        if item.is_file() and not item.name.endswith(".safetensors") and item.name not in (INDEX_FILE, CONFIG_FILE):
            shutil.copy2(item, out / item.name)
    return out


# ----------------------------------------------------------------------------
# Internal helpers


class _TensorReader:
    """The tensors of a snapshot's safetensors files by name, whatever their dtype."""

    def __init__(self, model_dir: Path):
        self.model_dir = model_dir
        self.locations = tensor_locations(model_dir)
        self._files: dict[Path, SafetensorsFile] = {}

    def has(self, name: str) -> bool:
        return name in self.locations

    def header(self, name: str) -> tuple:
        """(dtype tag, shape, begin, end) from the file's header."""
        return self._file(name).entries[name]

    def read_stored(self, name: str) -> np.ndarray:
        return self._file(name).read_stored(name)[0]

    def read_float(self, name: str) -> tuple[np.ndarray, str]:
        if name not in self.locations:
            raise ModelFormatError(f"{self.model_dir}: missing tensor {name!r}")
        arr, tag = self._file(name).read(name)
        if not np.isfinite(arr).all():
            raise ModelFormatError(f"{self.model_dir}: tensor {name!r} has NaN or Inf values")
        return arr, tag

    def _file(self, name: str) -> SafetensorsFile:
        path = self.locations[name]
        if path not in self._files:
            self._files[path] = SafetensorsFile(path)
        if name not in self._files[path].entries:
            raise ModelFormatError(f"{path}: the index places tensor {name!r} in this file, but it is not there")
        return self._files[path]


def _read_int4_pair(reader: _TensorReader, layout: Int4Layout, name: str):
    """(packed uint8 [out, in/2], scales [out, in/G]) of projection `name`, or None where it is stored in float
    (compressed-tensors: a module on the ignore list). A packed tensor without its scales is an error."""
    if layout.kind == "vla-edge":
        packed_name = name.removesuffix(".weight") + PACKED_SUFFIX
        scale_name = name.removesuffix(".weight") + SCALE_SUFFIX
        if not reader.has(packed_name):
            return None
        if not reader.has(scale_name):
            raise ModelFormatError(f"{reader.model_dir}: {packed_name!r} has no scales ({scale_name!r} is missing)")
        packed, scales = reader.read_stored(packed_name), reader.read_stored(scale_name)
        if scales.dtype != np.float16:
            raise ModelFormatError(f"{reader.model_dir}: {scale_name!r} is {scales.dtype}, the format stores float16")
        return packed, scales
    packed_name, scale_name, shape_name = ct.stored_names(name)
    if not reader.has(packed_name):
        return None
    for needed in (scale_name, shape_name):
        if not reader.has(needed):
            raise ModelFormatError(f"{reader.model_dir}: {packed_name!r} has no {needed!r}")
    packed = ct.packed_bytes(reader.read_stored(packed_name), reader.read_stored(shape_name),
                             f"{reader.model_dir}: {packed_name}")
    scales = reader.read_stored(scale_name)
    if scales.dtype not in ct.SCALE_DTYPES:
        raise ModelFormatError(f"{reader.model_dir}: {scale_name!r} is {scales.dtype}: scales are floats")
    prefix = name.removesuffix(".weight")
    zero_name, g_idx_name = prefix + ct.ZERO_POINT_SUFFIX, prefix + ct.G_IDX_SUFFIX
    if reader.has(zero_name) and np.any(reader.read_stored(zero_name)):
        raise ModelFormatError(f"{reader.model_dir}: {zero_name!r} holds nonzero zero points: the weights are "
                               f"asymmetric, whatever the config says; not read")
    if reader.has(g_idx_name):
        in_dim = 2 * packed.shape[1]
        static = np.arange(in_dim) // layout.group_size
        if not np.array_equal(np.asarray(reader.read_stored(g_idx_name)).reshape(-1), static):
            raise ModelFormatError(f"{reader.model_dir}: {g_idx_name!r} puts columns in other groups than "
                                   f"column // {layout.group_size} (activation order): not read")
    return packed, scales


def check_group_size(spec: ModelSpec, group_size: int) -> None:
    """Every projection's input dimension must be whole groups (of whole bytes): say which is not, and what fits."""
    if group_size <= 0 or group_size % 2:
        raise ValueError(f"group size must be a positive even number, got {group_size}")
    inputs = {"hidden_size (q/k/v/gate/up_proj)": spec.hidden_size, "q_dim (o_proj)": spec.q_dim,
              "intermediate_size (down_proj)": spec.intermediate_size}
    bad = {what: dim for what, dim in inputs.items() if dim % group_size}
    if bad:
        common = int(np.gcd.reduce(list(inputs.values())))
        fits = (f"the largest group size that fits this model is {common}" if common % 2 == 0 else
                "no even group size fits this model")
        raise ValueError(f"group size {group_size} does not divide the input dimension of every projection: "
                         + ", ".join(f"{what} = {dim}" for what, dim in bad.items()) + f"; {fits}")

