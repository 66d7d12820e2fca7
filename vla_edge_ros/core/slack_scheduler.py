"""How much reconciler work fits in the primary's slack before its next cycle.

The control cycle is periodic and its cost predicted; the reconciler's
rebuild is bulk work with a deadline of "soon". So the rebuild runs in steps
sized to the gap between the end of one cycle and the next boundary (minus
`asr.slack_margin_ms`), never across a boundary. The step size comes from an
EMA of the reconciler's own measured cost per token (device time: the caller
synchronizes before reading its clock), with HEADROOM for its spread. With no
measurement yet, one frame is tried: the smallest step there is (twice: the
first step's cost includes one-time work and is not used as a measurement). A step that
does not fit is never started; when none fits for long, `starved` says so, and the
estimate is relaxed toward the cheap end of the costs actually measured (see RELAX_FACTOR).

Both drivers use it: the reconciler node (core/swap_protocol.ReconcilerWorker,
windows read from the reasoning node's core/cycle_clock.py) and the in-process
benchmark (core/reconciliation.InProcessAsr, windows known directly).
"""
from __future__ import annotations

from collections import deque

from .metrics import percentile

HEADROOM = 1.25       # planned step cost x this must fit the window (a step's device time varies little)
EMA_ALPHA = 0.3       # weight of the newest step's cost per token
# A step that does not fit is never tried "to see": on the H200 such one-frame tries (12 ms in a 5 ms gap)
# were exactly the late cycles this schedule exists to prevent. When this many gaps in a row fit nothing,
# the caller is told (`starved`): the primary's slack is too small for any reconciler step.
STARVED_AFTER_WINDOWS = 100
# An estimate that fits nothing is never measured again, so one burst of expensive steps (a loaded CPU in CI:
# one frame measured at 18 ms) used to starve the reconciler for good. Each STARVED_AFTER_WINDOWS declined
# windows, the estimate is multiplied by this, but never below the 10th percentile of the recent steps' costs:
# a cost this process has really measured, so the schedule never plans a step cheaper than one it has seen.
RELAX_FACTOR = 0.5
RELAX_FLOOR_PERCENTILE = 10
# The summary's spread of step costs covers this many latest steps. Why it is reported: on the H200 the
# reconciler's steps cost 0.10 ms per token in one demo and 0.40 in the next two with the same kernels; the
# spread, and the share of it spent on the host before the device work was queued, say which kind of cost grew.
RECENT_STEPS = 256


class SlackScheduler:
    def __init__(self, tokens_per_frame: int, max_tokens_per_step: int, margin_ms: float):
        if tokens_per_frame <= 0 or max_tokens_per_step < tokens_per_frame:
            raise ValueError(f"SlackScheduler: {max_tokens_per_step} tokens per step cannot hold one frame of "
                             f"{tokens_per_frame}")
        self.tpf = int(tokens_per_frame)
        self.max_frames = int(max_tokens_per_step) // self.tpf
        self.margin_ms = float(margin_ms)
        self.ms_per_token: float | None = None
        self.warmup_ms_per_token: float | None = None     # the first step's cost (observe says why apart)
        self.steps = 0
        self.windows_too_small = 0
        self.relaxations = 0
        self._declined_in_a_row = 0
        self._recent: deque = deque(maxlen=RECENT_STEPS)    # (ms per token, host ms per token or None)

    def frames_for(self, window_ms: float) -> int:
        """Whole frames to compute in a window of `window_ms` (0: wait for the next window)."""
        usable = window_ms - self.margin_ms
        if usable <= 0:
            self.windows_too_small += 1
            self._declined_in_a_row += 1
            return 0
        if self.ms_per_token is None:
            return 1
        frames = min(self.max_frames, int(usable / (HEADROOM * self.ms_per_token * self.tpf)))
        if frames >= 1:
            self._declined_in_a_row = 0
            return frames
        self.windows_too_small += 1
        self._declined_in_a_row += 1
        if self._declined_in_a_row % STARVED_AFTER_WINDOWS == 0:
            self._relax()
        return 0

    def _relax(self) -> None:
        """Lower an estimate that has fitted nothing for STARVED_AFTER_WINDOWS windows (RELAX_FACTOR says why)."""
        floor = percentile([r for r, _ in self._recent], RELAX_FLOOR_PERCENTILE) if self._recent else None
        if floor is not None and floor < self.ms_per_token:
            self.ms_per_token = max(floor, self.ms_per_token * RELAX_FACTOR)
            self.relaxations += 1

    @property
    def starved(self) -> bool:
        """True once STARVED_AFTER_WINDOWS gaps in a row fitted no step: nothing will finish on this schedule."""
        return self._declined_in_a_row >= STARVED_AFTER_WINDOWS

    def one_frame_ms(self) -> float | None:
        """The planned cost of the smallest step, with headroom (for the starvation warning)."""
        return None if self.ms_per_token is None else HEADROOM * self.ms_per_token * self.tpf

    def observe(self, elapsed_ms: float, tokens: int, host_ms: float | None = None) -> None:
        """One step's measured cost (device work finished) for `tokens` tokens; host_ms, where the caller
        knows it, the part before the step's device work was all queued (Python, table uploads). The first
        step is not a measurement: it pays one-time costs (the first launches of a process, a graph
        capture), ~4x a later step on the H200, and taken as the estimate it declined every later window.
        So the next window probes one frame again, and the estimate starts from the second step."""
        if tokens <= 0:
            return
        self.steps += 1
        if self.steps == 1:
            self.warmup_ms_per_token = elapsed_ms / tokens
            return
        rate = elapsed_ms / tokens
        self.ms_per_token = rate if self.ms_per_token is None else (1 - EMA_ALPHA) * self.ms_per_token + EMA_ALPHA * rate
        self._recent.append((rate, None if host_ms is None else host_ms / tokens))

    def summary(self) -> dict:
        """The estimate, the warm-up step, the counts, and the spread of the latest steps' costs per token
        (p10 / p50 / p90, metrics.percentile; host: the median share before the device work was queued). ""
        where unknown."""
        rates = [r for r, _ in self._recent]
        hosts = [h for _, h in self._recent if h is not None]
        return {"step_ms_per_token": self.ms_per_token if self.ms_per_token is not None else "",
                "warmup_step_ms_per_token": self.warmup_ms_per_token if self.warmup_ms_per_token is not None else "",
                **{f"step_ms_per_token_p{q}": percentile(rates, q) if rates else "" for q in (10, 50, 90)},
                "step_host_ms_per_token_p50": percentile(hosts, 50) if hosts else "",
                "steps": self.steps, "windows_too_small": self.windows_too_small, "relaxations": self.relaxations,
                "starved": self.starved}
