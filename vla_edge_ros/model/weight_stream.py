"""Weights read one tensor (or one block of rows) at a time, in the format the device stores.

`load_weights` (weights.py) builds the whole model as float32 numpy arrays:
right for the numpy backend, wasteful for the GPU, where a 1.5B model in bf16
is 3.1 GB on the device but 6.2 GB of float32 on the host, and the reasoning
process's peak resident memory was 7.7 GiB. The CUDA backend instead pulls
tensors from a `TensorSource` as it uploads them:

    source.read(name, fmt, rows=None) -> np.ndarray
        name  HF tensor name (weights.LAYER_TENSOR_NAMES / GLOBAL_TENSOR_NAMES)
        fmt   "bf16" -> uint16 bfloat16 bit patterns (stored bf16 bits are passed
                        through untouched; wider dtypes are rounded to nearest even)
              "f32"  -> float32 (bf16 widened exactly)
        rows  (r0, r1): only those rows of a 2-D tensor (the embedding table is
              uploaded in blocks, so at most one block is ever on the host)

Three sources: `SnapshotTensors` reads a snapshot directory's safetensors files
with plain file reads at the header's offsets (no mmap, so nothing of the file
stays resident), checking every block for NaN/Inf and naming the file and
tensor; `Int4SnapshotTensors` does the same for a vla-edge INT4 snapshot
(int4_snapshot.py) and serves its projections as stored, packed nibbles and
fp16 scales (`int4 = True`, `read_int4(name)`); `MemoryTensors` serves a
ModelWeights already in memory (tests, the benchmark). Names and shapes are
checked up front by weights.check_snapshot (int4_snapshot.int4_entries).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .spec import ModelFormatError, ModelSpec
from .weights import (GLOBAL_TENSOR_NAMES, SAFETENSORS_DTYPES, ModelWeights, SafetensorsFile, bf16_bits_to_float32,
                      check_snapshot, float32_to_bf16_bits)

FORMATS = ("bf16", "f32")
BF16_EXPONENT = 0x7F80          # all exponent bits set: Inf or NaN


class SnapshotTensors:
    """The tensors of a HF snapshot directory, read on demand (see the module docstring)."""

    int4 = False                    # float projections (Int4SnapshotTensors: INT4 ones)

    def __init__(self, model_dir: str | Path, spec: ModelSpec | None = None, entries: dict | None = None):
        self.model_dir = Path(model_dir)
        self.spec = spec or ModelSpec.from_dir(self.model_dir)
        # name -> (file, tag, shape), from the headers
        self._entries = entries if entries is not None else check_snapshot(self.model_dir, self.spec)
        self._files: dict[Path, SafetensorsFile] = {}
        self.tied = self.spec.tie_word_embeddings

    def has(self, name: str) -> bool:
        return name in self._entries

    def shape(self, name: str) -> tuple:
        return tuple(self._entry(name)[2])

    def read(self, name: str, fmt: str, rows: tuple | None = None) -> np.ndarray:
        path, tag, shape = self._entry(name)
        _check_format(fmt)
        f = self._files.get(path)
        if f is None:
            f = self._files[path] = SafetensorsFile(path)
        _, _, begin, _ = f.entries[name]
        r0, r1, out_shape = _row_range(name, shape, rows)
        row_elems = int(np.prod(shape[1:], dtype=np.int64)) if len(shape) > 1 else 1
        itemsize = SAFETENSORS_DTYPES[tag][0]
        count = (r1 - r0) * row_elems
        offset = f.data_start + begin + r0 * row_elems * itemsize
        if tag == "BF16":
            raw = np.fromfile(path, dtype="<u2", count=count, offset=offset)
        else:
            raw = np.fromfile(path, dtype=np.dtype(SAFETENSORS_DTYPES[tag][1]).newbyteorder("<"), count=count,
                              offset=offset)
        if raw.size != count:
            raise ModelFormatError(f"{path}: tensor {name!r} is truncated ({raw.size} of {count} values read)")
        out = _convert(raw, tag, fmt).reshape(out_shape)
        _check_finite(path, name, out, fmt, r0)
        return out

    def _entry(self, name: str):
        try:
            return self._entries[name]
        except KeyError:
            raise ModelFormatError(f"{self.model_dir}: no tensor {name!r} in the snapshot") from None


class Int4SnapshotTensors(SnapshotTensors):
    """A vla-edge INT4 snapshot read on demand: its float tensors (embedding, head, norms, biases) as
    SnapshotTensors serves them, its projections (int4_snapshot.QUANTIZED_FIELDS of every layer) as stored by
    read_int4: the device computes with w_hat = q * scale exactly as the numpy backend does."""

    int4 = True

    def __init__(self, model_dir: str | Path, spec: ModelSpec | None = None):
        from .int4_snapshot import Int4Projections, int4_entries
        spec = spec or ModelSpec.from_dir(model_dir)
        self._projections = Int4Projections(model_dir, spec)        # refuses other INT4 layouts by name
        super().__init__(model_dir, spec, entries=int4_entries(model_dir, spec))
        self.int4_group_size = self._projections.group_size

    def read(self, name: str, fmt: str, rows: tuple | None = None) -> np.ndarray:
        if name in self._projections.names:
            raise ModelFormatError(f"{self.model_dir}: {name} is stored in INT4; read it with read_int4")
        return super().read(name, fmt, rows)

    def read_int4(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """(packed uint8 [out, in / 2], scales as uint16 fp16 bits [out, in / G]) of projection `name`."""
        packed, scales = self._projections.read(name)
        return np.ascontiguousarray(packed), np.ascontiguousarray(scales).view(np.uint16)


class MemoryTensors:
    """A ModelWeights already in memory (float32 arrays), served like SnapshotTensors. An INT4 model's
    dequantized arrays are float weights here: only an INT4 snapshot directory uploads INT4."""

    int4 = False

    def __init__(self, weights: ModelWeights, spec: ModelSpec):
        self.spec = spec
        self.tied = weights.tied
        self._arrays = dict(weights.named_tensors())
        if weights.tied:
            self._arrays.pop(GLOBAL_TENSOR_NAMES["lm_head"], None)

    def has(self, name: str) -> bool:
        return name in self._arrays

    def shape(self, name: str) -> tuple:
        return tuple(self._arrays[name].shape)

    def read(self, name: str, fmt: str, rows: tuple | None = None) -> np.ndarray:
        _check_format(fmt)
        arr = self._arrays[name]
        r0, r1, _ = _row_range(name, arr.shape, rows)
        part = arr if rows is None else arr[r0:r1]
        if fmt == "bf16":
            return float32_to_bf16_bits(part).reshape(part.shape)
        return np.ascontiguousarray(part, dtype=np.float32)


def tensor_source(weights, spec: ModelSpec):
    """A TensorSource for `weights`: a snapshot directory (str / Path), a ModelWeights, or a source already."""
    if isinstance(weights, (str, Path)):
        from .int4_snapshot import weight_format
        return Int4SnapshotTensors(weights, spec) if weight_format(weights) == "int4" else SnapshotTensors(weights, spec)
    if isinstance(weights, ModelWeights):
        if len(weights.layers) != spec.num_layers:
            raise ValueError(f"weights have {len(weights.layers)} layers, spec says {spec.num_layers}")
        return MemoryTensors(weights, spec)
    if isinstance(weights, (SnapshotTensors, MemoryTensors)):   # Int4SnapshotTensors too
        return weights
    raise TypeError(f"weights must be a model directory, a ModelWeights or a tensor source, got {type(weights).__name__}")


# ----------------------------------------------------------------------------
# Internal helpers


def _check_format(fmt: str) -> None:
    if fmt not in FORMATS:
        raise ValueError(f"tensor format {fmt!r} unknown; choose one of {FORMATS}")


def _row_range(name: str, shape: tuple, rows: tuple | None) -> tuple[int, int, tuple]:
    if rows is None:
        return 0, (shape[0] if shape else 1), tuple(shape)
    r0, r1 = int(rows[0]), int(rows[1])
    if len(shape) < 2 or not 0 <= r0 < r1 <= shape[0]:
        raise ValueError(f"rows {rows} of tensor {name!r} {list(shape)} out of range")
    return r0, r1, (r1 - r0,) + tuple(shape[1:])


def _convert(raw: np.ndarray, tag: str, fmt: str) -> np.ndarray:
    if tag == "BF16":
        return raw if fmt == "bf16" else bf16_bits_to_float32(raw)
    as_f32 = raw.astype(np.float32)
    return float32_to_bf16_bits(as_f32) if fmt == "bf16" else as_f32


def _check_finite(path, name: str, arr: np.ndarray, fmt: str, row0: int) -> None:
    bad = (arr & BF16_EXPONENT) == BF16_EXPONENT if fmt == "bf16" else ~np.isfinite(arr)
    if bad.any():
        where = np.argwhere(bad)[0]
        if arr.ndim:
            where[0] += row0
        raise ModelFormatError(f"{path}: tensor {name!r} has {int(np.count_nonzero(bad))} non-finite values in the "
                               f"block read (first at index {tuple(int(i) for i in where)})")
