"""A forward run a few layers at a time: a reconciler step too long for one gap, spread over several.

At 32768 KV slots on the H200 (bench asr, 2026-12-05) the primary's cycle
left the reconciler ~6 ms gaps, and one frame's step over ~20K cached tokens
took 5.7 ms, so rounds caught up one frame per gap, as fast as the camera
added them (trigger to swap ~11 s). Eight frames in one step took ~12.3 ms,
1.5 ms a frame: the weights are read once for all their rows and the
attention over the long context is done for many rows at once. No gap fits
such a step; a few do if it is cut between layers. The layers of a decoder are
applied one after another to the residual rows, and each writes its own K/V,
so running layers [0, a) in one gap and [a, b) in the next computes what one
forward computes: the same arithmetic on the same values, in the same order.
The numpy backend's tests hold the two to the same bits; on the GPU the
prefill's split-K atomics already make two whole forwards differ in the last
bits, and its tests hold the pieces to that spread.

    lf = backend.begin_layered(x, positions, write_slots, context_slots, pieces)   # inputs in place, nothing run
    while not backend.run_layer_piece(lf): ...                                    # one piece per call
    backend.abandon_layered(lf)                                                   # or give it up: its K/V rows
                                                                                  # are garbage, never read

A backend has at most one such forward in flight and refuses any other forward
meanwhile (the residual rows and tables between pieces are the backend's).
Only logits="none" forwards (the reconciler's appends) are run this way.
"""
from __future__ import annotations

from dataclasses import dataclass, field


def layer_pieces(num_layers: int, pieces: int) -> list[tuple[int, int]]:
    """[(first layer, end layer)] of `pieces` runs of consecutive layers, as even as they can be (the first
    ones one layer longer); at most one piece per layer."""
    if num_layers < 1 or pieces < 1:
        raise ValueError(f"layer_pieces: {pieces} pieces of {num_layers} layers")
    pieces = min(pieces, num_layers)
    base, extra = divmod(num_layers, pieces)
    out, start = [], 0
    for i in range(pieces):
        end = start + base + (1 if i < extra else 0)
        out.append((start, end))
        start = end
    return out


@dataclass
class LayeredForward:
    """One forward in flight, piece by piece (see the module docstring)."""
    rows: int                           # rows of the forward
    pieces: list                        # [(first layer, end layer)]
    done: int = 0                       # pieces run so far
    state: dict = field(default_factory=dict, repr=False)   # the backend's own (residual rows, tables)

    @property
    def finished(self) -> bool:
        return self.done >= len(self.pieces)

    @property
    def pieces_left(self) -> int:
        return len(self.pieces) - self.done

    def next_piece(self) -> tuple[int, int]:
        if self.finished:
            raise RuntimeError(f"LayeredForward: all {len(self.pieces)} pieces have run")
        return self.pieces[self.done]


class OneLayeredForward:
    """A backend's bookkeeping of its one forward in flight (a mixin of both backends, which need `spec`): each
    backend uploads and runs the pieces its own way, between _start_layered and _piece_ran."""

    _layered: LayeredForward | None = None

    def abandon_layered(self, lf: LayeredForward) -> None:
        """Give up a forward in flight: the K/V rows its pieces wrote are garbage (their slots are the caller's)."""
        if lf is self._layered:
            self._layered = None

    def _start_layered(self, rows: int, pieces: int) -> LayeredForward:
        self._layered = LayeredForward(rows=rows, pieces=layer_pieces(self.spec.num_layers, pieces))
        return self._layered

    def _next_layers(self, lf: LayeredForward) -> tuple[int, int]:
        if lf is not self._layered:
            raise RuntimeError("run_layer_piece: not the forward in flight on this backend")
        return lf.next_piece()

    def _piece_ran(self, lf: LayeredForward) -> bool:
        """Count the piece just run; True (and nothing in flight any more) once it was the last."""
        lf.done += 1
        if lf.finished:
            self._layered = None
        return lf.finished

    def _require_no_layered(self, what: str) -> None:
        if self._layered is not None:
            raise RuntimeError(f"{what}: a forward run piece by piece is in flight on this backend "
                               f"({self._layered.done} of {len(self._layered.pieces)} pieces run)")
