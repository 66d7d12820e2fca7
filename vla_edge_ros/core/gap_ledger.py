"""What the reconciler did with each gap between the primary's cycles (the slack schedule's own account).

Why it exists: in the H200 graph the slack schedule kept every deadline but a
round rarely finished (issue 20: 851 steps in 2272 gaps of a 75 s demo, most
of one frame, where a ~12 ms gap holds a 4-6 frame step). The step costs
alone could not say why. This ledger keeps, per gap of the primary:

    seen         the worker read the gap's window (cycle_clock's sequence number of that cycle end)
    missed       a cycle end the worker never read while a round had work (the sequence number jumped)
    idle         no round work when the worker looked (no round, or the round waits for its swap)
    stepped      at least one step ran in it
    nothing_fit  a round had frames to compute and no step fitted what was left of the gap
    step_empty   a step fitted but computed nothing (its round was aborted: the frames outgrew the arena)
    late_ms      how far into the gap the worker was when it first read it (the gap's start is the
                 primary's cycle end): time the step cannot use
    used_share   the gap's share spent in steps
    frames       frames computed in it; also over the gaps that began with a backlog (>= BACKLOG_FRAMES to
                 compute), where only the gap's length limits the step: a small figure there is the schedule's,
                 a small figure overall may just be a round that has caught up

and the inbox drains (receive(): every mirrored frame's vision encoding on the host), which run on the same
thread and so delay the next read of a window. Summaries are over the latest LEDGER_GAPS gaps.
"""
from __future__ import annotations

from collections import Counter, deque

from .metrics import percentile

LEDGER_GAPS = 1024        # latest gaps (and drains) whose figures are summarised
BACKLOG_FRAMES = 4        # a gap starting with at least this many frames to compute: limited by its length alone
SEQ_PER_CYCLE = 2         # cycle_clock's seqlock: one cycle end advances the sequence number by 2
SUMMARY_PREFIXES = ("gaps_", "gap_", "drain_ms_")    # every key summary() writes starts with one of these


class GapLedger:
    def __init__(self):
        self.counts: Counter = Counter()
        self._last_seq: int | None = None
        self._late: deque = deque(maxlen=LEDGER_GAPS)      # ms into the gap at the first read
        self._gap: deque = deque(maxlen=LEDGER_GAPS)       # the whole gap (ms)
        self._used: deque = deque(maxlen=LEDGER_GAPS)      # share of the gap in steps (gaps with round work)
        self._frames: deque = deque(maxlen=LEDGER_GAPS)    # frames computed (gaps with round work)
        self._backlogged: deque = deque(maxlen=LEDGER_GAPS)  # frames computed in gaps that began with a backlog
        self._drain: deque = deque(maxlen=LEDGER_GAPS)     # ms per inbox drain that handled at least one item

    def seen(self, seq: int, gap_ms: float, left_ms: float, busy: bool) -> bool:
        """A window read; True when it is a new gap (its cycle end not read before). busy: the round has work,
        so gaps skipped since the last read count as missed."""
        if seq == self._last_seq:
            return False
        if self._last_seq is not None and busy and seq > self._last_seq:
            self.counts["missed"] += max(0, (seq - self._last_seq) // SEQ_PER_CYCLE - 1)
        self._last_seq = seq
        self.counts["seen"] += 1
        if not busy:
            self.counts["idle"] += 1
            return True
        self._gap.append(gap_ms)
        self._late.append(max(0.0, gap_ms - left_ms))
        return True

    def used(self, gap_ms: float, step_ms: float, frames: int, fitted: bool, backlog: int = 0) -> None:
        """The end of a gap with round work: step_ms spent in steps, frames computed; fitted: a step fitted;
        backlog: frames the round had to compute when the gap began."""
        self.counts["stepped" if frames else ("step_empty" if fitted else "nothing_fit")] += 1
        self._used.append(step_ms / gap_ms if gap_ms > 0 else 0.0)
        self._frames.append(frames)
        if backlog >= BACKLOG_FRAMES:
            self._backlogged.append(frames)

    def drained(self, ms: float) -> None:
        self._drain.append(ms)

    def summary(self) -> dict:
        """Flat numbers for /diagnostics ("" where nothing was recorded)."""
        def pct(values, q):
            return round(percentile(values, q), 3) if values else ""
        counts = {f"gaps_{k}": self.counts[k] for k in ("seen", "missed", "idle", "stepped", "nothing_fit",
                                                         "step_empty")}
        return {**counts, "gap_ms_p50": pct(self._gap, 50),
                "gap_late_ms_p50": pct(self._late, 50), "gap_late_ms_p90": pct(self._late, 90),
                "gap_used_share_p50": pct(self._used, 50),
                "gap_frames_mean": _mean(self._frames), "gap_frames_backlogged_mean": _mean(self._backlogged),
                "drain_ms_p50": pct(self._drain, 50), "drain_ms_max": round(max(self._drain), 3) if self._drain else ""}

def _mean(values) -> float | str:
    values = list(values)
    return round(sum(values) / len(values), 3) if values else ""
