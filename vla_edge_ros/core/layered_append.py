"""An exact append of frames whose forward runs a few layers at a time (asr.step_layer_pieces).

The reconciler's step appends whole frames in one forward (FrameState.append_chunks). Where one gap between
the primary's cycles cannot hold a step of many frames but several can, the step runs piece by piece
(model/layered_forward.py): `begin_append` admits the frames (slots, positions, records: as append_chunks
does) and hands the backend its rows, each `continue_append` runs the next piece of layers, and the last
one commits the frames. Until then their K/V is not complete, so nothing may read the state: the backend
refuses every other forward, export_state refuses, and the reconciler offers nothing while a step is in
flight. `abandon_append` forgets the frames (and the K/V written so far), as a failed forward does; a reset
of the state abandons the append first.

A mixin of FrameState (core/engine_state.py), as SwapImport is: the attributes it uses are FrameState's.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..model.layered_forward import layer_pieces


@dataclass
class AppendBatch:
    """Frames admitted for one append: what its forward needs, and what committing it adds."""
    frame_ids: list                 # the admitted frames the forward computes, oldest first
    rows: np.ndarray                # [k * tpf, hidden] their vision rows
    positions: np.ndarray           # [k * tpf] int64
    slots: np.ndarray               # [k * tpf] int32 where their K/V goes
    context: np.ndarray             # what they attend to besides themselves
    chunks: int                     # frames asked for (positions advance by all of them)


class LayeredAppend:
    """FrameState's appends run piece by piece (see the module docstring)."""

    _layered_append: tuple | None = None       # (AppendBatch, model.layered_forward.LayeredForward) in flight

    @property
    def appending(self) -> bool:
        """True while an append runs piece by piece (begin_append ... the last continue_append)."""
        return self._layered_append is not None

    @property
    def append_pieces_left(self) -> int:
        """Pieces of layers the append in flight has still to run (0: none in flight)."""
        return 0 if self._layered_append is None else self._layered_append[1].pieces_left

    def piece_share(self, pieces: int) -> float:
        """The largest piece's share of a forward's layers when it runs in `pieces` pieces (what must fit a gap)."""
        runs = layer_pieces(self.backend.spec.num_layers, pieces)
        return max(end - first for first, end in runs) / self.backend.spec.num_layers

    def append_fits_pieces(self, frames: int) -> bool:
        """Whether an append of `frames` frames can run piece by piece on this backend (one pass holds it)."""
        fits = getattr(self.backend, "layered_rows_fit", None)
        return fits is not None and fits(frames * self.cfg.vision.tokens_per_frame)

    def begin_append(self, chunks, pieces: int) -> list[int]:
        """Admit pre-encoded frames as append_chunks(allow_evict=False) does (KVCapacityError with the state
        untouched unless they fit with the suffix reserve) and start their forward in `pieces` runs of layers;
        nothing is computed yet. Returns the frame ids the policy evicted (a sliding window's cap), as
        append_chunks does; with nothing left to compute, no append is in flight."""
        self._require_boundary("begin_append")
        self.require_no_append_in_flight("begin_append")
        evicted, batch = self._admit_batch(list(chunks), allow_evict=False)
        if batch is None:
            return evicted
        try:
            lf = self.backend.begin_layered(batch.rows, batch.positions, batch.slots, batch.context, pieces)
        except BaseException:
            self._forget_batch(batch)
            raise
        self._layered_append = (batch, lf)
        return evicted

    def continue_append(self) -> bool:
        """Run the next piece of the append in flight; True once its last piece has run and its frames are
        committed. A failing piece forgets the frames (their K/V would be garbage) and raises."""
        if self._layered_append is None:
            raise RuntimeError("continue_append: no append in flight")
        batch, lf = self._layered_append
        try:
            finished = self.backend.run_layer_piece(lf)
        except BaseException:
            self.abandon_append()
            raise
        if finished:
            self._layered_append = None
            self._commit_batch(batch)
        return finished

    def abandon_append(self) -> None:
        """Give up the append in flight, if any: its frames are forgotten, the state is as before it."""
        if self._layered_append is None:
            return
        batch, lf = self._layered_append
        self._layered_append = None
        self.backend.abandon_layered(lf)
        self._forget_batch(batch)

    def require_no_append_in_flight(self, what: str) -> None:
        """RuntimeError while an append runs piece by piece (the caller would compute over incomplete K/V)."""
        if self._layered_append is not None:
            raise RuntimeError(f"{what}: an append runs piece by piece ({self.append_pieces_left} pieces left); "
                               f"its frames' K/V is not complete")
