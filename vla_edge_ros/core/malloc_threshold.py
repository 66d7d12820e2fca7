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
"""
from __future__ import annotations

import ctypes

M_MMAP_THRESHOLD = -3          # glibc's mallopt parameter number (malloc.h)
MIB = 1 << 20


def pin_mmap_threshold(mib: float) -> str | None:
    """Fix the mmap threshold at `mib` MiB (0: leave glibc's dynamic threshold). None when done, else why not
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
    return None
