"""Can a cycle over a full KV arena meet the deadline? Measured before serving, said before the first live cycle.

A cycle attends to every token the state holds, so its cost grows with the
frames held: on the H200 the Qwen2.5-1.5B shape's cycle took ~16 ms over a
few frames and 30-31 ms over ~950 frames at kv.capacity_tokens 32768, against
an admission budget of ~31 ms (deadline 33.3 ms less the safety margin). In
`bench asr --capacity 32768` (2026-12-04) 291 of 296 refused cycles came with
900 or more frames held, and without a reconciler all 164: the configured
capacity was more state than the deadline can serve, and nothing said so
until the state grew there, a minute into the run.

The check (lifecycle.capacity_check_cycles, run by the reasoning node and
`bench asr` after the warm-up) times that many cycles on a nearly empty state,
fills the state to its frame capacity with synthetic frames (their KV
computed in the forwards a swap's late frames use, shapes the warm-up
prepared), times as many cycles over the full state, and forgets all of it
(Engine.synthetic_cycles: the state, metrics and admission estimate are as the
warm-up left them). The cost between the two is taken as linear in the frames
held (attention over the context; the 32K run above: 16.0, 18.4, 22.4, 25.0,
29.0 ms at 50, 200, 400, 600, 850 frames), which gives the frames a cycle can
serve within lifecycle.capacity_budget_share of the budget, and the
kv.capacity_tokens that would hold them. It changes no setting: a robot whose
state never grows that far (rounds of exact forgetting keep it near
asr.threshold of capacity) may keep the capacity; one that does learns where
admission will start refusing before it does. With admission.context_cost the
same slope becomes admission's cost per context token (take_context_cost), so
that a swap which grows the state raises the estimate before the first cycle
over it (core/admission.py).
"""
from __future__ import annotations

import math
import time
from dataclasses import MISSING, asdict, dataclass, fields

import numpy as np

from .state_snapshot import StateChunk

FILL_FRAME_ID0 = -(10 ** 9)     # the synthetic frames' ids: below any camera frame's and the warm-up's (-1, -2, ...)


@dataclass(frozen=True)
class CapacityFit:
    """The two measurements and what they imply (all times in ms, medians of the timed cycles)."""
    short_frames: int           # frames held after the short-state cycles (each added its own new frame)
    short_ms: float
    full_frames: int            # frames held after the full-state cycles: the most the state can hold
    full_tokens: int            # context tokens that cycle attended to
    full_ms: float
    budget_ms: float            # cycle.deadline_ms - cycle.safety_margin_ms: what admission compares against
    budget_share: float         # lifecycle.capacity_budget_share
    tokens_per_frame: int
    fixed_tokens: int           # the prefix and one cycle's suffix reserve: slots no frame can use
    fill_s: float               # seconds the synthetic frames' KV took to compute
    short_tokens: int = -1      # context tokens of the short-state cycles (-1: a record from before it was kept)

    @property
    def allowed_ms(self) -> float:
        return self.budget_share * self.budget_ms

    @property
    def fits(self) -> bool:
        return self.full_ms <= self.allowed_ms

    @property
    def ms_per_context_token(self) -> float:
        """What one more context token adds to a cycle: the slope between the two measurements (0 where it is not
        positive or the short state's tokens are not known). Admission takes it (admission.context_cost)."""
        span = self.full_tokens - self.short_tokens
        if self.short_tokens < 0 or span <= 0:
            return 0.0
        return max(0.0, (self.full_ms - self.short_ms) / span)

    @property
    def frames_that_fit(self) -> int:
        """The most frames whose cycle is predicted within allowed_ms (linear between the two measurements);
        the frame capacity when the full state fits, 0 when not even the short state does."""
        if self.fits:
            return self.full_frames
        if self.short_ms > self.allowed_ms:
            return 0
        span = self.full_frames - self.short_frames
        slope = (self.full_ms - self.short_ms) / span if span > 0 else math.inf
        if not slope > 0:
            return self.short_frames
        return min(self.full_frames, self.short_frames + int((self.allowed_ms - self.short_ms) / slope))

    @property
    def capacity_tokens_that_fit(self) -> int:
        """kv.capacity_tokens whose frame capacity is frames_that_fit (0: none)."""
        n = self.frames_that_fit
        return self.fixed_tokens + n * self.tokens_per_frame if n else 0

    @classmethod
    def from_values(cls, values: dict) -> "CapacityFit | None":
        """Back from as_dict()'s fields as /diagnostics carries them (strings); None when any is missing."""
        kinds = {"int": int, "float": float}
        try:
            return cls(**{f.name: kinds[f.type](float(values[f.name])) for f in fields(cls)
                          if f.name in values or f.default is MISSING})
        except (KeyError, ValueError, TypeError):
            return None

    def as_dict(self) -> dict:
        """For /diagnostics and JSON: the measurements and the verdict."""
        return asdict(self) | {"fits": self.fits, "frames_that_fit": self.frames_that_fit,
                               "capacity_tokens_that_fit": self.capacity_tokens_that_fit,
                               "ms_per_context_token": self.ms_per_context_token}

    def describe(self) -> str:
        """One line for the log and the reports."""
        measured = (f"a cycle over the full state ({self.full_frames} frames, {self.full_tokens} tokens) took "
                    f"{self.full_ms:.1f} ms ({self.short_ms:.1f} ms over {self.short_frames}), "
                    f"{self.full_ms / self.budget_ms:.0%} of the {self.budget_ms:.1f} ms admission budget")
        if self.fits:
            return f"{measured}: the whole frame capacity can be served"
        if not self.frames_that_fit:
            return (f"{measured}: not even a nearly empty state's cycle is within {self.budget_share:g} of the budget "
                    f"({self.allowed_ms:.1f} ms); expect refusals whatever the state holds")
        return (f"{measured}: admission will refuse cycles as the state nears capacity; about "
                f"{self.frames_that_fit} frames fit within {self.budget_share:g} of the budget ({self.allowed_ms:.1f} "
                f"ms): kv.capacity_tokens <= {self.capacity_tokens_that_fit}")


def check_capacity(engine, cycles: int, frame_pixels: np.ndarray) -> CapacityFit | None:
    """Measure CapacityFit on `engine` after its warm-up (module docstring); None when the frame capacity is too
    small to hold the timed cycles' frames. Leaves the engine as it found it (Engine.synthetic_cycles)."""
    state, tpf = engine.state, engine.cfg.vision.tokens_per_frame
    capacity = most_frames(state)
    if cycles < 1 or capacity < 2 * cycles:
        return None
    with engine.synthetic_cycles(keep_admission=False):
        short = _timed(engine, cycles, frame_pixels, FILL_FRAME_ID0 - 2 * cycles)
        short_frames, short_tokens = len(state.frames), short[-1].context_tokens
        state.reset_frames()
        state.last_frame_id = None
        encoded = state.encoder.encode(frame_pixels)
        per_forward = engine.late_frames_per_forward()
        fill = capacity - cycles
        t0 = time.perf_counter()
        for start in range(0, fill, per_forward):
            ids = range(FILL_FRAME_ID0 + start, FILL_FRAME_ID0 + min(fill, start + per_forward))
            state.append_chunks([StateChunk(f, 0.0, encoded.tokens, encoded.pooled) for f in ids])
        fill_s = time.perf_counter() - t0
        full = _timed(engine, cycles, frame_pixels, FILL_FRAME_ID0 + fill)
        full_frames, full_tokens = len(state.frames), full[-1].context_tokens
    cyc = engine.cfg.cycle
    return CapacityFit(short_frames=short_frames, short_ms=_median(short), full_frames=full_frames,
                       full_tokens=int(full_tokens), full_ms=_median(full),
                       budget_ms=cyc.deadline_ms - cyc.safety_margin_ms,
                       budget_share=engine.cfg.lifecycle.capacity_budget_share, tokens_per_frame=tpf,
                       fixed_tokens=state.prefix_tokens + state.suffix_reserve, fill_s=fill_s,
                       short_tokens=int(short_tokens))


def take_context_cost(engine, fit: CapacityFit | None) -> float:
    """admission.context_cost: the fit's cost per context token into `engine`'s admission estimate; returns the
    slope taken (0: none: the key is off, the check did not run, or its slope was not positive)."""
    if fit is None or not engine.cfg.admission.context_cost:
        return 0.0
    engine.admission.set_context_cost(fit.ms_per_context_token)
    return fit.ms_per_context_token


def most_frames(state) -> int:
    """The most frames the state can hold: its frame capacity, or fewer where the model's positions end first (a
    re-base puts the frames right after the prefix again, so no more than that many ever fit its positions)."""
    positions = state.backend.spec.max_position_embeddings - state.prefix_tokens - state.suffix_reserve
    return min(state.frame_capacity, positions // state.cfg.vision.tokens_per_frame)


def _timed(engine, cycles: int, frame_pixels: np.ndarray, first_id: int) -> list:
    """`cycles` cycles, each on a new synthetic frame: its prefill and the action's decode steps, as a live cycle."""
    return [engine.synthetic_cycle(frame_pixels, first_id + i) for i in range(cycles)]


def _median(results: list) -> float:
    return float(np.median([r.elapsed_ms for r in results]))
