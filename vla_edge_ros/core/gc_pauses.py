"""Python's garbage collector as a source of cycle stalls: watched, and kept away from the long-lived heap.

A full (generation 2) collection walks every container object of the
process and holds the GIL while it does, so the cycle thread waits, however
ready it is. In the reasoning process that heap is large and long-lived
(rclpy, numpy, PyCUDA, the engine's bookkeeping). On the H200 each 60 s demo
showed exactly one stall of the cycle thread of ~350 ms (one refused cycle
that started 387 ms late, then one late cycle), which is what a full
collection of such a heap costs.

`freeze()` runs one collection at a moment that costs nothing (the end of
configure, before any cycle) and then moves every surviving object into the
permanent generation (gc.freeze), so later collections only walk what the
cycles themselves allocate. `GcPauses` times every collection through
gc.callbacks, so the diagnostics show whether stalls remain.
"""
from __future__ import annotations

import gc
import threading
import time


class GcPauses:
    """Counts and times the collector's runs (per generation) for the diagnostics."""

    def __init__(self):
        self._lock = threading.Lock()
        self._started: dict = {}
        self.count = [0, 0, 0]
        self.max_ms = [0.0, 0.0, 0.0]
        self.total_ms = 0.0
        # Set by the caller after freeze(): gc.get_freeze_count() walks the whole permanent generation in C,
        # holding the GIL (2.8 ms for 40k objects on the CPU demo machine), so the diagnostics must not ask it.
        self.frozen_objects = 0

    def install(self) -> "GcPauses":
        gc.callbacks.append(self._on_gc)
        return self

    def uninstall(self) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)

    def reset(self, frozen_objects: int = 0) -> None:
        """Forget what was counted so far: freeze()'s own deliberate collection at configure (30-40 ms on the
        CPU demo) is not a pause of the cycles, and the demo report showed it as the longest one.
        `frozen_objects`: what freeze() returned, for the diagnostics."""
        with self._lock:
            self.frozen_objects = frozen_objects
            self.count = [0, 0, 0]
            self.max_ms = [0.0, 0.0, 0.0]
            self.total_ms = 0.0

    def summary(self) -> dict:
        with self._lock:
            return {"collections": sum(self.count), "full_collections": self.count[2],
                    "max_pause_ms": max(self.max_ms), "max_full_pause_ms": self.max_ms[2],
                    "total_pause_ms": self.total_ms, "frozen_objects": self.frozen_objects}

    def _on_gc(self, phase: str, info: dict) -> None:
        ident = threading.get_ident()
        if phase == "start":
            self._started[ident] = time.perf_counter()
            return
        t0 = self._started.pop(ident, None)
        if t0 is None:
            return
        ms = (time.perf_counter() - t0) * 1e3
        gen = int(info.get("generation", 0))
        with self._lock:
            self.count[gen] += 1
            self.max_ms[gen] = max(self.max_ms[gen], ms)
            self.total_ms += ms


def freeze() -> int:
    """Collect once now, then exempt every surviving object from future collections; returns how many."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def unfreeze() -> None:
    """Return the frozen objects to the collector (after cleanup: the engine's objects may go)."""
    gc.unfreeze()
