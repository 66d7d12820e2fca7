"""The swaps' KV in and out of the CUDA backend's arena: slot copies, host reads and writes (numpy and tests),
and the whole-state gathers and scatters that model/cuda_state_transfer.py and model/cuda_ipc.py enqueue. A base
class of cuda_backend.CudaBackend, which supplies the arena (`k_cache`, `v_cache`, `kv_element`), the staging
buffers (`kv_slots_buf`, `kv_staging`), `stream`, `kernels`, `_put` and `_slot_array`."""
from __future__ import annotations

import functools
import logging
import time

import numpy as np

from .cuda_gil_held import copy_htod_async, wait_event
from .weights import bf16_bits_to_float32, float32_to_bf16_bits

log = logging.getLogger(__name__)

ROWS_VIEWS_KEPT = 16      # whole-state buffer views kept by address (_rows_view)


def on_device(method):
    """Run a public method with the backend's CUDA context current on the calling thread (cuda_device.py):
    the cycle thread, a reconciler worker and a loader thread may all call in."""
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        if self.closed:
            raise RuntimeError(f"CudaBackend.{method.__name__}: the backend was closed")
        with self.device.bound():
            return method(self, *args, **kwargs)
    return wrapper


class KvTransfer:
    """K/V of arena slots moved as a swap, a copy or a test needs them."""

    @on_device
    def copy_slots(self, src_slots: np.ndarray, dst_slots: np.ndarray) -> None:
        src = self._slot_array(src_slots, "src_slots")
        dst = self._slot_array(dst_slots, "dst_slots")
        if src.shape != dst.shape:
            raise ValueError(f"copy_slots: src_slots {src.shape} and dst_slots {dst.shape} differ in length")
        if src.size > self.max_rows and np.intersect1d(src, dst).size:
            # Chunks would read slots an earlier chunk already overwrote: go through the host copy.
            self.write_kv(dst, self.read_kv(src))
            return
        for start in range(0, src.size, self.max_rows):
            n = min(self.max_rows, src.size - start)
            self._put(self.kv_slots_buf, src[start:start + n].astype(np.int32))
            self._kv_move("gather", n)
            self._put(self.kv_slots_buf, dst[start:start + n].astype(np.int32))
            self._kv_move("scatter", n)
        self.stream.synchronize()

    @on_device
    def read_kv(self, slots: np.ndarray) -> np.ndarray:
        """[2, layers, len(slots), kv_dim] float32: K (after RoPE) and V of the slots (a bf16 arena's values
        widened exactly)."""
        slots = self._slot_array(slots, "slots")
        out = np.empty((2, self.spec.num_layers, slots.size, self.spec.kv_dim), np.float32)
        for start in range(0, slots.size, self.max_rows):
            n = min(self.max_rows, slots.size - start)
            self._put(self.kv_slots_buf, slots[start:start + n].astype(np.int32))
            self._kv_move("gather", n)
            self.stream.synchronize()
            out[:, :, start:start + n] = self.kv_to_host(self.kv_staging.get()[:, :, :n])
        return out

    def kv_to_host(self, rows: np.ndarray) -> np.ndarray:
        """Arena elements as the device holds them (float32, or uint16 bf16 bits) -> float32 values."""
        return bf16_bits_to_float32(rows) if self.kv_element == np.uint16 else rows

    def kv_from_host(self, values: np.ndarray) -> np.ndarray:
        """float32 values -> arena elements (a bf16 arena: rounded to nearest even, as the kernels store)."""
        return float32_to_bf16_bits(values) if self.kv_element == np.uint16 else values

    @on_device
    def write_kv(self, slots: np.ndarray, kv: np.ndarray) -> None:
        slots = self._slot_array(slots, "slots")
        expected = (2, self.spec.num_layers, slots.size, self.spec.kv_dim)
        kv = np.asarray(kv)
        if kv.shape != expected or kv.dtype != np.float32:
            raise ValueError(f"write_kv: kv must be float32 {expected}, got {kv.dtype} {kv.shape}")
        staging = np.zeros(self.kv_staging.shape, self.kv_element)
        for start in range(0, slots.size, self.max_rows):
            n = min(self.max_rows, slots.size - start)
            staging[:, :, :n] = self.kv_from_host(kv[:, :, start:start + n])
            self.stream.synchronize()
            self.kv_staging.set(staging)
            self._put(self.kv_slots_buf, slots[start:start + n].astype(np.int32))
            self._kv_move("scatter", n)
        self.stream.synchronize()

    # -- whole-state KV moves on the device (model/cuda_state_transfer.py, model/cuda_ipc.py)

    @on_device
    def gather_kv_rows(self, dst_ptr: int, slots: np.ndarray) -> None:
        """Enqueue on self.stream: K/V of `slots` into the device buffer at dst_ptr, laid out as
        [2, layers, capacity, kv_dim] in the arena's element (kv_rows_dtype) with row j = slots[j] (one launch).
        The caller synchronizes."""
        self._move_kv_rows("gather", dst_ptr, slots)

    @on_device
    def scatter_kv_rows(self, src_ptr: int, slots: np.ndarray) -> None:
        """Enqueue on self.stream: rows 0..len(slots)-1 of a [2, layers, capacity, kv_dim] device buffer in the
        arena's element (kv_rows_dtype) at src_ptr (this context's address, e.g. an opened IPC handle) into
        `slots` (one launch)."""
        self._move_kv_rows("scatter", src_ptr, slots)

    def _move_kv_rows(self, direction: str, rows_ptr: int, slots: np.ndarray) -> None:
        slots = self._slot_array(slots, "slots")
        if slots.size:
            self._put_slot_list(slots)
            self.kernels.kv_move(direction, self.k_cache, self.v_cache, self.kv_slots_buf, self._rows_view(rows_ptr),
                                 slots.size, self.spec.num_layers, self.spec.num_kv_heads, self.capacity,
                                 self.spec.head_dim, self.stream)

    def _put_slot_list(self, slots: np.ndarray) -> None:
        """A whole-state move's slot list into kv_slots_buf through page-locked memory, so that queuing the move
        cannot wait for the device: from pageable memory CUDA may run an "async" copy synchronously with the host
        (its API synchronization notes). Written when a swap's copy queued at the boundary (asr.swap_finish
        next_cycle) took 0.36 ms p50 / 0.66 p99 to queue in an H200 soak of 2026-12-04, as long as the copy
        itself; the one soak since (another, noisier machine) still showed 0.47 / 0.93 ms, so that wait is
        elsewhere (notes/cuda_notes.md, twelfth session). The host buffer is rewritten only once the previous
        upload has read it (its event). The wait and the copy keep the interpreter lock (cuda_gil_held.py): given
        up, getting it back took up to the switch interval (this upload 0.04 / 0.51 ms p50 / p99)."""
        t = time.perf_counter()
        wait_event(self.kv_slots_host_read)             # done long ago: a query, the interpreter lock kept
        n = slots.size
        self.kv_slots_host[:n] = slots
        copy_htod_async(int(self.kv_slots_buf.gpudata), self.kv_slots_host[:n], self.stream)
        self.kv_slots_host_read.record(self.stream)
        self.last_slot_upload_ms = (time.perf_counter() - t) * 1e3     # a swap's report times its queuing's parts

    @on_device
    def synchronize(self) -> None:
        self.stream.synchronize()

    def kv_rows_shape(self) -> tuple:
        """Shape of the whole-state KV buffers gather_kv_rows / scatter_kv_rows use."""
        sp = self.spec
        return (2, sp.num_layers, self.capacity, sp.kv_dim)

    def kv_rows_dtype(self) -> np.dtype:
        """Element of those buffers: the arena's own (float32, or uint16 bf16 bits), moved bit for bit."""
        return self.kv_element

    @on_device
    def landing_buffer(self, nbytes: int) -> int:
        """Address of a device buffer for KV arriving from another context of this process (made on first use,
        freed by close): only the in-process two-context arrangement of the benchmark and tests needs it."""
        if self._landing is None or self._landing.nbytes < nbytes:
            self._landing = self._alloc((-(-nbytes // 4),), np.float32, zero=False)
            log.info("KV landing buffer of %.0f MB for swaps from another context", nbytes / 1e6)
        return int(self._landing.gpudata)

    def _rows_view(self, ptr: int):
        """A GPUArray view (no allocation) of a [2, layers, capacity, kv_dim] buffer of arena elements at a device
        address; kept per address (a view owns nothing: one made anew for the same address is the same view),
        since PyCUDA builds one in Python, ~30 us of a swap's KV copy queuing at the boundary."""
        views = self._rows_views
        view = views.get(int(ptr))
        if view is None:
            if len(views) >= ROWS_VIEWS_KEPT:          # the reconciler's few export buffers, and the landing one
                views.clear()
            view = views[int(ptr)] = self._gpuarray.GPUArray(self.kv_rows_shape(), self.kv_element, gpudata=int(ptr))
        return view

    def _kv_move(self, direction: str, n: int) -> None:
        sp = self.spec
        self.kernels.kv_move(direction, self.k_cache, self.v_cache, self.kv_slots_buf, self.kv_staging, n,
                             sp.num_layers, sp.num_kv_heads, self.capacity, sp.head_dim, self.stream)
