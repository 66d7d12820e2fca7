"""A fixed glibc mmap threshold, so a large buffer freed goes back to the operating system.

glibc serves an allocation at or above its mmap threshold (128 KiB at start)
with mmap and returns it on free. But the threshold is dynamic: freeing such a
buffer raises it to that buffer's size (up to 32 MiB). A node that loads
snapshots of 118..125 frames x 32 x 1536 float32 vision rows (24 MiB each, a
little smaller or larger each time) then gets the next one from the heap,
whose top is trimmed only past twice the new threshold, and its resident
memory steps up by a snapshot and stays: +24 MiB in the reasoning node at
~215 s of a 4-minute H200 soak, +85 MiB in the reconciler in another, which
failed the soak's memory-growth check. The same pattern in a plain loop: +46
MiB resident with glibc's dynamic threshold, 0 with a fixed one
(test/test_malloc_threshold.py).

A fixed threshold (mallopt M_MMAP_THRESHOLD, which also switches the dynamic
adjustment off) keeps every buffer of that size or more on mmap. It is set
above a camera frame (640 x 480 x 3 = 0.9 MiB, allocated 60 times a second:
mapping each would cost page faults on every frame) and below a snapshot.
The trim threshold is fixed with it at twice that size, the value glibc's own
adjustment gives it: fixing the mmap threshold alone leaves the trim threshold
at 128 KiB, and the heap then gives back and faults in again the numpy
backend's temporaries of every cycle (in an ad-hoc loop of tiny-model cycles
at 4096 slots, slower than glibc's default; with the trim threshold set, as
fast).
"""
from __future__ import annotations

import ctypes

M_TRIM_THRESHOLD = -1          # glibc's mallopt parameter numbers (malloc.h)
M_MMAP_THRESHOLD = -3
MIB = 1 << 20


def pin_mmap_threshold(mib: float) -> str | None:
    """Fix the mmap threshold at `mib` MiB and the trim threshold at twice that (0: leave glibc's dynamic ones). None when done, else why not
    (not glibc, or refused): the caller logs it; memory then behaves as glibc's default."""
    if mib <= 0:
        return None
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return "this C library has no mallopt (not glibc)"
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    if mallopt(M_MMAP_THRESHOLD, int(mib * MIB)) != 1:
        return f"mallopt refused an mmap threshold of {mib} MiB"
    if mallopt(M_TRIM_THRESHOLD, int(2 * mib * MIB)) != 1:
        return f"mallopt refused a trim threshold of {2 * mib} MiB (the mmap threshold is set)"
    return None
