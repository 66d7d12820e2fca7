"""Reconciler steps whose forward runs piece by piece, gap after gap (asr.step_layer_pieces, core/gap_steps.py,
core/layered_append.py): the state they leave is the one whole steps leave, bit for bit, and the primary that
applies it matches HF transformers from scratch.

CPU: the numpy backend and the seeded tiny model (2 layers: pieces of one layer), real footage. The gaps are
simulated (what is left of a gap falls by each step's planned cost), and the scheduler's costs are seeded, so
the plan does not depend on this machine's speed; the forwards are real.
"""
import numpy as np
import pytest

from engine_oracle import cosine, oracle_logits
from test_reconciliation import COS_EXACT, Rig, contiguous, drain

from vla_edge_ros.core.gap_steps import PIECE_PATIENCE, GapSteps
from vla_edge_ros.core.reconciliation import Phase
from vla_edge_ros.core.slack_scheduler import SlackScheduler

GAP_MS = 20.0
COST_MS = {1: 12.0, 2: 16.0, 3: 20.0, 4: 24.0}     # a step of k frames; whole, only 1 fits a gap, in pieces 4


def _chunks(rig, ids):
    return [rig.driver.primary_chunk(i) for i in ids]


def test_an_append_run_piece_by_piece_leaves_the_state_one_forward_leaves(tiny_model_dir, model, clip):
    rig = Rig(tiny_model_dir, model, clip)
    for _ in range(6):
        rig.primary_only_cycle()
    chunks = _chunks(rig, rig.held()[:4])
    whole, pieced = (Rig(tiny_model_dir, model, clip).rec.state for _ in range(2))
    whole.append_chunks(chunks[:1])
    pieced.append_chunks(chunks[:1])
    whole.append_chunks(chunks[1:])
    assert pieced.begin_append(chunks[1:], pieces=2) == []
    assert pieced.appending and pieced.append_pieces_left == 2
    with pytest.raises(RuntimeError, match="piece by piece"):
        pieced.export_state()                     # its frames' K/V is not complete
    with pytest.raises(RuntimeError, match="piece by piece"):
        pieced.append_chunks(chunks[:1])
    assert not pieced.continue_append() and pieced.append_pieces_left == 1
    assert pieced.continue_append() and not pieced.appending
    a, b = whole.export_state(), pieced.export_state()
    assert a.frame_ids == b.frame_ids and a.next_position == b.next_position
    np.testing.assert_array_equal(a.kv, b.kv)
    assert whole.computed_tokens == pieced.computed_tokens


def test_an_append_given_up_leaves_the_state_as_before(tiny_model_dir, model, clip):
    rig = Rig(tiny_model_dir, model, clip)
    for _ in range(4):
        rig.primary_only_cycle()
    chunks = _chunks(rig, rig.held()[:3])
    state = Rig(tiny_model_dir, model, clip).rec.state
    state.append_chunks(chunks[:1])
    before, free = state.export_state(), state.kv.free_slots
    state.begin_append(chunks[1:], pieces=2)
    state.continue_append()
    assert state.kv.free_slots < free
    state.abandon_append()
    after = state.export_state()
    assert after.frame_ids == before.frame_ids and after.next_position == before.next_position
    assert state.kv.free_slots == free and sorted(state.frames) == before.frame_ids
    state.begin_append(chunks[1:], pieces=2)
    state.reset_frames()                          # an abort's reset gives the append up first
    assert not state.appending and state.export_state().frame_ids == []


def _seeded_scheduler(rig) -> SlackScheduler:
    tpf = rig.cfg.vision.tokens_per_frame
    sched = SlackScheduler(tpf, rig.cfg.asr.warmup_tokens_per_step, rig.cfg.asr.slack_margin_ms)
    for frames, ms in COST_MS.items():
        for _ in range(60):                       # the first of each size is its warm-up; then the median
            sched.observe(ms, frames * tpf)
    return sched


def _run_gaps(rig, pieces: int, gaps: int = 60):
    """Reconciler gaps of GAP_MS with the primary idle: drain, steps (GapSteps), an offer when due. Returns what
    each gap ran and whether a step was left in flight at its end, and GapSteps' summary."""
    rec, sched = rig.rec, _seeded_scheduler(rig)
    steps = GapSteps(rec, sched, pieces)
    log = []
    for _ in range(gaps):
        left = [GAP_MS]
        ran = []

        def record(kind, frames, ms):
            planned = sched.costs.estimate(frames)
            left[0] -= planned * (rec.state.piece_share(pieces) if kind == "piece" else 1.0)
            ran.append((kind, frames))
        rec.receive()
        sched.new_window(GAP_MS)
        steps.run(lambda: left[0], record)
        if rec.offer_due:
            rec.make_offer()
        log.append((ran, rec.step_in_flight))
        if rec.phase is Phase.READY:
            break
    return log, steps.summary()


def test_pieced_steps_spread_over_gaps_and_offer_the_bits_of_whole_steps(tiny_model_dir, model, clip, hf):
    """Whole steps only (the cap's 4 frames each, as tick takes them) against steps of 4 frames in two pieces of
    one layer, one piece per gap as the simulated gaps allow: the same offer, bit for bit; applied, the primary
    matches HF from scratch."""
    overrides = {"asr.mode": "csr", "kv.eviction_policy": "fifo"}
    whole = Rig(tiny_model_dir, model, clip, **overrides)
    pieced = Rig(tiny_model_dir, model, clip, **{**overrides, "asr.step_layer_pieces": 2})
    for rig in (whole, pieced):
        for _ in range(12):                       # the primary fills up; the reconciler is handed every chunk
            rig.cycle(reconcile=False)
    drain(whole.rec)
    log, summary = _run_gaps(pieced, pieces=2)
    assert whole.rec.phase is Phase.READY and pieced.rec.phase is Phase.READY, log
    kinds = [kind for ran, _ in log for kind, _ in ran]
    assert "piece" in kinds and "step" not in kinds, log
    assert any(in_flight for _, in_flight in log), "no step ever waited for the next gap"
    assert all(len(ran) <= 1 for ran, _ in log), "a gap of 20 ms fits one piece of 24 / 2 ms with headroom"
    assert summary["pieces_run"] == kinds.count("piece") == 2 * summary["pieced_steps"] > 0
    assert summary["pieced_steps_given_up"] == 0 and summary["step_layer_pieces"] == 2
    a, b = whole.rec.take_offer(), pieced.rec.take_offer()
    assert a.frame_ids == b.frame_ids and a.next_position == b.next_position
    np.testing.assert_array_equal(a.kv, b.kv)
    pieced.primary.state.import_state(b)          # at this boundary, as the driver would
    pieced.primary_only_cycle(new=False)
    assert pieced.primary.state.state_exact and contiguous(pieced.primary)
    assert cosine(pieced.primary.last_prefill_logits, oracle_logits(hf, pieced.primary)) >= COS_EXACT


def test_without_pieces_or_with_room_for_a_whole_step_no_step_runs_in_pieces(tiny_model_dir, model, clip):
    overrides = {"asr.mode": "csr", "kv.eviction_policy": "fifo"}
    rig = Rig(tiny_model_dir, model, clip, **overrides)
    for _ in range(12):
        rig.cycle(reconcile=False)
    log, summary = _run_gaps(rig, pieces=1)
    kinds = {kind for ran, _ in log for kind, _ in ran}
    assert kinds == {"step"} and not any(in_flight for _, in_flight in log)
    assert all(frames == 1 for ran, _ in log for _, frames in ran)     # 12 ms of a 20 ms gap: one frame a step
    assert summary["pieced_steps"] == summary["pieces_run"] == 0


def test_a_round_that_ends_while_a_step_is_in_flight_gives_the_step_up(tiny_model_dir, model, clip):
    """The primary restarted (its mirror cleared) while a step waited for its second piece: the step is given up
    with the round, and the reconciler's state holds none of its frames."""
    rig, rec, steps = _a_step_in_flight(tiny_model_dir, model, clip)
    assert rec.state.appending
    rec.restart_mirror()
    rec.receive()
    assert not rec.step_in_flight and not rec.state.appending and rec.state.export_state().frame_ids == []
    assert steps.run(lambda: GAP_MS) == (0, 0.0, False)
    assert steps.summary()["pieced_steps_given_up"] == 1 and steps.summary()["pieced_steps"] == 0


def test_the_last_frames_of_a_round_take_a_whole_step_where_one_fits(tiny_model_dir, model, clip):
    """Pieces only pay for a step of more frames than fit whole: one frame left to catch up, in a gap where a
    one-frame step fits, is computed whole rather than over two gaps."""
    rig = Rig(tiny_model_dir, model, clip, **{"asr.mode": "csr", "kv.eviction_policy": "fifo",
                                              "asr.step_layer_pieces": 2})
    for _ in range(12):
        rig.cycle(reconcile=False)
    assert _run_gaps(rig, pieces=2)[0][-1][0], "the round never got ready"
    rig.primary_only_cycle()                      # one more frame: the round catches up on it
    log, _ = _run_gaps(rig, pieces=2)
    assert log[0] == ([("step", 1)], False) and rig.rec.phase is Phase.READY, log


def _a_round(tiny_model_dir, model, clip):
    """A primary with steps in 2 pieces configured, 12 cycles in: the reconciler has a round to compute."""
    rig = Rig(tiny_model_dir, model, clip, **{"asr.mode": "csr", "kv.eviction_policy": "fifo",
                                              "asr.step_layer_pieces": 2})
    for _ in range(12):
        rig.cycle(reconcile=False)
    return rig


def _a_step_in_flight(tiny_model_dir, model, clip):
    """A round whose first gap started a 4-frame step in 2 pieces and ran out after its first piece."""
    rig = _a_round(tiny_model_dir, model, clip)
    rec, steps = rig.rec, GapSteps(rig.rec, _seeded_scheduler(rig), 2)
    left = [GAP_MS]
    rec.receive()
    steps.run(lambda: left[0], lambda kind, frames, ms: left.__setitem__(0, 0.0))
    assert rec.step_in_flight and rec.in_flight_frames == 4
    return rig, rec, steps


def test_a_tick_finishes_a_step_begun_in_pieces(tiny_model_dir, model, clip):
    """The node's worker ticks (whole steps, no schedule) when the primary's cycle clock is stale; a step left in
    flight by the slack schedule is finished there, all its pieces at once, and the round goes on."""
    rig, rec, _steps = _a_step_in_flight(tiny_model_dir, model, clip)
    todo = rec.frames_to_compute
    assert rec.tick() == 4 * rig.cfg.vision.tokens_per_frame and not rec.step_in_flight
    assert rec.frames_to_compute == todo - 4
    drain(rec)
    assert rec.phase is Phase.READY


def test_a_piece_that_fails_leaves_no_step_in_flight(tiny_model_dir, model, clip):
    """A piece's forward that raises (a device error) gives its step up in the state and in the reconciler alike:
    the next tick or gap does not go on with a step the state no longer has."""
    rig, rec, _steps = _a_step_in_flight(tiny_model_dir, model, clip)
    todo = rec.frames_to_compute
    backend = rec.state.backend
    real_piece = backend.run_layer_piece

    def failing_piece(lf):                        # the device fails this once
        raise RuntimeError("device fault in a piece")

    backend.run_layer_piece = failing_piece
    with pytest.raises(RuntimeError, match="device fault"):
        rec.step_piece()
    backend.run_layer_piece = real_piece
    assert not rec.step_in_flight and not rec.state.appending and rec.frames_to_compute == todo
    drain(rec)                                    # the round goes on with whole steps
    assert rec.phase is Phase.READY


def test_a_step_in_pieces_whose_pieces_stop_fitting_is_given_up_for_one_that_fits(tiny_model_dir, model, clip):
    """The gaps shrink under a step begun in pieces (the primary's cycles grow with its state): its next piece,
    of a fixed size, never fits again and nothing relaxes it, while a smaller step would fit. After PIECE_PATIENCE
    plans it is given up (its frames are computed by a later step) and the round goes on in steps that fit."""
    rig = _a_round(tiny_model_dir, model, clip)
    rec, sched = rig.rec, _seeded_scheduler(rig)
    steps = GapSteps(rec, sched, 2)
    share = rec.state.piece_share(2)

    def gap(ms):
        left, ran = [ms], []

        def record(kind, frames, _ms):
            left[0] -= sched.costs.estimate(frames) * (share if kind == "piece" else 1.0)
            ran.append((kind, frames))
        rec.receive()
        sched.new_window(ms)
        steps.run(lambda: left[0], record)
        return ran

    assert gap(GAP_MS) == [("piece", 4)] and rec.in_flight_frames == 4
    small = next(ms for ms in np.arange(GAP_MS, 0.0, -0.25) if 1 <= sched.fitting_frames(ms, share=share) < 4)
    todo = rec.frames_to_compute
    runs = [gap(small) for _ in range(PIECE_PATIENCE)]
    assert steps.summary()["pieced_steps_given_up"] == 1, runs
    assert rec.frames_to_compute < todo, "the round made no progress in the smaller gaps"
    assert all(frames < 4 for run in runs for _kind, frames in run), runs
