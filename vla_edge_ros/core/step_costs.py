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

The context (StepCosts(follow_context=True), asr.step_cost_follows_context). A step's rows attend to every
token the reconciler's state already holds, and a round grows that state from the prefix to every kept
frame, so a size's cost grows through the round while the median of its samples lags behind. In `bench asr
--capacity 32768` on the H200 (2026-12-05) every other cycle of a catch-up with ~600 frames held started 2-3.5
ms late, and a later run's gap records showed one-frame steps of 7.1-7.7 ms at ~668 frames held running past
their boundary: steps planned, it seems, at the cost of the same size earlier in the round (inferred from the
timing, not measured step by step). With the context each step started
at (tokens held), the samples are moved to the context of the step being planned before their median is
taken: ms + beta * frames * (context - sample's context), beta the cost of one frame's rows per context
token. beta is learned robustly from the samples themselves: for each size with CONTEXT_MIN_SAMPLES samples
spread over the context, the slope between the medians of its lower and its upper half by context (a spike
moves a median little, unlike a least-squares fit); beta is the median of those slopes, at least 0 (0, as
without the option, until a size has such samples).
"""
from __future__ import annotations

from collections import deque

from .metrics import percentile

GROWTH = 2            # untried step sizes: at most this multiple of the largest size measured
SAMPLES_KEPT = 64     # latest samples per size: the estimate is their median
CONTEXT_MIN_SAMPLES = 8       # a size's samples before its slope over the context is taken (follow_context)
CONTEXT_MIN_SPREAD = 1.25     # ... and its upper half's median context at least this multiple of the lower's


class CostTrack:
    """The cost of one kind of step (ms): the median of its latest samples, after a warm-up sample.

    Relaxed (a starved schedule, core/slack_scheduler.py), the estimate is the median times a factor, never
    below a low percentile of the samples: kept as that factor and percentile rather than as one figure, so that
    an estimate moved to another context (value_at) is relaxed by the same factor and floored by the samples
    moved there too. As one figure, taken from the samples as measured, it stood for every context: above the
    moved estimate early in a round (relaxing raised it), below any sample's cost late in one."""

    def __init__(self):
        self.samples: deque = deque(maxlen=SAMPLES_KEPT)
        self.contexts: deque = deque(maxlen=SAMPLES_KEPT)   # the context tokens of each sample (None: unknown)
        self.warmup_ms: float | None = None           # the first sample: not a measurement
        self._relax_factor = 1.0                      # until the next sample
        self._relax_floor = 0.0                       # the percentile of the samples it never goes below

    @property
    def value(self) -> float | None:
        """The cost to plan with (None before a sample past the warm-up)."""
        return self._relaxed(self.samples) if self.samples else None

    def observe(self, ms: float, context: int | None = None) -> None:
        if self.warmup_ms is None:
            self.warmup_ms = float(ms)
            return
        self.samples.append(float(ms))
        self.contexts.append(None if context is None else int(context))
        self._relax_factor = 1.0

    def value_at(self, context: int, ms_per_context: float) -> float | None:
        """The cost to plan with at `context` tokens held: each sample moved there by ms_per_context per token
        (samples of unknown context as they are), then their median (relaxed as `value` is); as `value` without
        a slope."""
        if not ms_per_context or not self.samples:
            return self.value
        return self._relaxed([ms if c is None else ms + ms_per_context * (context - c)
                              for ms, c in zip(self.samples, self.contexts)])

    def context_slope(self) -> float | None:
        """ms per context token between the medians of the lower and upper half of the samples by context
        (module docstring); None with too few samples of known context or too little spread."""
        known = sorted((c, ms) for ms, c in zip(self.samples, self.contexts) if c is not None)
        if len(known) < CONTEXT_MIN_SAMPLES:
            return None
        half = len(known) // 2
        low, high = known[:half], known[len(known) - half:]
        c_low, c_high = percentile([c for c, _ in low], 50), percentile([c for c, _ in high], 50)
        if not c_high > CONTEXT_MIN_SPREAD * max(c_low, 1.0):
            return None
        return (percentile([ms for _, ms in high], 50) - percentile([ms for _, ms in low], 50)) / (c_high - c_low)

    def relax(self, factor: float, floor_percentile: float) -> bool:
        """Lower the estimate by `factor`, never below that percentile of the samples (a cost really measured).
        True when it moved."""
        current = self.value
        if current is None:
            return False
        if percentile(self.samples, floor_percentile) >= current:
            return False
        self._relax_factor *= factor
        self._relax_floor = floor_percentile
        return True

    def _relaxed(self, samples) -> float:
        median = percentile(samples, 50)
        if self._relax_factor >= 1.0:
            return median
        return max(percentile(samples, self._relax_floor), median * self._relax_factor)


class StepCosts:
    """Measured cost per step size (frames per step) and estimates for the sizes not measured yet."""

    def __init__(self, follow_context: bool = False):
        self.by_frames: dict[int, CostTrack] = {}
        self.follow_context = bool(follow_context)
        self.ms_per_frame_context = 0.0     # beta of the module docstring (follow_context), updated by observe
        self._slopes: dict[int, float] = {}   # each size's slope per frame, where it has one

    def observe(self, frames: int, ms: float, context: int | None = None) -> None:
        """A step of `frames` frames took `ms`; `context`: the tokens the state held when it started (taken only
        with follow_context)."""
        if frames <= 0:
            raise ValueError(f"StepCosts.observe: a step of {frames} frames")
        track = self.by_frames.setdefault(int(frames), CostTrack())
        track.observe(ms, context if self.follow_context else None)
        if self.follow_context:
            slope = track.context_slope()             # only this size's samples changed
            if slope is None:
                self._slopes.pop(int(frames), None)
            else:
                self._slopes[int(frames)] = slope / frames
            if self._slopes:
                self.ms_per_frame_context = max(0.0, percentile(self._slopes.values(), 50))

    def measured(self, context: int | None = None) -> dict[int, float]:
        """{frames: ms} of every size measured so far (past its warm-up sample), at `context` tokens held (None,
        or without follow_context: the samples' own median)."""
        beta = self.ms_per_frame_context if context is not None else 0.0
        values = {k: (t.value if not beta else t.value_at(context, beta * k)) for k, t in sorted(self.by_frames.items())}
        return {k: v for k, v in values.items() if v is not None}

    @property
    def largest_measured(self) -> int:
        return max(self.measured(), default=0)

    def eligible(self, cap: int, measured: dict | None = None) -> int:
        """The largest step size that may be planned now: GROWTH x the largest measured one, at most `cap`
        (`measured`: measured() already taken; its sizes are the same at any context)."""
        largest = self.largest_measured if measured is None else max(measured, default=0)
        return min(cap, max(1, GROWTH * largest))

    def estimate(self, frames: int, context: int | None = None, measured: dict | None = None) -> float | None:
        """The cost (ms) to plan for a step of `frames` frames starting with `context` tokens held (see
        measured; `measured`: measured(context) already taken, for a caller that estimates many sizes at
        once); None with nothing measured."""
        m = self.measured(context) if measured is None else measured
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
