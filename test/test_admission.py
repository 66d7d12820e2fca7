"""AdmissionController: EMA cost estimates and the admit/refuse rule, on the shipped configuration."""
import math

import numpy as np
import pytest

from vla_edge_ros import config
from vla_edge_ros.config import AdmissionConfig
from vla_edge_ros.core.admission import AdmissionController

CFG = config.load()


def make(alpha=None) -> AdmissionController:
    adm = CFG.admission if alpha is None else AdmissionConfig(ema_alpha=alpha)
    return AdmissionController(CFG.cycle, adm)


def test_first_cycle_is_admitted_even_past_the_deadline():
    ctl = make()
    assert not ctl.has_sample
    late = CFG.cycle.deadline_ms * 2
    d = ctl.decide(late, 32, 8)
    assert d.admit
    assert d.estimate_ms == 0.0
    assert d.budget_ms == pytest.approx(CFG.cycle.deadline_ms - late - CFG.cycle.safety_margin_ms)


def test_first_observation_seeds_then_separate_emas_follow_the_recurrence():
    ctl = make()
    rng = np.random.default_rng(7)
    alpha = CFG.admission.ema_alpha
    ref_prefill = ref_decode = None
    for _ in range(25):
        p_tok, d_tok = int(rng.integers(1, 80)), int(rng.integers(1, 9))
        p_ms, d_ms = float(rng.uniform(0.5, 20.0)), float(rng.uniform(0.5, 20.0))
        ctl.observe(p_ms, p_tok, d_ms, d_tok)
        xp, xd = p_ms / p_tok, d_ms / d_tok
        ref_prefill = xp if ref_prefill is None else (1 - alpha) * ref_prefill + alpha * xp
        ref_decode = xd if ref_decode is None else (1 - alpha) * ref_decode + alpha * xd
        assert ctl.has_sample
        assert ctl.ema_prefill_ms_per_token == pytest.approx(ref_prefill, rel=1e-12)
        assert ctl.ema_decode_ms_per_token == pytest.approx(ref_decode, rel=1e-12)


def test_prefill_and_decode_are_tracked_independently():
    ctl = make()
    ctl.observe(32.0, 32, 8.0, 8)             # 1 ms/token both
    for _ in range(200):
        ctl.observe(32.0, 32, 80.0, 8)        # decode gets 10x slower, prefill unchanged
    assert ctl.ema_prefill_ms_per_token == pytest.approx(1.0)
    assert ctl.ema_decode_ms_per_token == pytest.approx(10.0, rel=1e-6)


def test_admit_iff_estimate_within_budget_exactly_at_the_boundary():
    ctl = make()
    ctl.observe(prefill_ms=16.0, prefill_tokens=32, decode_ms=4.0, decode_tokens=8)    # 0.5 ms/token each
    estimate = 0.5 * 40 + 0.5 * 7
    # elapsed chosen so that budget == estimate: admitted; any later: refused.
    elapsed_at_edge = CFG.cycle.deadline_ms - CFG.cycle.safety_margin_ms - estimate
    d = ctl.decide(elapsed_at_edge, 40, 7)
    assert d.estimate_ms == pytest.approx(estimate)
    assert d.budget_ms == pytest.approx(estimate)
    assert d.admit
    later = ctl.decide(elapsed_at_edge + 0.01, 40, 7)
    assert not later.admit
    assert later.budget_ms < later.estimate_ms
    # Fewer tokens fit again at the same elapsed time.
    assert ctl.decide(elapsed_at_edge + 0.01, 32, 7).admit


def test_refuses_when_measured_cost_exceeds_the_whole_deadline():
    ctl = make()
    ctl.observe(prefill_ms=3100.0, prefill_tokens=32, decode_ms=800.0, decode_tokens=8)   # the article's ~3.1 s cycle
    d = ctl.decide(0.0, 32, 8)
    assert not d.admit
    assert d.estimate_ms > CFG.cycle.deadline_ms


@pytest.mark.parametrize("kwargs, name", [
    (dict(prefill_ms=float("nan"), prefill_tokens=32, decode_ms=1.0, decode_tokens=8), "prefill_ms"),
    (dict(prefill_ms=1.0, prefill_tokens=32, decode_ms=-1.0, decode_tokens=8), "decode_ms"),
    (dict(prefill_ms=1.0, prefill_tokens=0, decode_ms=1.0, decode_tokens=8), "prefill_tokens"),
    (dict(prefill_ms=1.0, prefill_tokens=32, decode_ms=1.0, decode_tokens=2.5), "decode_tokens"),
])
def test_observe_rejects_bad_measurements(kwargs, name):
    ctl = make()
    with pytest.raises(ValueError, match=name):
        ctl.observe(**kwargs)
    assert not ctl.has_sample


def test_decide_rejects_bad_inputs():
    ctl = make()
    with pytest.raises(ValueError, match="elapsed_ms"):
        ctl.decide(math.inf, 32, 8)
    with pytest.raises(ValueError, match="prefill_tokens"):
        ctl.decide(1.0, -1, 8)
    assert ctl.decide(1.0, np.int64(32), np.int32(8)).admit      # numpy integers are integers


def test_a_stale_high_estimate_recovers_through_a_probe_cycle():
    """Refusals measure nothing; after probe_after_refusals in a row one cycle is admitted to re-measure."""
    ctl = AdmissionController(config.CycleConfig(), AdmissionConfig(ema_alpha=1.0, probe_after_refusals=3))
    ctl.observe(prefill_ms=400.0, prefill_tokens=40, decode_ms=70.0, decode_tokens=7)   # one slow spell: 10 ms/token
    decisions = [ctl.decide(0.0, 40, 7) for _ in range(4)]
    assert [d.admit for d in decisions] == [False, False, False, True]
    assert decisions[-1].probe and not any(d.probe for d in decisions[:-1])
    ctl.observe(prefill_ms=4.0, prefill_tokens=40, decode_ms=3.5, decode_tokens=7)     # the probe measures fast again
    d = ctl.decide(0.0, 40, 7)
    assert d.admit and not d.probe
