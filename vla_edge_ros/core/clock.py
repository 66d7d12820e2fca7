"""Cycle boundaries on the monotonic clock, reached with a hybrid sleep-then-spin wait.

`time.sleep` on Linux overshoots by up to about a millisecond (timer slack,
scheduler latency), which is 3 % of a 33 ms cycle and random. So the wait
sleeps until `spin_window_s` before the target and busy-waits the rest
(the article's `hybrid_sleep_until`). The spin costs at most `spin_window_s`
of one core per cycle (1 ms of 33 ms by default).

Boundaries are a fixed grid `origin + k * period` on `time.perf_counter()`: a
cycle that overruns does not shift the grid, the loop simply waits for the
next boundary still in the future and counts the boundaries it skipped.

ROS-free: the reasoning node drives it from its cycle thread.
"""
from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass

DEFAULT_SPIN_WINDOW_S = 0.001   # busy-wait the last millisecond before a boundary


def hybrid_sleep_until(target_perf_s: float, spin_window_s: float = DEFAULT_SPIN_WINDOW_S,
                       stop: threading.Event | None = None) -> float:
    """Return at `target_perf_s` (perf_counter seconds); returns how late we woke, in seconds.

    Sleeps (interruptibly when `stop` is given) until `spin_window_s` before the
    target, then spins. Returns early, with a negative lateness, if `stop` is set.
    """
    if spin_window_s < 0:
        raise ValueError(f"spin_window_s must be >= 0, got {spin_window_s}")
    while True:
        remaining = target_perf_s - time.perf_counter()
        if remaining <= spin_window_s:
            break
        coarse = remaining - spin_window_s
        if stop is not None:
            if stop.wait(coarse):
                return -(target_perf_s - time.perf_counter())
        else:
            time.sleep(coarse)
    while True:
        now = time.perf_counter()
        if now >= target_perf_s:
            return now - target_perf_s
        if stop is not None and stop.is_set():
            return now - target_perf_s


@dataclass(frozen=True)
class Boundary:
    index: int          # boundary number on the grid since the origin
    perf_s: float       # its time on perf_counter
    skipped: int        # boundaries passed without a cycle since the previous one (overruns)


class CycleGrid:
    """The fixed grid of cycle boundaries `origin + k * period`."""

    def __init__(self, period_s: float, origin_perf_s: float | None = None):
        if not period_s > 0:
            raise ValueError(f"period_s must be > 0, got {period_s}")
        self.period_s = period_s
        self.origin_perf_s = time.perf_counter() if origin_perf_s is None else origin_perf_s
        self._last_index = -1

    def next_boundary(self, now_perf_s: float | None = None) -> Boundary:
        """The first boundary strictly after the previous one and not in the past."""
        now = time.perf_counter() if now_perf_s is None else now_perf_s
        k = max(self._last_index + 1, math.ceil((now - self.origin_perf_s) / self.period_s))
        skipped = k - self._last_index - 1 if self._last_index >= 0 else 0
        self._last_index = k
        return Boundary(index=k, perf_s=self.origin_perf_s + k * self.period_s, skipped=skipped)

