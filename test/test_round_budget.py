"""The round budget's arithmetic (core/round_budget.py) on the figures it was written for."""
import pytest

from vla_edge_ros.core.round_budget import APPLY_WINDOW, ARRIVAL_WINDOW, REBUILD_WINDOW, RoundBudget


def arrivals(budget, hz: float, n: int, start: float = 0.0) -> None:
    for i in range(n):
        budget.frame_arrived(start + i / hz)


def test_no_bound_until_both_rates_are_measured():
    b = RoundBudget(0.8)
    assert b.frame_limit(125) is None
    arrivals(b, 30.0, 10)
    assert b.frame_limit(125) is None           # arrivals known, no round measured yet
    b.round_measured(0, 1.0)                      # nothing computed: no measurement
    assert b.frame_limit(125) is None


def test_the_h200_semantic_soak_round_of_94_frames_is_cut_to_73():
    """2026-12-03 on the H200: 3.74 frames per gap at 30 gaps/s rebuilt, 30 frames/s admitted, 125 frames: a round
    of 94 outgrew the arena; the bound keeps floor(0.8 x 125 x (1 - 30/112.2)) = 73."""
    b = RoundBudget(0.8)
    arrivals(b, 30.0, 200)
    b.round_measured(94, 94 / (3.74 * 30.0))
    assert b.arrival_frames_per_s == pytest.approx(30.0)
    assert b.frame_limit(125) == 73
    kept = 73
    caught_up = kept * b.rebuild_frames_per_s / (b.rebuild_frames_per_s - b.arrival_frames_per_s)
    assert caught_up <= 0.8 * 125 + 1e-9         # what the bound promises: it fits with the margin's room left


def test_a_reconciler_no_faster_than_the_camera_gets_one_frame_rounds():
    b = RoundBudget(0.8)
    arrivals(b, 30.0, 5)
    b.round_measured(20, 1.0)
    assert b.frame_limit(125) == 1


def test_the_arrival_rate_follows_the_newest_window_and_the_rebuild_rate_the_newest_rounds():
    b = RoundBudget(0.8)
    arrivals(b, 10.0, ARRIVAL_WINDOW)
    arrivals(b, 30.0, ARRIVAL_WINDOW, start=100.0)
    assert b.arrival_frames_per_s == pytest.approx(30.0)
    b.round_measured(10, 1.0)
    for _ in range(REBUILD_WINDOW):
        b.round_measured(60, 1.0)
    assert b.rebuild_frames_per_s == 60.0 and b.frame_limit(100) == 40      # the 10-frame round left the window


def test_one_tiny_round_does_not_set_the_rebuild_rate_alone():
    """Rounds that waited for their gaps (60 frames in 10 s), then one bounded to a frame that its first step
    finished (5 frames in 4 ms): pooled, the rate stays near what the slack gives, and the bound with it."""
    b = RoundBudget(0.8)
    arrivals(b, 15.0, 100)
    for _ in range(3):
        b.round_measured(60, 10.0)
    b.round_measured(5, 0.004)
    assert b.rebuild_frames_per_s == pytest.approx(185 / 30.004)
    assert b.frame_limit(128) == 1                    # still slower than the arrivals: no round can catch up


@pytest.mark.parametrize("margin", [0.0, 1.5])
def test_a_margin_outside_zero_to_one_is_refused(margin):
    with pytest.raises(ValueError, match="margin"):
        RoundBudget(margin)


def test_the_offer_to_swap_time_takes_its_arrivals_off_the_room():
    """(margin x C - a x L) x (1 - a/b): 30 frames/s for up to 1 s between offer and swap leave 100 - 30 = 70 frames
    of room; at b = 60 half of it can be kept. The slowest of the newest APPLY_WINDOW rounds counts."""
    b = RoundBudget(0.8)
    arrivals(b, 30.0, 100)
    b.round_measured(60, 1.0)
    assert b.frame_limit(125) == 50
    b.round_applied(1.0)
    for _ in range(APPLY_WINDOW - 1):
        b.round_applied(0.2)
    assert b.offer_to_swap_s == 1.0 and b.frame_limit(125) == 35
    b.round_applied(0.2)                     # the slow one leaves the window
    assert b.offer_to_swap_s == pytest.approx(0.2) and b.frame_limit(125) == 47
