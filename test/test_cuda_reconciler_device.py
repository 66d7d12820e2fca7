"""asr.device: the GPU a reconciler runs on (model/cuda_device.reconciler_device_index, core/engine_factory).

GPU only (marker `gpu`); written to run on one GPU. -1 and the primary's own index mean the primary's
device; an index the process cannot see is a configure error naming asr.device; on a machine with two
GPUs, index 1 either runs there (peer access) or says why not. The KV crossing between the reconciler's
context and the primary's goes by cuMemcpyPeerAsync: here both contexts are on device 0 (a context of its
own beside the primary context), the arrangement the API allows on one GPU, and the rows must arrive
bit for bit.
"""
import numpy as np
import pytest

from vla_edge_ros import config as C

pytestmark = pytest.mark.gpu

CAPACITY = 512


def _cfg(model_dir, device: int):
    return C.load(overrides={"model.path": str(model_dir), "model.backend": "pycuda", "model.dtype": "float32",
                             "kv.capacity_tokens": CAPACITY, "asr.backend": "pycuda", "asr.device": device,
                             "asr.warmup_tokens_per_step": 64})


def test_device_choice_and_a_clear_error_for_an_index_that_does_not_exist(tiny_model_dir):
    from vla_edge_ros.core.engine_factory import reconciler_state
    from vla_edge_ros.model.cuda_device import NoCudaDevice, device_count, reconciler_device_index
    count = device_count()
    assert reconciler_device_index(-1) == (0, "device 0, the primary's (asr.device -1)")
    assert reconciler_device_index(0)[0] == 0
    with pytest.raises(NoCudaDevice, match=rf"asr\.device {count}: this process sees {count} CUDA device"):
        reconciler_device_index(count)
    with pytest.raises(NoCudaDevice, match=r"asr\.device"):
        reconciler_state(_cfg(tiny_model_dir, count))                 # what the reconciler's configure reports
    if count > 1:
        index, why = reconciler_device_index(1)
        assert ("peer to peer" in why) if index == 1 else (index == 0 and "cannot be read peer to peer" in why), why
    state = reconciler_state(_cfg(tiny_model_dir, 0))
    try:
        assert state.backend.device.index == 0 and state.kv_export is not None
    finally:
        state.backend.close()


def test_the_reconciler_backend_is_held_to_the_configured_vram_ceiling(tiny_model_dir):
    # The reconciler has no engine to check memory.vram_ceiling_gib: its CUDA backend must (engine_factory.
    # backend_options); before, it kept the backend's own 8 GiB whatever the configuration said.
    from vla_edge_ros.core.engine_factory import reconciler_state
    from vla_edge_ros.model.cuda_backend import DeviceMemoryError
    cfg = _cfg(tiny_model_dir, -1).replace({"memory.vram_ceiling_gib": 1e-4})       # ~100 KiB: below any plan
    with pytest.raises(DeviceMemoryError, match="over the VRAM ceiling of 0.00 GiB"):
        reconciler_state(cfg)


def test_kv_crosses_from_a_reconciler_context_of_its_own_bit_for_bit(tiny_model_dir):
    from vla_edge_ros.model.cuda_device import CudaDevice, reconciler_device_index
    from vla_edge_ros.model.cuda_state_transfer import DeviceKvExporter
    from vla_edge_ros.model.factory import create_backend
    index, _why = reconciler_device_index(0)
    own = CudaDevice.own(index)
    reconciler = create_backend("pycuda", tiny_model_dir, CAPACITY, "float32", device=own)
    primary = create_backend("pycuda", tiny_model_dir, CAPACITY, "float32")
    try:
        spec = reconciler.spec
        rows = 40
        kv = np.random.default_rng(5).standard_normal((2, spec.num_layers, rows, spec.kv_dim)).astype(np.float32)
        src = np.arange(rows, dtype=np.int32) + 7
        reconciler.write_kv(src, kv)
        exported = DeviceKvExporter(reconciler, 3)(reconciler, src)
        dst = np.arange(CAPACITY - 1, CAPACITY - 1 - rows, -1)
        exported.write_into(primary, dst)
        np.testing.assert_array_equal(primary.read_kv(dst), kv)
        assert exported.last_copy_ms is not None
    finally:
        primary.close()
        reconciler.close()
        own.close()
