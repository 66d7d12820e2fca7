"""One CUDA context and the rule for using it from several threads.

A CUDA context is current per thread, and PyCUDA keeps its own per-thread
stack of them: a thread that touches the device without a current context
fails ("invalid device context"), and a thread (or the interpreter) that ends
with a context still on its PyCUDA stack aborts the whole process ("context
stack was not empty upon module cleanup"). Both happened on the H200 the first
time the nodes ran there: the backend was built on one thread and its cycles
ran on another.

So nothing here leaves a context pushed. `CudaDevice.bound()` makes the
context current on the calling thread for a `with` block and pops it at the
end (a no-op when it is already current there, so blocks nest freely). Every
public method of CudaBackend runs inside `bound()`, and the long-lived device
threads (the reasoning node's cycle thread, the reconciler's worker) hold
`bound()` for their whole lifetime, which makes the per-call check free.

Two kinds of context:
    primary_device(i)      the device's primary context, retained once per process
                           and never released (it lives as long as the process;
                           memory is given back by freeing buffers, not contexts)
    CudaDevice.own(i)      a context of its own (cuCtxCreate), e.g. a reconciler
                           beside the primary in one process; `close()` destroys it

Importing this module touches no GPU: PyCUDA is imported on first use.
"""
from __future__ import annotations

import contextlib
import logging
import threading

log = logging.getLogger(__name__)

_lock = threading.Lock()
_primary: dict = {}          # device index -> CudaDevice (primary context, one per process)


class NoCudaDevice(RuntimeError):
    """PyCUDA is missing, the driver cannot initialise, or the requested device does not exist."""


def driver():
    """pycuda.driver, initialised (NoCudaDevice when PyCUDA or a device is missing)."""
    try:
        import pycuda.driver as drv
    except ImportError as exc:
        raise NoCudaDevice(f"PyCUDA is not installed ({exc})") from exc
    try:
        drv.init()
    except drv.Error as exc:
        raise NoCudaDevice(f"the CUDA driver did not initialise: {exc}") from exc
    return drv


def device_count() -> int:
    """Devices the driver sees; 0 when PyCUDA or a driver is missing."""
    try:
        return driver().Device.count()
    except NoCudaDevice:
        return 0


class CudaDevice:
    """A CUDA context on one device; see the module docstring for the threading rule."""

    def __init__(self, index: int, context, owned: bool):
        drv = driver()
        self.drv = drv
        self.index = int(index)
        self.device = drv.Device(self.index)
        self.context = context
        self.owned = owned                 # a context of our own (destroyed by close), not the primary
        self.handle = int(context.handle)
        self._closed = False

    # ------------------------------------------------------------------ construction

    @classmethod
    def own(cls, index: int = 0) -> "CudaDevice":
        """A new context of its own on device `index` (not left current anywhere)."""
        drv = driver()
        _check_index(drv, index)
        context = drv.Device(index).make_context()        # make_context pushes it on this thread
        drv.Context.pop()
        return cls(index, context, owned=True)

    # ------------------------------------------------------------------ use

    @contextlib.contextmanager
    def bound(self):
        """This context current on the calling thread for the block, popped after (nests freely)."""
        if self._closed:
            raise NoCudaDevice(f"CUDA context on device {self.index} was closed")
        if current_handle(self.drv) == self.handle:
            yield self
            return
        self.context.push()
        try:
            yield self
        finally:
            self.drv.Context.pop()

    def mem_info(self) -> tuple[int, int]:
        """(free, total) bytes of the device, as the driver reports them."""
        with self.bound():
            return self.drv.mem_get_info()

    def name(self) -> str:
        return self.device.name()

    def pci_bus_id(self) -> str:
        return self.device.pci_bus_id()

    def describe(self) -> str:
        kind = "own context" if self.owned else "primary context"
        return f"{self.name()} (device {self.index}, {kind})"

    def close(self) -> None:
        """Destroy an owned context (its memory goes with it); the primary context stays retained."""
        if self.owned and not self._closed:
            self._closed = True
            try:
                self.context.push()
                self.context.detach()      # last reference: the context is destroyed and popped
            except self.drv.Error as exc:  # noqa: PERF203 - a failed teardown is logged, not fatal
                log.warning("closing the CUDA context on device %d failed: %s", self.index, exc)


def primary_device(index: int = 0) -> CudaDevice:
    """The device's primary context, retained once per process (no context is pushed)."""
    with _lock:
        dev = _primary.get(index)
        if dev is None:
            drv = driver()
            _check_index(drv, index)
            dev = CudaDevice(index, drv.Device(index).retain_primary_context(), owned=False)
            _primary[index] = dev
            log.info("CUDA device %d: %s", index, dev.name())
        return dev


def reconciler_device_index(requested: int, primary: int = 0) -> tuple[int, str]:
    """Where a GPU reconciler runs for asr.device `requested`: (device index, one line saying why).

    -1 or the primary's own index: the primary's device. Another index must exist (NoCudaDevice names
    asr.device otherwise) and be reachable from the primary's device peer to peer, since the primary's
    kv_scatter reads the offered KV where it lies; when it is not, the reconciler runs on the primary's
    device instead, and that is logged here as a warning (never a silent fallback; the choice otherwise at
    INFO), so every caller reports it alike."""
    drv = driver()
    if requested < 0 or requested == primary:
        index, why = primary, f"device {primary}, the primary's (asr.device {requested})"
    else:
        count = drv.Device.count()
        if requested >= count:
            raise NoCudaDevice(f"asr.device {requested}: this process sees {count} CUDA device(s) (0..{count - 1}; "
                               f"CUDA_VISIBLE_DEVICES renumbers them)")
        here, there = drv.Device(primary), drv.Device(requested)
        if here.can_access_peer(there):
            index, why = requested, f"device {requested} ({there.name()}), its KV read by device {primary} peer to peer"
        else:
            index, why = primary, (f"asr.device {requested} ({there.name()}) cannot be read peer to peer by the "
                                   f"primary's device {primary} ({here.name()}): the reconciler runs on device "
                                   f"{primary} instead")
    log.log(logging.WARNING if requested >= 0 and index != requested else logging.INFO, "reconciler on %s", why)
    return index, why


def current_handle(drv) -> int | None:
    """Handle of the context current on this thread (PyCUDA's view), or None."""
    try:
        ctx = drv.Context.get_current()
    except drv.Error:
        return None
    return None if ctx is None else int(ctx.handle)


@contextlib.contextmanager
def bound(device: CudaDevice | None):
    """`device.bound()`, or nothing for None (a CPU backend): for threads that may or may not own a GPU."""
    if device is None:
        yield None
    else:
        with device.bound():
            yield device


def _check_index(drv, index: int) -> None:
    count = drv.Device.count()
    if not 0 <= int(index) < count:
        raise NoCudaDevice(f"CUDA device {index} requested, {count} visible")
