"""AdmissionController: EMA cost estimates and the admit/refuse rule, on the shipped configuration."""
import math

import numpy as np
import pytest

from vla_edge_ros import config
from vla_edge_ros.config import AdmissionConfig
from vla_edge_ros.core.admission import AdmissionController

CFG = config.load()


def make(alpha=None, spike_factor=None) -> AdmissionController:
    adm = CFG.admission
    if alpha is not None:
        adm = AdmissionConfig(ema_alpha=alpha)
    if spike_factor is not None:
        adm = AdmissionConfig(ema_alpha=adm.ema_alpha, spike_factor=spike_factor)
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
    ctl = make(spike_factor=1e12)          # the plain recurrence: no sample counts as a spike
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


def test_a_spike_is_reported_by_the_caller_but_not_learned():
    """The reconciler's rebuild on the H200: three cycles at ~2x cost, then normal again. The estimate must
    not move, so the cycles after the spike are admitted instead of refused for half a second."""
    ctl = make()
    for _ in range(20):
        ctl.observe(16.0, 44, 8.0, 7)                        # ~24 ms cycles
    before = (ctl.ema_prefill_ms_per_token, ctl.ema_decode_ms_per_token)
    for _ in range(CFG.admission.spikes_to_adopt - 1):
        assert ctl.observe(33.0, 44, 17.0, 7) is False       # ~50 ms: a spike
    assert (ctl.ema_prefill_ms_per_token, ctl.ema_decode_ms_per_token) == before
    assert ctl.spikes == CFG.admission.spikes_to_adopt - 1
    assert ctl.observe(16.0, 44, 8.0, 7) is True and ctl.spikes_in_a_row == 0
    d = ctl.decide(0.5, 44, 7)
    assert d.admit and d.estimate_ms == pytest.approx(24.0, rel=1e-6)


def test_spikes_in_a_row_are_a_lasting_change_and_are_learned():
    ctl = make()
    for _ in range(20):
        ctl.observe(16.0, 44, 8.0, 7)
    learned = [ctl.observe(40.0, 44, 20.0, 7) for _ in range(60)]
    n = CFG.admission.spikes_to_adopt
    assert learned[:n - 1] == [False] * (n - 1) and all(learned[n - 1:])
    estimate = ctl.ema_prefill_ms_per_token * 44 + ctl.ema_decode_ms_per_token * 7
    assert estimate == pytest.approx(60.0, rel=1e-3)           # the new cost, fully learned
    assert ctl.adoptions == 1
    assert not ctl.decide(0.0, 44, 7).admit                   # which no longer fits the deadline


def test_adopted_spikes_seed_the_estimate_so_the_tail_learns_no_lag():
    """bench asr at 32K slots on the H200: the warm-up seeded 15.8 ms on a short state, the warm-started state's
    cycles cost 26.6 ms. Nudged toward it by ema_alpha, ten cycles went into the tail at 1.3-1.7 and it refused
    170 of the next 200 cycles; seeded by the adopting spike, the estimate is the new cost at once and the
    cycles after it are ratios of 1."""
    ctl = make()
    ctl.observe(10.84, 32, 5.0, 7)                             # 15.84 ms: the warm-up's seed
    n = CFG.admission.spikes_to_adopt
    for i in range(n + 15):
        d = ctl.decide(0.2, 32, 7)
        assert d.admit, f"cycle {i} refused: estimate {d.estimate_ms:.2f} > budget {d.budget_ms:.2f}"
        ctl.observe(18.2, 32, 8.4, 7)                          # 26.6 ms, 1.68x the seed: a spike until adopted
        if i == n - 1:
            assert ctl.mean_ms(32, 7) == pytest.approx(26.6) and ctl.adoptions == 1
    assert len(ctl._ratios) == 15 and ctl.tail_factor == pytest.approx(1.0)
    d = ctl.decide(0.2, 32, 7)
    assert d.admit and d.estimate_ms == pytest.approx(26.6)


def test_the_tail_is_of_recent_cycles_and_expires_while_admission_refuses():
    """Ratios age by decisions, not by learned cycles: while admission refuses, only a probe learns, so a tail
    counted in learned cycles kept one slow spell for hundreds of cycles (~190 at 32K slots). After tail_window
    decisions the spell's ratios are gone and the mean alone (re-seeded by the probes) decides."""
    ctl = make()
    window, probe_after = CFG.admission.tail_window, CFG.admission.probe_after_refusals
    budget = CFG.cycle.deadline_ms - CFG.cycle.safety_margin_ms
    base = 0.75 * budget
    ctl.observe(1.0, 1, base - 1.0, 7)
    for i in range(30):                                        # a slow spell within the spike factor: 1.45x
        ctl.observe(1.0, 1, (1.45 if i % 3 == 0 else 1.0) * base - 1.0, 7)
    assert ctl.mean_ms(1, 7) < budget < ctl.mean_ms(1, 7) * ctl.tail_factor    # refused from here on the tail
    decisions = []
    for _ in range(window + 1):                                # the spell was learned before decision 1
        d = ctl.decide(0.0, 1, 7)
        decisions.append(d)
        if d.admit and d.probe:                                # at the estimate's mean: a ratio of 1
            ctl.observe(1.0, 1, ctl.mean_ms(1, 7) - 1.0, 7, probe=True)
    probes = (window + 1) // (probe_after + 1)
    assert sum(d.probe for d in decisions) == probes
    assert sum(not d.admit for d in decisions) == window - probes   # refused until the spell expired ...
    assert decisions[-1].admit and not decisions[-1].probe    # ... then admitted on the mean
    assert ctl.tail_factor == 1.0 and len(ctl._ratios) == probes


def test_in_steady_state_the_tail_holds_the_last_window_of_cycles():
    ctl = make()
    rng = np.random.default_rng(11)
    ctl.observe(10.0, 32, 5.0, 7)
    ratios = []
    for _ in range(3 * CFG.admission.tail_window):
        assert ctl.decide(0.0, 32, 7).admit
        predicted, f = ctl.mean_ms(32, 7), float(rng.uniform(0.95, 1.1))
        ctl.observe(10.0 * f, 32, 5.0 * f, 7)
        ratios.append(15.0 * f / predicted)
    window = ratios[-CFG.admission.tail_window:]
    assert list(ctl._ratios) == pytest.approx(window)
    assert ctl.tail_factor == pytest.approx(max(1.0, float(np.quantile(window, CFG.admission.tail_quantile))))


def test_spike_settings_are_validated():
    with pytest.raises(config.ConfigError, match="spike_factor"):
        AdmissionConfig(spike_factor=1.0)
    with pytest.raises(config.ConfigError, match="spikes_to_adopt"):
        AdmissionConfig(spikes_to_adopt=0)


def test_admission_uses_the_slow_end_of_recent_cycles_not_the_mean():
    """Cycles that vary around their mean: one admitted on the mean would be late about half the time its budget
    is tight. The estimate is the mean times the tail_quantile of actual / predicted, so a budget between the two
    refuses."""
    ctl = make()
    rng = np.random.default_rng(3)
    ctl.observe(20.0, 44, 0.0, 7, other_ms=2.0)                  # seeds: 22 ms predicted for 44 + 7 tokens
    for _ in range(CFG.admission.tail_window):
        f = float(rng.uniform(0.9, 1.25))                          # within the spike factor: all learned
        assert ctl.observe(20.0 * f, 44, 0.0, 7, other_ms=2.0 * f)
    ratios = np.fromiter(ctl._ratios, float)
    assert ctl.tail_factor == pytest.approx(np.quantile(ratios, CFG.admission.tail_quantile))
    assert 1.15 < ctl.tail_factor <= 1.25
    mean = ctl.mean_ms(44, 7)
    assert ctl.ema_other_ms > 0 and mean == pytest.approx(ctl.ema_prefill_ms_per_token * 44 + ctl.ema_other_ms)
    budget_between = (mean + mean * ctl.tail_factor) / 2.0
    elapsed = CFG.cycle.deadline_ms - CFG.cycle.safety_margin_ms - budget_between
    d = ctl.decide(elapsed, 44, 7)
    assert not d.admit and d.estimate_ms == pytest.approx(mean * ctl.tail_factor)
    off = AdmissionController(CFG.cycle, AdmissionConfig(tail_quantile=0.0))
    off.observe(20.0, 44, 0.0, 7, other_ms=2.0)
    for f in rng.uniform(0.9, 1.25, 50):
        off.observe(20.0 * f, 44, 0.0, 7, other_ms=2.0 * f)
    assert off.tail_factor == 1.0 and off.decide(elapsed, 44, 7).estimate_ms == pytest.approx(off.mean_ms(44, 7))


def test_spikes_stay_out_of_the_tail_and_a_young_estimate_has_none():
    ctl = make()
    ctl.observe(16.0, 44, 8.0, 7)
    for _ in range(5):
        ctl.observe(16.0, 44, 8.0, 7)
    assert ctl.tail_factor == 1.0                                  # fewer than TAIL_MIN_SAMPLES learned cycles
    for _ in range(20):
        ctl.observe(16.0, 44, 8.0, 7)
    for _ in range(CFG.admission.spikes_to_adopt - 1):
        assert ctl.observe(40.0, 44, 20.0, 7) is False
    assert ctl.tail_factor == pytest.approx(1.0)


def test_tail_settings_are_validated():
    with pytest.raises(config.ConfigError, match="tail_quantile"):
        AdmissionConfig(tail_quantile=1.0)
    with pytest.raises(config.ConfigError, match="tail_window"):
        AdmissionConfig(tail_window=0)
    with pytest.raises(config.ConfigError, match=f"at least {config.TAIL_MIN_SAMPLES}"):
        AdmissionConfig(tail_window=config.TAIL_MIN_SAMPLES - 1)     # would never hold a tail: the mean alone
    assert AdmissionConfig(tail_window=config.TAIL_MIN_SAMPLES).tail_window == config.TAIL_MIN_SAMPLES


def _seed_refusing(ctl: AdmissionController, cost_ms: float, context: int) -> None:
    """One learned cycle of `cost_ms` (one prefill token, seven decode steps) with `context` tokens held."""
    ctl.observe(1.0, 1, cost_ms - 1.0, 7, context_tokens=context)


def test_a_probe_replaces_the_estimate_it_was_admitted_to_check():
    """While admission refuses, a probe is the only fresh cost: taken at ema_alpha, a cost that halved would need
    several probes (15 refusals each) to be believed; taken whole, the next cycle is admitted."""
    ctl = make()
    budget = CFG.cycle.deadline_ms - CFG.cycle.safety_margin_ms
    _seed_refusing(ctl, 1.2 * budget, 30_000)
    decisions = [ctl.decide(0.0, 1, 7) for _ in range(CFG.admission.probe_after_refusals + 1)]
    assert not any(d.admit for d in decisions[:-1]) and decisions[-1].probe
    ctl.observe(1.0, 1, 0.5 * budget - 1.0, 7, probe=True)          # the cost halved meanwhile
    after = ctl.decide(0.0, 1, 7)
    assert after.admit and not after.probe and after.estimate_ms == pytest.approx(0.5 * budget)
    # The same cycle learned as an ordinary one moves the estimate by ema_alpha only: still refused.
    nudged = make()
    _seed_refusing(nudged, 1.2 * budget, 30_000)
    nudged.observe(1.0, 1, 0.5 * budget - 1.0, 7)
    assert not nudged.decide(0.0, 1, 7).admit


def test_a_state_that_shrank_gets_a_probe_at_once_and_only_one():
    """A swap that leaves the state with fewer tokens than the estimate was learned with makes it too high (a cycle
    attends to every token held): the first cycle it refuses is admitted as a probe instead, once per shrink."""
    ctl = make()
    budget = CFG.cycle.deadline_ms - CFG.cycle.safety_margin_ms
    shrink = CFG.admission.probe_on_context_shrink
    assert 0.0 < shrink < 1.0
    _seed_refusing(ctl, 1.2 * budget, 30_000)
    assert not ctl.decide(0.0, 1, 7, context_tokens=30_000).admit
    assert not ctl.decide(0.0, 1, 7, context_tokens=int(30_000 * (1 - shrink)) + 64).admit   # not shrunk enough
    first = ctl.decide(0.0, 1, 7, context_tokens=int(30_000 * (1 - shrink)))
    assert first.admit and first.probe and ctl.shrink_probes == 1 and ctl.refusals_in_a_row == 0
    # Its measurement never came (the cycle failed before it): the same smaller state is not probed again.
    assert not ctl.decide(0.0, 1, 7, context_tokens=int(30_000 * (1 - shrink))).admit
    # Without context (a caller that does not know it), or with the rule off, only the run of refusals probes.
    off = AdmissionController(CFG.cycle, AdmissionConfig(probe_on_context_shrink=0.0))
    _seed_refusing(off, 1.2 * budget, 30_000)
    assert not off.decide(0.0, 1, 7, context_tokens=1_000).admit and off.shrink_probes == 0
    with pytest.raises(config.ConfigError, match="probe_on_context_shrink"):
        AdmissionConfig(probe_on_context_shrink=1.0)


def test_with_a_context_cost_a_state_that_grew_raises_the_estimate_before_its_first_cycle():
    """bench asr at 32768 slots on the H200 (2026-12-05): the estimate was learned over 90 frames (~2.9K tokens),
    a swap brought 729 (~23.4K), and the next cycle, admitted on 15.3 ms with 18.1 ms left, took 37.4. With the
    capacity check's slope (14.0 ms over 3 frames, 28.0 over 1021: ~0.43 us a context token) the same decision
    is a refusal (an explained fallback before the work, not a late one after it)."""
    slope = (27.995 - 14.037) / (32665 - (81 + 3 * 32))
    small, grown, budget_left = 81 + 90 * 32, 81 + 729 * 32, 18.06
    elapsed = CFG.cycle.deadline_ms - CFG.cycle.safety_margin_ms - budget_left
    blind, aware = make(), make()
    aware.set_context_cost(slope)
    for ctl in (blind, aware):
        for _ in range(10):                    # a steady run over the small state: 15.3 ms a cycle
            ctl.observe(4.0, 33, 11.3, 7, other_ms=0.0, context_tokens=small)
    assert aware.ema_context_tokens == pytest.approx(small)
    assert blind.decide(elapsed, 33, 7, context_tokens=grown).admit          # what happened
    d = aware.decide(elapsed, 33, 7, context_tokens=grown)
    assert not d.admit and d.budget_ms == pytest.approx(budget_left)
    assert d.estimate_ms == pytest.approx((15.3 + slope * (grown - small)) * aware.tail_factor)
    # At the context it was learned at, the estimate is the plain sum; a smaller state costs less (never < 0).
    assert aware.decide(0.0, 33, 7, context_tokens=small).estimate_ms == pytest.approx(
        blind.decide(0.0, 33, 7, context_tokens=small).estimate_ms)
    assert aware.mean_ms(33, 7, context_tokens=81) == pytest.approx(15.3 - slope * (small - 81))
    assert aware.mean_ms(33, 7, context_tokens=small - 10 ** 9) == 0.0
    assert aware.mean_ms(33, 7) == pytest.approx(15.3)                       # context unknown: the sum


def test_the_context_the_estimate_was_learned_at_follows_the_learned_cycles():
    ctl = make(spike_factor=1e12)
    ctl.set_context_cost(1e-4)
    alpha = CFG.admission.ema_alpha
    ref = None
    for context in (1000, 5000, 5000, 20000, 3000):
        ctl.observe(10.0, 32, 7.0, 7, context_tokens=context)
        ref = context if ref is None else (1 - alpha) * ref + alpha * context
        assert ctl.ema_context_tokens == pytest.approx(ref)
    # The cycle's ratio against its prediction is taken at its own context: a cycle costing exactly what the
    # averages plus the slope predict adds a ratio of 1.
    before = ctl.ema_context_tokens
    predicted = ctl.mean_ms(32, 7, context_tokens=30000)
    ctl.observe(predicted - 7.0, 32, 7.0, 7, context_tokens=30000)
    assert list(ctl._ratios)[-1] == pytest.approx(1.0)
    assert ctl.ema_context_tokens == pytest.approx((1 - alpha) * before + alpha * 30000)


@pytest.mark.parametrize("bad", [-1e-6, float("nan"), float("inf")])
def test_a_context_cost_must_be_a_finite_non_negative_number(bad):
    ctl = make()
    with pytest.raises(ValueError, match="context ms per token"):
        ctl.set_context_cost(bad)
    assert ctl.context_ms_per_token == 0.0


def test_the_context_cost_is_off_by_default():
    assert CFG.admission.context_cost is False and make().context_ms_per_token == 0.0
