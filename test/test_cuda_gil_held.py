"""cuda_gil_held.py: the cycle thread's short copies through libcuda with the interpreter lock kept.

The argument checks run anywhere; the copies themselves need a GPU (marker `gpu`). The GPU test that says what
the module is for: while a copy made here runs, no other Python thread runs (the lock is kept), while during
PyCUDA's own copy of the same bytes one does (it gives the lock up)."""
import sys
import threading
import time

import numpy as np
import pytest

from vla_edge_ros.model import cuda_gil_held as held


def test_host_side_must_be_contiguous_and_writable_where_written():
    strided = np.zeros((4, 4), np.float32)[:, ::2]
    with pytest.raises(ValueError, match="C-contiguous"):
        held.copy_htod_async(0, strided, None)
    read_only = np.zeros(4, np.int32)
    read_only.flags.writeable = False
    with pytest.raises(ValueError, match="writable"):
        held.copy_dtoh(read_only, 0)
    with pytest.raises(ValueError, match="numpy array"):
        held.copy_dtoh_async([0, 0], 0, None)


@pytest.mark.gpu
def test_copies_round_trip_and_an_event_wait_finds_the_device_done(cuda_device):
    drv = cuda_device.drv
    stream = drv.Stream()
    src = np.arange(4096, dtype=np.int32)
    buf = drv.mem_alloc(src.nbytes)
    pinned_in = drv.pagelocked_empty(src.shape, np.int32)
    pinned_in[:] = src
    pinned_out = drv.pagelocked_zeros(src.shape, np.int32)
    held.copy_htod_async(int(buf), pinned_in, stream)
    held.copy_dtoh_async(pinned_out, int(buf), stream)
    done = drv.Event()
    done.record(stream)
    held.wait_event(done)
    np.testing.assert_array_equal(pinned_out, src)
    assert done.query()
    held.wait_event(done)                                     # already reached: returns at once
    pageable = np.zeros(10, np.int32)
    held.copy_dtoh(pageable, int(buf) + 4 * 100)               # synchronous, from an offset
    np.testing.assert_array_equal(pageable, src[100:110])
    held.copy_htod_async(int(buf), np.full(8, -3, np.int32), stream)   # pageable: staged before it returns
    stream.synchronize()
    held.copy_dtoh(pageable[:8], int(buf))
    np.testing.assert_array_equal(pageable[:8], -3)
    held.copy_htod_async(int(buf), np.zeros(0, np.int32), stream)      # nothing to copy: no call
    with pytest.raises(held.DriverCallError, match="cuMemcpyDtoH"):
        held.copy_dtoh(pageable, 8)                                      # not a device address
    buf.free()


def _longest_stall_of_another_thread(call) -> tuple[float, float]:
    """(the longest a second Python thread went without running while `call` ran, how long `call` took), s.
    A call that keeps the interpreter lock stalls the other thread for all of it; one that gives the lock up
    lets it run within a switch interval."""
    state = {"last": time.perf_counter(), "longest": 0.0}
    stop, started = threading.Event(), threading.Event()

    def spin():
        state["last"] = time.perf_counter()
        started.set()
        while not stop.is_set():
            now = time.perf_counter()
            state["longest"] = max(state["longest"], now - state["last"])
            state["last"] = now

    interval = sys.getswitchinterval()
    sys.setswitchinterval(0.001)         # as the reasoning node sets it: the call starts within a millisecond
    worker = threading.Thread(target=spin, daemon=True)
    try:
        worker.start()
        started.wait()
        time.sleep(0.02)
        state["longest"] = 0.0
        t = time.perf_counter()
        call()
        took = time.perf_counter() - t
        time.sleep(0.02)                 # the other thread notices the stall when it runs again
    finally:
        stop.set()
        worker.join()
        sys.setswitchinterval(interval)
    return state["longest"], took


@pytest.mark.gpu
def test_a_copy_made_here_keeps_the_interpreter_lock_and_pycudas_gives_it_up(cuda_device):
    drv = cuda_device.drv
    nbytes = 256 << 20                                          # ~50 ms to pageable host memory: long enough
    buf = drv.mem_alloc(nbytes)
    host = np.empty(nbytes // 4, np.float32)
    try:
        stall, took = _longest_stall_of_another_thread(lambda: drv.memcpy_dtoh(host, buf))
        assert took > 0.01 and stall < 0.3 * took, (stall, took)
        stall, took = _longest_stall_of_another_thread(lambda: held.copy_dtoh(host, int(buf)))
        assert took > 0.01 and stall > 0.7 * took, (stall, took)
    finally:
        buf.free()
