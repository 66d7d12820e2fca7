"""The CUDA backend's INT4 upload and launch checks, on the CPU (no device needed).

DeviceMemory uploads an INT4 snapshot's projections as Int4Matrix (packed nibbles + fp16 scales) in the row
layouts the kernels read; here its upload runs against a host stand-in for device memory and the matrices it
built, dequantized, must be the float layouts of the numpy backend's w_hat: q|k|v stacked, in
qkv_rope_row_order, gate/up interleaved, padding rows exact zeros. The plan counts packed + scales bytes as
int4.device_bytes. The launchers refuse what the INT4 kernels cannot take, by name.
"""
from types import SimpleNamespace

import numpy as np
import pytest

from vla_edge_ros.model import int4
from vla_edge_ros.model import weight_layouts as layouts
from vla_edge_ros.model.cuda_device_memory import DeviceMemory
from vla_edge_ros.model.cuda_int4_launchers import Int4Launchers, Int4Matrix
from vla_edge_ros.model.cuda_launch_common import KernelError
from vla_edge_ros.model.int4_snapshot import load_int4_weights
from vla_edge_ros.model.make_model import make_model
from vla_edge_ros.model.spec import ModelFormatError, ModelSpec
from vla_edge_ros.model.weight_stream import Int4SnapshotTensors, tensor_source

GROUP = 32                      # tiny's intermediate_size 352 and llama-tiny's hidden 96 take 32, not 128


@pytest.fixture(scope="module", params=["tiny", "llama-tiny"])
def int4_model(request, tmp_path_factory):
    path = make_model(request.param, tmp_path_factory.mktemp(request.param) / "int4", seed=3, int4_group_size=GROUP)
    return path, ModelSpec.from_dir(path)


class HostMemory(DeviceMemory):
    """DeviceMemory's upload with host arrays for device buffers."""

    def __init__(self, spec, source, dtype="bfloat16"):
        self.spec, self.dtype, self.int4 = spec, dtype, source.int4
        self.int4_group = source.int4_group_size
        self.max_rows, self.capacity, self.bulk_min_rows, self.bulk_max_rows = 8, 64, 0, 0
        self.kv_element = np.dtype(np.float32)
        self._bytes = 0

    def _alloc(self, shape, dtype, zero=True):
        arr = np.zeros(shape, dtype)
        self._bytes += arr.nbytes
        return arr

    def _to_device(self, host):
        arr = self._alloc(host.shape, host.dtype)
        arr[...] = host
        return arr

    def _upload_rows(self, source, name, wdt):
        return self._to_device(self._read(source, name, wdt))


def _dequantized(matrix: Int4Matrix) -> np.ndarray:
    assert isinstance(matrix, Int4Matrix) and matrix.packed.dtype == np.uint8 and matrix.scales.dtype == np.uint16
    return int4.dequantize(matrix.packed, matrix.scales.view(np.float16))


def test_int4_snapshot_source_serves_packed_nibbles_and_scales(int4_model):
    path, spec = int4_model
    source = tensor_source(path, spec)
    assert isinstance(source, Int4SnapshotTensors) and source.int4 and source.int4_group_size == GROUP
    weights = load_int4_weights(path, spec)
    name = "model.layers.1.mlp.down_proj.weight"
    packed, scales = source.read_int4(name)
    assert packed.dtype == np.uint8 and scales.dtype == np.uint16
    np.testing.assert_array_equal(int4.dequantize(packed, scales.view(np.float16)), weights.layers[1].down_proj)
    with pytest.raises(ModelFormatError, match="stored in INT4; read it with read_int4"):
        source.read(name, "f32")
    np.testing.assert_array_equal(source.read("model.embed_tokens.weight", "f32", rows=(2, 5)), weights.embed[2:5])


def test_int4_upload_lays_out_rows_as_the_float_upload(int4_model):
    path, spec = int4_model
    source = tensor_source(path, spec)
    mem = HostMemory(spec, source)
    mem._upload_weights(source, np.uint16)
    weights = load_int4_weights(path, spec)
    order = layouts.qkv_rope_row_order(spec.num_heads, spec.num_kv_heads, spec.head_dim)
    for i, (dev, ref) in enumerate(zip(mem.layers, weights.layers)):
        qkv = np.concatenate([ref.q_proj, ref.k_proj, ref.v_proj])
        np.testing.assert_array_equal(_dequantized(dev.w_qkv), qkv, err_msg=f"layer {i} q|k|v")
        np.testing.assert_array_equal(_dequantized(dev.w_qkv_rope), layouts.permute_rows(qkv, order))
        np.testing.assert_array_equal(_dequantized(dev.w_o), ref.o_proj)
        np.testing.assert_array_equal(_dequantized(dev.w_gate_up), layouts.interleave_gate_up(ref.gate_proj, ref.up_proj))
        np.testing.assert_array_equal(_dequantized(dev.w_down), ref.down_proj)
        pad = order < 0
        if pad.any():                       # padding rows: q = 0 nibbles (0x88), scale 0
            assert (dev.w_qkv_rope.packed[pad] == layouts.INT4_ZERO_BYTE).all()
            assert not dev.w_qkv_rope.scales[pad].any()


def test_int4_plan_and_byte_counts_are_packed_plus_scales(int4_model):
    path, spec = int4_model
    source = tensor_source(path, spec)
    mem = HostMemory(spec, source)
    plan = mem._plan(np.uint16)
    assert "layer0.qkv.packed" in plan and "layer0.qkv" not in plan and "decode_layer_table" not in plan
    assert plan["layer0.down.scales"] == ((spec.hidden_size, spec.intermediate_size // GROUP), np.uint16)
    mem._upload_weights(source, np.uint16)
    per_layer = [layer.w_qkv.nbytes + layer.w_o.nbytes + layer.w_gate_up.nbytes + layer.w_down.nbytes
                 for layer in mem.layers]
    weights = load_int4_weights(path, spec)
    expected = sum(int4.device_bytes(arr.size, GROUP) for name, arr in weights.named_tensors()
                   if name in weights.int4_names)
    i8 = -(-spec.intermediate_size // 8) * 8        # gate/up padding rows to whole tiles count as stored
    padding = spec.num_layers * int4.device_bytes(2 * (i8 - spec.intermediate_size) * spec.hidden_size, GROUP)
    assert sum(per_layer) == expected + padding
    norms = 2 * spec.hidden_size * 4 + ((spec.q_dim + 2 * spec.kv_dim) * 4 if spec.qkv_bias else 0)
    assert mem.layer_weight_bytes == sum(per_layer) + spec.num_layers * norms       # the q|k|v copy counted once


def test_compressed_tensors_int4_is_refused_by_name_for_the_device(tmp_path):
    from vla_edge_ros.model.int4_snapshot import Int4Projections
    path = make_model("tiny", tmp_path / "float", seed=1)
    with pytest.raises(ModelFormatError, match="states no INT4 weights; the CUDA backend reads vla-edge"):
        Int4Projections(path, ModelSpec.from_dir(path))


def _launchers():
    kn = Int4Launchers()
    kn.num_sms, kn._shared_limits = 132, {"gemv_int4": 227 * 1024}
    kn._function = lambda name: None
    kn.launched = []
    kn._launch = lambda name, grid, block, stream, *args, shared=0: kn.launched.append((name, grid))
    return kn


def _array(shape, dtype):
    return SimpleNamespace(shape=tuple(shape), dtype=np.dtype(dtype), gpudata=0,
                           nbytes=int(np.prod(shape)) * np.dtype(dtype).itemsize, size=int(np.prod(shape)))


def test_int4_launchers_refuse_what_the_kernels_cannot_take():
    from vla_edge_ros.model.cuda_kernels import MODE_ADD, MODE_QKV_ROPE, MODE_STORE, MODE_SWIGLU
    kn = _launchers()
    x, out = _array((1, 256), np.float32), _array((4, 64), np.float32)
    good = Int4Matrix(_array((64, 128), np.uint8), _array((64, 2), np.uint16), 128)
    kn.gemv(good, x, out, MODE_STORE, None)
    kn.projection(good, _array((4, 256), np.float32), out, 4, MODE_ADD, None)
    assert [name for name, _ in kn.launched] == ["gemv_int4", "projection_int4_nt1"]
    with pytest.raises(KernelError, match="group 48 must be a multiple of 32"):
        kn.gemv(Int4Matrix(_array((64, 48), np.uint8), _array((64, 2), np.uint16), 48), x, out, MODE_STORE, None)
    with pytest.raises(KernelError, match=r"scales: shape \(64, 4\), expected \(64, 2\)"):
        kn.gemv(Int4Matrix(_array((64, 128), np.uint8), _array((64, 4), np.uint16), 128), x, out, MODE_STORE, None)
    with pytest.raises(KernelError, match="packed: dtype uint16, expected uint8"):
        kn.gemv(Int4Matrix(_array((64, 128), np.uint16), _array((64, 2), np.uint16), 128), x, out, MODE_STORE, None)
    with pytest.raises(KernelError, match="rope target missing"):
        kn.gemv(good, x, out, MODE_QKV_ROPE, None)
    with pytest.raises(KernelError, match="unknown mode"):
        kn.projection(good, _array((4, 256), np.float32), out, 4, MODE_QKV_ROPE, None)
    with pytest.raises(KernelError, match="ksplit 2 needs MODE_ADD"):
        kn.projection(good, _array((4, 256), np.float32), out, 4, MODE_STORE, None, ksplit=2)
    with pytest.raises(KernelError, match="multiple of 16"):
        kn.projection(Int4Matrix(_array((24, 128), np.uint8), _array((24, 2), np.uint16), 128),
                      _array((4, 256), np.float32), out, 4, MODE_SWIGLU, None)
    with pytest.raises(KernelError, match="row stride 128 must be >= K 256"):
        kn.gemv(good, _array((1, 128), np.float32), out, MODE_STORE, None)
