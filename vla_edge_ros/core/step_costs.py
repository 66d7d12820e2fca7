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

Costs are device time (the caller synchronizes before reading its clock), EMAs
with EMA_ALPHA; each size also keeps its latest samples, the floor a starved
schedule relaxes toward (core/slack_scheduler.py).
"""
from __future__ import annotations

from collections import deque

from .metrics import percentile

EMA_ALPHA = 0.3       # weight of the newest measurement of a step size
GROWTH = 2            # untried step sizes: at most this multiple of the largest size measured
SAMPLES_KEPT = 64     # latest samples per size (the relaxation's floor is a percentile of them)


class CostTrack:
    """The cost of one kind of step (ms): an EMA and the latest samples."""

    def __init__(self):
        self.ema: float | None = None
        self.samples: deque = deque(maxlen=SAMPLES_KEPT)

    def observe(self, ms: float) -> None:
        self.ema = ms if self.ema is None else (1 - EMA_ALPHA) * self.ema + EMA_ALPHA * ms
        self.samples.append(float(ms))

    def relax(self, factor: float, floor_percentile: float) -> bool:
        """Lower the EMA by `factor`, never below that percentile of the samples (a cost really measured).
        True when it moved."""
        if self.ema is None or not self.samples:
            return False
        floor = percentile(self.samples, floor_percentile)
        if floor >= self.ema:
            return False
        self.ema = max(floor, self.ema * factor)
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
        """{frames: EMA ms} of every size measured so far."""
        return {k: t.ema for k, t in sorted(self.by_frames.items())}

    @property
    def largest_measured(self) -> int:
        return max(self.by_frames, default=0)

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
