"""Shared test set-up: ROS on localhost only, GPU tests skipped without a device."""
import os

import pytest

# Real DDS traffic in tests must stay on this machine.
os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")


def _cuda_available() -> bool:
    try:
        import pycuda.driver as drv
        drv.init()
        return drv.Device.count() > 0
    except Exception:  # noqa: BLE001 - any import/driver failure means "no GPU here"
        return False


def pytest_collection_modifyitems(config, items):
    if any("gpu" in item.keywords for item in items) and not _cuda_available():
        skip = pytest.mark.skip(reason="no CUDA device / PyCUDA on this machine")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """The default CPU model (seeded, Qwen2-shaped), written once per test session."""
    from vla_edge_ros.model.make_model import make_model
    out = tmp_path_factory.mktemp("models") / "tiny"
    make_model("tiny", out)
    return out


@pytest.fixture(scope="session")
def cuda_device():
    """Device 0's primary context, current on the main thread for the whole session: for GPU tests that
    touch device arrays themselves. Backends do not need it (each call makes its context current), and
    test_cuda_threads.py checks exactly that from threads that hold no context."""
    from vla_edge_ros.model.cuda_device import primary_device
    device = primary_device(0)
    with device.bound():
        yield device


@pytest.fixture(scope="session")
def kn(cuda_device):
    """The kernels of cuda/*.cu compiled into the session's context (cuda_kernels.CudaKernels)."""
    from vla_edge_ros.model.cuda_kernels import CudaKernels
    return CudaKernels(cuda_device)


@pytest.fixture(scope="session")
def kn16(cuda_device):
    """The kernels compiled for a bf16 KV arena, in the session's context."""
    from vla_edge_ros.model.cuda_kernels import CudaKernels
    return CudaKernels(cuda_device, kv_dtype="bfloat16")


@pytest.fixture(scope="session")
def gpu(cuda_device):
    """(pycuda.gpuarray, a stream of the session's context) for tests that build device arrays."""
    from pycuda import gpuarray
    return gpuarray, cuda_device.drv.Stream()


@pytest.fixture(scope="session")
def tiny_weights(tiny_model_dir):
    """(ModelSpec, ModelWeights) of the session's tiny model, for backends built from memory."""
    from vla_edge_ros.model.spec import ModelSpec
    from vla_edge_ros.model.weights import load_weights
    spec = ModelSpec.from_dir(tiny_model_dir)
    return spec, load_weights(tiny_model_dir, spec)


# The two-engine ASR tests' inputs (test_reconciliation.py, test_swap_finish_next_cycle.py, test_layered_steps.py):
# real footage, the tiny model loaded once per module, and HF transformers on it as the oracle. A module that needs
# another clip or model defines its own fixture of the same name, which takes precedence.
@pytest.fixture(scope="module")
def clip():
    from vla_edge_ros.core.footage import read_clip
    return read_clip("bikes.mp4", max_frames=48)


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    from vla_edge_ros.model.factory import load_model
    return load_model(tiny_model_dir)


@pytest.fixture(scope="module")
def hf(tiny_model_dir):
    from vla_edge_ros.model.hf_oracle import load_hf_model
    return load_hf_model(tiny_model_dir)
