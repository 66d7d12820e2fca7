"""The composed cycle on the tiny model with the numpy backend, checked against HF transformers.

Real parts only: the seeded tiny model written to disk, the real vision
encoder, real footage frames, and HuggingFace transformers recomputing the
same context from scratch as the oracle for the action tokens.
"""

import numpy as np
import pytest

from vla_edge_ros.core.engine_factory import primary_engine
from vla_edge_ros import config as C
from vla_edge_ros.core import cycle_result as R
from vla_edge_ros.core.engine import NO_SWAP_ROOM, EngineConfigError
from vla_edge_ros.core.footage import read_clip
from vla_edge_ros.core.frames import Frame
from vla_edge_ros.core.prompt import encode_text, prefix_text
from vla_edge_ros.model.weights import round_to_bf16


@pytest.fixture(scope="module")
def clip():
    return read_clip("bikes.mp4", max_frames=12)


def make_engine(model_dir, **overrides):
    cfg = C.load(overrides={"model.path": str(model_dir), "model.backend": "numpy", **overrides})
    return primary_engine(cfg)


def frame(pixels, i, stamp=None):
    return Frame(pixels=pixels, stamp_s=float(i) if stamp is None else stamp, frame_id=i)


def test_action_tokens_equal_hf_recomputing_the_whole_context(tiny_model_dir, clip):
    """Before any eviction the cached state is exact, so HF on the full sequence must pick the same bins."""
    import torch
    from vla_edge_ros.model.hf_oracle import load_hf_model

    eng = make_engine(tiny_model_dir, **{"cycle.deterministic": True})
    hf = load_hf_model(tiny_model_dir)
    emb = hf.get_input_embeddings()
    lo = eng.backend.spec.vocab_size - eng.cfg.action.num_bins
    prefix = encode_text(eng.tokenizer, prefix_text(eng.cfg.prompt))
    vision_rows = []
    for i, px in enumerate(clip[:5]):
        res = eng.run_cycle(frame(px, i), now_s=float(i))
        assert res.is_action, res.detail
        vision_rows.append(eng.state.encoder.encode(px).tokens)
        with torch.inference_mode():
            x = torch.cat([emb(torch.from_numpy(prefix)),
                           torch.from_numpy(np.concatenate(vision_rows)),
                           emb(torch.from_numpy(eng.suffix))])[None]
            pos = torch.arange(x.shape[1])[None]
            out = hf(inputs_embeds=x, position_ids=pos, use_cache=True)
            cache, tokens = out.past_key_values, [lo + int(out.logits[0, -1, lo:].argmax())]
            for step in range(eng.cfg.action.num_tokens - 1):
                out = hf(input_ids=torch.tensor([[tokens[-1]]]), past_key_values=cache, use_cache=True,
                         position_ids=torch.tensor([[x.shape[1] + step]]))
                tokens.append(lo + int(out.logits[0, -1, lo:].argmax()))
        assert res.tokens.tolist() == tokens, f"cycle {i}"
        assert np.all(np.abs(res.action) <= 1.0)
    assert eng.state_summary()["frames"] == 5


def test_every_cycle_ends_in_exactly_one_outcome_with_the_right_reason(tiny_model_dir, clip):
    eng = make_engine(tiny_model_dir)
    r = eng.run_cycle(None, now_s=0.0)
    assert r.reason == R.NO_FRAME and r.action is None
    r = eng.run_cycle(frame(clip[0], 1, stamp=0.0), now_s=10.0)
    assert r.reason == R.STALE_FRAME and "old" in r.detail
    r = eng.run_cycle(frame(clip[1], 2, stamp=10.0), now_s=10.0)
    assert r.is_action or r.reason == R.DEADLINE_MISSED
    ids = [eng.run_cycle(frame(clip[3 + k], 3 + k, stamp=10.0), now_s=10.0).cycle_id for k in range(3)]
    assert ids == [3, 4, 5]
    s = eng.metrics.summary()
    assert s["cycles"] == 6
    assert s["actions"] + s["fallbacks"] == 6


def test_a_budget_too_small_is_refused_before_any_work(tiny_model_dir, clip):
    # 3 ms deadline with a 2.9 ms margin: after the first (always admitted) cycle nothing fits.
    eng = make_engine(tiny_model_dir, **{"cycle.deadline_ms": 3.0, "cycle.safety_margin_ms": 2.9})
    first = eng.run_cycle(frame(clip[0], 0), now_s=0.0)
    assert first.reason in (None, R.DEADLINE_MISSED)      # admitted: no history yet
    frames_before = eng.state_summary()["frames"]
    second = eng.run_cycle(frame(clip[1], 1), now_s=1.0)
    assert second.reason == R.REFUSED_BUDGET
    assert second.estimate_ms > second.budget_ms
    assert eng.state_summary()["frames"] == frames_before  # refused means nothing was started


def test_late_result_becomes_deadline_missed_not_an_action(tiny_model_dir, clip):
    eng = make_engine(tiny_model_dir, **{"cycle.deadline_ms": 0.5, "cycle.safety_margin_ms": 0.0})
    r = eng.run_cycle(frame(clip[0], 0), now_s=0.0)       # first cycle is admitted, and cannot finish in 0.5 ms
    assert r.reason == R.DEADLINE_MISSED and r.action is None and r.overran


def test_the_same_frame_is_answered_without_growing_the_state(tiny_model_dir, clip):
    eng = make_engine(tiny_model_dir, **{"cycle.deterministic": True})
    a = eng.run_cycle(frame(clip[0], 7), now_s=7.0)
    b = eng.run_cycle(frame(clip[0], 7), now_s=7.0)
    assert a.new_frame and not b.new_frame
    assert eng.state_summary()["frames"] == 1
    assert a.tokens.tolist() == b.tokens.tolist()       # same state, same suffix: same answer


def test_new_instruction_changes_only_the_suffix(tiny_model_dir, clip):
    eng = make_engine(tiny_model_dir, **{"cycle.deterministic": True})
    eng.run_cycle(frame(clip[0], 0), now_s=0.0)
    prefix_before = eng.state_summary()["prefix_tokens"]
    eng.set_instruction("place the cup on the shelf and then wave")
    r = eng.run_cycle(frame(clip[0], 0), now_s=0.0)
    assert r.is_action
    assert eng.state_summary()["prefix_tokens"] == prefix_before
    assert eng.state_summary()["frames"] == 1


def test_eviction_keeps_the_state_bounded_forever(tiny_model_dir, clip):
    # Room for the prefix, a handful of frames and one suffix: eviction must start and never stop.
    eng = make_engine(tiny_model_dir, **{"cycle.deterministic": True, "kv.capacity_tokens": 320})
    for i in range(40):
        r = eng.run_cycle(frame(clip[i % len(clip)], i), now_s=float(i))
        assert r.is_action, r.detail
    s = eng.state_summary()
    assert s["evictions"] > 0
    assert s["frames"] * 32 + s["prefix_tokens"] <= 320
    assert eng.metrics.summary()["evictions"] == s["evictions"]


def test_nan_in_the_encoder_is_an_engine_error_and_the_next_cycle_recovers(tiny_model_dir, clip):
    eng = make_engine(tiny_model_dir, **{"cycle.deterministic": True})
    good = eng.state.encoder.weight.copy()
    eng.state.encoder.weight[:] = np.nan
    bad = eng.run_cycle(frame(clip[0], 0), now_s=0.0)
    assert bad.reason == R.ENGINE_ERROR and "NaN" in bad.detail
    assert eng.state_summary()["frames"] == 0             # the poisoned frame is not kept
    eng.state.encoder.weight[:] = good
    ok = eng.run_cycle(frame(clip[1], 1), now_s=1.0)
    assert ok.is_action, ok.detail


def test_nan_logits_are_an_engine_error_and_the_poisoned_frame_is_forgotten(tiny_model_dir, clip):
    eng = make_engine(tiny_model_dir, **{"cycle.deterministic": True})
    norm = eng.backend._final_norm
    good = norm.copy()
    norm[:] = np.nan                                      # corrupt weights in memory, as a bad upload would
    bad = eng.run_cycle(frame(clip[0], 0), now_s=0.0)
    assert bad.reason == R.ENGINE_ERROR and "non-finite" in bad.detail
    assert eng.state_summary()["frames"] == 0
    norm[:] = good
    ok = eng.run_cycle(frame(clip[1], 1), now_s=1.0)
    assert ok.is_action, ok.detail


def test_a_frame_stamped_far_in_the_future_is_stale_not_fresh_for_ever(tiny_model_dir, clip):
    """Its age, now minus its stamp, is negative and would never pass cycle.stale_frame_ms: the policy kept acting
    on it after the camera stopped. A skew within the bound (a camera clock a little ahead) is served."""
    eng = make_engine(tiny_model_dir, **{"cycle.deterministic": True})
    ahead = eng.run_cycle(frame(clip[0], 0, stamp=10.0 + 3600.0), now_s=10.0)
    assert ahead.reason == R.STALE_FRAME and "in the future" in ahead.detail
    skew = eng.cfg.cycle.stale_frame_ms / 2e3
    assert eng.run_cycle(frame(clip[1], 1, stamp=10.0 + skew), now_s=10.0).is_action


def test_a_failure_before_the_cycle_runs_is_an_engine_error_too(tiny_model_dir, clip):
    """What a swap left to the cycle and a position re-base run before the cycle's own work: a failure there (here
    a re-base's budget from a setting that is not a number, as a NaN safety margin gave before the config refused
    it) ends the cycle as an engine_error fallback; it used to raise out of run_cycle and stop the reasoning node."""
    eng = make_engine(tiny_model_dir, **{"cycle.deterministic": True})
    budget = eng._rebase_budget_frames

    def broken():
        raise ValueError("cannot convert float NaN to integer")

    eng._rebase_budget_frames = broken
    bad = eng.run_cycle(frame(clip[0], 0), now_s=0.0)
    assert bad.reason == R.ENGINE_ERROR and "before the cycle" in bad.detail and "NaN" in bad.detail
    eng._rebase_budget_frames = budget
    ok = eng.run_cycle(frame(clip[1], 1), now_s=1.0)
    assert ok.is_action, ok.detail


def test_a_failure_repeating_every_cycle_is_a_fallback_each_time_and_one_traceback(tiny_model_dir, clip, caplog):
    """A persistent fault (here the KV arena made read-only, as a broken device buffer would be) must
    not stop the cycles or flood the log: every cycle is an engine_error fallback naming the cause,
    the traceback is logged once, then repeats are only counted."""
    eng = make_engine(tiny_model_dir, **{"cycle.deterministic": True})
    eng.backend._k.flags.writeable = False
    with caplog.at_level("INFO", logger="vla_edge_ros.core.engine"):
        results = [eng.run_cycle(frame(clip[i % len(clip)], i), now_s=float(i)) for i in range(40)]
    assert all(r.reason == R.ENGINE_ERROR and "read-only" in r.detail for r in results), {r.detail for r in results}
    tracebacks = [rec for rec in caplog.records if rec.exc_info]
    assert len(tracebacks) == 1, [rec.getMessage() for rec in caplog.records]
    assert len(caplog.records) <= 2, [rec.getMessage() for rec in caplog.records]   # + at most one count line
    eng.backend._k.flags.writeable = True
    assert eng.run_cycle(frame(clip[0], 100), now_s=100.0).is_action


def test_capacity_too_small_for_the_prefix_is_refused_at_configure(tiny_model_dir):
    with pytest.raises(EngineConfigError, match="capacity"):
        make_engine(tiny_model_dir, **{"kv.capacity_tokens": 90})


def test_memory_ceiling_is_checked_before_allocating(tiny_model_dir):
    with pytest.raises(EngineConfigError, match="vram_ceiling"):
        make_engine(tiny_model_dir, **{"memory.vram_ceiling_gib": 1e-6})


@pytest.mark.parametrize("kv_dtype", ["float32", "bfloat16"])
def test_state_exported_from_one_engine_and_imported_into_another_answers_identically(tiny_model_dir, clip, tmp_path,
                                                                                      kv_dtype):
    a = make_engine(tiny_model_dir, **{"cycle.deterministic": True, "kv.dtype": kv_dtype})
    b = make_engine(tiny_model_dir, **{"cycle.deterministic": True, "kv.dtype": kv_dtype})
    assert a.backend.kv_dtype == kv_dtype                 # kv.dtype reaches the backend through engine_factory
    for i in range(4):
        a.state.append_frame(frame(clip[i], i))
    snap = a.state.export_state(version=3)
    if kv_dtype == "bfloat16":                            # the snapshot's float32 KV holds the arena's bf16 values
        np.testing.assert_array_equal(round_to_bf16(snap.kv), snap.kv)
    path = snap.save(tmp_path / "snap.npz")
    b.state.import_state(type(snap).load(path))
    assert b.state_summary()["frames"] == 4
    same = frame(clip[3], 3)                              # already in both states: only the suffix is computed
    ra, rb = a.run_cycle(same, now_s=3.0), b.run_cycle(same, now_s=3.0)
    assert ra.tokens.tolist() == rb.tokens.tolist()
    with pytest.raises(ValueError, match="kv must be"):
        b.backend.write_kv(np.arange(2, dtype=np.int32), snap.kv)


def test_positions_are_rebased_before_they_leave_the_models_trained_range(tiny_model_dir, clip, tmp_path):
    """No reconciler: positions grow by 32 per frame; past max_position_embeddings the state is recomputed."""
    import json
    import shutil

    small = tmp_path / "tiny_600"
    shutil.copytree(tiny_model_dir, small)
    cfg_json = json.loads((small / "config.json").read_text())
    cfg_json["max_position_embeddings"] = 600            # a model trained on 600 positions
    (small / "config.json").write_text(json.dumps(cfg_json))
    eng = make_engine(small, **{"cycle.deterministic": True, "kv.capacity_tokens": 320})
    rebases = []
    for i in range(30):
        r = eng.run_cycle(frame(clip[i % len(clip)], i), now_s=float(i))
        assert r.is_action, r.detail
        assert eng.state.next_position + eng.suffix.size <= 600
        rebases.append("re-based" in r.detail)
    assert sum(rebases) >= 2                              # it happens, and again later
    # After a rebase the frames sit right after the prefix, as a from-scratch forward would place them.
    starts = [f.position_start for f in eng.state.kv.retained()]
    assert starts == sorted(starts) and starts[0] >= eng.state.prefix_tokens


def test_a_rebase_in_a_live_cycle_recomputes_only_what_fits_its_budget(tiny_model_dir, clip, tmp_path):
    """Live (not deterministic): the re-base keeps the newest frames its cycle's slack can recompute and
    forgets the older ones, so that cycle is not late. On the H200 recomputing all 125 frames took ~400 ms."""
    import json
    import shutil

    small = tmp_path / "tiny_600"
    shutil.copytree(tiny_model_dir, small)
    cfg_json = json.loads((small / "config.json").read_text())
    cfg_json["max_position_embeddings"] = 600
    (small / "config.json").write_text(json.dumps(cfg_json))
    eng = make_engine(small, **{"cycle.deterministic": False, "kv.capacity_tokens": 320, "cycle.stale_frame_ms": 1e9})
    adm = eng.admission
    details = []
    for i in range(30):
        # A known cost model (the slack of 33 - 2 ms fits 2.5 frames beside the cycle itself, each planned at
        # kv.recompute_headroom times the prefill's cost per frame), set before each cycle so real timings on a busy
        # machine cannot move it.
        adm.has_sample, adm.ema_decode_ms_per_token, adm.ema_other_ms, adm.tail_quantile = True, 0.0, 0.0, 0.0
        tpf, headroom = eng.cfg.vision.tokens_per_frame, eng.cfg.kv.recompute_headroom
        adm.ema_prefill_ms_per_token = (eng.cfg.cycle.deadline_ms - eng.cfg.cycle.safety_margin_ms) / (
            (1 + 2.5 * headroom) * tpf + int(eng.suffix.size))
        r = eng.run_cycle(frame(clip[i % len(clip)], i), now_s=float(i))
        if "re-based" in r.detail:
            details.append(r.detail)
            assert eng.state.last_rebase["kept"] == 2 and eng.state.last_rebase["budget_frames"] == 2
            assert len(eng.state.frames) == 3             # the two kept and this cycle's new frame
    assert details and all("2 frames kept" in d for d in details), details


def test_a_swap_recompute_is_planned_on_the_slow_end_of_recent_cycles(tiny_model_dir):
    eng = make_engine(tiny_model_dir)
    assert eng.swap_recompute_budget_frames(30.0) is None          # nothing measured: not bounded
    adm, tpf = eng.admission, eng.cfg.vision.tokens_per_frame
    adm.observe(0.25 * tpf, tpf, 1.0, 1)                           # seeds 0.25 ms per prefill token
    margin = eng.cfg.cycle.safety_margin_ms
    per_frame = 0.25 * tpf
    assert eng.swap_recompute_budget_frames(30.0) == int((30.0 - margin) // (per_frame * eng.cfg.kv.recompute_headroom))
    for _ in range(20):                                            # cycles 1.3x slower than predicted
        adm.observe(0.25 * tpf * 1.3, tpf, 1.3, 1)
    assert adm.tail_factor > 1.2
    headroom = eng.cfg.kv.recompute_headroom
    planned = int((30.0 - margin) // (adm.ema_prefill_ms_per_token * tpf * adm.tail_factor * headroom))
    assert eng.swap_recompute_budget_frames(30.0) == planned < int((30.0 - margin) // per_frame)
    assert eng.swap_recompute_budget_frames(margin) == 0
    # A lone frame's measured recompute, dearer than the cycle's per-token rate says, is what is planned on.
    eng.state.note_recompute(3 * 12.0, 3)
    assert eng.swap_recompute_budget_frames(30.0) == int((30.0 - margin) // (12.0 * adm.tail_factor * headroom))
    # With enough recomputes measured, their own slow end: 1 in 8 took 3x the rest.
    assert eng.state.recompute_ms_per_frame_tail is None
    for i in range(40):
        eng.state.note_recompute(12.0 * (3 if i % 8 == 0 else 1), 1)
    tail = eng.state.recompute_ms_per_frame_tail
    assert tail == pytest.approx(36.0)
    assert eng.swap_recompute_budget_frames(100.0) == int((100.0 - margin) // (tail * headroom))
    # Room is kept for what a swap costs besides its recompute (checks, placing, the KV copy), at its slow end;
    # a slack that cannot take even that leaves the offer for the next boundary.
    for ms in [2.0] * 19 + [6.0]:
        eng.state._note_swap_fixed(ms)
    fixed = eng.state.swap_fixed_ms_tail
    assert 2.0 < fixed <= 6.0
    assert eng.swap_recompute_budget_frames(100.0) == int((100.0 - margin - fixed) // (tail * headroom))
    assert eng.swap_recompute_budget_frames(margin + fixed - 0.1) == NO_SWAP_ROOM


def test_recomputes_cheaper_than_the_cycles_rate_are_planned_on_once_enough_are_measured(tiny_model_dir):
    """On the H200 a swap's late frames go through the bulk prefill (~0.4 ms a frame) while the cycle's short
    prefill prices a frame at ~8.8 ms: with the cycles' rate as a floor, the boundary's room took at most one late
    frame, and offers with two were deferred. A few cheap samples do not lift the floor (TAIL_MIN_SAMPLES: the
    cycles' rate is all that is known); once that many are in, their own cost is what a swap, a re-base and the
    next cycle's late room are planned on."""
    from vla_edge_ros.core.sample_window import TAIL_MIN_SAMPLES
    eng = make_engine(tiny_model_dir, **{"asr.swap_finish": "next_cycle", "asr.max_late_chunks": 4})
    adm, tpf = eng.admission, eng.cfg.vision.tokens_per_frame
    adm.observe(0.25 * tpf + 1.0, tpf, 1.0, 1)                     # cycles: 0.25 ms per prefill token
    cycle_frame_ms, cheap_ms = 0.25 * tpf, 0.02 * tpf
    headroom, margin = eng.cfg.kv.recompute_headroom, eng.cfg.cycle.safety_margin_ms
    for _ in range(TAIL_MIN_SAMPLES - 1):
        eng.state.note_recompute(cheap_ms, 1)
    floor_budget = eng.swap_recompute_budget_frames(30.0)
    assert floor_budget == int((30.0 - margin) // (cycle_frame_ms * adm.tail_factor * headroom))
    floor_plans = (floor_budget, eng._rebase_budget_frames(), eng.next_cycle_late_room())
    eng.state.note_recompute(cheap_ms, 1)
    assert eng.state.recompute_ms_per_frame_tail == pytest.approx(cheap_ms)
    assert eng.swap_recompute_budget_frames(30.0) == int((30.0 - margin) // (cheap_ms * adm.tail_factor * headroom))
    measured_plans = (eng.swap_recompute_budget_frames(30.0), eng._rebase_budget_frames(), eng.next_cycle_late_room())
    assert all(m > f for m, f in zip(measured_plans[:2], floor_plans[:2])), (floor_plans, measured_plans)
    assert measured_plans[2] >= floor_plans[2] and measured_plans[2] == eng.cfg.asr.max_late_chunks


def test_one_slow_recompute_cannot_price_every_later_swap_and_rebase_out_of_the_slack(tiny_model_dir):
    """Recomputes are measured only when one runs: a single hiccup (86 ms once in a CPU soak) folded into an average
    left every later swap and re-base a budget of 0 frames, so no new sample ever came. The plan takes the median
    of recent samples, and counts it up to kv.recompute_estimate_cap x the cycles' own estimate of a frame (which
    every cycle refreshes) when the samples at hand are slow ones."""
    def engine(cap):
        eng = make_engine(tiny_model_dir, **{"kv.recompute_estimate_cap": cap})
        tpf = eng.cfg.vision.tokens_per_frame
        eng.admission.observe(0.05 * tpf, tpf, 0.5, 1)             # cycles: 0.05 ms per prefill token, short decode
        return eng, tpf

    def budgets(eng):
        return eng.swap_recompute_budget_frames(20.0), eng._rebase_budget_frames()

    eng, tpf = engine(8.0)
    for _ in range(30):                                             # ordinary lone-frame recomputes: 2x the cycles'
        eng.state.note_recompute(0.1 * tpf, 1)
    before = budgets(eng)
    assert min(before) >= 2
    eng.state.note_recompute(1000.0, 1)                             # one hiccup: the plan does not move
    assert budgets(eng) == before
    (capped, _), (uncapped, _) = engine(8.0), engine(1e9)
    for e in (capped, uncapped):                                    # nothing measured but slow recomputes
        for _ in range(3):
            e.state.note_recompute(1000.0, 1)
    assert min(budgets(capped)) >= 1 and budgets(uncapped) == (0, 0)


def test_warm_up_measures_a_frame_recompute_and_a_swap_measures_it_again(tiny_model_dir, clip):
    eng = make_engine(tiny_model_dir)
    eng.warm_up(4, clip[0])
    seeded = eng.state.recompute_ms_per_frame
    assert seeded is not None and seeded > 0
    eng.state.note_recompute(float("nan"), 1)                       # not a measurement: ignored
    assert eng.state.recompute_ms_per_frame == seeded
    # The median of recent samples: one slow one (a hiccup) does not move it, a lasting change does.
    st = make_engine(tiny_model_dir).state
    for _ in range(3):
        st.note_recompute(2.0, 1)
    st.note_recompute(44.0, 2)                                      # 22 ms per frame, once
    assert st.recompute_ms_per_frame == 2.0
    for _ in range(3):
        st.note_recompute(22.0, 1)
    assert st.recompute_ms_per_frame == 22.0


def test_a_cycle_that_will_be_late_gives_up_between_decode_steps_and_keeps_its_frame(tiny_model_dir, clip):
    # A 3 ms deadline the tiny model's prefill alone outruns, with an estimate that admits the cycle anyway.
    eng = make_engine(tiny_model_dir, **{"cycle.deadline_ms": 3.0, "cycle.safety_margin_ms": 0.1,
                                         "cycle.stale_frame_ms": 1e9})
    adm = eng.admission
    adm.has_sample, adm.ema_prefill_ms_per_token, adm.ema_decode_ms_per_token, adm.ema_other_ms = True, 1e-4, 1e-4, 0.0
    r = eng.run_cycle(frame(clip[0], 0), now_s=0.0)
    steps = eng.cfg.action.num_tokens - 1
    assert r.reason == R.DEADLINE_MISSED and "given up after" in r.detail, r.detail
    assert f"of {steps + 1} action tokens" in r.detail and r.action is None
    assert r.new_frame and 0 in eng.state.frames                       # the prefill's KV is kept: it is exact
    assert eng.state.computed_tokens["decode"] < steps
    # Deterministic replay acts on every cycle, late or not: nothing is given up there.
    det = make_engine(tiny_model_dir, **{"cycle.deadline_ms": 3.0, "cycle.safety_margin_ms": 0.1,
                                         "cycle.stale_frame_ms": 1e9, "cycle.deterministic": True})
    r = det.run_cycle(frame(clip[0], 0), now_s=0.0)
    assert r.is_action and len(r.tokens) == steps + 1 and r.overran


def test_a_cycle_after_the_state_shrank_is_probed_not_refused(tiny_model_dir, clip):
    """The engine gives admission the tokens its state holds: after the state shrank (here every frame forgotten,
    as a torn swap does; a swap to a smaller state is the usual case), a cycle the estimate learned on the larger
    state would refuse runs as a probe, and its cost is the estimate from then on."""
    eng = make_engine(tiny_model_dir)
    for i in range(8):
        assert eng.run_cycle(frame(clip[i], i), now_s=float(i)).is_action
    from vla_edge_ros.core.admission import AdmissionController

    held = eng.state.kv.used_slots
    budget = eng.cfg.cycle.deadline_ms - eng.cfg.cycle.safety_margin_ms
    adm = eng.admission = AdmissionController(eng.cfg.cycle, eng.cfg.admission)   # as warm_up re-seeds it:
    adm.observe(1.0, 1, 2.0 * budget, 7, context_tokens=held)       # an estimate, on this state, that refuses
    refused = eng.run_cycle(frame(clip[8], 8), now_s=8.0)
    assert refused.reason == R.REFUSED_BUDGET and refused.context_tokens == held
    eng.state.reset_frames()
    probe = eng.run_cycle(frame(clip[9], 9), now_s=9.0)
    assert probe.is_action and probe.probe and adm.shrink_probes == 1
    assert probe.context_tokens <= (1 - eng.cfg.admission.probe_on_context_shrink) * held
    after = eng.run_cycle(frame(clip[10], 10), now_s=10.0)
    assert after.is_action and not after.probe and after.estimate_ms < budget


def test_an_action_bin_count_the_models_tokenizer_disagrees_with_is_refused(tiny_model_dir):
    """Bins are the last action.num_bins vocabulary ids: with 128 configured on a 256-bin model every action was
    shifted and rescaled without an error (the model's bin 128, +0.004, published as -1.0)."""
    with pytest.raises(EngineConfigError, match="names 256 action bins .* set action.num_bins to 256"):
        make_engine(tiny_model_dir, **{"action.num_bins": 128})
