"""What one control cycle produced: exactly one action or one explained fallback."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

# Reason codes published on /vla/fallback (DESIGN.md, "Interfaces").
REFUSED_BUDGET = "refused_budget"     # admission estimated the cycle would not finish in time
DEADLINE_MISSED = "deadline_missed"   # computed, but finished after the deadline: not acted on
NO_FRAME = "no_frame"                 # no camera frame has arrived yet
STALE_FRAME = "stale_frame"           # the freshest frame is older than cycle.stale_frame_ms
MEMORY_CEILING = "memory_ceiling"     # the engine would exceed the memory ceiling
ENGINE_ERROR = "engine_error"         # the backend raised or produced non-finite numbers
FALLBACK_REASONS = (REFUSED_BUDGET, DEADLINE_MISSED, NO_FRAME, STALE_FRAME, MEMORY_CEILING, ENGINE_ERROR)


@dataclass
class CycleResult:
    cycle_id: int
    reason: str | None = None                 # None: an action; otherwise one of FALLBACK_REASONS
    action: np.ndarray | None = None          # [num_tokens] float32 in [-1, 1]
    tokens: np.ndarray | None = None          # [num_tokens] int64 vocabulary ids of the action bins
    frame_id: int | None = None               # frame answered (None when there was none)
    frame_stamp_s: float | None = None        # its capture stamp: the action's header stamp
    new_frame: bool = False                   # the frame was appended to the state this cycle
    swap_frames: int = 0                      # a swap's late frames this cycle wrote at its start (asr.swap_finish)
    swap_settle_ms: float | None = None       # this cycle's start waited this long for a swap's KV copy check
    estimate_ms: float = 0.0                  # admission's cost estimate
    budget_ms: float = 0.0                    # deadline - elapsed - margin at admission
    elapsed_ms: float = 0.0                   # cycle start to result
    prefill_ms: float = 0.0
    decode_ms: float = 0.0
    prefill_tokens: int = 0
    evicted_frame_ids: list = field(default_factory=list)
    probe: bool = False                       # admitted only to re-measure (refusals in a row, a shrunk state)
    context_tokens: int = 0                   # KV slots the state held at admission (its context, before this cycle)
    overran: bool = False                     # finished after the deadline (deterministic mode still acts)
    state_exact: bool = True                  # served on an exact state: no approximate eviction since the last
                                              # reconciled swap (FrameState.state_exact after this cycle's admission)
    detail: str = ""                          # human-readable explanation for fallbacks
    phases_ms: dict = field(default_factory=dict)   # where the time went: core/cycle_phases.py IN_CYCLE names
    boundary_skipped: bool = False            # no cycle ran for this boundary (the one before overran it)
    given_up: bool = False                    # deadline_missed between decode steps: stopped before its end
    overran_in: str = ""                      # for a skipped boundary: core/boundary_overrun.py OVERRUN_PARTS

    @property
    def is_action(self) -> bool:
        return self.reason is None
