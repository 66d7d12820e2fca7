"""The reconciler's own CUDA context, and KV moved between two arenas device to device.

ASR on the GPU (core/reconciliation.py) runs the reconciler's Engine on a
second CudaBackend in a context of its own: the second GPU when the process
sees one, else a second context on the same device. This module makes that
context (`OwnContext`), builds a backend in it (`backend_in_own_context`),
wraps the backend so every call makes its context current on the calling
thread (`ContextBoundBackend`: PyCUDA contexts are current per thread, and the
reconciler may run on the primary's thread or on its own), and moves a
snapshot's KV from the reconciler's arena into the primary's without a trip
through host memory:

    export (reconciler side, its context)       Engine.kv_export = DeviceKvExporter(...)
        per chunk of <= max_rows slots: kv_gather into the source's kv_staging,
        then a same-context copy of the whole staging block into block c of a
        pre-allocated snapshot buffer; one sum over the buffer tells whether
        any value is NaN/Inf (unused rows are zeroed first)
            snapshot buffer  [blocks, 2, layers, max_rows, kv_dim] float32
    import (primary side, its context)          Engine.import_state -> DeviceKV.write_into
        per chunk: cuMemcpyPeerAsync of block c into the primary's kv_staging
        (source and destination contexts named explicitly), then kv_scatter
        into the primary's slots; one synchronize at the end

A destination that is not a CudaBackend (numpy) gets the KV through the host
(`DeviceKV.to_host`). Snapshot buffers are a ring of two, allocated once: the
protocol has at most one offer outstanding; a DeviceKV whose buffer was
reused by a newer export refuses to be applied (`check_usable`).

Known limits: PyCUDA creates plain streams (no cuStreamCreateWithPriority), so
the reconciler's stream has default priority; on one device the two contexts
time-slice the GPU (kernels of different contexts never overlap), which is why
`SharedPrimaryContext` exists: the reconciler's backend in the primary's
context, on its own stream, for one-GPU machines. Kernel modules are per context
(cuda_kernels caches them by context handle): building a backend inside the new
context compiles (or loads from PyCUDA's disk cache) the kernel families there.
"""
from __future__ import annotations

import contextlib
import logging
import threading

import numpy as np

from . import cuda_kernels as ck

log = logging.getLogger(__name__)

RING_BUFFERS = 2


class _PushedContext:
    """`scope()`: makes `self.context` current on the calling thread for the block (PyCUDA contexts are
    per-thread current), then restores whatever was current before."""

    @contextlib.contextmanager
    def scope(self):
        self.context.push()
        try:
            yield self.context
        finally:
            self.drv.Context.pop()


class OwnContext(_PushedContext):
    """A CUDA context made for one user (the reconciler); `scope()` makes it current on the calling thread."""

    def __init__(self, device_index: int | None = None):
        drv = ck.cuda_context()            # the process's primary context exists and is current here
        self.drv = drv
        count = drv.Device.count()
        index = (1 if count > 1 else 0) if device_index is None else int(device_index)
        if not 0 <= index < count:
            raise ValueError(f"OwnContext: device {index} requested, {count} visible")
        self.device_index = index
        self.device = drv.Device(index)
        self.context = self.device.make_context()      # made current (pushed) by make_context
        drv.Context.pop()
        self.shares_device = drv.Context.get_device().pci_bus_id() == self.device.pci_bus_id()
        log.info("reconciler context on device %d (%s)%s", index, self.device.name(),
                 ", same device as the primary: the two contexts time-slice it" if self.shares_device else "")

    def describe(self) -> str:
        where = "same GPU as the primary: the two contexts time-slice it" if self.shares_device else "its own GPU"
        return f"reconciler in its own CUDA context on device {self.device_index} ({where})"



class SharedPrimaryContext(_PushedContext):
    """The process's primary context, for a reconciler that shares it (own stream, no second context):
    on one GPU its kernels can then overlap the primary's instead of time-slicing with them.
    Same interface as OwnContext; `scope()` pushes the primary context on the calling thread."""

    def __init__(self):
        drv = ck.cuda_context()
        self.drv = drv
        self.context = drv.Context.get_current()
        self.device = drv.Context.get_device()
        self.device_index = next(i for i in range(drv.Device.count())
                                 if drv.Device(i).pci_bus_id() == self.device.pci_bus_id())
        self.shares_device = True

    def describe(self) -> str:
        return f"reconciler in the primary's CUDA context on device {self.device_index} (own stream)"



def backend_in_own_context(own: OwnContext, spec, weights, capacity: int, dtype: str = "bfloat16", **kwargs):
    """A CudaBackend built inside `own` (weights uploaded, kernels loaded there), wrapped as ContextBoundBackend."""
    from .cuda_backend import CudaBackend

    with own.scope():
        return ContextBoundBackend(CudaBackend(spec, weights, capacity, dtype, **kwargs), own)


class ContextBoundBackend:
    """The Backend interface of a CudaBackend whose context is pushed around every call (any thread)."""

    def __init__(self, backend, own: OwnContext):
        self.inner = backend
        self.own = own
        self.spec = backend.spec
        self.capacity = backend.capacity
        self.dtype = backend.dtype
        self.max_rows = backend.max_rows

    def scope(self):
        return self.own.scope()

    def embed(self, token_ids):
        with self.scope():
            return self.inner.embed(token_ids)

    def forward(self, x, positions, write_slots, context_slots, logits="last", return_hidden=False):
        with self.scope():
            return self.inner.forward(x, positions, write_slots, context_slots, logits=logits,
                                      return_hidden=return_hidden)

    def read_kv(self, slots):
        with self.scope():
            return self.inner.read_kv(slots)

    def write_kv(self, slots, kv):
        with self.scope():
            return self.inner.write_kv(slots, kv)

    def copy_slots(self, src_slots, dst_slots):
        with self.scope():
            return self.inner.copy_slots(src_slots, dst_slots)

    def memory_bytes(self) -> int:
        return self.inner.memory_bytes()

    def close(self) -> None:
        with self.scope():
            self.inner.close()


def _cuda_parts(backend):
    """(CudaBackend, context scope) of a CudaBackend or ContextBoundBackend; (None, None) for anything else."""
    if isinstance(backend, ContextBoundBackend):
        return backend.inner, backend.scope
    from .cuda_backend import CudaBackend
    if isinstance(backend, CudaBackend):
        return backend, contextlib.nullcontext
    return None, None


class DeviceKvExporter:
    """`Engine.kv_export` for an engine on a CUDA backend: snapshots keep their KV on the device.

    Holds RING_BUFFERS snapshot buffers of the whole arena, allocated here in the backend's context.
    """

    def __init__(self, backend):
        inner, scope = _cuda_parts(backend)
        if inner is None:
            raise TypeError(f"DeviceKvExporter needs a CudaBackend, got {type(backend).__name__}")
        self.backend, self._scope = inner, scope
        sp = inner.spec
        self.block_shape = (2, sp.num_layers, inner.max_rows, sp.kv_dim)           # = kv_staging
        self.block_bytes = int(np.prod(self.block_shape)) * 4
        self.blocks = -(-inner.capacity // inner.max_rows)
        with self._scope() as ctx:
            from pycuda import gpuarray
            self.context = ctx if ctx is not None else inner._drv.Context.get_current()
            self._buffers = [gpuarray.zeros((self.blocks,) + self.block_shape, np.float32)   # [blocks, 2, L, m, kv]
                             for _ in range(RING_BUFFERS)]
            gpuarray.sum(self._buffers[0][:1]).get()      # compile the reduction now, not at the first export
        self._generation = [0] * RING_BUFFERS
        self._next = 0
        self._lock = threading.Lock()
        log.info("device KV export: %d x %.0f MB snapshot buffers", RING_BUFFERS,
                 self._buffers[0].nbytes / 1e6)

    def __call__(self, backend, slots: np.ndarray) -> "DeviceKV":
        slots = np.asarray(slots)
        inner, _ = _cuda_parts(backend)
        if inner is not self.backend:
            raise ValueError("DeviceKvExporter: called for a backend it was not made for")
        with self._lock:
            index = self._next
            self._next = (self._next + 1) % RING_BUFFERS
            self._generation[index] += 1
            generation = self._generation[index]
        buf, m, drv = self._buffers[index], inner.max_rows, inner._drv
        with self._scope():
            for c, start in enumerate(range(0, slots.size, m)):
                chunk = slots[start:start + m]
                if chunk.size < m:        # rows past the chunk stay zero: the finiteness sum sees only real KV
                    drv.memset_d32_async(int(inner.kv_staging.gpudata), 0, inner.kv_staging.size, inner.stream)
                inner.gather_kv_staging(chunk)
                drv.memcpy_dtod_async(int(buf.gpudata) + c * self.block_bytes, int(inner.kv_staging.gpudata),
                                      self.block_bytes, inner.stream)
            used = -(-slots.size // m)
            from pycuda import gpuarray
            total_dev = gpuarray.sum(buf[:used], stream=inner.stream) if used else None
            inner.stream.synchronize()
            total = float(total_dev.get()) if used else 0.0
        sp = inner.spec
        return DeviceKV(self, index, generation, (2, sp.num_layers, int(slots.size), sp.kv_dim), bool(np.isfinite(total)))

    def buffer_address(self, index: int, block: int) -> int:
        return int(self._buffers[index].gpudata) + block * self.block_bytes

    def is_current(self, index: int, generation: int) -> bool:
        with self._lock:
            return self._generation[index] == generation


class DeviceKV:
    """A snapshot's KV rows left on the reconciler's device (`StateSnapshot.kv` of a device export).

    Looks like the host array to the snapshot checks: `shape`, `dtype`, and
    `np.isfinite(kv).all()` answered from the sum taken at export.
    """

    dtype = np.dtype(np.float32)

    def __init__(self, exporter: DeviceKvExporter, index: int, generation: int, shape: tuple, finite: bool):
        self.exporter, self.index, self.generation = exporter, index, generation
        self.shape = shape                 # (2, layers, rows, kv_dim) as read_kv would give
        self.finite = finite

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        if ufunc is np.isfinite and method == "__call__":
            return np.bool_(self.finite)
        raise TypeError(f"DeviceKV stays on the device: numpy {ufunc.__name__} is not available (use to_host())")

    def check_usable(self) -> None:
        """Raise SnapshotError when a newer export has reused this snapshot's device buffer."""
        if not self.exporter.is_current(self.index, self.generation):
            from ..core.state_snapshot import SnapshotError
            raise SnapshotError(f"device KV buffer {self.index} was reused by a newer export: this snapshot is stale")

    def write_into(self, backend, slots: np.ndarray) -> None:
        """Write the rows into `slots` of `backend`: device to device for a CUDA backend, else via the host."""
        slots = np.asarray(slots)
        if slots.size != self.shape[2]:
            raise ValueError(f"DeviceKV.write_into: {slots.size} slots for {self.shape[2]} KV rows")
        self.check_usable()
        inner, scope = _cuda_parts(backend)
        if inner is None:
            backend.write_kv(slots, self.to_host())
            return
        ex = self.exporter
        if inner.kv_staging.nbytes != ex.block_bytes:
            raise ValueError(f"DeviceKV.write_into: destination staging {inner.kv_staging.shape} differs from the "
                             f"source's {ex.block_shape} (max_rows or model shape differ)")
        drv, m = inner._drv, inner.max_rows
        with scope():
            dst_ctx = drv.Context.get_current()
            for c, start in enumerate(range(0, slots.size, m)):
                copy_across_contexts(drv, int(inner.kv_staging.gpudata), dst_ctx, ex.buffer_address(self.index, c),
                                     ex.context, ex.block_bytes, inner.stream)
                inner.scatter_kv_staging(slots[start:start + m])
            inner.stream.synchronize()

    def to_host(self) -> np.ndarray:
        """[2, layers, rows, kv_dim] float32 on the host."""
        self.check_usable()
        ex, rows = self.exporter, self.shape[2]
        m = ex.backend.max_rows
        with ex._scope():
            blocks = ex._buffers[self.index][: -(-rows // m)].get()                 # [blocks, 2, L, m, kv]
        kv = np.concatenate([blocks[c] for c in range(blocks.shape[0])], axis=2) if rows else \
            np.zeros(self.shape, np.float32)
        return np.ascontiguousarray(kv[:, :, :rows])


def copy_across_contexts(drv, dst: int, dst_ctx, src: int, src_ctx, nbytes: int, stream) -> None:
    """cuMemcpyPeerAsync from (src, src_ctx) to (dst, dst_ctx), ordered on `stream` (a stream of dst_ctx)."""
    try:
        drv.memcpy_peer_async(dst, src, nbytes, dst_ctx, src_ctx, stream)
    except TypeError:
        # Boost.Python refused the signature (another PyCUDA version): make the same driver call directly.
        from cuda.bindings import driver as cu
        result = cu.cuMemcpyPeerAsync(cu.CUdeviceptr(dst), cu.CUcontext(dst_ctx.handle), cu.CUdeviceptr(src),
                                      cu.CUcontext(src_ctx.handle), nbytes, cu.CUstream(stream.handle))
        err = result[0] if isinstance(result, tuple) else result
        if err != cu.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"cuMemcpyPeerAsync of {nbytes} bytes failed: {err}") from None
