"""The demo report's exact-forgetting verdict (tools/demo_report.py) from the nodes' /diagnostics values, as
the controller receives them (strings): one word a reader can trust at a glance, and the numbers behind it."""
from vla_edge_ros.tools.demo_report import EXACT_SHARE_WORKED, exactness, format_table


def _diagnostics(actions=100, exact=100, swaps=0, started=0, applied=0, aborted_fits=0, deferred=0, no_slack=0,
                 no_room=0):
    reasoning = {"total.actions": str(actions), "total.exact_actions": str(exact), "swap.swaps": str(swaps),
                 "swap.swap_deferred_stale": str(deferred), "swap.swap_deferred_no_slack": str(no_slack),
                 "swap.swap_waits_no_room": str(no_room), "state.approximate_evictions": "0"}
    reconciler = {"rounds_started": str(started), "rounds_applied": str(applied),
                  "rounds_aborted": str(aborted_fits), "rounds_aborted_by.no_longer_fits": str(aborted_fits),
                  "trigger_to_applied_ms_p50": "420.5" if applied else "",
                  "trigger_to_applied_ms_max": "900" if applied else ""}
    return reasoning, reconciler


def test_the_verdict_says_whether_exact_forgetting_worked():
    assert exactness(*_diagnostics())["verdict"].startswith("not needed")
    worked = exactness(*_diagnostics(exact=int(100 * EXACT_SHARE_WORKED), swaps=5, started=6, applied=5,
                                     aborted_fits=1, deferred=2))
    assert worked["verdict"] == "YES" and worked["rounds_aborted_by"]["no_longer_fits"] == 1
    assert worked["trigger_to_swap_ms_p50"] == 420.5 and worked["offers_deferred_stale"] == 2
    partly = exactness(*_diagnostics(exact=60, swaps=3, started=9, applied=3, aborted_fits=6))
    assert partly["verdict"].startswith("PARTLY") and partly["exact_action_share"] == 0.6
    # The soak on the H200 before issue 20: 111 rounds, 109 aborted, 3 swaps, the state mostly approximate.
    soak = exactness(*_diagnostics(actions=7270, exact=700, swaps=3, started=111, applied=2, aborted_fits=109))
    assert soak["verdict"].startswith("NO") and "despite 3 swaps" in soak["verdict"]
    never = exactness(*_diagnostics(exact=40, started=4, aborted_fits=4))
    assert never["verdict"].startswith("NO")
    assert exactness({}, {})["verdict"].startswith("n/a")


def test_the_table_puts_the_verdict_and_the_swap_parts_on_their_own_lines():
    from vla_edge_ros.tools.demo_report import build_report
    reasoning, reconciler = _diagnostics(exact=97, swaps=4, started=5, applied=4, aborted_fits=1, deferred=3,
                                         no_slack=7, no_room=2)
    reasoning.update({"swap.swap_apply_ms_p50": "2.5", "swap.swap_apply_ms_p99": "4.0", "swap.swap_apply_ms_max": "4.1",
                      "swap.swap_kv_copy_ms_p50": "0.7", "swap.swap_recompute_ms_max": "3.0"})
    meta = {"seconds": 1.0, "camera_hz": 60.0, "deadline_ms": 33.0, "camera_to_first_action_s": 0.1,
            "model": "tiny", "backend": "NumpyBackend", "max_publish_ms": 0.1, "camera_frames_published": 60}
    table = format_table(build_report([], reasoning, {}, meta, reconciler))
    line = next(x for x in table.splitlines() if x.startswith("exact forgetting"))
    assert "YES: 97.0% of actions on an exact state" in line and "no_longer_fits 1" in line
    assert "3 stale offers deferred" in line and "trigger -> swap p50 420.50 ms" in line
    # Why offers were not applied when they came: no slack for their late frames, no room for a swap at all.
    assert "7 deferred without slack for their late frames" in line and "2 boundaries an offer waited" in line
    parts = next(x for x in table.splitlines() if x.startswith("swap at the boundary"))
    assert "whole 2.50/4.00/4.10 ms" in parts and "KV copy 0.70/n/a/n/a ms" in parts


def test_the_table_says_what_the_capacity_check_found_or_that_it_did_not_run():
    from vla_edge_ros.tools.demo_report import build_report
    meta = {"seconds": 1.0, "camera_hz": 60.0, "deadline_ms": 33.3, "camera_to_first_action_s": 0.1,
            "model": "qwen", "backend": "CudaBackend", "max_publish_ms": 0.1, "camera_frames_published": 60}
    reasoning, reconciler = _diagnostics()
    # As the reasoning node published it after its configure (strings): 1021 frames at 31.4 ms of a 31.1 ms budget.
    checked = {**reasoning, "capacity.short_frames": "3", "capacity.short_ms": "16", "capacity.full_frames": "1021",
               "capacity.full_tokens": "32697", "capacity.full_ms": "31.4", "capacity.budget_ms": "31.1",
               "capacity.budget_share": "0.9", "capacity.tokens_per_frame": "32", "capacity.fixed_tokens": "96",
               "capacity.fill_s": "0.8", "capacity.fits": "False", "capacity.frames_that_fit": "795"}
    report = build_report([], checked, {}, meta, reconciler)
    assert report["capacity_check"]["full_frames"] == 1021 and report["capacity_check"]["fits"] is False
    line = next(x for x in format_table(report).splitlines() if x.startswith("capacity check"))
    assert "1021 frames, 32697 tokens" in line and "admission will refuse cycles" in line
    assert f"kv.capacity_tokens <= {report['capacity_check']['capacity_tokens_that_fit']}" in line
    unchecked = build_report([], reasoning, {}, meta, reconciler)
    assert unchecked["capacity_check"] is None
    line = next(x for x in format_table(unchecked).splitlines() if x.startswith("capacity check"))
    assert "not run" in line
