"""Launches of kernels whose parameters PyCUDA cannot hand over: gemm_tma.cu takes two tensor maps by value,
128-byte parameters aligned to 64 bytes. Launched with PyCUDA's packed argument buffer, that kernel read every
scalar parameter as 0 and did no products (notes/cuda_notes.md, 2026-12-02 fourth). Here cuLaunchKernel gets an
array of pointers, one per parameter, so the driver lays out each parameter itself, as it does for the runtime's
<<<>>> launches.

libcuda is called through ctypes (PyCUDA has no such launch, and the device image's cuda.bindings is not needed
for it): the family's cubin (compiled by PyCUDA, read back from its disk cache) is loaded a second time into the
current context, once per (context, family, arch). A stream capture records these launches like any other, and
the parameters are copied into the captured node: nothing has to outlive the call.
"""
from __future__ import annotations

import ctypes
import functools
import threading

from .cuda_launch_common import KernelError

_MAX_DYNAMIC_SHARED = 8          # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
_lock = threading.Lock()
_modules: dict = {}              # (context handle, family, arch) -> CUmodule (ctypes.c_void_p)


@functools.lru_cache(maxsize=1)
def libcuda():
    """The CUDA driver library (the one PyCUDA itself is linked against)."""
    return ctypes.CDLL("libcuda.so.1")


def check(status: int, what: str, error: type[Exception] = KernelError) -> None:
    """Raise `error` naming the call and the driver's error name for a failed CUresult."""
    if status == 0:
        return
    name = ctypes.c_char_p()
    libcuda().cuGetErrorName(int(status), ctypes.byref(name))
    raise error(f"{what} failed: {(name.value or b'?').decode()} ({status})")


class ParamLauncher:
    """Kernels `names` of one family's cubin, loaded into `device`'s context and launched with a parameter array."""

    def __init__(self, device, family: str, arch: str, cubin: bytes, names):
        lib = libcuda()
        self._fns: dict = {}
        with device.bound():
            key = (device.handle, family, arch)
            with _lock:
                module = _modules.get(key)
                if module is None:
                    module = ctypes.c_void_p()
                    check(lib.cuModuleLoadData(ctypes.byref(module), ctypes.c_char_p(cubin)),
                          f"cuModuleLoadData({family})")
                    _modules[key] = module
            for name in names:
                fn = ctypes.c_void_p()
                check(lib.cuModuleGetFunction(ctypes.byref(fn), module, name.encode()), f"cuModuleGetFunction({name})")
                self._fns[name] = fn

    def set_max_dynamic_shared(self, name: str, nbytes: int) -> None:
        check(libcuda().cuFuncSetAttribute(self._fns[name], _MAX_DYNAMIC_SHARED, int(nbytes)),
              f"cuFuncSetAttribute({name}, max dynamic shared {nbytes})")

    def launch(self, name: str, grid: tuple, block: int, stream, params: list, shared: int = 0) -> None:
        """cuLaunchKernel of `name` on a PyCUDA stream; `params` are ctypes objects in the kernel's parameter order
        (each one's bytes are the parameter: c_void_p for a pointer, c_int, c_longlong, a c_char array for a struct)."""
        gx, gy, gz = (tuple(int(g) for g in grid) + (1, 1))[:3]
        pointers = (ctypes.c_void_p * len(params))(*[ctypes.addressof(p) for p in params])
        handle = ctypes.c_void_p(int(stream.handle) if stream is not None else 0)
        check(libcuda().cuLaunchKernel(self._fns[name], gx, gy, gz, int(block), 1, 1, int(shared), handle, pointers,
                                       None), f"cuLaunchKernel({name}, grid {grid})")
