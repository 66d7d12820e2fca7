"""vision.encode_ahead in the ROS graph: the reasoning node encodes frames as they arrive and its cycles take them.

The camera and reasoning nodes as separate processes over real DDS, real footage at 60 Hz, the tiny model: every
cycle answers, the diagnostics count the cycles that found their frame encoded, the
phase table has the worker's encodes, and deactivating the node stops the worker (its counts in the log).
How many cycles find their frame encoded depends on the machine's load (the worker shares two cores with the
camera and the test here), so the share is not asserted: test_vision_prefetch.py checks take() itself.
"""
import pytest
from diagnostic_msgs.msg import DiagnosticArray

import ros_helpers as H
from vla_edge_ros.nodes import graph
from vla_edge_ros.nodes.interfaces import ActionTokens

pytestmark = pytest.mark.ros
ACTIONS = 30


def test_cycles_take_the_frames_the_worker_encoded(tmp_path, tiny_model_dir):
    logs = tmp_path / "logs"
    domain = H.ros_domain(__name__)
    harness = H.RosHarness(domain)
    tokens = harness.collect(ActionTokens, graph.ACTION_TOKENS_TOPIC)
    diagnostics = harness.collect(DiagnosticArray, graph.DIAGNOSTICS_TOPIC)
    camera = H.CameraPublisher(harness, H.footage_rgb(120))
    procs = H.start_graph(domain, {"model.path": str(tiny_model_dir), "vision.encode_ahead": True},
                          names=("camera_ingest", "reasoning"), log_dir=logs)
    try:
        camera.start()
        H.wait_until(lambda: len(tokens) > 0, H.GRAPH_START_TIMEOUT_S, "the first action")
        H.wait_until(lambda: len(tokens) > ACTIONS, 30.0, f"{ACTIONS} actions with the worker encoding ahead")
        H.wait_until(lambda: int((H.latest_status(diagnostics, "reasoning") or {}).get("vision_prefetch.hits", 0)) > 0,
                     5.0, "cycles that found their frame encoded, in the reasoning node's diagnostics")
        status = H.latest_status(diagnostics, "reasoning")
        camera.stop()
        alive = procs.dead()
    finally:
        codes = procs.stop()
        harness.close()
    assert not alive and all(code == 0 for code in codes.values()), codes
    hits = int(status["vision_prefetch.hits"])
    assert int(status["vision_prefetch.encoded"]) >= hits and int(status["vision_prefetch.errors"]) == 0
    assert float(status["phase.vision_ahead.n"]) > 0
    log = H.node_log(logs, "reasoning")
    assert "vision.encode_ahead: frames encoded on arrival" in log
    assert "vision prefetch stopped:" in log            # the worker ended with the node (its counts logged)
