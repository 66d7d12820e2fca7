"""Weights read one tensor or one block of rows at a time (model/weight_stream.py), as the GPU upload reads them.

Real snapshots written by make_model (float32 and bf16 on disk) against the
whole-model loader (itself held against HF transformers in test_weights.py),
plus the failures a streamed read must still name: a truncated file and a NaN
in a block.
"""
import json
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

from vla_edge_ros.model.make_model import make_model
from vla_edge_ros.model.spec import ModelFormatError
from vla_edge_ros.model.weight_stream import MemoryTensors, SnapshotTensors, tensor_source
from vla_edge_ros.model.weights import float32_to_bf16_bits, load_weights

EMBED = "model.embed_tokens.weight"
DOWN = "model.layers.1.mlp.down_proj.weight"


@pytest.fixture(scope="module", params=["float32", "bf16"])
def snapshot(request, tmp_path_factory):
    return make_model("tiny", tmp_path_factory.mktemp(f"tiny_{request.param}"), seed=4, dtype=request.param)


def test_every_tensor_and_row_block_equals_the_whole_model_loader(snapshot):
    weights = load_weights(snapshot)
    source = SnapshotTensors(snapshot)
    memory = MemoryTensors(weights, source.spec)
    for name, arr in weights.named_tensors():
        assert source.shape(name) == arr.shape
        np.testing.assert_array_equal(source.read(name, "f32"), arr)
        np.testing.assert_array_equal(source.read(name, "bf16"), float32_to_bf16_bits(arr).reshape(arr.shape))
        np.testing.assert_array_equal(memory.read(name, "bf16"), source.read(name, "bf16"))
    rows = source.shape(EMBED)[0]
    blocks = [source.read(EMBED, "bf16", rows=(r0, min(rows, r0 + 37))) for r0 in range(0, rows, 37)]
    np.testing.assert_array_equal(np.concatenate(blocks), source.read(EMBED, "bf16"))
    with pytest.raises(ValueError, match="out of range"):
        source.read(EMBED, "f32", rows=(0, rows + 1))
    with pytest.raises(ValueError, match="format"):
        source.read(EMBED, "fp8")


def test_tensor_source_accepts_a_directory_weights_or_a_source(snapshot):
    spec = SnapshotTensors(snapshot).spec
    assert isinstance(tensor_source(snapshot, spec), SnapshotTensors)
    assert isinstance(tensor_source(load_weights(snapshot), spec), MemoryTensors)
    with pytest.raises(TypeError, match="model directory"):
        tensor_source(42, spec)


def _tensor_span(path, name):
    """(absolute byte offset, dtype tag) of a tensor's data in a single-file snapshot."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    entry = json.loads(raw[8:8 + n])[name]
    return 8 + n + entry["data_offsets"][0], entry["dtype"]


def test_a_nan_in_a_block_is_named_with_its_row(snapshot, tmp_path):
    path = Path(shutil.copytree(snapshot, tmp_path / "model"))
    weights = path / "model.safetensors"
    offset, tag = _tensor_span(weights, DOWN)
    cols = SnapshotTensors(path).shape(DOWN)[1]
    raw = bytearray(weights.read_bytes())
    width = 2 if tag == "BF16" else 4
    nan = b"\xc0\x7f" if tag == "BF16" else np.array([np.nan], "<f4").tobytes()
    at = offset + (3 * cols + 5) * width                       # row 3, column 5
    raw[at:at + width] = nan
    weights.write_bytes(bytes(raw))
    source = SnapshotTensors(path)
    source.read(DOWN, "bf16", rows=(0, 3))                    # the rows before it are fine
    for fmt in ("bf16", "f32"):
        with pytest.raises(ModelFormatError, match=r"down_proj.*non-finite.*\(3, 5\)"):
            source.read(DOWN, fmt)


def test_a_truncated_snapshot_is_refused_before_any_tensor_is_read(snapshot, tmp_path):
    path = Path(shutil.copytree(snapshot, tmp_path / "model"))
    weights = path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    with pytest.raises(ModelFormatError, match="truncated"):
        SnapshotTensors(path)
