"""The reconciler's steps in one gap of the primary's slack: whole steps, or one step of many frames piece by piece.

Both drivers run this loop (the reconciler node's core/swap_protocol.ReconcilerWorker, and bench asr's
core/in_process_asr.InProcessAsr): while the round has frames to compute, plan the largest whole step that fits
what is left of the gap (core/slack_scheduler.py), run it, wait for its device work, time it.

With asr.step_layer_pieces P > 1 a step may also run piece by piece (core/layered_append.py): when a step of more
frames fits if only its largest piece of layers (about 1/P of it) has to fit the gap, that step is started
instead, and its pieces run one after another in this gap and the next ones, each only when its estimated cost
fits. Its measured cost (the sum of its pieces' times) is observed as one step of its size when its last piece
has run, so whole and pieced steps share one cost model. Why: at 32768 slots on the H200 one frame took 5.7 ms in
~6 ms gaps and eight 12.3 ms (notes/cuda_notes.md, twentieth session), so rounds caught up no faster than the
camera added frames.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

# A step begun in pieces whose next piece has not fitted this many plans in a row (the node plans twice per gap)
# is given up and planned afresh: the gaps shrank under it (the primary's cycles grow with its state), and a piece
# of fixed size never relaxes into them while a smaller step would fit.
PIECE_PATIENCE = 8


@dataclass
class _Pieced:
    """A step running piece by piece: its size, the context it started with, its pieces' time so far."""
    frames: int
    context: int
    ms: float = 0.0
    host_ms: float = 0.0
    declined: int = 0               # plans in a row its next piece did not fit


class GapSteps:
    def __init__(self, reconciler, scheduler, pieces: int = 1):
        self.rec = reconciler
        self.sched = scheduler
        self.pieces = max(1, int(pieces))
        self._pieced: _Pieced | None = None
        self.pieced_steps = 0            # steps run piece by piece to their end
        self.pieces_run = 0
        self.pieced_given_up = 0         # steps in pieces not finished here: their round ended before their last
                                         # piece, a tick finished them (no primary cycles to leave room for), or
                                         # their pieces stopped fitting the gaps (PIECE_PATIENCE)

    def summary(self) -> dict:
        """What the steps in pieces did (the diagnostics' and bench asr's reconciler figures)."""
        return {"step_layer_pieces": self.pieces, "pieced_steps": self.pieced_steps, "pieces_run": self.pieces_run,
                "pieced_steps_given_up": self.pieced_given_up}

    def run(self, ms_left, record=None, guard=None) -> tuple[int, float, bool]:
        """Steps (and pieces) while the next fits; ms_left(): what is left of the gap now. record(kind, frames, ms)
        is told of each ('step' or 'piece'); guard(call) runs each call that may raise (the in-process driver stops
        a failing reconciler there). Returns (tokens computed, seconds spent, whether anything fitted)."""
        rec, sched = self.rec, self.sched
        guard = guard or (lambda call: call())
        total, spent, fitted = 0, 0.0, False
        if self._pieced is not None and not rec.step_in_flight:   # its round ended, or a tick finished it
            self._count_given_up()
        while rec.frames_to_compute:
            if rec.step_in_flight:
                if self._pieced is None:              # started elsewhere: planned at the context it started with
                    started = rec.in_flight_frames
                    self._pieced = _Pieced(started, rec.state.kv.used_slots - started * rec.tpf)
                p = self._pieced
                share = rec.state.piece_share(self.pieces)
                if not sched.plan_piece(ms_left(), p.frames, share, p.context):
                    p.declined += 1
                    if p.declined < PIECE_PATIENCE:
                        break
                    rec.give_up_step()                # its frames go to a step that fits the gaps as they are now
                    self._count_given_up()
                    continue
                p.declined = 0
                fitted = True
                tokens, ms, host_ms = self._timed(rec.step_piece, guard)
                spent += ms / 1e3
                self.pieces_run += 1
                p.ms, p.host_ms = p.ms + ms, p.host_ms + host_ms
                if record is not None:
                    record("piece", p.frames, ms)
                if tokens:                            # its last piece: observed as one step of its size
                    sched.observe(p.ms, tokens, host_ms=p.host_ms, context_tokens=p.context)
                    total += tokens
                    self._pieced = None
                    self.pieced_steps += 1
                elif not rec.step_in_flight:          # the round ended meanwhile: its step was given up
                    self._count_given_up()
                continue
            context = rec.state.kv.used_slots         # what the step's rows attend to besides themselves
            left = ms_left()
            if self.pieces > 1 and self._start_pieced(left, context, guard):
                continue
            frames = sched.frames_for(left, context)
            if frames == 0:
                break
            fitted = True
            tokens, ms, host_ms = self._timed(lambda: rec.step(frames * rec.tpf), guard)
            spent += ms / 1e3
            sched.observe(ms, tokens, host_ms=host_ms, context_tokens=context)
            if record is not None and tokens:
                record("step", tokens // rec.tpf, ms)
            total += tokens
            if not tokens:                            # the round was aborted
                break
        return total, spent, fitted

    def offer(self, ms_left, record=None, guard=None) -> bool:
        """The round's offer, if one is due and its planned cost fits what is left of the gap: made, its device work
        waited for and timed for the schedule; record("offer", 0, ms) is told. True if one was made."""
        rec, sched = self.rec, self.sched
        guard = guard or (lambda call: call())
        if not (rec.offer_due and sched.offer_fits(ms_left())):
            return False
        made, ms, _host_ms = self._timed(rec.make_offer, guard)    # the export: device work too
        if not made:                          # the in-process driver's guard stopped a failing reconciler
            return False
        sched.observe_offer(ms)
        if record is not None:
            record("offer", 0, ms)
        return True

    def _count_given_up(self) -> None:
        """The step in pieces is no longer run here (pieced_given_up says why it can be)."""
        self._pieced = None
        self.pieced_given_up += 1

    def _start_pieced(self, left_ms: float, context: int, guard) -> bool:
        """Start a step piece by piece when it holds more frames than a whole step that fits now; True if one
        started (its first piece runs next, if it fits)."""
        rec, sched = self.rec, self.sched
        share = rec.state.piece_share(self.pieces)
        # Only as many frames as the round has left: its last one or two, when a whole step fits them, are not
        # spread over several gaps.
        big = min(sched.fitting_frames(left_ms, context, share), rec.frames_to_compute)
        if big <= sched.fitting_frames(left_ms, context) or not rec.state.append_fits_pieces(big):
            return False
        started = guard(lambda: rec.begin_step(big * rec.tpf, self.pieces))
        if not started:
            return False
        self._pieced = _Pieced(started, context)
        return True

    def _timed(self, call, guard) -> tuple:
        """guard(call) with its device work waited for: (its result, ms in all, ms before the device work was
        queued)."""
        t0 = time.perf_counter()
        out = guard(call)
        queued = time.perf_counter()              # host work done, the device work queued (or done, on the CPU)
        guard(self.rec.state.backend.synchronize)     # the device work is done: time it, leave the GPU idle
        end = time.perf_counter()
        return out, (end - t0) * 1e3, (queued - t0) * 1e3
