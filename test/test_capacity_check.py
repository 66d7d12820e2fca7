"""The configure-time capacity check (core/capacity_check.py): does a cycle over a full KV arena meet the deadline?

On the tiny model with the numpy backend: the check really fills the frame
capacity and times cycles over it, and leaves nothing behind (the next live
cycles pick the tokens an engine that never ran it picks, over real footage).
The arithmetic of the verdict is checked on figures of the kind the H200 gave
at 32768 slots (`bench asr`, 2026-12-04).
"""

import dataclasses

import numpy as np
import pytest

from vla_edge_ros import config as C
from vla_edge_ros.core.capacity_check import CapacityFit, check_capacity
from vla_edge_ros.core.engine_factory import primary_engine
from vla_edge_ros.core.footage import read_clip
from vla_edge_ros.core.frames import Frame

CAPACITY = 1024          # 29 frames of the tiny model beside its prefix and suffix reserve: a quick fill


def make_engine(model_dir):
    cfg = C.load(overrides={"model.path": str(model_dir), "model.backend": "numpy", "cycle.deterministic": True,
                            "kv.capacity_tokens": CAPACITY})
    engine = primary_engine(cfg)
    engine.warm_up(4, warm_frame(cfg))
    return engine


def warm_frame(cfg):
    return np.random.default_rng(7).integers(0, 256, (cfg.vision.image_height, cfg.vision.image_width, 3), np.uint8)


def admission_state(engine) -> tuple:
    a = engine.admission
    return a.ema_prefill_ms_per_token, a.ema_decode_ms_per_token, a.ema_other_ms, a.tail_factor


def test_the_check_times_cycles_over_the_whole_frame_capacity_and_leaves_no_trace(tiny_model_dir):
    checked, untouched = make_engine(tiny_model_dir), make_engine(tiny_model_dir)
    cfg, st = checked.cfg, checked.state
    before = admission_state(checked)

    fit = check_capacity(checked, 3, warm_frame(cfg))

    tpf = cfg.vision.tokens_per_frame
    assert fit.full_frames == st.frame_capacity and fit.short_frames == 3
    # The last timed cycle attended to every frame but its own: the state was full when it ended.
    assert fit.full_tokens == st.prefix_tokens + (st.frame_capacity - 1) * tpf
    assert fit.short_tokens == st.prefix_tokens + (fit.short_frames - 1) * tpf
    assert fit.fixed_tokens == st.prefix_tokens + st.suffix_reserve
    assert fit.budget_ms == cfg.cycle.deadline_ms - cfg.cycle.safety_margin_ms and fit.budget_share == 0.9
    assert fit.full_ms > 0 and fit.short_ms > 0 and fit.fill_s > 0
    # Nothing of it stays: the state holds the prefix only, the counters start at zero, admission is as the
    # warm-up left it.
    assert not st.frames and st.next_position == st.prefix_tokens and st.state_exact
    assert checked.cycle_id == 0 and checked.metrics.summary()["cycles"] == 0
    assert admission_state(checked) == before
    # ... and the live cycles after it act as those of an engine that never ran it.
    for i, pixels in enumerate(read_clip("bikes.mp4", max_frames=8)):
        a, b = (e.run_cycle(Frame(pixels=pixels, stamp_s=float(i), frame_id=i), now_s=float(i))
                for e in (checked, untouched))
        assert a.is_action and b.is_action and a.tokens.tolist() == b.tokens.tolist(), i


def test_the_check_is_skipped_when_the_frames_cannot_hold_its_cycles(tiny_model_dir):
    engine = make_engine(tiny_model_dir)
    capacity = engine.state.frame_capacity
    assert check_capacity(engine, capacity // 2 + 1, warm_frame(engine.cfg)) is None
    assert check_capacity(engine, 0, warm_frame(engine.cfg)) is None
    assert not engine.state.frames and engine.cycle_id == 0


def fit_of(short_ms: float, full_ms: float) -> CapacityFit:
    """The shape of the H200's 1.5B at 32768 slots: 1021 frames, budget 31.1 ms (deadline 33.3 less 2.2)."""
    return CapacityFit(short_frames=3, short_ms=short_ms, full_frames=1021, full_tokens=32697, full_ms=full_ms,
                       budget_ms=31.1, budget_share=0.9, tokens_per_frame=32, fixed_tokens=96, fill_s=0.8)


def predicted_ms(fit: CapacityFit, frames: int) -> float:
    return fit.short_ms + (fit.full_ms - fit.short_ms) * (frames - fit.short_frames) / (fit.full_frames - fit.short_frames)


def test_a_full_state_within_its_share_of_the_budget_fits_whole():
    fit = fit_of(16.0, 27.5)
    assert fit.fits and fit.frames_that_fit == 1021 and fit.capacity_tokens_that_fit == 96 + 1021 * 32
    assert fit.describe().endswith("the whole frame capacity can be served")


def test_a_full_state_over_its_share_gets_the_frames_that_fit_and_the_capacity_for_them():
    fit = fit_of(16.0, 31.4)              # 101% of the budget: admission refuses there
    n = fit.frames_that_fit
    assert not fit.fits and 3 < n < 1021
    assert predicted_ms(fit, n) <= fit.allowed_ms < predicted_ms(fit, n + 1)
    assert fit.capacity_tokens_that_fit == 96 + n * 32
    line = fit.describe()
    assert "admission will refuse cycles as the state nears capacity" in line
    assert f"about {n} frames fit" in line and f"kv.capacity_tokens <= {96 + n * 32}" in line
    assert "101% of the 31.1 ms admission budget" in line


def test_a_short_state_already_over_its_share_says_no_capacity_helps():
    fit = fit_of(29.0, 40.0)
    assert not fit.fits and fit.frames_that_fit == 0 and fit.capacity_tokens_that_fit == 0
    assert "expect refusals whatever the state holds" in fit.describe()


@pytest.mark.parametrize("short_ms, full_ms", [(16.0, 27.5), (16.0, 31.4), (29.0, 40.0)])
def test_the_verdict_survives_the_trip_through_diagnostics_strings(short_ms, full_ms):
    fit = fit_of(short_ms, full_ms)
    # As nodes/conversions.flatten writes /diagnostics values: floats with 6 significant digits, the rest str().
    values = {k: (f"{v:.6g}" if isinstance(v, float) else str(v)) for k, v in fit.as_dict().items()}
    back = CapacityFit.from_values(values)
    assert back is not None and back.describe() == fit.describe() and back.as_dict() == fit.as_dict()
    assert CapacityFit.from_values({k: v for k, v in values.items() if k != "full_ms"}) is None
    assert CapacityFit.from_values({**values, "full_ms": "n/a"}) is None


def test_the_slope_between_the_two_states_is_the_cost_of_a_context_token():
    """The H200's 32K check of 2026-12-05: 14.0 ms over 3 frames (177 tokens), 28.0 over 1021 (32665)."""
    fit = CapacityFit(short_frames=3, short_ms=14.037, full_frames=1021, full_tokens=32665, full_ms=27.995,
                      budget_ms=31.33, budget_share=0.9, tokens_per_frame=32, fixed_tokens=81, fill_s=2.9,
                      short_tokens=177)
    assert fit.ms_per_context_token == pytest.approx((27.995 - 14.037) / (32665 - 177))
    assert fit.as_dict()["ms_per_context_token"] == fit.ms_per_context_token
    # A cheaper full state (noise on a tiny model) is no negative cost; a record from before short_tokens was kept
    # (bench asr JSON of earlier sessions) reads back, with no slope.
    assert dataclasses.replace(fit, full_ms=13.0).ms_per_context_token == 0.0
    old = {k: v for k, v in fit.as_dict().items() if k not in ("short_tokens", "ms_per_context_token")}
    back = CapacityFit.from_values(old)
    assert back is not None and back.short_tokens == -1 and back.ms_per_context_token == 0.0
    assert back.describe() == fit.describe()


def test_admission_takes_the_slope_only_where_the_configuration_asks(tiny_model_dir):
    from vla_edge_ros.core.capacity_check import take_context_cost
    fit = dataclasses.replace(fit_of(16.0, 27.5), short_tokens=96 + 2 * 32)
    off = make_engine(tiny_model_dir)
    assert take_context_cost(off, fit) == 0.0 and off.admission.context_ms_per_token == 0.0
    cfg = C.load(overrides={"model.path": str(tiny_model_dir), "model.backend": "numpy", "cycle.deterministic": True,
                            "kv.capacity_tokens": CAPACITY, "admission.context_cost": True})
    on = primary_engine(cfg)
    assert take_context_cost(on, None) == 0.0 and on.admission.context_ms_per_token == 0.0
    assert take_context_cost(on, fit) == fit.ms_per_context_token > 0
    assert on.admission.context_ms_per_token == fit.ms_per_context_token


def test_a_model_whose_positions_end_before_the_arena_is_filled_as_far_as_they_go(tiny_model_dir, tmp_path):
    """Frames beyond max_position_embeddings never fit (a re-base would forget them): the check stops there."""
    import json
    import shutil
    short = tmp_path / "tiny_600_positions"
    shutil.copytree(tiny_model_dir, short)
    config = json.loads((short / "config.json").read_text())
    (short / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 600}))
    engine = make_engine(short)
    st = engine.state
    by_positions = (600 - st.prefix_tokens - st.suffix_reserve) // engine.cfg.vision.tokens_per_frame
    assert 3 < by_positions < st.frame_capacity
    fit = check_capacity(engine, 3, warm_frame(engine.cfg))
    assert fit.full_frames == by_positions
    assert fit.full_tokens == st.prefix_tokens + (by_positions - 1) * engine.cfg.vision.tokens_per_frame


@pytest.mark.gpu
def test_on_the_gpu_the_check_captures_no_graph_and_leaves_no_trace(tiny_model_dir, cuda_device):
    """On the CUDA backend the fill's forwards and the timed cycles replay graphs the warm-up captured (a capture
    keeps driver memory for good, and the configure is the place for none but those), and the live cycles after
    the check pick the tokens an engine that never ran it picks."""
    def gpu_engine():
        cfg = C.load(overrides={"model.path": str(tiny_model_dir), "model.backend": "pycuda", "model.dtype": "float32",
                                "cycle.deterministic": True, "kv.capacity_tokens": CAPACITY})
        engine = primary_engine(cfg)
        engine.warm_up(4, warm_frame(cfg))
        return engine
    checked, untouched = gpu_engine(), gpu_engine()
    try:
        captured = set(checked.backend._graphs)
        fit = check_capacity(checked, 3, warm_frame(checked.cfg))
        assert set(checked.backend._graphs) == captured
        assert fit.full_frames == checked.state.frame_capacity and fit.full_ms > 0
        for i, pixels in enumerate(read_clip("bikes.mp4", max_frames=8)):
            a, b = (e.run_cycle(Frame(pixels=pixels, stamp_s=float(i), frame_id=i), now_s=float(i))
                    for e in (checked, untouched))
            assert a.is_action and b.is_action and a.tokens.tolist() == b.tokens.tolist(), i
    finally:
        checked.close()
        untouched.close()
