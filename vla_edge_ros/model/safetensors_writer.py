"""Stream tensors of any safetensors dtype into a snapshot directory, one block of rows at a time.

The header of a safetensors file comes before its data and holds every
tensor's dtype, shape and byte range, so the whole plan (names, dtype tags,
shapes) is known first and the data follows in order: a tensor is produced,
written and dropped before the next one exists. Peak memory is then one
produced block, never the model (a 7B model's INT4 snapshot is written
without the model ever being in memory, in any dtype).

Files: `model.safetensors`, or shards `model-0000k-of-0000n.safetensors` plus
`model.safetensors.index.json` when the plan exceeds `max_shard_bytes`, as HF
writes them. (make_model.write_safetensors_snapshot is the float-only writer
of the synthetic models; this one also takes the integer and fp16 tensors of
INT4 snapshots.)
"""
from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

from .weights import INDEX_FILE, SAFETENSORS_DTYPES, SINGLE_FILE

# dtype tag -> the numpy dtype its bytes are written from (BF16 as its uint16 bit patterns)
WRITE_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "F64": np.float64,
                "U8": np.uint8, "I32": np.int32, "I64": np.int64}


@dataclass(frozen=True)
class PlannedTensor:
    name: str          # HF tensor name
    tag: str           # safetensors dtype tag (WRITE_DTYPES)
    shape: tuple

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * SAFETENSORS_DTYPES[self.tag][0]


# produce(tensor) -> the tensor's data as blocks of leading rows, in order, each in WRITE_DTYPES[tag]
Producer = Callable[[PlannedTensor], Iterable[np.ndarray]]


def write_tensors(out: Path, plan: list[PlannedTensor], produce: Producer, max_shard_bytes: int) -> list[Path]:
    """Write `plan` into `out` (shards + index beyond max_shard_bytes); returns the files written."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    shards: list[list[PlannedTensor]] = [[]]
    shard_bytes = 0
    for tensor in plan:
        if tensor.tag not in WRITE_DTYPES:
            raise ValueError(f"tensor {tensor.name!r}: dtype tag {tensor.tag} not writable; use one of "
                             f"{sorted(WRITE_DTYPES)}")
        if shards[-1] and shard_bytes + tensor.nbytes > max_shard_bytes:
            shards.append([])
            shard_bytes = 0
        shards[-1].append(tensor)
        shard_bytes += tensor.nbytes
    for stale in list(out.glob("model*.safetensors")) + [out / INDEX_FILE]:
        stale.unlink(missing_ok=True)   # shards of an earlier snapshot of another size must not stay behind
    names = [SINGLE_FILE] if len(shards) == 1 else \
        [f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors" for k in range(len(shards))]
    weight_map, total = {}, 0
    for file_name, tensors in zip(names, shards):
        total += _write_file(out / file_name, tensors, produce)
        weight_map.update({t.name: file_name for t in tensors})
    if len(shards) > 1:
        (out / INDEX_FILE).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map},
                                                 indent=2) + "\n")
    return [out / name for name in names]


def _write_file(path: Path, tensors: list[PlannedTensor], produce: Producer) -> int:
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for t in tensors:
        header[t.name] = {"dtype": t.tag, "shape": [int(d) for d in t.shape],
                          "data_offsets": [offset, offset + t.nbytes]}
        offset += t.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)   # data block 8-byte aligned, as the reference writer does
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for t in tensors:
            want = np.dtype(WRITE_DTYPES[t.tag]).newbyteorder("<")
            written = 0
            for block in produce(t):
                if block.dtype != np.dtype(WRITE_DTYPES[t.tag]):
                    raise ValueError(f"tensor {t.name!r}: produced {block.dtype}, {t.tag} needs "
                                     f"{np.dtype(WRITE_DTYPES[t.tag])}")
                data = np.ascontiguousarray(block, dtype=want)
                f.write(data.data)
                written += data.nbytes
            if written != t.nbytes:
                raise ValueError(f"tensor {t.name!r} {t.tag}{list(t.shape)}: produced {written} bytes, "
                                 f"planned {t.nbytes}")
    return offset
