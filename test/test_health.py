"""The /diagnostics level rules (core/health.py), without ROS: times are fed in explicitly."""
from vla_edge_ros import config as C
from vla_edge_ros.core import health as Hl

CFG = C.HealthConfig()              # window 1 s, fallback bound 0.2, no action 1 s, reconciler silence 2 s
PERIOD = 1 / 30


def _cycles(h, start, n, action=True, missed=False):
    for i in range(n):
        h.on_cycle(action, missed, start + i * PERIOD)
    return start + n * PERIOD


def test_reasoning_ok_while_actions_flow():
    h = Hl.ReasoningHealth(CFG, start_s=0.0)
    t = _cycles(h, 0.0, 60)
    assert h.assess(t).level == Hl.OK and h.assess(t).message == "ok"


def test_no_action_for_a_second_while_active_is_error_and_counts_from_activation():
    h = Hl.ReasoningHealth(CFG, start_s=10.0)
    assert h.assess(10.5).level == Hl.OK                 # half a second after start
    health = h.assess(11.0)
    assert health.level == Hl.ERROR and "no action published ever" in health.message
    t = _cycles(h, 11.0, 30)                              # actions again
    assert h.assess(t).level == Hl.OK
    t = _cycles(h, t, 40, action=False)                   # 1.33 s of fallbacks only
    health = h.assess(t)
    assert health.level == Hl.ERROR and {"no_action", "fallback_rate"} <= health.codes
    h.set_active(False, t)                                # inactive: not expected to act
    assert "no_action" not in h.assess(t + 5).codes
    h.set_active(True, t + 5)
    assert "no_action" not in h.assess(t + 5.5).codes and "no_action" in h.assess(t + 6.0).codes


def test_fallback_rate_over_the_last_second_above_the_bound_warns():
    h = Hl.ReasoningHealth(CFG, start_s=0.0)
    t = 0.0
    for i in range(30):                                   # every 4th cycle a fallback: 0.25 > 0.2
        h.on_cycle(i % 4 != 0, False, t)
        t += PERIOD
    health = h.assess(t)
    assert health.level == Hl.WARN and health.codes == {"fallback_rate"}, health
    assert "fallback rate 0.27" in health.message         # 8 of the 30 cycles
    t = _cycles(h, t, 30)                                 # the window moves on: only actions in it
    assert h.assess(t).level == Hl.OK


def test_fallback_rate_at_the_bound_is_ok_and_misses_warn():
    h = Hl.ReasoningHealth(CFG, start_s=0.0)
    t = 0.0
    for i in range(30):                                   # 6 of 30 = 0.2, not above
        h.on_cycle(i % 5 != 0, False, t)
        t += PERIOD
    assert h.assess(t).level == Hl.OK
    h.on_cycle(False, True, t)
    assert h.assess(t).codes == {"fallback_rate", "deadline_missed"}


def test_reconciler_lost_after_silence_or_a_timeout_never_before_it_answered():
    h = Hl.ReasoningHealth(CFG, start_s=0.0)
    t = _cycles(h, 0.0, 300)                              # 10 s, no reconciler ever: not "lost"
    assert h.assess(t).level == Hl.OK
    h.on_swap_answer(t)
    assert "reconciler_lost" not in h.assess(t + 1.9).codes
    _cycles(h, t, 90)
    health = h.assess(t + 3.0)
    assert health.codes == {"reconciler_lost"} and "no swap answer for 3.0 s" in health.message
    h.on_swap_answer(t + 3.0)
    assert "reconciler_lost" not in h.assess(t + 3.0).codes
    h.on_swap_timeouts(1, t + 3.2)                        # a request abandoned: lost for the next window
    assert "swap request timed out" in h.assess(t + 3.5).message
    h.on_swap_timeouts(1, t + 4.0)                        # no new timeout
    h.on_swap_answer(t + 4.0)
    assert "reconciler_lost" not in h.assess(t + 4.3).codes


def test_camera_warns_without_images_for_stale_frame_ms_and_on_rejections():
    h = Hl.CameraHealth(CFG, stale_frame_ms=250.0, start_s=0.0)
    assert h.assess(0.2).level == Hl.OK
    health = h.assess(0.3)
    assert health.level == Hl.WARN and "no image since start" in health.message
    h.on_image(1.0)
    assert h.assess(1.25).level == Hl.OK
    assert "no image for 300 ms" in h.assess(1.3).message
    h.on_image(2.0)
    h.on_rejected(2.0)
    assert h.assess(2.1).codes == {"rejected"}
    h.on_image(3.1)
    assert h.assess(3.1).level == Hl.OK                   # the rejection left the window


def test_reconciler_health_and_the_change_log():
    assert Hl.reconciler_health("").level == Hl.OK
    assert Hl.reconciler_health("OSError('disk')").level == Hl.ERROR
    log = Hl.HealthLog()
    ok = Hl.Health()
    lost = Hl.Health((Hl.Problem("reconciler_lost", Hl.WARN, "reconciler lost (x)"),))
    assert log.change(ok) is None
    assert log.change(lost) == (Hl.WARN, "WARN: reconciler lost (x)")
    assert log.change(lost) is None                       # same problems: logged once
    assert log.change(ok) == (Hl.OK, "healthy again (cleared: reconciler_lost)")
