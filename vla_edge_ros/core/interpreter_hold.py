"""Keeping the interpreter lock through a swap at the cycle boundary (off unless cycle.boundary_switch_interval_ms).

A thread of the reasoning process that wants the interpreter lock while the cycle thread holds it waits for the
switch interval (cycle.gil_switch_interval_ms, 0.5 ms), then asks the holder to let go; the holder does at its next
bytecode boundary and gets the lock back only when the other thread blocks or its own interval ends. A swap at the
boundary is ~1 ms of Python on the cycle thread, with the executor (camera frames at 60 Hz, diagnostics) and the
swap loader running Python beside it, so it can lose the lock several times: on the H200 its whole-state KV
scatter queued in 0.045 ms p50 in an idle process and in 0.19 ms p50 in the graph (notes/cuda_notes.md,
fifteenth session). Raising the interval for the length of the swap lets the others wait for it instead; they
lose at most that interval once, which the double buffer and the swap loader absorb.

The interval is process-wide (sys.setswitchinterval). A thread already waiting when it is raised keeps the timeout
it started with, so the first request can still come after the ordinary interval; later ones wait longer. The other
side: a thread that does get the lock inside the block keeps it for up to the raised interval, so a swap that waits
for the device (asr.swap_finish boundary: the wait gives the lock up) can lose that long; the key is meant for
next_cycle swaps, whose boundary keeps the lock (model/cuda_gil_held.py), and for a value of 1-2 ms.
"""
from __future__ import annotations

import sys
from contextlib import contextmanager


@contextmanager
def interpreter_held(interval_ms: float):
    """Within the block, the process's switch interval is `interval_ms` (0: unchanged); the interval before is
    restored on the way out, whatever the block raised."""
    if interval_ms <= 0.0:
        yield
        return
    before = sys.getswitchinterval()
    sys.setswitchinterval(interval_ms / 1000.0)
    try:
        yield
    finally:
        sys.setswitchinterval(before)
