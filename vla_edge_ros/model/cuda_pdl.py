"""Programmatic dependent launch (PDL) of chosen kernels through `cuLaunchKernelEx` (cuda.bindings).

Why: a decode step is ~170 small kernels in a row. On an ordinary stream each one starts only
after the one before has drained, so every boundary costs the launch, the ramp-up and the tail of
the previous grid. With the programmatic-stream-serialization attribute the next kernel may start
while the previous one is still running; it loads what does not depend on it (weights) and then
waits in `griddep_wait()` (cuda/common.cuh) for the previous grid's results. Graph capture keeps
these programmatic edges, so the captured decode step replays with them.

PyCUDA cannot pass launch attributes, so the kernels launched this way are loaded a second time,
through cuda.bindings, from the same cubin PyCUDA compiled (its disk cache makes that a load, not a
compile). Only kernels that call `griddep_wait()` before their first dependent access may be in
PDL_KERNELS: a kernel without it would race the one before it. The loading and `cuLaunchKernelEx`
helpers here also serve cuda_cooperative.py.
"""
from __future__ import annotations

import ctypes
import logging
import threading

from .cuda_attention_launchers import ATTN_DECODE_ENTRIES
from .cuda_int4_launchers import GEMV4_ALL_ENTRIES
from .cuda_graphs import _driver, _ok

log = logging.getLogger(__name__)

# Kernels whose code waits (griddep_wait) before reading or writing anything an earlier kernel touches.
PDL_KERNELS = frozenset({
    "gemv_bf16", "gemv_bf16_items", *GEMV4_ALL_ENTRIES,
    *ATTN_DECODE_ENTRIES,
    "attention_merge", "attention_merge_prefetch",
    "embed_gather_bf16", "embed_gather_f32", "argmax_bins",
})
_CTYPES = {"P": ctypes.c_void_p, "i": ctypes.c_int, "f": ctypes.c_float, "q": ctypes.c_longlong}

_lock = threading.Lock()
_modules: dict = {}          # (context handle, family, arch) -> cuda.bindings CUmodule


class ProgrammaticLaunchError(RuntimeError):
    """cuLaunchKernelEx or loading a kernel for it failed (names the kernel and the driver error)."""


def _check(result, what: str):
    return _ok(result, what, ProgrammaticLaunchError)


def driver_function(device, arch: str, family: str, name: str, cubin_of, options: tuple = ()):
    """Kernel `name` of `family` as a cuda.bindings CUfunction in `device`'s context, its module loaded once
    per (context, family, arch, options) from the cubin PyCUDA compiled (cubin_of(family) returns its bytes);
    options: the family's nvcc options that cubin was compiled with (the KV arena's type: backends of both arena
    types may share one context, and each must launch its own build)."""
    drv = _driver()
    key = (device.handle, family, arch, tuple(options))
    with _lock:
        module = _modules.get(key)
        if module is None:
            module = _check(drv.cuModuleLoadData(cubin_of(family)), f"cuModuleLoadData({family})")
            _modules[key] = module
    return _check(drv.cuModuleGetFunction(module, name.encode()), f"cuModuleGetFunction({name})")


def argument_types(types: str) -> tuple:
    """ctypes of a PyCUDA argument-type string ('P' pointer, 'i' int, 'f' float, 'q' long long)."""
    return tuple(_CTYPES[c] for c in types)


def launch_ex(drv, fn, name: str, grid: tuple, block: int, stream, args: tuple, types: tuple, attrs: list,
              shared: int = 0) -> None:
    """cuLaunchKernelEx of `fn` with launch attributes `attrs` (driver errors raise ProgrammaticLaunchError)."""
    cfg = drv.CUlaunchConfig()
    cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = (tuple(grid) + (1, 1))[:3]
    cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = int(block), 1, 1
    cfg.sharedMemBytes = int(shared)
    cfg.hStream = drv.CUstream(stream.handle)
    cfg.attrs = attrs
    cfg.numAttrs = len(attrs)
    values = tuple(float(a) if t is ctypes.c_float else int(a) for a, t in zip(args, types))
    _check(drv.cuLaunchKernelEx(cfg, fn, (values, types), 0), f"cuLaunchKernelEx({name})")


def supported(device) -> bool:
    """PDL needs compute capability 9.0 or newer (griddepcontrol)."""
    return device.device.compute_capability()[0] >= 9


class ProgrammaticLauncher:
    """Launches PDL_KERNELS with the programmatic-serialization attribute in `device`'s context.

    `cubin_of(family)` returns the compiled cubin bytes of a family (cuda_kernels supplies it);
    `types_of(name)` the PyCUDA argument-type string of a kernel ('P' pointer, 'i' int, 'f' float)."""

    def __init__(self, device, arch: str, families: dict, cubin_of, options_of=lambda family: ()):
        drv = _driver()
        self._drv = drv
        self._fns: dict = {}
        self._types: dict = {}
        for family, kernels in families.items():
            wanted = [name for name in kernels if name in PDL_KERNELS]
            if not wanted:
                continue
            for name in wanted:
                self._fns[name] = driver_function(device, arch, family, name, cubin_of, options_of(family))
                self._types[name] = argument_types(kernels[name])
        attr = drv.CUlaunchAttribute()
        attr.id = drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        attr.value.programmaticStreamSerializationAllowed = 1
        self._attrs = [attr]

    def handles(self, name: str) -> bool:
        return name in self._fns

    def set_max_dynamic_shared(self, name: str, nbytes: int) -> None:
        drv = self._drv
        _check(drv.cuFuncSetAttribute(self._fns[name],
                                      drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                      int(nbytes)), f"cuFuncSetAttribute({name})")

    def launch(self, name: str, grid: tuple, block: int, stream, args: tuple, shared: int = 0) -> None:
        launch_ex(self._drv, self._fns[name], name, grid, block, stream, args, self._types[name], self._attrs, shared)
