"""Which export buffer the next offer's KV goes into: never one the primary may still be reading.

A reconciler on a GPU exports each offer's KV into one of a few device buffers
of its own (model/cuda_state_transfer.DeviceKvExporter) and hands the primary
the buffer's CUDA IPC handle. While the primary has not applied a round, the
reconciler keeps offering fresher versions (core/reconciliation.py), so
buffers are reused while the primary may be copying from one of them. The
rule here decides which buffer an export may write:

    never the newest export's    the offer on hand: the next request is answered with it
    never a protected one        its owner's list: the reconciler worker protects the buffer of
                                 the offer it last handed out (core/swap_protocol.py)
    of the rest, the next in turn after the one written last

With asr.export_buffers >= 3 (one newest, one protected) there is always a
free buffer. Thread-safe: the worker protects from the executor thread while
the export runs on its own.
"""
from __future__ import annotations

import threading


class ExportRing:
    def __init__(self, buffers: int):
        if buffers < 2:
            raise ValueError(f"ExportRing: {buffers} buffers; the newest export and one to write the next into "
                             f"need at least 2")
        self.buffers = int(buffers)
        self.newest: int | None = None
        self._next = 0
        self._protected: frozenset = frozenset()
        self._lock = threading.Lock()

    def protect(self, indices) -> None:
        """The buffers the next exports must not write, besides the newest export's (replaces the set)."""
        indices = frozenset(int(i) for i in indices)
        if any(not 0 <= i < self.buffers for i in indices):
            raise ValueError(f"ExportRing.protect: buffers {sorted(indices)} of {self.buffers}")
        with self._lock:
            self._protected = indices

    def free(self) -> list[int]:
        """The buffers an export may write now, in the order they would be taken."""
        with self._lock:
            return self._free()

    def take(self) -> int:
        """The buffer the next export writes; it becomes the newest. RuntimeError when none is free."""
        with self._lock:
            free = self._free()
            if not free:
                raise RuntimeError(f"ExportRing: no free buffer of {self.buffers} (newest {self.newest}, "
                                   f"protected {sorted(self._protected)})")
            index = free[0]
            self._next = (index + 1) % self.buffers
            self.newest = index
            return index

    def _free(self) -> list[int]:
        order = [(self._next + k) % self.buffers for k in range(self.buffers)]
        return [i for i in order if i != self.newest and i not in self._protected]
