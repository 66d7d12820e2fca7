"""Vision rows of the frames the policy evicted, kept for a swap in host memory reserved up front.

With asr.snapshot_rows false an offer comes without vision rows: a swap takes a frame's rows from the
records the reasoning node holds, and, for a frame its own policy evicted meanwhile (an approximate eviction,
while a round runs late), from here. Kept as references to the frames' own arrays, those rows pinned up to
frame_capacity heap blocks (32 x 1536 float32, 192 KiB each, for the 1.5B shape) that would otherwise have
been freed and reused: the first round that ran late in a run grew the reasoning node's resident memory by a
store's worth, and it stayed. H200 soak of 2026-12-04: +22.1 MiB at ~175 s, with the run's one aborted
round; the soak's memory-growth check failed on it (the same steps at 160 and 210 s on 2026-12-03).

Here the rows are copied into a slab allocated and written at construction, so keeping them allocates
nothing. A slot of the slab is
  free;
  released: it holds an evicted frame's rows (the newest `frames` of them are kept, oldest out first);
  lent: a swap gave its rows back to a frame the state retains again, as a read-only view of the slot; the
      slot is free again when that view is garbage (weakref.finalize). Records and chunks pass the same view
      object along (a re-base, a policy eviction), so the slot lives as long as any of them holds it.
Released slots are at most `frames`, lent ones at most the frames a state retains (`frames` too), so a slab
of twice `frames` slots always has room.
"""
from __future__ import annotations

import logging
import weakref
from collections import OrderedDict

import numpy as np

log = logging.getLogger(__name__)


class ReleasedRows:
    """The rows of the newest `frames` evicted frames, [rows_per_frame, hidden] float32 each, in a fixed slab."""

    def __init__(self, frames: int, rows_per_frame: int, hidden: int):
        if frames <= 0 or rows_per_frame <= 0 or hidden <= 0:
            raise ValueError(f"ReleasedRows needs positive sizes, got frames={frames}, rows_per_frame="
                             f"{rows_per_frame}, hidden={hidden}")
        self.frames = int(frames)
        self._slab = np.empty((2 * self.frames, rows_per_frame, hidden), np.float32)  # [slots, rows, hidden]
        self._slab.fill(0.0)          # written now: resident from the start, not when the first round runs late
        self._free = list(range(2 * self.frames))
        self._released: OrderedDict[int, int] = OrderedDict()       # frame id -> slot, oldest first
        self._returned: list[int] = []     # slots whose lent view died (finalize appends: any thread, no lock)
        self.not_kept = 0                  # rows refused: another shape, or no slot (lent views held elsewhere)

    @property
    def nbytes(self) -> int:
        return int(self._slab.nbytes)

    @property
    def released(self) -> int:
        return len(self._released)

    @property
    def lent(self) -> int:
        self._reclaim()
        return self._slab.shape[0] - len(self._free) - len(self._released)

    def keep(self, frame_id: int, rows: np.ndarray | None) -> bool:
        """Copy an evicted frame's rows into a slot (the oldest released frame makes room past `frames` of
        them). False, and nothing kept, for rows of another shape or dtype or when no slot is free."""
        if rows is None:
            return False
        if rows.shape != self._slab.shape[1:] or rows.dtype != np.float32:
            self.not_kept += 1
            log.debug("released rows: frame %d rows %s %s, expected %s float32", frame_id, rows.dtype, rows.shape,
                      self._slab.shape[1:])
            return False
        self._reclaim()
        if frame_id in self._released:
            self._free.append(self._released.pop(frame_id))
        if len(self._released) >= self.frames or (not self._free and self._released):
            self._free.append(self._released.popitem(last=False)[1])
        if not self._free:
            self.not_kept += 1
            log.warning("released rows: no free slot of %d for frame %d (lent views still held)",
                        self._slab.shape[0], frame_id)
            return False
        slot = self._free.pop()
        self._slab[slot] = rows
        self._released[frame_id] = slot
        return True

    def lend(self, frame_id: int) -> np.ndarray | None:
        """The released frame's rows as a read-only view of its slot, lent until the view is garbage; None when
        not kept. The frame leaves the released ones (its rows now belong to the record that holds the view)."""
        slot = self._released.pop(frame_id, None)
        if slot is None:
            return None
        view = self._slab[slot]                                      # [rows, hidden]
        view.flags.writeable = False
        weakref.finalize(view, self._returned.append, slot)
        return view

    def _reclaim(self) -> None:
        while self._returned:
            self._free.append(self._returned.pop())
