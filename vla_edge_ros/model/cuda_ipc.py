"""A reconciled snapshot's KV taken from another process through CUDA IPC: no trip through the host.

The reconciler node exports each snapshot into a ring buffer of its own
process (cuda_state_transfer.DeviceKvExporter) and puts the buffer's IPC
handle in its swap offer (`DeviceKV.ipc_descriptor()`):

    {"handle": hex of the 64-byte cuIpcMemHandle, "bytes": allocation size,
     "header_offset": where the generation word is, "generation": g,
     "buffer": ring index, "rows": rows in the snapshot,
     "shape": [2, layers, capacity, kv_dim], "element": the arena's element
     ("float32", or "uint16" for bf16 bits), "finite": bool, "device_pci_bus_id": ...,
     and with asr.host_generation_board "generation_board": the path of the
     host copy of the generation words (model/generation_board.py)}

The reasoning node's arena must hold the same element (both read kv.dtype from
one configuration); a mismatch is a clear error, never a conversion.

In the reasoning process an `IpcKvMapper` opens each handle once
(cuIpcOpenMemHandle; the exporter has asr.export_buffers buffers, so after
the first few offers nothing is opened again) in the backend's context, on the swap loader thread.
At the cycle boundary the swap first checks the generation word (`check_usable`:
a synchronous device read, or with a generation board one read of host
memory, mapped on the loader thread too), then `IpcKV.write_into` queues, on the backend's stream, a
read of the buffer's generation word (it must read 2g: written completely,
not reused), one kv_scatter from the mapped rows into the arena slots and a
second read of the word, then records an event (`IpcKV.start_write`). The
swap queues its late frames' recompute behind the copy and only then waits
for that event (`IpcWrite.finish`), so the copy runs on the device while the
host prepares and launches the recompute. A wrong word before or a change
after means the copy may be mixed (reused, or rewritten during the copy),
and it is reported as torn (DeviceKVUnavailable) so the engine can forget
the frames, the recomputed ones with them, rather than attend to mixed KV.

A mapping stays valid while the reconciler process keeps the allocation; an
offer is only taken from a reconciler that just answered, and the copy runs
at the next boundary.
"""
from __future__ import annotations

import logging
import threading
import time

import numpy as np

from .cuda_gil_held import DriverCallError, copy_dtoh, copy_dtoh_async, wait_event
from .errors import DeviceKVUnavailable
from .generation_board import GenerationView, complete_word

log = logging.getLogger(__name__)

DESCRIPTOR_KEYS = ("handle", "bytes", "header_offset", "generation", "rows", "shape", "element", "finite")


class IpcKvMapper:
    """IPC handles of reconciler processes opened in one backend's context, kept for reuse."""

    def __init__(self, device):
        self.device = device
        self._open: dict = {}            # handle hex -> pycuda IPCMemoryHandle
        self._by_buffer: dict = {}       # ring index -> the handle last offered for it
        self.retired = 0                 # mappings closed because another reconciler's buffer took their index
        self._boards: dict = {}          # generation board path -> GenerationView
        self._lock = threading.Lock()
        self.opened = 0
        self._words = None               # two page-locked int32: the generation word before and after a copy
        self._event = None               # recorded after a copy's second word read (IpcKV.start_write)

    def address(self, handle_hex: str) -> int:
        """Device address of the mapped allocation in this context (opened on first use)."""
        with self._lock:
            mapped = self._open.get(handle_hex)
            if mapped is None:
                drv = self.device.drv
                with self.device.bound():
                    try:
                        mapped = drv.IPCMemoryHandle(bytearray.fromhex(handle_hex),
                                                     drv.ipc_mem_flags.LAZY_ENABLE_PEER_ACCESS)
                    except drv.Error as exc:
                        raise DeviceKVUnavailable(f"cannot open the reconciler's CUDA IPC handle: {exc}") from exc
                self._open[handle_hex] = mapped
                self.opened += 1
                log.info("opened a reconciler KV buffer through CUDA IPC (%d mapped)", len(self._open))
            return int(mapped)

    def board(self, path: str) -> GenerationView | None:
        """The host generation words at `path`, mapped on first use (call off the cycle thread); None when they
        cannot be mapped (said once per path): the boundary then reads the device word, as without a board.
        A new path is a new reconciler (each makes its own directory): the earlier boards are unmapped then, and
        an offer still holding one reads the device word (GenerationView.word answers None once closed)."""
        with self._lock:
            if path in self._boards:
                return self._boards[path]
            self._close_boards()
            try:
                view = GenerationView(path)
                log.info("mapped a reconciler's generation board %s (%d words)", path, view.buffers)
            except (OSError, ValueError) as exc:
                view = None
                log.warning("cannot map the reconciler's generation board (%s); swaps check the device's generation "
                            "word instead", exc)
            self._boards[path] = view
            return view

    def copy_event(self):
        """The event a copy records after its second word read (made once, in this context; one swap at a time)."""
        with self._lock:
            if self._event is None:
                with self.device.bound():
                    self._event = self.device.drv.Event(self.device.drv.event_flags.DISABLE_TIMING)
            return self._event

    def header_words(self) -> tuple:
        """Two page-locked host words the copy's generation reads land in (made once, in this context)."""
        with self._lock:
            if self._words is None:
                with self.device.bound():
                    self._words = (self.device.drv.pagelocked_empty(1, np.int32),
                                   self.device.drv.pagelocked_empty(1, np.int32))
            return self._words

    def open(self, descriptor: dict) -> "IpcKV":
        """The KV holder of an offer's descriptor, its buffer mapped now (call off the cycle thread)."""
        kv = IpcKV(descriptor, self)
        self._retire_replaced(kv.buffer, descriptor["handle"])
        kv.prepare()
        return kv

    def _retire_replaced(self, buffer: int, handle_hex: str) -> None:
        """A reconciler keeps one allocation per ring buffer for its life, so a new handle for a ring index is a new
        reconciler (the old one was restarted): the old mapping is closed. Left open, each restart kept a whole ring
        of arena-sized buffers mapped, their memory held for a dead process. Safe here: the swap protocol loads an
        offer only once the last one's copy has been checked (SwapClient: no request while one is ready, applying
        or its copy unchecked), so nothing still reads an old buffer."""
        if buffer < 0:
            return
        with self._lock:
            old = self._by_buffer.get(buffer)
            self._by_buffer[buffer] = handle_hex
            mapped = self._open.pop(old, None) if old is not None and old != handle_hex else None
        if mapped is None:
            return
        self.retired += 1
        self._close_mapping(mapped)
        log.info("reconciler buffer %d has a new owner (a restarted reconciler): its old mapping closed", buffer)

    def forget(self, keep: set) -> None:
        """Close mappings whose handle is not in `keep` (a restarted reconciler's old buffers)."""
        with self._lock:
            for handle in [h for h in self._open if h not in keep]:
                self._close_mapping(self._open.pop(handle))

    def _close_mapping(self, mapped) -> None:
        with self.device.bound():
            try:
                mapped.close()
            except self.device.drv.Error as exc:         # the exporter may be gone: nothing left to release
                log.debug("closing an IPC mapping failed: %s", exc)

    def _close_boards(self) -> None:
        """Unmap every generation board (the lock held)."""
        for view in self._boards.values():
            if view is not None:
                view.close()
        self._boards.clear()

    def close(self) -> None:
        self.forget(set())
        with self._lock:
            self._close_boards()


class IpcKV:
    """`StateSnapshot.kv` of an offer from another process (see the module docstring)."""

    dtype = np.dtype(np.float32)
    on_device = True                       # model/backend.KvPayload

    def __init__(self, descriptor: dict, mapper: IpcKvMapper):
        missing = [k for k in DESCRIPTOR_KEYS if k not in descriptor]
        if missing:
            raise ValueError(f"IPC KV descriptor lacks {missing}")
        self.descriptor = descriptor
        self.mapper = mapper
        layers_shape = descriptor["shape"]
        self.shape = (2, int(layers_shape[1]), int(descriptor["rows"]), int(layers_shape[3]))
        self.finite = bool(descriptor["finite"])
        self.generation = int(descriptor["generation"])
        self.buffer = int(descriptor.get("buffer", -1))
        self.board_path = descriptor.get("generation_board")     # None: the device word is read at the boundary
        self._board: GenerationView | None = None
        if self.board_path is not None and self.buffer < 0:
            raise ValueError("IPC KV descriptor names a generation board but no buffer index")
        self.last_copy_ms: float | None = None
        # What start_write compares the arena with, made here (the loader thread): numpy's dtype.name is a
        # Python-level property, 36 us a call under the H200 swap profile of 2026-12-04, on the cycle thread.
        self._arena_shape = tuple(int(n) for n in descriptor["shape"])
        try:
            self._element = np.dtype(descriptor["element"])
        except TypeError as exc:
            raise ValueError(f"IPC KV descriptor: element {descriptor['element']!r} is not a numpy dtype") from exc

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        if ufunc is np.isfinite and method == "__call__":
            return np.bool_(self.finite)
        raise TypeError(f"IpcKV stays on the device: numpy {ufunc.__name__} is not available")

    def all_finite(self) -> bool:
        """From the reconciler's sum taken at export, carried in the descriptor (model/backend.KvPayload)."""
        return self.finite

    def prepare(self) -> None:
        """Map the buffer (and the generation board, if the offer names one) now, on the loader thread, so the
        cycle boundary only reads and copies."""
        self.attach_board()
        self.mapper.address(self.descriptor["handle"])

    def attach_board(self) -> None:
        """Map the offer's generation board, if it names one. One that cannot be mapped, or has no word for this
        buffer, is not used: the boundary reads the device word instead (the mapper says so once)."""
        if self.board_path is None or self._board is not None:
            return
        board = self.mapper.board(self.board_path)
        if board is not None and self.buffer < board.buffers:
            self._board = board
        elif board is not None:
            log.warning("generation board %s has %d words, the offer's buffer is %d: not used", self.board_path,
                        board.buffers, self.buffer)

    @property
    def checks_on_host(self) -> bool:
        """Whether check_usable reads the host generation board (else the device word)."""
        return self._board is not None

    def check_usable(self) -> None:
        """DeviceKVUnavailable unless the buffer still holds this snapshot, completely written: its generation word
        read from the host board when the offer has one (attach_board), else from the device."""
        word = None if self._board is None else self._board.word(self.buffer)
        if word is not None:
            where = "host generation board"
        else:                             # no board, or one that cannot say (closed, its exporter gone)
            word, where = self._header(), "generation word"
        if word != complete_word(self.generation):
            raise DeviceKVUnavailable(f"reconciler buffer {self.descriptor.get('buffer')} moved on ({where} {word}, "
                                      f"offer {self.generation}): the snapshot is stale")

    def check_fits(self, backend) -> None:
        """ValueError unless these rows can be copied into `backend`'s arena as they are: the same layout and
        element (both nodes read one configuration; a mismatch is refused, never converted). The swap asks it
        before anything changes (FrameState._check_snapshot), so a misconfigured pair of nodes rejects offers
        instead of emptying the primary's state at each one."""
        if tuple(backend.kv_rows_shape()) != self._arena_shape:
            raise ValueError(f"IpcKV.write_into: arena layout {backend.kv_rows_shape()} differs from the reconciler's "
                             f"{self._arena_shape} (capacity or model shape differ)")
        if backend.kv_rows_dtype() != self._element:
            raise ValueError(f"IpcKV.write_into: this arena holds {np.dtype(backend.kv_rows_dtype()).name}, the "
                             f"reconciler's rows {self._element.name} (kv.dtype differs between the nodes)")

    def write_into(self, backend, slots: np.ndarray) -> None:
        """One kv_scatter from the mapped rows into `slots` of the CudaBackend `backend`, checked before and after."""
        self.start_write(backend, slots).finish()

    def start_write(self, backend, slots: np.ndarray) -> "IpcWrite":
        """Queue on the backend's stream: the generation word's read, one kv_scatter, the word's second read,
        and an event after them; IpcWrite.finish() waits for that event only (not for work queued after it)."""
        slots = np.asarray(slots)
        if slots.size != self.shape[2]:
            raise ValueError(f"IpcKV.write_into: {slots.size} slots for {self.shape[2]} KV rows")
        self.check_fits(backend)
        t = time.perf_counter()
        dev = self.mapper.device
        drv = dev.drv
        base = self.mapper.address(self.descriptor["handle"])
        word_at = base + int(self.descriptor["header_offset"])
        before, after = self.mapper.header_words()
        done = self.mapper.copy_event()
        try:                              # the word reads keep the interpreter lock (cuda_gil_held.py)
            with dev.bound():
                copy_dtoh_async(before, word_at, backend.stream)
            t_scatter = time.perf_counter()
            backend.scatter_kv_rows(base, slots)
            scatter_ms = (time.perf_counter() - t_scatter) * 1e3
            with dev.bound():
                copy_dtoh_async(after, word_at, backend.stream)
                done.record(backend.stream)
        except (drv.Error, DriverCallError) as exc:   # e.g. the reconciler's process went away under the mapping
            raise DeviceKVUnavailable(f"copying the reconciler's KV failed: {exc}") from exc
        write = IpcWrite(self, done, t)
        # Where the queuing's time goes (it took as long as the copy in the H200 soaks, all calls asynchronous):
        # the scatter's share, and of that its slot list's upload (CudaBackend.last_slot_upload_ms).
        write.scatter_queue_ms, write.slot_upload_ms = scatter_ms, getattr(backend, "last_slot_upload_ms", None)
        return write

    def _header(self) -> int:
        base = self.mapper.address(self.descriptor["handle"])
        word = np.zeros(1, np.int32)
        dev = self.mapper.device
        try:                              # at a boundary: keeps the interpreter lock (cuda_gil_held.py)
            with dev.bound():
                copy_dtoh(word, base + int(self.descriptor["header_offset"]))
        except (dev.drv.Error, DriverCallError) as exc:
            raise DeviceKVUnavailable(f"reading the reconciler's buffer failed: {exc}") from exc
        return int(word[0])


class IpcWrite:
    """IpcKV.start_write's queued copy: finish() waits for its event and checks the two generation words."""

    def __init__(self, kv: IpcKV, done, t_start: float):
        self.kv = kv
        self.done = done                 # pycuda Event recorded after the copy and the word's second read
        self.t_start = t_start
        self.scatter_queue_ms: float | None = None    # of queuing: the kv_scatter's (start_write sets both)
        self.slot_upload_ms: float | None = None      # of that: its slot list's upload

    def finish(self) -> None:
        kv = self.kv
        dev = kv.mapper.device
        try:
            with dev.bound():
                wait_event(self.done)
        except dev.drv.Error as exc:
            raise DeviceKVUnavailable(f"copying the reconciler's KV failed: {exc}") from exc
        kv.last_copy_ms = (time.perf_counter() - self.t_start) * 1e3
        before, after = kv.mapper.header_words()
        if int(before[0]) != complete_word(kv.generation):
            raise DeviceKVUnavailable(f"reconciler buffer {kv.descriptor.get('buffer')} moved on before the copy "
                                      f"(generation word {int(before[0])}, offer {kv.generation}): torn KV")
        if int(after[0]) != complete_word(kv.generation):
            raise DeviceKVUnavailable(f"reconciler buffer rewritten during the copy (generation word {int(after[0])}): "
                                      f"torn KV")
