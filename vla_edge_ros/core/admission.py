"""Deadline-aware admission: refuse a cycle before starting it when it would not finish in time.

The cost of a cycle is predicted from the engine's own measurements, kept as
two separate exponential moving averages because prefill (one parallel pass
over many tokens) and decode (one forward per token) cost differently:

    mean_ms     = ema_prefill_ms_per_token * prefill_tokens + ema_decode_ms_per_token * decode_tokens
                  + ema_other_ms
    estimate_ms = mean_ms * tail_factor
    budget_ms   = deadline_ms - elapsed_ms - safety_margin_ms
    admit       = estimate_ms <= budget_ms

`ema_other_ms` is the rest of an admitted cycle's time (vision encoder, KV
slot bookkeeping): a fixed cost per cycle, not per token.

The tail, not only the mean. A cycle admitted on its mean cost finishes late
about half the times its budget is tight. So every learned cycle's ratio
actual / predicted is kept for the last `admission.tail_window` cycles, and
the estimate is the mean times the `admission.tail_quantile` of those ratios
(never below 1): the cycle is admitted only if it would finish in time even
when it runs as slow as the slow end of what the recent cycles did, whatever
made them slow (other processes on the cores, the reconciler, the publisher,
a longer context). Spikes (below) are kept out of the tail as they are kept
out of the mean, so the factor stays between 1 and spike_factor.

The first cycle is admitted unconditionally (nothing measured yet to distrust);
its measurement seeds both averages.

Spikes are not learned. A cycle that cost more than `admission.spike_factor`
times its estimate was slowed by something else (measured on the H200: the
reconciler's rebuild made three cycles in a row take ~50 ms instead of ~24,
and the inflated estimate then refused for half a second after each of its
11 rebuilds in 30 s). Such a cycle is still reported (late if it was), but it
does not move the estimate, unless `admission.spikes_to_adopt` of them come in
a row: then the cost has really changed, and the cycle that proves it seeds the
averages (as a probe does) instead of moving them by ema_alpha. Nudged, the
mean climbed toward the new cost over ~10 cycles and each of them went into the
tail as a ratio of 1.3-1.7: the lag of the average, not the spread of the
cycles (`bench asr --capacity 32768` on the H200, 2026-12-04: a warm start at
766 frames met an estimate seeded at 15.8 ms by the warm-up's short state,
cycles cost 26.6 ms, and the tail learned 1.58 and refused 170 of the next 200
cycles).

The tail is of recent cycles in time, not of the last learned ones. Refused
cycles learn nothing, so a tail counted in learned cycles stayed as it was
while admission refused (only a probe per probe_after_refusals added a ratio):
in the run above, ~190 cycles. Each ratio is dropped `admission.tail_window`
decisions after it was learned, whatever came between; a tail left with fewer
than TAIL_MIN_SAMPLES ratios is 1 (the mean alone) until cycles refill it.

Refused cycles measure nothing, so an estimate inflated by one slow spell
(another process on the core, a page fault storm) would refuse forever. After
`admission.probe_after_refusals` refusals in a row one cycle is admitted as a
probe to re-measure; if it is late, the engine reports it as deadline_missed,
so the cost of recovering is one explained fallback, not silence. A probe's
measurement replaces the averages (as the first cycle's seeds them) instead of
moving them by ema_alpha: it is the only fresh cost while admission refuses, and
nudged 20% at a time, one probe per 16 cycles, an estimate twice the real cost
took eight probes (128 cycles) to come within 20% of it.

The context. A cycle attends to every token the state holds, so its cost grows
with the state (1.5B shape on the H200: 16 ms with 2K tokens held, 31 ms with
32K), and a swap or re-base that shrinks the state makes the estimate, learned
on the larger one, too high. A cycle refused with the state at most
(1 - admission.probe_on_context_shrink) of the tokens the estimate was last
learned with is admitted as a probe at once, one per shrink: fewer tokens cannot
cost more to attend to. `cycle.deterministic` is applied by the
caller, so a decision always reports the honest estimate and budget.

A swap that grows the state is the other way round, and worse: the estimate,
learned on the smaller state, is too low, and the first cycle over the larger
one is admitted and runs late (`bench asr --capacity 32768` on the H200,
2026-12-05: a swap took the primary from 90 frames to 729, the next cycle was
admitted on 15.3 ms and took 37.4). With a cost per context token
(set_context_cost: the capacity check's slope between its nearly empty and its
full state, admission.context_cost), the estimate is

    mean_ms     = (the sum above) + context_ms_per_token * (context_tokens - ema_context_tokens)

where ema_context_tokens is the context of the cycles the averages were learned
on, averaged with the same ema_alpha: the averages hold the cost at that
context, and the term moves it to this cycle's (down as well as up; never
below zero). Without a slope (0, the default) the estimate is the sum alone.
"""
from __future__ import annotations

import math
import numbers
from collections import deque
from dataclasses import dataclass

from ..config import AdmissionConfig, CycleConfig
from .sample_window import SampleWindow

@dataclass(frozen=True)
class AdmissionDecision:
    admit: bool
    estimate_ms: float      # predicted cost of the cycle (0 before the first sample)
    budget_ms: float        # time left for it: deadline - elapsed - margin
    probe: bool = False     # admitted only to re-measure after a run of refusals


class AdmissionController:
    def __init__(self, cycle_cfg: CycleConfig, admission_cfg: AdmissionConfig):
        self.deadline_ms = cycle_cfg.deadline_ms
        self.safety_margin_ms = cycle_cfg.safety_margin_ms
        self.alpha = admission_cfg.ema_alpha
        self.probe_after = admission_cfg.probe_after_refusals
        self.spike_factor = admission_cfg.spike_factor
        self.spikes_to_adopt = admission_cfg.spikes_to_adopt
        self.probe_on_shrink = admission_cfg.probe_on_context_shrink
        self.refusals_in_a_row = 0
        self.spikes_in_a_row = 0
        self.shrink_probes = 0          # probes admitted because the context shrank (see the module docstring)
        self._learned_context: int | None = None    # context tokens of the last learned cycle (or shrink probe)
        self.spikes = 0                 # cycles not learned from (too slow to be the engine's own cost)
        self.adoptions = 0              # runs of spikes_to_adopt spikes taken as the new cost (seeded from)
        self.ema_prefill_ms_per_token = 0.0
        self.ema_decode_ms_per_token = 0.0
        self.ema_other_ms = 0.0
        self.context_ms_per_token = 0.0     # set_context_cost; 0: the estimate does not follow the context
        self.ema_context_tokens: float | None = None   # the context the averages were learned at (None: unknown)
        self.has_sample = False
        self.tail_quantile = admission_cfg.tail_quantile
        # actual / predicted of recent learned cycles, kept sorted too: the tail is taken as each cycle ends,
        # before its action is published (core/sample_window.py)
        self._ratios = SampleWindow(admission_cfg.tail_window)
        self._ratio_decided_at: deque[int] = deque()   # self.decisions when each ratio in _ratios was learned
        self.decisions = 0
        self._tail = 1.0

    def set_context_cost(self, ms_per_token: float) -> None:
        """The cost of one more context token to a cycle (ms; the module docstring): from now on every estimate
        follows the context it is asked about. 0 turns that off."""
        _check_finite_non_negative("context ms per token", ms_per_token)
        self.context_ms_per_token = float(ms_per_token)

    def mean_ms(self, prefill_tokens: int, decode_tokens: int, context_tokens: int | None = None) -> float:
        """The mean predicted cost of a cycle of these tokens, over `context_tokens` held (None: at the context
        the averages were learned at)."""
        mean = (self.ema_prefill_ms_per_token * prefill_tokens + self.ema_decode_ms_per_token * decode_tokens
                + self.ema_other_ms)
        if context_tokens is None or self.ema_context_tokens is None or not self.context_ms_per_token:
            return mean
        return max(0.0, mean + self.context_ms_per_token * (context_tokens - self.ema_context_tokens))

    @property
    def tail_factor(self) -> float:
        """The tail_quantile of the recent actual / predicted ratios, at least 1 (1 until TAIL_MIN_SAMPLES).
        Computed when a ratio comes in, not per decision: a decision is on every cycle's critical path."""
        return self._tail

    def _update_tail(self) -> None:
        tail = self._ratios.tail(self.tail_quantile) if self.tail_quantile else None
        self._tail = 1.0 if tail is None else max(1.0, tail)

    def decide(self, elapsed_ms: float, prefill_tokens: int, decode_tokens: int,
               context_tokens: int | None = None) -> AdmissionDecision:
        """Admit or refuse a cycle that has already spent `elapsed_ms` and would run these tokens; context_tokens:
        the tokens its state holds (None: unknown, no probe on a shrink)."""
        _check_finite_non_negative("elapsed_ms", elapsed_ms)
        _check_token_count("prefill_tokens", prefill_tokens)
        _check_token_count("decode_tokens", decode_tokens)
        if context_tokens is not None:
            _check_token_count("context_tokens", context_tokens)
        budget = self.deadline_ms - elapsed_ms - self.safety_margin_ms
        self.decisions += 1
        self._expire_ratios()
        if not self.has_sample:
            return AdmissionDecision(admit=True, estimate_ms=0.0, budget_ms=budget)
        estimate = self.mean_ms(prefill_tokens, decode_tokens, context_tokens) * self.tail_factor
        if estimate <= budget:
            self.refusals_in_a_row = 0
            return AdmissionDecision(admit=True, estimate_ms=estimate, budget_ms=budget)
        if self._context_shrank(context_tokens):
            self._learned_context = context_tokens      # one probe per shrink, even if it is not learned
            self.refusals_in_a_row = 0
            self.shrink_probes += 1
            return AdmissionDecision(admit=True, estimate_ms=estimate, budget_ms=budget, probe=True)
        self.refusals_in_a_row += 1
        if self.refusals_in_a_row > self.probe_after:
            self.refusals_in_a_row = 0
            return AdmissionDecision(admit=True, estimate_ms=estimate, budget_ms=budget, probe=True)
        return AdmissionDecision(admit=False, estimate_ms=estimate, budget_ms=budget)

    def _expire_ratios(self) -> None:
        """Drop the ratios learned more than tail_window decisions ago (see the module docstring): in steady state,
        where every decision learns, the window's own count drops them first. O(1) when none is due."""
        stamps, oldest_kept = self._ratio_decided_at, self.decisions - self._ratios.size
        if stamps and stamps[0] < oldest_kept:
            while stamps and stamps[0] < oldest_kept:
                stamps.popleft()
                self._ratios.drop_oldest()
            self._update_tail()

    def _context_shrank(self, context_tokens: int | None) -> bool:
        learned = self._learned_context
        return (self.probe_on_shrink > 0.0 and context_tokens is not None and learned is not None
                and context_tokens <= (1.0 - self.probe_on_shrink) * learned)

    def observe(self, prefill_ms: float, prefill_tokens: int, decode_ms: float, decode_tokens: int,
                other_ms: float = 0.0, context_tokens: int | None = None, probe: bool = False) -> bool:
        """Fold one measured cycle into the EMAs (the first one, and a probe, seed them) and its actual /
        predicted ratio into the tail; a spike (see the module docstring) is not folded in. context_tokens: the
        tokens its state held; probe: it was admitted to re-measure (AdmissionDecision.probe). Returns True when
        learned."""
        _check_finite_non_negative("prefill_ms", prefill_ms)
        _check_finite_non_negative("decode_ms", decode_ms)
        _check_finite_non_negative("other_ms", other_ms)
        for name, count in (("prefill_tokens", prefill_tokens), ("decode_tokens", decode_tokens)):
            _check_token_count(name, count)
            if count == 0:
                raise ValueError(f"AdmissionController.observe: {name} must be > 0 to measure a per-token cost")
        prefill_rate = prefill_ms / prefill_tokens
        decode_rate = decode_ms / decode_tokens
        if not self.has_sample:
            self._seed(prefill_rate, decode_rate, other_ms, context_tokens)
            return True
        predicted = self.mean_ms(prefill_tokens, decode_tokens, context_tokens)
        actual = prefill_ms + decode_ms + other_ms
        if actual > self.spike_factor * predicted:
            self.spikes_in_a_row += 1
            if self.spikes_in_a_row < self.spikes_to_adopt:
                self.spikes += 1
                return False
            self.spikes_in_a_row = 0        # a lasting change: seeded from, not a ratio (the module docstring)
            self.adoptions += 1
            self._seed(prefill_rate, decode_rate, other_ms, context_tokens)
            return True
        self.spikes_in_a_row = 0
        if predicted > 0.0:
            self._add_ratio(actual / predicted)
        if probe:
            self._seed(prefill_rate, decode_rate, other_ms, context_tokens)
            return True
        a = self.alpha
        self.ema_prefill_ms_per_token = (1.0 - a) * self.ema_prefill_ms_per_token + a * prefill_rate
        self.ema_decode_ms_per_token = (1.0 - a) * self.ema_decode_ms_per_token + a * decode_rate
        self.ema_other_ms = (1.0 - a) * self.ema_other_ms + a * other_ms
        if context_tokens is not None:
            self._learned_context = context_tokens
            self.ema_context_tokens = (float(context_tokens) if self.ema_context_tokens is None
                                       else (1.0 - a) * self.ema_context_tokens + a * context_tokens)
        return True

    def _add_ratio(self, ratio: float) -> None:
        if len(self._ratios) == self._ratios.size:      # the window drops its oldest: so do the stamps
            self._ratio_decided_at.popleft()
        self._ratios.append(ratio)
        self._ratio_decided_at.append(self.decisions)
        self._update_tail()

    def _seed(self, prefill_rate: float, decode_rate: float, other_ms: float, context_tokens: int | None) -> None:
        self.ema_prefill_ms_per_token = prefill_rate
        self.ema_decode_ms_per_token = decode_rate
        self.ema_other_ms = other_ms
        self.has_sample = True
        if context_tokens is not None:
            self._learned_context = context_tokens
            self.ema_context_tokens = float(context_tokens)


def _check_finite_non_negative(name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (math.isfinite(value) and value >= 0.0):
        raise ValueError(f"AdmissionController: {name} must be a finite number >= 0, got {value!r}")


def _check_token_count(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise ValueError(f"AdmissionController: {name} must be an integer >= 0, got {value!r}")
