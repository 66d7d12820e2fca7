"""Short driver calls that keep the interpreter lock: the cycle thread's copies at a cycle boundary.

PyCUDA gives the interpreter lock (GIL) up around every memory copy, asynchronous ones included, and around
Event.synchronize (its wrappers call the driver inside Py_BEGIN_ALLOW_THREADS); its kernel launches, event
records and Event.query keep it. A thread that gives the lock up gets it back only when the thread holding it
lets go, and while another thread of the reasoning node runs Python (the executor's frame callbacks, the swap
loader) that is after up to the switch interval (cycle.gil_switch_interval_ms, 0.5 ms). On the H200 the parts
of a swap at the boundary that made such calls had p99s about 0.5 ms above their p50s (the slot list's upload,
an event wait and one copy: 0.04 / 0.51 ms in the demo of 2026-12-04, fourteenth session), the parts without
one did not. A copy between page-locked host memory and the device is queued in microseconds, a four-byte
synchronous read takes a few more once the stream is idle, as it is at a boundary: too short to be worth the
lock. Here libcuda is called through ctypes.PyDLL, whose calls keep the lock, with the context of the caller
(cuda_device.bound) current, as PyCUDA's are.
"""
from __future__ import annotations

import ctypes
import functools

import numpy as np

from .cuda_param_launch import check


# Copies up to this size are made here by the backend's generic helpers (CudaBackend._put / _get): a cycle's
# inputs are ~0.2 MB, its tokens a few bytes. Larger ones (a reconciler's 1024-row forward, verify's logits, up
# to hundreds of MB) keep PyCUDA's copies, which let the node's other threads run meanwhile.
SHORT_COPY_BYTES = 1 << 20


class DriverCallError(RuntimeError):
    """A libcuda call made here failed (names the call and the driver's error)."""


@functools.lru_cache(maxsize=1)
def _libcuda():
    return ctypes.PyDLL("libcuda.so.1")


def _check(status: int, what: str) -> None:
    check(status, what, DriverCallError)         # the error's name, as the parameter-array launches report it


def _host(array: np.ndarray, what: str, writable: bool = False) -> tuple:
    if not isinstance(array, np.ndarray) or not array.flags.c_contiguous or (writable and not array.flags.writeable):
        raise ValueError(f"{what}: the host side must be a C-contiguous{' writable' if writable else ''} numpy array")
    return ctypes.c_void_p(array.ctypes.data), ctypes.c_size_t(array.nbytes)


def _stream(stream) -> ctypes.c_void_p:
    return ctypes.c_void_p(int(stream.handle) if stream is not None else 0)


def copy_htod_async(dst: int, host: np.ndarray, stream) -> None:
    """Queue host -> device (dst, a device address) on a PyCUDA stream. `host` must stay as it is until the stream
    has read it: page-locked and guarded by an event (as the callers do), or pageable, which the driver stages
    before returning."""
    ptr, nbytes = _host(host, "copy_htod_async")
    if nbytes.value:
        _check(_libcuda().cuMemcpyHtoDAsync_v2(ctypes.c_uint64(int(dst)), ptr, nbytes, _stream(stream)),
               "cuMemcpyHtoDAsync")


def copy_dtoh_async(host: np.ndarray, src: int, stream) -> None:
    """Queue device -> host (page-locked `host`, read once the stream has passed this point)."""
    ptr, nbytes = _host(host, "copy_dtoh_async", writable=True)
    if nbytes.value:
        _check(_libcuda().cuMemcpyDtoHAsync_v2(ptr, ctypes.c_uint64(int(src)), nbytes, _stream(stream)),
               "cuMemcpyDtoHAsync")


def copy_dtoh(host: np.ndarray, src: int) -> None:
    """Device -> host, returning when the bytes are in `host` (ordered after the context's blocking streams)."""
    ptr, nbytes = _host(host, "copy_dtoh", writable=True)
    if nbytes.value:
        _check(_libcuda().cuMemcpyDtoH_v2(ptr, ctypes.c_uint64(int(src)), nbytes), "cuMemcpyDtoH")


def wait_event(event) -> None:
    """Wait for a PyCUDA event: a query first, which keeps the lock, and Event.synchronize (which gives it up for
    the wait) only when the device has not reached the event yet."""
    if not event.query():
        event.synchronize()
