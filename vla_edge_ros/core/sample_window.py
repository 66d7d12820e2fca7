"""A window of recent samples whose median and quantiles cost microseconds, not a numpy call.

Every cycle folds its actual / predicted ratio into admission's tail
(AdmissionController.observe), and the swap at a cycle boundary folds two
measurements into running statistics (FrameState.note_recompute,
FrameState._note_swap_fixed): a median and an admission.tail_quantile over the
last admission.tail_window samples. With np.median / np.quantile over the
window each fold took 0.1-0.4 ms (numpy's per-call overhead, not the 90
values), most of the swap's "rest" in the swap benchmark (bench/swap_host.py).
Here the window is also kept sorted, so a sample costs a bisect and the
statistics an index and an interpolation.

The results equal numpy's to the bit: `sorted_quantile` repeats
np.quantile's default ("linear", Hyndman & Fan 7) arithmetic step for step,
and the median is np.median's (the middle value, or the mean of the middle
two). test/test_sample_window.py checks both against numpy.
"""
from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections import deque

from ..config import TAIL_MIN_SAMPLES    # fewer samples than this: no tail yet (the mean alone)


def sorted_quantile(values, q: float) -> float:
    """np.quantile(values, q) of `values` sorted ascending (non-empty, no NaN), by numpy's own steps."""
    n = len(values)
    virtual = (n - 1) * q                       # numpy's virtual index for "linear"
    if virtual >= n - 1:
        return float(values[-1])
    if virtual < 0:
        return float(values[0])
    lo = math.floor(virtual)
    a, b, t = values[lo], values[lo + 1], virtual - lo
    diff = b - a
    # numpy's _lerp: from the nearer end, so that t = 1 gives b exactly.
    return float(b - diff * (1 - t)) if t >= 0.5 else float(a + diff * t)


class SampleWindow:
    """The last `size` float samples in arrival order, and the same values sorted."""

    def __init__(self, size: int):
        if size <= 0:
            raise ValueError(f"SampleWindow: size must be > 0, got {size}")
        self._recent: deque = deque(maxlen=size)
        self._sorted: list[float] = []

    def append(self, value: float) -> None:
        """Add a sample (finite: the callers drop the others), the oldest leaving a full window."""
        value = float(value)
        if len(self._recent) == self._recent.maxlen:
            del self._sorted[bisect_left(self._sorted, self._recent[0])]
        self._recent.append(value)
        insort(self._sorted, value)

    def drop_oldest(self) -> None:
        """Remove the oldest sample (the window non-empty): for samples that expire by age, not by count."""
        del self._sorted[bisect_left(self._sorted, self._recent.popleft())]

    @property
    def size(self) -> int:
        """The most samples the window keeps."""
        return self._recent.maxlen

    def __len__(self) -> int:
        return len(self._recent)

    def __iter__(self):
        return iter(self._recent)

    def median(self) -> float:
        """np.median of the window (non-empty)."""
        s, n = self._sorted, len(self._sorted)
        return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2

    def max(self) -> float:
        return self._sorted[-1]

    def tail(self, q: float) -> float | None:
        """The window's q-quantile (np.quantile's), None before TAIL_MIN_SAMPLES samples."""
        if len(self._sorted) < TAIL_MIN_SAMPLES:
            return None
        return sorted_quantile(self._sorted, q)
