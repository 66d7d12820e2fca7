"""How many frames a reconciliation round can rebuild and still finish, from measured rates.

A round rebuilds n kept frames while the primary keeps admitting frames (a per second); the
reconciler computes b frames per second in the slack it gets. Everything that arrives during the
round must be computed too, so the round catches up after T = n / (b - a) seconds and then holds

    n + a T = n b / (b - a)    frames,

which must fit the reconciler's frame capacity C, or the round is aborted (no_longer_fits) and its
work thrown away. Hence the largest round that finishes:

    n <= margin x C x (1 - a / b)

margin (asr.round_fit_margin) leaves room for the frames that arrive between the round's offer and
the primary's swap, and for the rates moving. Measured on the H200 (2026-12-03, semantic mode,
rebuild_fill 0.75): b ~ 112 frames/s (3.74 frames per gap, 30 gaps/s), a = 30 frames/s, C = 125:
94 kept frames needed 34 cycles and outgrew 125, and 128 of 153 rounds were aborted; the bound
gives 73 at margin 0.8.

Until a round has been measured there is no bound (the mode's own rule decides alone), and a
rebuild rate at or below the arrival rate bounds the round to one frame: no size can catch up then,
and the smallest round wastes the least work.
"""
from __future__ import annotations

import math
from collections import deque

ARRIVAL_WINDOW = 64      # the newest arrival times the arrival rate is measured over (~2 s at 30 Hz)


class RoundBudget:
    """Measured arrival and rebuild rates, and the largest round they let finish (`frame_limit`)."""

    def __init__(self, margin: float):
        if not 0.0 < margin <= 1.0:
            raise ValueError(f"round budget margin must be in (0, 1], got {margin}")
        self.margin = margin
        self._arrivals: deque = deque(maxlen=ARRIVAL_WINDOW)
        self.rebuild_frames_per_s: float | None = None

    def frame_arrived(self, now_s: float) -> None:
        """The primary admitted a frame (seen by this side at now_s)."""
        self._arrivals.append(now_s)

    def round_measured(self, frames: int, seconds: float) -> None:
        """A round computed `frames` in `seconds` from its trigger while it had a backlog (its warm-up, or all of it
        when it ended before warm-up did): the newest measurement replaces the older one, as the slack moves."""
        if frames > 0 and seconds > 0.0:
            self.rebuild_frames_per_s = frames / seconds

    @property
    def arrival_frames_per_s(self) -> float | None:
        """Arrivals per second over the window (None until two arrivals at distinct times)."""
        if len(self._arrivals) < 2:
            return None
        span = self._arrivals[-1] - self._arrivals[0]
        return (len(self._arrivals) - 1) / span if span > 0.0 else None

    def frame_limit(self, frame_capacity: int) -> int | None:
        """The most frames a round may keep so that it catches up inside frame_capacity; None: not measured yet."""
        a, b = self.arrival_frames_per_s, self.rebuild_frames_per_s
        if a is None or b is None:
            return None
        if b <= a:
            return 1
        # (the epsilon: a rate measured as 29.999... frames/s must not cost a whole frame of the bound)
        return max(1, math.floor(self.margin * frame_capacity * (1.0 - a / b) + 1e-9))
