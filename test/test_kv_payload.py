"""The swap's KV payload protocol (model/backend.py) on the host: what the CUDA payloads (DeviceKV, IpcKV)
implement too, tested on the GPU by test_cuda_asr.py and test_cuda_ipc.py through the same swap path."""
import numpy as np
import pytest

from vla_edge_ros.model.backend import HostKV, kv_payload
from vla_edge_ros.model.factory import create_backend
from vla_edge_ros.model.spec import ModelSpec


def test_host_rows_are_wrapped_and_written_into_the_arena(tiny_model_dir):
    spec = ModelSpec.from_dir(tiny_model_dir)
    backend = create_backend("numpy", tiny_model_dir, capacity=16)
    rows = np.random.default_rng(0).standard_normal((2, spec.num_layers, 3, spec.kv_dim)).astype(np.float32)
    payload = kv_payload(rows)
    assert isinstance(payload, HostKV) and not payload.on_device and payload.shape == rows.shape
    assert payload.all_finite()
    payload.check_usable()                                   # host rows are always the snapshot's own
    slots = np.array([7, 2, 11], dtype=np.int32)
    payload.write_into(backend, slots)
    np.testing.assert_array_equal(backend.read_kv(slots), rows)
    assert kv_payload(None) is None
    assert kv_payload(payload) is payload                    # a payload passes through as it is


def test_non_finite_host_rows_are_seen_and_refused_by_the_arena(tiny_model_dir):
    spec = ModelSpec.from_dir(tiny_model_dir)
    backend = create_backend("numpy", tiny_model_dir, capacity=16)
    rows = np.zeros((2, spec.num_layers, 2, spec.kv_dim), np.float32)
    rows[1, 0, 1, 3] = np.nan
    payload = kv_payload(rows)
    assert not payload.all_finite()
    with pytest.raises(ValueError, match="NaN or Inf"):
        payload.write_into(backend, np.array([0, 1], dtype=np.int32))
