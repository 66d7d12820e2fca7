"""What a reconciler step of k frames costs: measured per step size, estimated conservatively for the others.

A reconciler step computes k whole frames in one forward (k * tokens_per_frame
rows). A multi-row forward costs a fixed part (launches, streaming the weights
once; ~1-3 ms for the GPU's bulk prefill) plus a part per row, so k frames do
not cost k times one frame: one cost per token, the schedule before, either
wasted the gap (a many-frame step planned at the one-frame rate) or, fitted to
big steps, overran it with small ones. So every step size ("bucket": frames
per step) keeps its own measured cost, and a size not measured yet is
estimated from the measured ones, never optimistically:

    fit(k)        least squares a + b k over the measured sizes (b >= 0); with one measured size m,
                  c_m k / m: for k > m an upper bound of the true cost, whose fixed part is >= 0
    estimate(k)   max(fit(k), the cost measured for any smaller size): a bigger step never costs less;
                  below every measured size, the smallest measured size's cost (an upper bound again)
    eligible      k <= GROWTH x the largest size measured: untried sizes are reached by doubling, each
                  measured before the next is planned, so a wrong estimate costs one step of at most twice
                  a size whose cost is known

Costs are device time (the caller synchronizes before reading its clock). A size's cost is the median of
its latest samples, not a running average: in the H200 graph one 4-frame step measured 38 ms (against
~7 ms for 4 frames alone on the GPU: it met a cycle, or paid a one-time cost), and as an average that one
sample priced every step above 2 frames out of the gap for the rest of a 4-minute run, because a size
that is never planned is never measured again. For the same reason the first sample of each size is a
warm-up (the first replay of its graph) and is not kept. The samples are also the floor a starved
schedule relaxes toward (core/slack_scheduler.py).
"""
from __future__ import annotations

from collections import deque

from .metrics import percentile

GROWTH = 2            # untried step sizes: at most this multiple of the largest size measured
SAMPLES_KEPT = 64     # latest samples per size: the estimate is their median


class CostTrack:
    """The cost of one kind of step (ms): the median of its latest samples, after a warm-up sample."""

    def __init__(self):
        self.samples: deque = deque(maxlen=SAMPLES_KEPT)
        self.warmup_ms: float | None = None           # the first sample: not a measurement
        self._relaxed: float | None = None            # a lowered estimate, until the next sample

    @property
    def value(self) -> float | None:
        """The cost to plan with (None before a sample past the warm-up)."""
        if self._relaxed is not None:
            return self._relaxed
        return percentile(self.samples, 50) if self.samples else None

    def observe(self, ms: float) -> None:
        if self.warmup_ms is None:
            self.warmup_ms = float(ms)
            return
        self.samples.append(float(ms))
        self._relaxed = None

    def relax(self, factor: float, floor_percentile: float) -> bool:
        """Lower the estimate by `factor`, never below that percentile of the samples (a cost really measured).
        True when it moved."""
        current = self.value
        if current is None:
            return False
        floor = percentile(self.samples, floor_percentile)
        if floor >= current:
            return False
        self._relaxed = max(floor, current * factor)
        return True


class StepCosts:
    """Measured cost per step size (frames per step) and estimates for the sizes not measured yet."""

    def __init__(self):
        self.by_frames: dict[int, CostTrack] = {}

    def observe(self, frames: int, ms: float) -> None:
        if frames <= 0:
            raise ValueError(f"StepCosts.observe: a step of {frames} frames")
        self.by_frames.setdefault(int(frames), CostTrack()).observe(ms)

    def measured(self) -> dict[int, float]:
        """{frames: ms} of every size measured so far (past its warm-up sample)."""
        return {k: t.value for k, t in sorted(self.by_frames.items()) if t.value is not None}

    @property
    def largest_measured(self) -> int:
        return max(self.measured(), default=0)

    def eligible(self, cap: int) -> int:
        """The largest step size that may be planned now: GROWTH x the largest measured one, at most `cap`."""
        return min(cap, max(1, GROWTH * self.largest_measured))

    def estimate(self, frames: int) -> float | None:
        """The cost (ms) to plan for a step of `frames` frames; None with nothing measured."""
        m = self.measured()
        if not m:
            return None
        if frames in m:
            return m[frames]
        sizes = list(m)
        if frames < sizes[0]:
            return m[sizes[0]]
        smaller = max(m[k] for k in sizes if k < frames)
        return max(self._fit(m)(frames), smaller)

    def relax(self, factor: float, floor_percentile: float) -> bool:
        """Relax every size's cost (CostTrack.relax); True when any moved."""
        moved = [t.relax(factor, floor_percentile) for t in self.by_frames.values()]
        return any(moved)

    @staticmethod
    def _fit(m: dict):
        """cost(k) from the measured sizes: see the module docstring."""
        sizes = list(m)
        if len(sizes) == 1:
            (s,) = sizes
            return lambda k: m[s] * k / s
        n = len(sizes)
        x_mean = sum(sizes) / n
        y_mean = sum(m.values()) / n
        var = sum((k - x_mean) ** 2 for k in sizes)
        b = max(0.0, sum((k - x_mean) * (m[k] - y_mean) for k in sizes) / var)
        a = y_mean - b * x_mean
        return lambda k: a + b * k
