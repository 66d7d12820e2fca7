"""Pick and build a transformer backend for a model directory.

kind "auto" takes PyCUDA when `pycuda.driver` imports and sees a device, else
numpy. The CUDA backend module is imported only when chosen, so this module
(and the numpy path) never touches a GPU.
"""
from __future__ import annotations

import logging
from pathlib import Path

from ..config import BACKENDS as BACKEND_KINDS
from .backend import Backend
from .spec import ModelSpec
from .weights import ModelWeights, canonical_dtype, load_tokenizer, load_weights

logger = logging.getLogger(__name__)


def load_model(model_dir: str | Path):
    """(ModelSpec, ModelWeights, tokenizers.Tokenizer) of a snapshot directory."""
    spec = ModelSpec.from_dir(model_dir)
    weights = load_weights(model_dir, spec)
    return spec, weights, load_tokenizer(model_dir)


def create_backend(kind: str, model_dir: str | Path, capacity: int, dtype="float32") -> Backend:
    """Load `model_dir` and build backend `kind` (auto | numpy | pycuda) with `capacity` KV slots."""
    spec = ModelSpec.from_dir(model_dir)
    return create_backend_from_weights(kind, spec, load_weights(model_dir, spec), capacity, dtype)


def create_backend_from_weights(kind: str, spec: ModelSpec, weights: ModelWeights, capacity: int,
                                dtype="float32") -> Backend:
    """As create_backend, for weights already in memory. dtype is passed on as 'float32' or 'bfloat16'."""
    dtype = canonical_dtype(dtype)
    resolved = resolve_kind(kind)
    if resolved == "pycuda":
        from .cuda_backend import CudaBackend  # lazy: imports pycuda and creates a context
        backend = CudaBackend(spec, weights, capacity, dtype)
    else:
        from .numpy_backend import NumpyBackend
        backend = NumpyBackend(spec, weights, capacity, dtype)
    logger.info("backend %s (asked %s), dtype %s, %d KV slots", resolved, kind, dtype, capacity)
    return backend


def resolve_kind(kind: str) -> str:
    """'auto' -> 'pycuda' or 'numpy'; other kinds are checked and returned as they are."""
    if kind not in BACKEND_KINDS:
        raise ValueError(f"backend kind {kind!r} unknown; choose one of {BACKEND_KINDS}")
    if kind != "auto":
        return kind
    return "pycuda" if cuda_device_available() else "numpy"


def cuda_device_available() -> bool:
    """True when PyCUDA imports and the driver reports at least one device."""
    try:
        import pycuda.driver as drv
    except ImportError:
        return False
    try:
        drv.init()
        return drv.Device.count() > 0
    except drv.Error as exc:
        logger.info("pycuda present but no usable CUDA device: %s", exc)
        return False
