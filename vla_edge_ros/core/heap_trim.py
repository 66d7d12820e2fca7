"""Free heap memory handed back to the operating system now and then, between cycles.

glibc keeps what a process frees: chunks inside its heaps stay mapped for reuse, and the top of a heap is
returned only past the trim threshold (8 MiB here, core/malloc_threshold.py). So a burst of extra live
buffers (a swap, a round that ran late) raises resident memory by what the burst took, and it stays there as
free heap: 30 extra 192 KiB vision-row arrays alive at once, then freed, leave ~5.3 MiB resident for good in a
plain loop with the node's thresholds (test/test_heap_trim.py). On the H200 (2026-12-04, eleventh session) the
reasoning node's RSS stepped +5.8 MiB at the one late round of a 4-minute soak and stayed, which failed the
soak's growth bound of 5 MiB although nothing was kept.

malloc_trim(0) returns every free page of every arena (madvise), so resident memory follows what is live.
It walks the arenas under their locks; the reasoning node calls it from its cycle thread after a cycle's
boundary work, only when the next boundary is at least `min_slack_ms` away and at most once per
`interval_s`, and times it (the report's `heap_trim` phase); the reconciler's worker while no round runs
(core/swap_protocol.py; counted in its diagnostics as heap_trims). Pages it returned fault back in when
reused (a few us per 4 KiB page).
"""
from __future__ import annotations

import ctypes
import time


def _malloc_trim():
    """glibc's malloc_trim, or None where the C library has none."""
    try:
        fn = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    fn.argtypes = (ctypes.c_size_t,)
    fn.restype = ctypes.c_int
    return fn


class HeapTrim:
    """At most one malloc_trim(0) per `interval_s`, only with `min_slack_ms` left before the next deadline."""

    def __init__(self, interval_s: float, min_slack_ms: float, clock=time.perf_counter):
        if interval_s < 0 or min_slack_ms < 0:
            raise ValueError(f"HeapTrim needs interval_s >= 0 and min_slack_ms >= 0, got {interval_s}, {min_slack_ms}")
        self.interval_s = float(interval_s)
        self.min_slack_ms = float(min_slack_ms)
        self._clock = clock
        self._trim = _malloc_trim() if interval_s > 0 else None
        self._last = clock()
        self.count = 0

    @property
    def why_off(self) -> str | None:
        """None when trimming, else why not (for the node's log)."""
        if self.interval_s == 0:
            return "memory.heap_trim_interval_s is 0"
        if self._trim is None:
            return "this C library has no malloc_trim (not glibc)"
        return None

    def maybe_trim(self, slack_ms: float) -> float | None:
        """Trim when due and `slack_ms` (until the next deadline) allows; the ms it took, or None when it did not
        run."""
        if self._trim is None or slack_ms < self.min_slack_ms:
            return None
        t0 = self._clock()
        if t0 - self._last < self.interval_s:
            return None
        self._trim(0)
        self._last = self._clock()
        self.count += 1
        return (self._last - t0) * 1e3
