"""Cooperative launches (`CU_LAUNCH_ATTRIBUTE_COOPERATIVE` through `cuLaunchKernelEx`) for kernels that
synchronise their whole grid: cuda/decode_persistent.cu's barrier spins until every block has arrived,
so every block must be resident at once. A cooperative launch makes the driver check that the grid
fits (and refuse it, rather than hang, when it does not); graph capture records the attribute on the
kernel node, so the captured decode step replays the same way.

PyCUDA cannot pass launch attributes, so these kernels are loaded a second time through cuda.bindings
from the cubin PyCUDA compiled, as cuda_pdl.py does for programmatic launches.
"""
from __future__ import annotations

from .cuda_pdl import _check, _driver, argument_types, driver_function, launch_ex


class CooperativeKernel:
    """One grid-synchronising kernel of `family` in `device`'s context, launched cooperatively with
    `dynamic_shared` bytes of dynamic shared memory (the caller checks it against `static_shared` first)."""

    def __init__(self, device, arch: str, family: str, name: str, types: str, cubin_of, block: int,
                 options: tuple = ()):
        drv = _driver()
        self._drv = drv
        self.name = name
        self.block = int(block)
        self.dynamic_shared = 0
        self.blocks_per_sm = 0
        self._fn = driver_function(device, arch, family, name, cubin_of, options)
        self._types = argument_types(types)
        self.static_shared = int(_check(drv.cuFuncGetAttribute(
            drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, self._fn), f"cuFuncGetAttribute({name})"))
        attr = drv.CUlaunchAttribute()
        attr.id = drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_COOPERATIVE
        attr.value.cooperative = 1
        self._attrs = [attr]

    def set_dynamic_shared(self, nbytes: int) -> int:
        """Opt in to `nbytes` of dynamic shared memory (static + dynamic may pass the default 48 KB) and
        return how many blocks then fit on one SM (0: none)."""
        drv = self._drv
        _check(drv.cuFuncSetAttribute(self._fn, drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                      int(nbytes)), f"cuFuncSetAttribute({self.name})")
        self.dynamic_shared = int(nbytes)
        self.blocks_per_sm = int(_check(drv.cuOccupancyMaxActiveBlocksPerMultiprocessor(
            self._fn, self.block, self.dynamic_shared), f"cuOccupancyMaxActiveBlocksPerMultiprocessor({self.name})"))
        return self.blocks_per_sm

    def launch(self, grid: int, stream, args: tuple) -> None:
        launch_ex(self._drv, self._fn, self.name, (int(grid),), self.block, stream, args, self._types, self._attrs,
                  self.dynamic_shared)
