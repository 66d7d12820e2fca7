"""How much reconciler work fits in the primary's slack before its next cycle.

The control cycle is periodic and its cost predicted; the reconciler's
rebuild is bulk work with a deadline of "soon". So the rebuild runs in steps
sized to the gap between the end of one cycle and the next boundary (minus
`asr.slack_margin_ms`), never across a boundary. A step of k frames is one
forward over k * tokens_per_frame rows; its cost is measured per step size
(core/step_costs.py: device time, the caller synchronizes before reading its
clock) and the largest step whose cost, estimated conservatively for sizes not
measured yet, fits the gap with HEADROOM is planned, up to
`asr.warmup_tokens_per_step`. Offering the rebuilt state (exporting its KV) is
device work too and is planned the same way (`offer_fits`).

Protections kept from the one-cost-per-token schedule before:
  - the first step of a process pays one-time costs (first launches, lazy
    allocations): it is not a measurement; one frame is probed again;
  - a step of unknown cost (such a probe) is only started as the first step of
    a gap (`new_window`) and with at least PROBE_MIN_SHARE of the gap left, never
    in what is left of one: on the loaded 2-core CI machine a probe started with
    2.3 ms of a 25 ms gap left (the inbox had taken the rest) ran 2.3 ms into the
    next cycle;
  - a step that does not fit is never started; when none fits for
    STARVED_AFTER_WINDOWS gaps, `starved` says so and the estimates are relaxed
    toward the cheap end of the costs actually measured (RELAX_FACTOR);
  - an offer of unknown cost follows the same rule (`offer_fits`);
  - the summary gives the spread of the latest steps' costs per token.

Both drivers use it: the reconciler node (core/swap_protocol.ReconcilerWorker,
windows read from the reasoning node's core/cycle_clock.py) and the in-process
benchmark (core/in_process_asr.InProcessAsr, windows known directly).
"""
from __future__ import annotations

from collections import deque

from .metrics import percentile
from .step_costs import CostTrack, StepCosts

HEADROOM = 1.25       # planned step cost x this must fit the window (a step's device time varies little)
# A step that does not fit is never tried "to see": on the H200 such one-frame tries (12 ms in a 5 ms gap)
# were exactly the late cycles this schedule exists to prevent. When this many gaps in a row fit nothing,
# the caller is told (`starved`): the primary's slack is too small for any reconciler step.
STARVED_AFTER_WINDOWS = 100
# An estimate that fits nothing is never measured again, so one burst of expensive steps (a loaded CPU in CI:
# one frame measured at 18 ms) used to starve the reconciler for good. Each STARVED_AFTER_WINDOWS declined
# windows, the estimates are multiplied by this, but never below the 10th percentile of the recent samples of
# their size: a cost this process has really measured, so the schedule never plans a step cheaper than one it
# has seen.
RELAX_FACTOR = 0.5
RELAX_FLOOR_PERCENTILE = 10
# The summary's spread of step costs covers this many latest steps. Why it is reported: on the H200 the
# reconciler's steps cost 0.10 ms per token in one demo and 0.40 in the next two with the same kernels; the
# spread, and the share of it spent on the host before the device work was queued, say which kind of cost grew.
RECENT_STEPS = 256
PROBE_MIN_SHARE = 0.5   # a step of unknown cost starts only with at least this share of its gap left
# An offer of unknown cost waits for PROBE_MIN_SHARE of a gap at most this many gaps in a row, then takes any usable
# time: once a round has caught up, each gap's first step computes the frame that just arrived, and where that
# step takes more than half the gap no gap would ever leave the share (nothing measures an export beforehand).
UNKNOWN_OFFER_PATIENCE = 8


class SlackScheduler:
    def __init__(self, tokens_per_frame: int, max_tokens_per_step: int, margin_ms: float,
                 follow_context: bool = False):
        if tokens_per_frame <= 0 or max_tokens_per_step < tokens_per_frame:
            raise ValueError(f"SlackScheduler: {max_tokens_per_step} tokens per step cannot hold one frame of "
                             f"{tokens_per_frame}")
        self.tpf = int(tokens_per_frame)
        self.max_frames = int(max_tokens_per_step) // self.tpf
        self.margin_ms = float(margin_ms)
        # follow_context (asr.step_cost_follows_context): step costs planned at the context the step starts with
        # (core/step_costs.py); the drivers pass it to frames_for and observe.
        self.costs = StepCosts(follow_context)
        self.offer_cost = CostTrack()                       # exporting an offer (the first one not measured)
        self.warmup_ms_per_token: float | None = None     # the first step's cost (observe says why apart)
        self.first_offer_ms: float | None = None
        self.steps = 0
        self.offers = 0
        self.windows_too_small = 0
        self.offers_postponed = 0
        self.relaxations = 0
        self._declined_in_a_row = 0
        self._offers_declined_in_a_row = 0
        self._probe_allowed = True                          # a step of unknown cost: first in a window only
        self._gap_ms: float | None = None                   # the whole current gap, where the driver knows it
        self._declined_this_window = False                  # a gap that fits nothing counts once, however often
                                                            # the driver asks (the node plans twice per gap)...
        self._windows_announced = False                     # ... where the driver announces its gaps (new_window)
        self._recent: deque = deque(maxlen=RECENT_STEPS)    # (ms per token, host ms per token or None)

    # ------------------------------------------------------------------ plans

    def new_window(self, gap_ms: float | None = None) -> None:
        """A new gap begins (the drivers call it before its first frames_for); gap_ms: its whole length, from
        the cycle's end to the next boundary (None: unknown, any usable time will do for a probe)."""
        self._probe_allowed = True
        self._gap_ms = gap_ms
        self._declined_this_window = False
        self._windows_announced = True

    def frames_for(self, window_ms: float, context_tokens: int | None = None) -> int:
        """Whole frames to compute in a window of `window_ms` (0: wait for the next window): the largest step
        size, up to the cap and the sizes eligible so far, whose estimated cost x HEADROOM fits; context_tokens:
        what the state holds now (planned with under follow_context)."""
        usable = window_ms - self.margin_ms
        if usable <= 0:
            return self._decline()
        measured = self.costs.measured(context_tokens)
        if not measured:                   # nothing measured (or only warm-up steps): probe one frame,
            whole = self._gap_ms is None or window_ms >= PROBE_MIN_SHARE * self._gap_ms     # in most of a gap,
            probe, self._probe_allowed = self._probe_allowed and whole, False              # as its first step
            return 1 if probe else 0
        best = self._largest(usable, measured)
        if best:
            self._declined_in_a_row = 0
            return best
        return self._decline()

    def fitting_frames(self, window_ms: float, context_tokens: int | None = None, share: float = 1.0) -> int:
        """The largest step size (up to the cap and the sizes eligible so far) whose estimated cost x share x
        HEADROOM fits the window, 0 when none does or nothing is measured yet; share: the part of a step that must
        fit (a piece of its layers, core/gap_steps.py). A plan only: no probe, nothing counted."""
        usable = window_ms - self.margin_ms
        measured = self.costs.measured(context_tokens)
        if usable <= 0 or not measured:
            return 0
        return self._largest(usable / share, measured)

    def plan_piece(self, window_ms: float, frames: int, share: float, context_tokens: int | None = None) -> bool:
        """Whether the next piece (`share` of a step of `frames` frames, at its estimated cost) fits the window;
        counted as frames_for counts its plans, so that a piece that never fits starves the schedule (and relaxes
        its estimates) as a step would."""
        est = self.costs.estimate(frames, context_tokens)
        if est is not None and HEADROOM * est * share <= window_ms - self.margin_ms:
            self._declined_in_a_row = 0
            return True
        self._decline()
        return False

    def offer_fits(self, window_ms: float) -> bool:
        """Whether exporting an offer fits the window. An export of unknown cost (a process's first, which is its
        warm-up, and the one after) is tried as a step of unknown cost is: with at least PROBE_MIN_SHARE of the
        gap left (any usable time where the gap is unknown), for UNKNOWN_OFFER_PATIENCE gaps, then in any usable
        time. On the H200 at 32768 slots both such offers were tried in what was left of a gap after its steps
        and ran 12-22 ms past the boundary."""
        usable = window_ms - self.margin_ms
        estimate = self.offer_cost.value
        if estimate is None:
            patient = self._offers_declined_in_a_row < UNKNOWN_OFFER_PATIENCE
            fits = usable > 0 and (self._gap_ms is None or not patient or window_ms >= PROBE_MIN_SHARE * self._gap_ms)
        else:
            fits = usable > 0 and HEADROOM * estimate <= usable
        if fits:
            self._offers_declined_in_a_row = 0
            return True
        self.offers_postponed += 1
        self._offers_declined_in_a_row += 1
        if self._offers_declined_in_a_row % STARVED_AFTER_WINDOWS == 0 and self.offer_cost.relax(
                RELAX_FACTOR, RELAX_FLOOR_PERCENTILE):
            self.relaxations += 1
        return False

    def planned_ms(self, frames: int) -> float | None:
        """The cost planned for a step of `frames` frames, with headroom (None before any measurement)."""
        est = self.costs.estimate(frames)
        return None if est is None else HEADROOM * est

    def one_frame_ms(self) -> float | None:
        """The planned cost of the smallest step, with headroom (for the starvation warning)."""
        return self.planned_ms(1)

    @property
    def starved(self) -> bool:
        """True once STARVED_AFTER_WINDOWS gaps in a row fitted no step: nothing will finish on this schedule."""
        return self._declined_in_a_row >= STARVED_AFTER_WINDOWS

    # ----------------------------------------------------------- measurements

    def observe(self, elapsed_ms: float, tokens: int, host_ms: float | None = None,
                context_tokens: int | None = None) -> None:
        """One step's measured cost (device work finished) for `tokens` tokens (whole frames); host_ms, where the
        caller knows it, the part before the step's device work was all queued (Python, table uploads). The first
        step is not a measurement: it pays one-time costs (the first launches of a process, a graph capture),
        ~4x a later step on the H200, and taken as the estimate it declined every later window. So the next
        window probes one frame again, and the estimates start from the second step. Every step size's first
        step is such a warm-up too (core/step_costs.py: the first replay of that size's graph)."""
        if tokens <= 0:
            return
        self.steps += 1
        # a size's first sample is its warm-up; context_tokens: what the state held when the step started
        self.costs.observe(max(1, tokens // self.tpf), elapsed_ms, context_tokens)
        if self.steps == 1:
            self.warmup_ms_per_token = elapsed_ms / tokens
            return
        self._recent.append((elapsed_ms / tokens, None if host_ms is None else host_ms / tokens))

    def observe_offer(self, elapsed_ms: float) -> None:
        """One export's measured cost; the first one of a process is not a measurement (as for steps)."""
        self.offers += 1
        self.offer_cost.observe(elapsed_ms)
        self.first_offer_ms = self.offer_cost.warmup_ms

    def summary(self) -> dict:
        """The estimates, the warm-up step, the counts, and the spread of the latest steps' costs per token
        (p10 / p50 / p90, metrics.percentile; host: the median share before the device work was queued). ""
        where unknown."""
        rates = [r for r, _ in self._recent]
        hosts = [h for _, h in self._recent if h is not None]
        largest = self.costs.largest_measured
        return {"step_ms_per_token": self.costs.estimate(largest) / (largest * self.tpf) if largest else "",
                "largest_step_frames": largest or "",
                "step_ms_by_frames": {str(k): round(ms, 3) for k, ms in self.costs.measured().items()},
                "step_ms_per_frame_context": self.costs.ms_per_frame_context,
                "warmup_step_ms_per_token": self.warmup_ms_per_token if self.warmup_ms_per_token is not None else "",
                **{f"step_ms_per_token_p{q}": percentile(rates, q) if rates else "" for q in (10, 50, 90)},
                "step_host_ms_per_token_p50": percentile(hosts, 50) if hosts else "",
                "offer_ms": self.offer_cost.value if self.offer_cost.value is not None else "",
                "steps": self.steps, "windows_too_small": self.windows_too_small,
                "offers_postponed": self.offers_postponed, "relaxations": self.relaxations, "starved": self.starved}

    # -------------------------------------------------------------- internals

    def _largest(self, usable: float, measured: dict) -> int:
        best = 0
        for frames in range(1, self.costs.eligible(self.max_frames, measured) + 1):
            if HEADROOM * self.costs.estimate(frames, measured=measured) <= usable:
                best = frames
        return best

    def _decline(self) -> int:
        if self._declined_this_window:
            return 0
        self._declined_this_window = self._windows_announced
        self.windows_too_small += 1
        self._declined_in_a_row += 1
        if self._declined_in_a_row % STARVED_AFTER_WINDOWS == 0 and self.costs.relax(RELAX_FACTOR,
                                                                                     RELAX_FLOOR_PERCENTILE):
            self.relaxations += 1
        return 0
