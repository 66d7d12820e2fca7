"""Pick and build a transformer backend for a model directory.

kind "auto" takes PyCUDA when `pycuda.driver` imports and sees a device, else
numpy; `choose_backend` also says why, in one line, for the logs and the CLI.
The CUDA backend module is imported only when chosen, so this module (and the
numpy path) never touches a GPU.

The numpy backend needs the whole model as float32 arrays (`load_weights`);
the CUDA backend streams the snapshot to the device tensor by tensor in its
stored dtype (weight_stream.py; an INT4 snapshot's projections as packed
nibbles and fp16 scales), so the host never holds the model.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from ..config import BACKENDS as BACKEND_KINDS
from ..config import WEIGHT_FORMATS
from .backend import Backend
from .spec import ModelFormatError, ModelSpec
from .weights import ModelWeights, canonical_dtype, load_tokenizer, load_weights

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class BackendChoice:
    kind: str          # "numpy" | "pycuda"
    asked: str         # what the configuration said (auto | numpy | pycuda)
    reason: str        # one line: why this kind

    def describe(self) -> str:
        return f"backend {self.kind} ({self.reason})"


def load_model(model_dir: str | Path):
    """(ModelSpec, ModelWeights, tokenizers.Tokenizer) of a snapshot directory (weights as float32 on the host)."""
    spec = ModelSpec.from_dir(model_dir)
    weights = load_weights(model_dir, spec)
    return spec, weights, load_tokenizer(model_dir)


def create_backend(kind: str, model_dir: str | Path, capacity: int, dtype="float32", device=None,
                   kernel_options: dict | None = None, kv_dtype: str = "float32", weights: str = "float") -> Backend:
    """Load `model_dir` and build backend `kind` (auto | numpy | pycuda) with `capacity` KV slots.
    pycuda streams the weights to the device (never the whole model on the host); device: a CudaDevice;
    kernel_options: pycuda's bulk prefill rows (ModelConfig.kernel_options(); CudaBackend's keyword arguments; the
    kernels are the measured-best KernelPlan, model/cuda_kernel_plan.py);
    kv_dtype: the KV arena's element type, 'float32' or 'bfloat16' (kv.dtype); weights: 'float' or 'int4'
    (model.weights), what the snapshot must hold."""
    spec = ModelSpec.from_dir(model_dir)
    choice = choose_backend(kind)
    if choice.kind == "pycuda":
        # The snapshot says what it holds; the CUDA backend reads it so (weight_stream.tensor_source): INT4
        # projections as packed nibbles + fp16 scales, computed with w_hat = q * scale as on numpy.
        check_weight_format(model_dir, weights)
        return _cuda_backend(spec, Path(model_dir), capacity, dtype, device, choice, kernel_options, kv_dtype)
    return create_backend_from_weights("numpy", spec, load_model_weights(model_dir, spec, weights), capacity, dtype,
                                       kv_dtype=kv_dtype)


def load_model_weights(model_dir: str | Path, spec: ModelSpec, weights: str = "float") -> ModelWeights:
    """The snapshot's weights as float32 arrays; weights 'int4': an INT4 snapshot's, dequantized (int4_snapshot)."""
    check_weight_format(model_dir, weights)
    if weights == "int4":
        from .int4_snapshot import load_int4_weights
        return load_int4_weights(model_dir, spec)
    return load_weights(model_dir, spec)


def check_weight_format(model_dir: str | Path, weights: str) -> None:
    """ModelFormatError unless the snapshot's config.json states the weight format the configuration asks for."""
    from .int4_snapshot import weight_format
    if weights not in WEIGHT_FORMATS:
        raise ValueError(f"weights must be one of {WEIGHT_FORMATS}, got {weights!r}")
    stored = weight_format(model_dir)
    if stored != weights:
        hint = ("`vla-edge quantize` writes an INT4 copy" if weights == "int4"
                else "set model.weights: int4 to run it")
        raise ModelFormatError(f"{model_dir}: the snapshot holds {stored} weights but model.weights is {weights}; "
                               f"{hint}")


def create_backend_from_weights(kind: str, spec: ModelSpec, weights: ModelWeights, capacity: int,
                                dtype="float32", device=None, kv_dtype: str = "float32",
                                kernel_options: dict | None = None) -> Backend:
    """As create_backend, for weights already in memory (pycuda also takes a snapshot directory or a
    weight_stream source: an INT4 snapshot's directory uploads its INT4 projections). dtype is passed on as
    'float32' or 'bfloat16'."""
    choice = choose_backend(kind)
    if choice.kind == "pycuda":
        return _cuda_backend(spec, weights, capacity, dtype, device, choice, kernel_options, kv_dtype=kv_dtype)
    from .numpy_backend import NumpyBackend
    backend = NumpyBackend(spec, weights, capacity, canonical_dtype(dtype), kv_dtype=kv_dtype)
    logger.info("%s, dtype %s, %d KV slots of %s", choice.describe(), canonical_dtype(dtype), capacity, kv_dtype)
    return backend


def _cuda_backend(spec, weights, capacity, dtype, device, choice: BackendChoice, kernel_options: dict | None = None,
                  kv_dtype: str = "float32"):
    from .cuda_backend import CudaBackend  # lazy: imports pycuda
    backend = CudaBackend(spec, weights, capacity, canonical_dtype(dtype), device=device, kv_dtype=kv_dtype,
                          **(kernel_options or {}))
    logger.info("%s, dtype %s, %d KV slots of %s, decode %s", choice.describe(), canonical_dtype(dtype), capacity,
                kv_dtype, "in one persistent kernel" if backend.kernel_plan.persistent_decode else
                f"in {'programmatic' if backend.kernel_plan.programmatic_launch else 'ordinary'} launches")
    return backend


def choose_backend(kind: str) -> BackendChoice:
    """Which backend `kind` means on this machine, and why (ValueError for an unknown kind)."""
    if kind not in BACKEND_KINDS:
        raise ValueError(f"backend kind {kind!r} unknown; choose one of {BACKEND_KINDS}")
    if kind == "numpy":
        return BackendChoice("numpy", kind, "asked for numpy")
    found, detail = cuda_device_status()
    if kind == "pycuda":
        return BackendChoice("pycuda", kind, f"asked for pycuda; {detail}")
    if found:
        return BackendChoice("pycuda", kind, f"auto: {detail}")
    return BackendChoice("numpy", kind, f"auto: {detail}, so the CPU")


def resolve_kind(kind: str) -> str:
    """'auto' -> 'pycuda' or 'numpy'; other kinds are checked and returned as they are."""
    return choose_backend(kind).kind


def cuda_device_available() -> bool:
    """True when PyCUDA imports and the driver reports at least one device."""
    return cuda_device_status()[0]


def cuda_device_status() -> tuple[bool, str]:
    """(a device is usable, one line saying what was found)."""
    from .cuda_device import NoCudaDevice, driver
    try:
        drv = driver()
    except NoCudaDevice as exc:
        return False, str(exc)
    count = drv.Device.count()
    if count == 0:
        return False, "PyCUDA found no CUDA device"
    return True, f"CUDA device 0 is {drv.Device(0).name()} ({count} visible)"
