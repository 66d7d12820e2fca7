"""When to reconcile and what to keep: one small policy object per asr.mode.

Used by the reconciler (core/reconciliation.py) and by the synchronous
baseline of the benchmark, so both decide alike:

    csr       the primary's frames reach asr.threshold of its frame capacity: keep the newest
              (1 - asr.evict_fraction) of them (the paper's rule)
    semantic  the primary has made asr.semantic_evictions_before_rebuild approximate evictions
              since its state was last exact (asr.semantic_trigger evictions), or its frames reach
              asr.threshold of its frame capacity (fill: before any approximate eviction): rebuild
              the frames it still holds, trimmed by its eviction policy to asr.rebuild_fill of the
              frame capacity so that the chunks arriving during the round fit without new
              approximate evictions
"""
from __future__ import annotations

import math

from ..config import VlaConfig
from .kv_slots import AdjacentCosines

TRIGGER_CSR = "csr_threshold"
TRIGGER_SEMANTIC = "semantic_evictions"
TRIGGER_SEMANTIC_FILL = "semantic_fill"


class CsrMode:
    """The paper's rule: at asr.threshold of the frame capacity, keep the newest (1 - asr.evict_fraction)."""
    name = "csr"

    def __init__(self, asr):
        self.threshold, self.evict_fraction = asr.threshold, asr.evict_fraction

    def trigger(self, frames_held: int, frame_capacity: int, approximate_evictions: int) -> str | None:
        return TRIGGER_CSR if frames_held >= math.ceil(self.threshold * frame_capacity) else None

    def keep(self, retained: list, frame_capacity: int, policy, limit: int | None = None) -> list[int]:
        """The newest (1 - evict_fraction), and at most `limit` of them (core/round_budget.py: what can finish)."""
        kept = retained[int(len(retained) * self.evict_fraction):]
        if limit is not None and len(kept) > limit:
            kept = kept[len(kept) - limit:]
        return [r.frame_id for r in kept]


class SemanticMode:
    """After asr.semantic_evictions_before_rebuild approximate evictions, rebuild what the primary holds,
    trimmed by its eviction policy to asr.rebuild_fill of the capacity (room for chunks arriving meanwhile)."""
    name = "semantic"

    def __init__(self, asr):
        self.evictions_before_rebuild, self.rebuild_fill = asr.semantic_evictions_before_rebuild, asr.rebuild_fill
        self.on_fill, self.threshold = asr.semantic_trigger == "fill", asr.threshold

    def trigger(self, frames_held: int, frame_capacity: int, approximate_evictions: int) -> str | None:
        if self.on_fill:    # a full primary (it evicts) is past the threshold too: no second rule needed
            return TRIGGER_SEMANTIC_FILL if frames_held >= math.ceil(self.threshold * frame_capacity) else None
        return TRIGGER_SEMANTIC if approximate_evictions >= self.evictions_before_rebuild else None

    def keep(self, retained: list, frame_capacity: int, policy, limit: int | None = None) -> list[int]:
        """Trimmed by the policy to rebuild_fill of the capacity, and to `limit` (core/round_budget.py)."""
        frames = list(retained)
        fill = max(1, int(self.rebuild_fill * frame_capacity))
        limit = fill if limit is None else min(fill, limit)
        # Kept as frames go, not recomputed per choice: trimming 125 frames to 80 was 45 restacks of them.
        adjacent = AdjacentCosines.of(frames) if policy.uses_adjacent and len(frames) > limit else None
        while len(frames) > limit:
            idx = policy.victim(frames, need_free=True, adjacent=adjacent)
            if idx is None:
                break
            if adjacent is not None:
                adjacent.removed(frames, idx)
            frames.pop(idx)
        return [r.frame_id for r in frames]


ASR_MODE_CLASSES = {cls.name: cls for cls in (CsrMode, SemanticMode)}


def make_asr_mode(cfg: VlaConfig):
    """The policy object of asr.mode (ValueError listing the known ones for any other name)."""
    try:
        return ASR_MODE_CLASSES[cfg.asr.mode](cfg.asr)
    except KeyError:
        raise ValueError(f"asr.mode {cfg.asr.mode!r} unknown; choose one of {sorted(ASR_MODE_CLASSES)}") from None
