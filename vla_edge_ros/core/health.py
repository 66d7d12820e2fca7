"""What the /diagnostics level of each node means, as plain rules (no ROS).

A robot operator reads OK / WARN / ERROR, not the numbers behind them, so each
level must say whether the policy is doing its job:

    reasoning      ERROR  no action published for health.no_action_error_s while active
                   WARN   fallback rate over the last health.window_s above
                          health.max_fallback_rate
                   WARN   reconciler lost: a reconciler that once answered the swap
                          request has not answered for health.reconciler_silence_s, or a
                          request timed out within the last window (the node keeps serving
                          with its own eviction; the level says that it does)
                   WARN   deadline misses in the last window
    camera_ingest  WARN   no image arrived for cycle.stale_frame_ms (the cycles can only
                          answer stale_frame / no_frame)
                   WARN   images rejected within the last window
    reconciler     ERROR  its worker failed (no further offers)

The nodes feed events in (`on_cycle`, `on_image`, ...) from whatever thread
sees them and call `assess(now_s)` from their 1 Hz diagnostics timer. Times
are seconds on one monotonic clock chosen by the caller. Levels use the
numbers of diagnostic_msgs/DiagnosticStatus (OK 0, WARN 1, ERROR 2).

`Health.codes` names the problems, so a node logs a change of its state once
(`HealthLog`) instead of the level every second.
"""
from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass

OK = 0
WARN = 1
ERROR = 2
LEVEL_NAMES = {OK: "OK", WARN: "WARN", ERROR: "ERROR"}


@dataclass(frozen=True)
class Problem:
    code: str          # stable name, e.g. "no_action"
    level: int         # WARN or ERROR
    text: str          # for the operator, with the numbers


@dataclass(frozen=True)
class Health:
    problems: tuple = ()

    @property
    def level(self) -> int:
        return max((p.level for p in self.problems), default=OK)

    @property
    def message(self) -> str:
        """The problems worst first, or 'ok'."""
        ordered = sorted(self.problems, key=lambda p: -p.level)
        return "; ".join(p.text for p in ordered) if ordered else "ok"

    @property
    def codes(self) -> frozenset:
        return frozenset(p.code for p in self.problems)


class _Window:
    """Event times (with a flag) of the last `window_s`; thread-safe."""

    def __init__(self, window_s: float):
        self.window_s = window_s
        self._events: deque = deque()       # (t_s, flag)
        self._lock = threading.Lock()

    def add(self, t_s: float, flag: bool = True) -> None:
        with self._lock:
            self._events.append((t_s, flag))
            self._prune(t_s)

    def counts(self, now_s: float) -> tuple:
        """(events, events with the flag set) within the window ending at now_s."""
        with self._lock:
            self._prune(now_s)
            return len(self._events), sum(flag for _, flag in self._events)

    def _prune(self, now_s: float) -> None:
        while self._events and self._events[0][0] <= now_s - self.window_s:
            self._events.popleft()


# ----------------------------------------------------------------------------
# reasoning


class ReasoningHealth:
    """Cycles, deadline misses and the reconciler link of the reasoning node."""

    def __init__(self, health_cfg, start_s: float, active: bool = True):
        self.cfg = health_cfg
        self._cycles = _Window(health_cfg.window_s)        # flag: fallback
        self._misses = _Window(health_cfg.window_s)
        self._timeouts = _Window(health_cfg.window_s)
        self._active_since = start_s if active else None
        self._last_action_s: float | None = None
        self._last_answer_s: float | None = None            # swap answers: the reconciler's heartbeat
        self._timeouts_seen = 0

    def set_active(self, active: bool, now_s: float) -> None:
        """Lifecycle: the no-action rule only holds while the node is meant to produce actions."""
        self._active_since = now_s if active else None

    def on_cycle(self, is_action: bool, deadline_missed: bool, now_s: float) -> None:
        self._cycles.add(now_s, not is_action)
        if deadline_missed:
            self._misses.add(now_s)
        if is_action:
            self._last_action_s = now_s

    def on_swap_answer(self, now_s: float) -> None:
        self._last_answer_s = now_s

    def on_swap_timeouts(self, total: int, now_s: float) -> None:
        """The swap client's running count of abandoned requests."""
        if total > self._timeouts_seen:
            self._timeouts.add(now_s)
        self._timeouts_seen = total

    def assess(self, now_s: float) -> Health:
        cfg = self.cfg
        problems = []
        if self._active_since is not None:
            since = max(self._active_since, self._last_action_s or -float("inf"))
            if now_s - since >= cfg.no_action_error_s:
                what = "ever" if self._last_action_s is None else f"for {now_s - since:.1f} s"
                problems.append(Problem("no_action", ERROR, f"no action published {what}"))
        cycles, fallbacks = self._cycles.counts(now_s)
        if cycles and fallbacks / cycles > cfg.max_fallback_rate:
            problems.append(Problem("fallback_rate", WARN, f"fallback rate {fallbacks / cycles:.2f} over the last "
                                    f"{cfg.window_s:g} s (bound {cfg.max_fallback_rate:g})"))
        misses, _ = self._misses.counts(now_s)
        if misses:
            problems.append(Problem("deadline_missed", WARN, f"{misses} deadline misses in the last {cfg.window_s:g} s"))
        lost = self.reconciler_lost(now_s)
        if lost:
            problems.append(Problem("reconciler_lost", WARN, f"reconciler lost ({lost}): serving with own eviction"))
        return Health(tuple(problems))

    def reconciler_lost(self, now_s: float) -> str:
        """Why the reconciler counts as lost, or '' (also '' when none was ever there)."""
        timeouts, _ = self._timeouts.counts(now_s)
        if timeouts:
            return "swap request timed out"
        if self._last_answer_s is not None and now_s - self._last_answer_s >= self.cfg.reconciler_silence_s:
            return f"no swap answer for {now_s - self._last_answer_s:.1f} s"
        return ""


# ----------------------------------------------------------------------------
# camera_ingest


class CameraHealth:
    """Images in: arrival of good ones, rejections."""

    def __init__(self, health_cfg, stale_frame_ms: float, start_s: float):
        self.cfg = health_cfg
        self.stale_s = stale_frame_ms / 1000.0
        self._since = start_s                   # no image yet: silent since the node started
        self._last_image_s: float | None = None
        self._rejected = _Window(health_cfg.window_s)

    def on_image(self, now_s: float) -> None:
        self._last_image_s = now_s

    def on_rejected(self, now_s: float) -> None:
        self._rejected.add(now_s)

    def assess(self, now_s: float) -> Health:
        problems = []
        last = self._last_image_s if self._last_image_s is not None else self._since
        if now_s - last > self.stale_s:
            what = "since start" if self._last_image_s is None else f"for {(now_s - last) * 1000.0:.0f} ms"
            problems.append(Problem("no_image", WARN, f"no image {what} (cycle.stale_frame_ms "
                                    f"{self.stale_s * 1000.0:g})"))
        rejected, _ = self._rejected.counts(now_s)
        if rejected:
            problems.append(Problem("rejected", WARN, f"{rejected} images rejected in the last {self.cfg.window_s:g} s"))
        return Health(tuple(problems))


# ----------------------------------------------------------------------------
# reconciler


def reconciler_health(worker_error: str) -> Health:
    """The reconciler publishes diagnostics only while active; its one failure is a dead worker."""
    if worker_error:
        return Health((Problem("worker_failed", ERROR, f"worker failed, no further offers: {worker_error}"),))
    return Health()


# ----------------------------------------------------------------------------
# Logging a change once


class HealthLog:
    """Remembers the last problem codes; `change(health)` returns the line to log when they changed, else None."""

    def __init__(self):
        self._codes: frozenset = frozenset()

    def change(self, health: Health) -> tuple | None:
        """(level, text) to log, or None when the set of problems is the same as last time."""
        if health.codes == self._codes:
            return None
        gone = sorted(self._codes - health.codes)
        self._codes = health.codes
        if health.level == OK:
            return OK, f"healthy again (cleared: {', '.join(gone)})"
        return health.level, f"{LEVEL_NAMES[health.level]}: {health.message}"
