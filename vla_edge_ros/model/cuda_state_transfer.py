"""A snapshot's KV kept on the device: exported by the reconciler, written into the primary's arena.

ASR (core/reconciliation.py) rebuilds the exact state on a second engine and
hands its KV rows to the primary. On the GPU those rows never need the host:

    export (reconciler side)      Engine.kv_export = DeviceKvExporter(backend)
        one kv_gather launch writes the retained slots' K/V into a snapshot
        buffer of the exporter's ring, then one kv_count_nonfinite launch says
        whether any value is NaN/Inf
            snapshot buffer   [2, layers, capacity, kv_dim] in the arena's own
                              element (float32, or bf16 bits for kv.dtype
                              bfloat16: half the bytes), row j = the snapshot's
                              j-th slot; a 16-byte header after it holds the
                              buffer's generation (see below)
    import (primary side)         Engine.import_state -> kv.write_into(backend, slots)
        same context           one kv_scatter launch straight from the buffer
        other context, same    cuMemcpyPeerAsync of the buffer into a landing
        process                buffer of the primary (allocated on first use),
                               then one kv_scatter
        other process          model/cuda_ipc.py: the buffer's CUDA IPC handle,
                               opened once in the reasoning process, then one
                               kv_scatter from the mapped address

Which buffer an export writes (model/export_ring.py): never the newest
export's (the offer on hand), nor one its owner `protect`s (the reconciler
worker: the offer it last handed to the primary, core/swap_protocol.py); of
the others the next in turn. With asr.export_buffers >= 3 one is always free.

Generations: each export bumps its buffer's generation and writes it to the
header as 2g+1 before the rows and 2g after them (a seqlock), so a reader in
any process can tell a buffer it was offered from one being rewritten: it
checks the header before and after its copy (`check_usable`, cuda_ipc). With
the protection above that check should never fire; it stays as the proof.
With a GenerationBoard (asr.host_generation_board) the same words are also
kept in host shared memory, so the primary's check before its copy needs no
device read (model/generation_board.py).

A destination that is not a CudaBackend (numpy) gets the KV through the host
(`DeviceKV.to_host`, float32 values). A CUDA destination must hold the same
arena element as the source: rows are copied bit for bit, never converted.
"""
from __future__ import annotations

import logging
import threading
import time

import numpy as np

from ..config import ASRConfig
from .backend import FINISHED, FinishedWrite
from .cuda_backend import CudaBackend
from .cuda_device import CudaDevice
from .errors import DeviceKVUnavailable
from .export_ring import ExportRing
from .generation_board import GenerationBoard, complete_word, writing_word

log = logging.getLogger(__name__)

HEADER_BYTES = 16             # int32 generation word (+ padding), after the rows


class DeviceKvExporter:
    """`Engine.kv_export` for an engine on a CudaBackend: snapshots keep their KV on the device.

    Holds `buffers` snapshot buffers of the whole arena (asr.export_buffers), allocated here once, in the
    backend's context.
    """

    def __init__(self, backend: CudaBackend, buffers: int | None = None, board: GenerationBoard | None = None):
        """board: the host copy of the buffers' generation words (as many words as buffers; the exporter closes
        it), or None (the device words only)."""
        if not isinstance(backend, CudaBackend):
            raise TypeError(f"DeviceKvExporter needs a CudaBackend, got {type(backend).__name__}")
        self.ring = ExportRing(ASRConfig().export_buffers if buffers is None else buffers)
        self.buffers = self.ring.buffers
        if board is not None and board.buffers != self.buffers:
            raise ValueError(f"DeviceKvExporter: a generation board of {board.buffers} words for {self.buffers} buffers")
        self.board = board
        self.backend = backend
        self.device: CudaDevice = backend.device
        self.shape = backend.kv_rows_shape()                         # [2, L, capacity, kv_dim]
        self.element = np.dtype(backend.kv_rows_dtype())             # the arena's: float32 or uint16 bf16 bits
        self.payload_bytes = int(np.prod(self.shape)) * self.element.itemsize
        drv = self.device.drv
        with self.device.bound():
            from pycuda import gpuarray
            self._allocs = [drv.mem_alloc(self.payload_bytes + HEADER_BYTES) for _ in range(self.buffers)]
            self._views = [gpuarray.GPUArray(self.shape, self.element, gpudata=int(a)) for a in self._allocs]
            for a in self._allocs:
                drv.memset_d8(int(a), 0, self.payload_bytes + HEADER_BYTES)
            self._nonfinite = gpuarray.zeros(1, np.int32)      # kv_count_nonfinite's counter
            # One IPC handle per buffer for its whole life: an importer maps each buffer once, by handle.
            self._handles = [bytes(drv.mem_get_ipc_handle(int(a))) for a in self._allocs]
        self._generation = [0] * self.buffers
        self._lock = threading.Lock()
        log.info("device KV export: %d x %.0f MB snapshot buffers (%s) on %s", self.buffers, self.payload_bytes / 1e6,
                 backend.kv_dtype, self.device.describe())

    def protect(self, indices) -> None:
        """Buffers the next exports must not rewrite (besides the newest export's), e.g. the one holding the
        offer the primary was last handed; replaces the previous set (ExportRing.protect)."""
        self.ring.protect(indices)

    def __call__(self, backend, slots: np.ndarray) -> "DeviceKV":
        slots = np.asarray(slots)
        if backend is not self.backend:
            raise ValueError("DeviceKvExporter: called for a backend it was not made for")
        index = self.ring.take()
        with self._lock:
            self._generation[index] += 1
            generation = self._generation[index]
        drv, stream, addr = self.device.drv, backend.stream, self.address(index)
        if self.board is not None:
            self.board.writing(index, generation)       # before anything of this export is queued
        with self.device.bound():
            drv.memset_d32_async(addr + self.payload_bytes, writing_word(generation), 1, stream)
            drv.memset_d32_async(addr, 0, self.payload_bytes // 4, stream)    # rows past the snapshot stay zero
            backend.gather_kv_rows(addr, slots)
            drv.memset_d32_async(int(self._nonfinite.gpudata), 0, 1, stream)
            backend.kernels.count_nonfinite(self._views[index], self._nonfinite, stream)
            drv.memset_d32_async(addr + self.payload_bytes, complete_word(generation), 1, stream)
            stream.synchronize()
            finite = int(self._nonfinite.get()[0]) == 0
        if self.board is not None:
            self.board.complete(index, generation)
        sp = backend.spec
        return DeviceKV(self, index, generation, (2, sp.num_layers, int(slots.size), sp.kv_dim), finite)

    def address(self, index: int) -> int:
        """Device address of ring buffer `index` in the exporter's context."""
        return int(self._allocs[index])

    def ipc_handle(self, index: int) -> bytes:
        """The CUDA IPC handle of ring buffer `index` (whole allocation: rows + header)."""
        return self._handles[index]

    def is_current(self, index: int, generation: int) -> bool:
        with self._lock:
            return self._generation[index] == generation

    def close(self) -> None:
        if self.board is not None:                      # first: a reader sees every offer stale from now on
            self.board.close()
        with self.device.bound():
            for a in self._allocs:
                a.free()
            self._nonfinite.gpudata.free()
        self._allocs, self._views = [], []


class DeviceKV:
    """A snapshot's KV rows left on the reconciler's device (`StateSnapshot.kv` of a device export).

    Looks like the host array to the snapshot checks: `shape`, `dtype`, and
    `np.isfinite(kv).all()` answered from the sum taken at export.
    """

    dtype = np.dtype(np.float32)
    on_device = True                       # model/backend.KvPayload

    def __init__(self, exporter: DeviceKvExporter, index: int, generation: int, shape: tuple, finite: bool):
        self.exporter, self.index, self.generation = exporter, index, generation
        self.shape = shape                 # (2, layers, rows, kv_dim) as read_kv would give
        self.finite = finite
        self.last_copy_ms: float | None = None

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        if ufunc is np.isfinite and method == "__call__":
            return np.bool_(self.finite)
        raise TypeError(f"DeviceKV stays on the device: numpy {ufunc.__name__} is not available (use to_host())")

    def all_finite(self) -> bool:
        """From the sum taken at export (model/backend.KvPayload)."""
        return self.finite

    def check_usable(self) -> None:
        """Raise DeviceKVUnavailable when a newer export has reused this snapshot's device buffer."""
        if not self.exporter.is_current(self.index, self.generation):
            raise DeviceKVUnavailable(f"device KV buffer {self.index} was reused by a newer export: this snapshot is stale")

    def ipc_descriptor(self) -> dict:
        """What another process needs to map and check these rows (model/cuda_ipc.py)."""
        ex = self.exporter
        return {"handle": ex.ipc_handle(self.index).hex(), "bytes": ex.payload_bytes + HEADER_BYTES,
                "element": ex.element.name,
                "header_offset": ex.payload_bytes, "generation": self.generation, "buffer": self.index,
                "rows": int(self.shape[2]), "shape": list(ex.shape), "finite": self.finite,
                "device_pci_bus_id": ex.device.pci_bus_id(),
                **({} if ex.board is None else {"generation_board": str(ex.board.path)})}

    def write_into(self, backend, slots: np.ndarray) -> None:
        """Write the rows into `slots` of `backend`: device to device for a CUDA backend, else via the host."""
        slots = np.asarray(slots)
        if slots.size != self.shape[2]:
            raise ValueError(f"DeviceKV.write_into: {slots.size} slots for {self.shape[2]} KV rows")
        self.check_usable()
        if not isinstance(backend, CudaBackend):
            backend.write_kv(slots, self.to_host())
            return
        ex = self.exporter
        if backend.kv_rows_shape() != ex.shape:
            raise ValueError(f"DeviceKV.write_into: destination KV layout {backend.kv_rows_shape()} differs from the "
                             f"source's {ex.shape} (capacity or model shape differ)")
        if np.dtype(backend.kv_rows_dtype()) != ex.element:
            raise ValueError(f"DeviceKV.write_into: destination KV arena holds {backend.kv_dtype}, the source's "
                             f"{ex.element.name} rows (kv.dtype differs between the engines)")
        t = time.perf_counter()
        src = ex.address(self.index)
        if backend.device.handle != ex.device.handle:
            src = _landing_copy(backend, src, ex.device, ex.payload_bytes)
        backend.scatter_kv_rows(src, slots)
        backend.synchronize()
        self.last_copy_ms = (time.perf_counter() - t) * 1e3

    def start_write(self, backend, slots: np.ndarray) -> FinishedWrite:
        """write_into, complete on return (a same-process copy has no torn-buffer check left to defer)."""
        self.write_into(backend, slots)
        return FINISHED

    def to_host(self) -> np.ndarray:
        """[2, layers, rows, kv_dim] float32 on the host (a bf16 arena's values widened exactly)."""
        self.check_usable()
        ex = self.exporter
        with ex.device.bound():
            whole = ex._views[self.index].get()                       # [2, L, capacity, kv]
        return np.ascontiguousarray(ex.backend.kv_to_host(whole[:, :, :self.shape[2]]))


def _landing_copy(backend: CudaBackend, src: int, src_device: CudaDevice, nbytes: int) -> int:
    """Copy a buffer of another context of this process into the backend's landing buffer; returns its address."""
    landing = backend.landing_buffer(nbytes)
    with backend.device.bound():
        copy_across_contexts(backend.device.drv, landing, backend.device.context, src, src_device.context,
                             nbytes, backend.stream)
    return landing


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
