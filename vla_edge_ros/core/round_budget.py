"""How many frames a reconciliation round can rebuild and still finish, from measured rates.

A round rebuilds n kept frames while the primary keeps admitting frames (a per second); the
reconciler computes b frames per second in the slack it gets. Everything that arrives during the
round must be computed too, so the round catches up after T = n / (b - a) seconds and then holds

    n + a T = n b / (b - a)    frames,

and then keeps growing by a L until the primary applies its offer, L seconds after it was made
(handed out, loaded, a boundary with room). All of it must fit the reconciler's frame capacity C, or
the round is aborted (no_longer_fits) and its work thrown away. Hence the largest round that finishes:

    n <= (margin x C - a x L) x (1 - a / b)

margin (asr.round_fit_margin) leaves room for the rates moving; L is the slowest of the newest
APPLY_WINDOW rounds' offer-to-swap times. On the H200 (2026-12-03, semantic mode, rebuild_fill
0.75, C = 125, a = 30 frames/s) 128 of 153 rounds were aborted with no bound; with the bound
without L, 16 of 117 (warm-up measured b ~ 258 frames/s, rounds cut to 88 frames: caught up at
~100, leaving 25 frames, 0.8 s, for an apply whose trigger-to-swap time reached 1.4 s); with L, 88
of 92 (the newest bound 80 frames, L 238 ms).

Until a round has been measured there is no bound (the mode's own rule decides alone), and a
rebuild rate at or below the arrival rate bounds the round to one frame: no size can catch up then,
and the smallest round wastes the least work.
"""
from __future__ import annotations

import math
from collections import deque

ARRIVAL_WINDOW = 64      # the newest arrival times the arrival rate is measured over (~2 s at 30 Hz)
APPLY_WINDOW = 8         # the newest applied rounds whose offer-to-swap time bounds L (their slowest)
REBUILD_WINDOW = 4       # the newest measured rounds whose frames and seconds, pooled, give the rebuild rate b


class RoundBudget:
    """Measured arrival and rebuild rates, and the largest round they let finish (`frame_limit`)."""

    def __init__(self, margin: float):
        if not 0.0 < margin <= 1.0:
            raise ValueError(f"round budget margin must be in (0, 1], got {margin}")
        self.margin = margin
        self._arrivals: deque = deque(maxlen=ARRIVAL_WINDOW)
        self._rebuilds: deque = deque(maxlen=REBUILD_WINDOW)      # (frames, seconds) of the newest rounds
        self._apply_s: deque = deque(maxlen=APPLY_WINDOW)

    def frame_arrived(self, now_s: float) -> None:
        """The primary admitted a frame (seen by this side at now_s)."""
        self._arrivals.append(now_s)

    def round_measured(self, frames: int, seconds: float) -> None:
        """A round computed `frames` in `seconds` from its trigger while it had a backlog (its warm-up, or all of it
        when it ended before warm-up did). The rate is pooled over the newest REBUILD_WINDOW rounds (their frames
        over their seconds), so that it follows the slack as it moves but one tiny round does not set it alone: on
        the H200 with the 7B shape at 15 Hz the newest rate read "1198 frames/s" (most likely a round bounded to
        one frame that its first step of up to 5 frames finished at once), with the slack rebuilding a few frames
        a second: such a rate sizes the next round far past what can catch up."""
        if frames > 0 and seconds > 0.0:
            self._rebuilds.append((frames, seconds))

    @property
    def rebuild_frames_per_s(self) -> float | None:
        """b: the newest REBUILD_WINDOW measured rounds' frames over their seconds (None before the first)."""
        if not self._rebuilds:
            return None
        return sum(f for f, _ in self._rebuilds) / sum(t for _, t in self._rebuilds)

    def round_applied(self, offer_to_swap_s: float) -> None:
        """The primary applied a round's offer this long after the round first offered."""
        self._apply_s.append(max(0.0, offer_to_swap_s))

    @property
    def offer_to_swap_s(self) -> float:
        """L: the slowest recent offer-to-swap time (0 before any round was applied)."""
        return max(self._apply_s, default=0.0)

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
        room = self.margin * frame_capacity - a * self.offer_to_swap_s
        return max(1, math.floor(room * (1.0 - a / b) + 1e-9))
