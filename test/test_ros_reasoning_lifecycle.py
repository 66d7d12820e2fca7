"""The reasoning node as a lifecycle node, driven through the standard lifecycle services.

A real node process over DDS with the tiny model and a 60 Hz camera of real
footage: nothing is published while unconfigured or inactive; configure
builds and warms up the engine (the warm-up shows in /diagnostics, and the
first live cycles are not refused); activate starts cycles; deactivate stops
them after a last outcome; cleanup and a second configure work again; a model
that cannot load fails configure with the reason and leaves the node alive.
"""
import shutil
import time
from pathlib import Path

import pytest
from diagnostic_msgs.msg import DiagnosticArray
from diagnostic_msgs.msg import DiagnosticStatus
from lifecycle_msgs.msg import State
from lifecycle_msgs.msg import Transition
from lifecycle_msgs.srv import ChangeState

import ros_helpers as H
from vla_edge_ros.nodes import graph
from vla_edge_ros.nodes.interfaces import ActionTokens
from vla_edge_ros.tools.bringup import BringupError
from vla_edge_ros.tools.bringup import GraphProcesses

pytestmark = pytest.mark.ros
NODE = "reasoning"


@pytest.fixture(scope="module")
def harness():
    h = H.RosHarness(H.ros_domain(__name__))
    yield h
    h.close()


def _state(harness) -> int:
    return H.lifecycle_state(harness, NODE, timeout_s=H.GRAPH_START_TIMEOUT_S)


def _transition(harness, transition_id: int) -> None:
    H.lifecycle_transition(harness, NODE, transition_id, timeout_s=60.0)


def _outputs(tokens, fallbacks) -> int:
    return len(tokens) + len(fallbacks)


def test_configure_activate_deactivate_cleanup_and_again(tiny_model_dir, harness, tmp_path):
    tokens = harness.collect(ActionTokens, graph.ACTION_TOKENS_TOPIC)
    fallbacks = harness.collect(DiagnosticStatus, graph.FALLBACK_TOPIC)
    diagnostics = harness.collect(DiagnosticArray, graph.DIAGNOSTICS_TOPIC)
    camera = H.CameraPublisher(harness, H.footage_rgb(60))
    procs = GraphProcesses(overrides={"model.path": str(tiny_model_dir), "kv.capacity_tokens": 1024,
                                      "cycle.deadline_ms": H.PLUMBING_DEADLINE_MS},
                           env=H.graph_env(harness.domain_id),
                           nodes=(graph.node("camera_ingest"), graph.node(NODE)), log_dir=tmp_path)
    procs.start()
    camera.start()
    try:
        assert _state(harness) == State.PRIMARY_STATE_UNCONFIGURED
        time.sleep(1.0)
        assert _outputs(tokens, fallbacks) == 0, "cycles ran while unconfigured"

        _transition(harness, Transition.TRANSITION_CONFIGURE)
        assert _state(harness) == State.PRIMARY_STATE_INACTIVE
        time.sleep(1.0)
        assert _outputs(tokens, fallbacks) == 0, "cycles ran while inactive"
        status = H.wait_until(lambda: (s := H.latest_status(diagnostics, NODE)) and "warmup.steady_ms" in s and s,
                              10.0, "the warm-up figures in the reasoning node's diagnostics")
        assert status["lifecycle_state"] == "inactive"
        assert float(status["warmup.steady_ms"]) > 0 and int(status["warmup.cycles"]) >= 2
        # The capacity check ran in the configure too (core/capacity_check.py): its figures and verdict published.
        assert int(status["capacity.full_frames"]) > int(status["capacity.short_frames"]) > 0, status
        assert float(status["capacity.full_ms"]) > 0 and status["capacity.fits"] in ("True", "False")
        assert status["total.cycles"] == "0", "warm-up cycles must not count as served cycles"

        H.wait_matched(tokens, fallbacks)       # cycle 0 must be seen below: both topics matched before they run
        _transition(harness, Transition.TRANSITION_ACTIVATE)
        H.wait_until(lambda: len(tokens) >= 30, 30.0, "30 actions after activate")
        outcomes = H.cycle_outputs(tokens, fallbacks)
        H.assert_no_gaps(outcomes)
        assert min(outcomes) == 0, "cycle ids start at 0 after the warm-up"
        refused = [c for c, o in outcomes.items() if o[0] == "fallback" and o[1] == "refused_budget"]
        assert not refused, f"the seeded admission estimate still refused cycles {refused}"

        _transition(harness, Transition.TRANSITION_DEACTIVATE)
        assert _state(harness) == State.PRIMARY_STATE_INACTIVE
        time.sleep(0.3)                   # outcomes of the last cycle still in flight arrive
        seen = _outputs(tokens, fallbacks)
        time.sleep(1.0)
        assert _outputs(tokens, fallbacks) == seen, "cycles ran after deactivate"
        H.assert_no_gaps(H.cycle_outputs(tokens, fallbacks))

        _transition(harness, Transition.TRANSITION_CLEANUP)
        assert _state(harness) == State.PRIMARY_STATE_UNCONFIGURED
        _transition(harness, Transition.TRANSITION_CONFIGURE)
        _transition(harness, Transition.TRANSITION_ACTIVATE)
        H.wait_until(lambda: _outputs(tokens, fallbacks) > seen + 10, 30.0, "cycles after a second configure")
        assert procs.dead() == {}
    finally:
        camera.stop()
        codes = procs.stop()
    log = H.node_log(tmp_path, NODE)
    assert "configured in" in log and "warm-up" in log, log[-2000:]
    assert codes == {"camera_ingest": 0, NODE: 0}, log[-3000:]


def test_a_model_that_cannot_load_fails_configure_and_the_node_stays_up(tiny_model_dir, harness, tmp_path):
    broken = Path(shutil.copytree(tiny_model_dir, tmp_path / "broken"))
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])            # truncated
    procs = GraphProcesses(overrides={"model.path": str(broken)}, env=H.graph_env(harness.domain_id),
                           nodes=(graph.node(NODE),), log_dir=tmp_path)
    procs.start()
    try:
        assert _state(harness) == State.PRIMARY_STATE_UNCONFIGURED
        with pytest.raises(BringupError):
            _transition(harness, Transition.TRANSITION_CONFIGURE)
        assert _state(harness) == State.PRIMARY_STATE_UNCONFIGURED
        assert procs.dead() == {}
    finally:
        codes = procs.stop()
    log = H.node_log(tmp_path, NODE)
    assert "configure failed" in log and "truncated" in log, log[-2000:]
    assert codes == {NODE: 0}, log[-2000:]


def test_a_transition_out_of_order_is_answered_and_shutdown_ends_the_process(tiny_model_dir, harness, tmp_path):
    """ACTIVATE asked by id of an unconfigured node: rclpy raised inside its service and no answer ever came; it is
    refused with an answer now. SHUTDOWN finalizes the node and its process exits (it stayed up, serving nothing,
    so a supervisor never saw it gone)."""
    procs = GraphProcesses(overrides={"model.path": str(tiny_model_dir)}, env=H.graph_env(harness.domain_id),
                           nodes=(graph.node(NODE),), log_dir=tmp_path)
    procs.start()
    try:
        assert _state(harness) == State.PRIMARY_STATE_UNCONFIGURED
        activate = ChangeState.Request()
        activate.transition.id = Transition.TRANSITION_ACTIVATE          # idempotent while refused: re-sent if lost
        answer = H.call_service(harness, ChangeState, f"/{NODE}/change_state", activate)
        assert answer is not None and not answer.success, "an out-of-order transition went unanswered"
        assert _state(harness) == State.PRIMARY_STATE_UNCONFIGURED and procs.dead() == {}
        shutdown = ChangeState.Request()
        shutdown.transition.id = Transition.TRANSITION_UNCONFIGURED_SHUTDOWN
        answer = H.call_service(harness, ChangeState, f"/{NODE}/change_state", shutdown, resend_s=30.0)   # once
        assert answer is not None and answer.success
        H.wait_until(lambda: procs.dead(), 20.0, "the finalized node's process to exit")
        assert procs.dead() == {NODE: 0}
    finally:
        procs.stop()
    log = H.node_log(tmp_path, NODE)
    assert "refused" in log and "finalized: the process exits" in log, log[-2000:]
