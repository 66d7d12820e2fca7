"""Logging for a failure that may repeat every cycle: one traceback per kind, then a periodic count.

A cycle that fails becomes an `engine_error` fallback (the robot gets an
explained answer every cycle), but the cause is often persistent: a device
fault, a corrupted arena. Logging a full traceback 30 times a second would
bury everything else in the log, so each kind of failure (exception type and
message) gets its traceback once, and repeats are summarised with a count at
most every `period_s`.
"""
from __future__ import annotations

import logging
import time

MAX_KINDS = 64          # distinct failure kinds remembered; past that the memory starts over


class FailureLog:
    def __init__(self, logger: logging.Logger, period_s: float):
        self.log = logger
        self.period_s = float(period_s)
        self._seen: set = set()
        self._repeats = 0
        self._last_report = -float("inf")

    def report(self, what: str, exc: BaseException) -> None:
        """Call from inside the `except` block that caught `exc` (the traceback is taken from there)."""
        kind = (type(exc).__name__, str(exc)[:200])
        now = time.monotonic()
        if kind not in self._seen:
            if len(self._seen) >= MAX_KINDS:
                self._seen.clear()
            self._seen.add(kind)
            self.log.exception("%s failed", what)
            self._last_report = now
            return
        self._repeats += 1
        if now - self._last_report >= self.period_s:
            self.log.error("%s failed: %s: %s (%d repeated failures since the last report; traceback logged once)",
                           what, kind[0], kind[1], self._repeats)
            self._repeats = 0
            self._last_report = now
