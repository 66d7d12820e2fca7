"""Cycle statistics: miss rate, fallback rate, latency percentiles, evictions, peak memory.

Which cycles count where:
  - every recorded cycle counts in `cycles` and in the rates;
  - `deadline_miss_rate` = cycles whose reason is `deadline_missed` / cycles;
  - `exact_action_share` = actions served on an exact state (no approximate
    eviction since the last reconciled swap: CycleResult.state_exact) / actions:
    how much of the time exact forgetting (ASR) kept up;
  - latency percentiles cover the cycles that ran the model to the end: the
    actions and the `deadline_missed` fallbacks (those computed an answer, just
    too late). Refused, no-frame, stale-frame, memory-ceiling and engine-error
    cycles did not run (or did not finish) a forward pass and would drag the
    percentiles down with near-zero times, so they are left out; so are the
    `deadline_missed` cycles given up between decode steps (CycleResult.given_up,
    counted in `given_up`): stopped at 30-38 ms where the whole cycle would have
    taken ~61, they made the slowest cycle look like a near miss.

Memory is the process's, read from /proc/self/status: VmHWM is the kernel's
peak resident set (what the process really touched at its worst), VmRSS the
current one. Where that file does not exist (not Linux) both read as None.

The all-time latency record is bounded so a node can run forever: up to
`max_latency_samples` values are kept exactly; past that, a uniform reservoir
sample of that size stands in for them (the max stays exact).

Thread safety: the cycle thread records while a diagnostics timer reads. A
short internal lock covers `record` and the copying of the state a summary
needs; the sorting for percentiles (tens of ms at a million samples) happens
on the copy, outside the lock, so a reader never stalls the control cycle.
"""
from __future__ import annotations

import array
import copy
import logging
import math
import random
import threading
from collections import Counter, deque
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .cycle_result import DEADLINE_MISSED, FALLBACK_REASONS, CycleResult

log = logging.getLogger(__name__)

PROC_STATUS = Path("/proc/self/status")
PERCENTILES = (50, 95, 99)


@dataclass(frozen=True)
class _Sample:
    """What the sliding window keeps of one cycle."""
    reason: str | None
    elapsed_ms: float
    ran_model: bool
    evictions: int
    overran: bool
    exact_action: bool            # an action served on an exact state
    given_up: bool = False        # deadline_missed between decode steps (not in the latency percentiles)


class CycleMetrics:
    def __init__(self, deadline_ms: float, window_cycles: int = 30, max_latency_samples: int = 1_000_000):
        if window_cycles <= 0 or max_latency_samples <= 0:
            raise ValueError(f"CycleMetrics: window_cycles ({window_cycles}) and max_latency_samples "
                             f"({max_latency_samples}) must be > 0")
        self.deadline_ms = float(deadline_ms)
        self.max_latency_samples = int(max_latency_samples)
        self._all = _Totals()
        self._latencies = array.array("d")          # exact up to max_latency_samples, then a reservoir
        self._latency_seen = 0
        self._latency_max = None
        self._reservoir_rng = random.Random(0)      # fixed seed: the same run gives the same summary
        self._window: deque = deque(maxlen=int(window_cycles))
        self._lock = threading.Lock()

    def record(self, result: CycleResult) -> None:
        if result.reason is not None and result.reason not in FALLBACK_REASONS:
            raise ValueError(f"CycleMetrics.record: unknown fallback reason {result.reason!r}; known: {FALLBACK_REASONS}")
        elapsed = float(result.elapsed_ms)
        if not math.isfinite(elapsed) or elapsed < 0:
            raise ValueError(f"CycleMetrics.record: cycle {result.cycle_id} has elapsed_ms {result.elapsed_ms!r}")
        sample = _Sample(reason=result.reason, elapsed_ms=elapsed,
                         ran_model=result.reason is None or (result.reason == DEADLINE_MISSED
                                                             and not getattr(result, "boundary_skipped", False)
                                                             and not getattr(result, "given_up", False)),
                         given_up=bool(getattr(result, "given_up", False)),
                         evictions=len(result.evicted_frame_ids), overran=bool(getattr(result, "overran", False)),
                         exact_action=result.reason is None and bool(getattr(result, "state_exact", True)))
        with self._lock:
            self._all.add(sample)
            self._window.append(sample)
            if sample.ran_model:
                self._add_latency(elapsed)

    def summary(self) -> dict:
        """All cycles so far (see the module docstring for which cycles each number covers)."""
        with self._lock:                                   # copies only: O(n) memcpy, no sort
            latencies = np.frombuffer(self._latencies, dtype=np.float64).copy()
            totals = copy.deepcopy(self._all)
            latency_max = self._latency_max
        latency = _latency_summary(latencies)
        if latency_max is not None:
            latency["max"] = latency_max
        return totals.as_dict(self.deadline_ms, latency)

    def window_summary(self) -> dict:
        """The same numbers over the last `window_cycles` cycles (the 1 Hz /diagnostics view)."""
        with self._lock:
            window = list(self._window)
        totals = _Totals()
        for s in window:
            totals.add(s)
        latency = _latency_summary([s.elapsed_ms for s in window if s.ran_model])
        return totals.as_dict(self.deadline_ms, latency)

    def _add_latency(self, value: float) -> None:
        self._latency_seen += 1
        self._latency_max = value if self._latency_max is None else max(self._latency_max, value)
        if len(self._latencies) < self.max_latency_samples:
            self._latencies.append(value)
            return
        # Reservoir sampling (algorithm R): every value seen so far is kept with equal probability.
        j = self._reservoir_rng.randrange(self._latency_seen)
        if j < self.max_latency_samples:
            self._latencies[j] = value


class _Totals:
    def __init__(self):
        self.cycles = 0
        self.actions = 0
        self.model_cycles = 0
        self.evictions = 0
        self.overruns = 0
        self.exact_actions = 0
        self.given_up = 0
        self.reasons: Counter = Counter()

    def add(self, s: _Sample) -> None:
        self.cycles += 1
        self.actions += s.reason is None
        self.model_cycles += s.ran_model
        self.evictions += s.evictions
        self.overruns += s.overran
        self.exact_actions += s.exact_action
        self.given_up += s.given_up
        if s.reason is not None:
            self.reasons[s.reason] += 1

    def as_dict(self, deadline_ms: float, latency: dict) -> dict:
        fallbacks = self.cycles - self.actions
        n = self.cycles
        memory = read_memory_bytes()

        def rate(count: int) -> float:
            return count / n if n else 0.0

        return {
            "deadline_ms": deadline_ms,
            "cycles": n,
            "actions": self.actions,
            "fallbacks": fallbacks,
            "fallback_reasons": {reason: self.reasons.get(reason, 0) for reason in FALLBACK_REASONS},
            "fallback_rate": rate(fallbacks),
            "deadline_miss_rate": rate(self.reasons.get(DEADLINE_MISSED, 0)),
            "overrun_rate": rate(self.overruns),          # finished late, including deterministic-mode actions
            "model_cycles": self.model_cycles,            # cycles in the latency percentiles
            "given_up": self.given_up,                    # deadline_missed between decode steps (not in them)
            "latency_ms": latency,
            "evictions": self.evictions,
            "exact_actions": self.exact_actions,          # actions served on an exact state
            "exact_action_share": self.exact_actions / self.actions if self.actions else None,
            "peak_rss_bytes": memory["VmHWM"],
            "rss_bytes": memory["VmRSS"],
        }


# ----------------------------------------------------------------------------
# Helpers


def percentile(values, q: float) -> float:
    """q-th percentile (0..100) with linear interpolation between closest ranks.

    Sorted values v[0..n-1]; rank r = q/100 * (n-1); result = v[floor r] +
    (v[ceil r] - v[floor r]) * (r - floor r). This is numpy.percentile's
    default ("linear") method, written out so the definition is explicit.
    """
    ordered = sorted(float(v) for v in values)
    if not ordered:
        raise ValueError("percentile: no values")
    return _percentile_of_sorted(ordered, q)


def _percentile_of_sorted(ordered, q: float) -> float:
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile: q must be in [0, 100], got {q}")
    rank = q / 100.0 * (len(ordered) - 1)
    lo = math.floor(rank)
    hi = min(lo + 1, len(ordered) - 1)
    return float(ordered[lo] + (ordered[hi] - ordered[lo]) * (rank - lo))


def read_vm_hwm_bytes() -> int | None:
    """Peak resident set size of this process (VmHWM), or None where /proc is absent."""
    return read_memory_bytes()["VmHWM"]


def read_vm_rss_bytes() -> int | None:
    """Current resident set size of this process (VmRSS), or None where /proc is absent."""
    return read_memory_bytes()["VmRSS"]


def read_memory_bytes(status: Path = PROC_STATUS, keys: tuple = ("VmHWM", "VmRSS")) -> dict:
    """{key: bytes} of these kB lines from one read of a process's status file (this process's by default: VmHWM
    and VmRSS, so VmHWM >= VmRSS holds); all None where the file cannot be read (no /proc, a process gone)."""
    try:
        text = status.read_text()
    except OSError:
        return dict.fromkeys(keys)
    found = dict.fromkeys(keys)
    for line in text.splitlines():
        # Layout: "VmHWM:\t  123456 kB"
        name, _, rest = line.partition(":")
        if name in found:
            number, unit = rest.split()
            if unit != "kB":
                raise ValueError(f"{status}: unexpected unit {unit!r} for {name}")
            found[name] = int(number) * 1024
    for key in keys:
        if found[key] is None:
            log.warning("%s has no %s line", status, key)
    return found


def _latency_summary(values) -> dict:
    if len(values) == 0:
        return {"p50": None, "p95": None, "p99": None, "max": None}
    ordered = np.sort(np.asarray(values, dtype=np.float64))      # one sort for all percentiles
    out = {f"p{q}": _percentile_of_sorted(ordered, q) for q in PERCENTILES}
    out["max"] = float(ordered[-1])
    return out
