"""Which part of the work at one boundary ran past the next boundary, for a boundary no cycle ran for.

The cycle thread does three things per period: the cycle itself (boundary to
result), publishing its answer, and the work between cycles (a new
instruction, applying a reconciled state). A skipped boundary is answered with
a deadline_missed fallback (Engine.skipped_boundary); saying which of the
three straddled it tells an engineer what to fix: a cycle admission let
through that then ran long, a slow publish, or a swap apply bigger than the
slack it was given. "other" is time outside all three (a garbage-collection
pause or the thread not being scheduled between the end of the work and the
next wait).
"""
from __future__ import annotations

from dataclasses import dataclass

OVERRUN_PARTS = ("cycle", "publish", "between", "other")


@dataclass(frozen=True)
class BoundaryWork:
    """When (time.perf_counter seconds) each part of the work at one boundary ended."""
    cycle_end_s: float
    publish_end_s: float
    between_end_s: float


def overran_in(work: BoundaryWork | None, missed_at_s: float) -> str:
    """The part of `work` still running at `missed_at_s`; "other" when all had ended (or nothing ran)."""
    if work is None:
        return "other"
    for part, end in zip(OVERRUN_PARTS, (work.cycle_end_s, work.publish_end_s, work.between_end_s)):
        if end > missed_at_s:
            return part
    return "other"
