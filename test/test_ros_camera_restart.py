"""A camera_ingest restart mid-run: its frame numbering starts over, the state must not notice.

Real processes over DDS: reasoning and reconciler keep running while the
camera node is stopped and started again (as a respawning launch file or an
operator would). Afterwards the frame ids the cycles report keep growing, and
the reconciler keeps mirroring, so swaps go on; before the fix in
core/frame_ids.py the reconciler took every new chunk for a re-sent old one
and reconciliation stalled until the new ids passed the old maximum.
"""
import time

import pytest
from diagnostic_msgs.msg import DiagnosticArray
from diagnostic_msgs.msg import DiagnosticStatus

import ros_helpers as H
from vla_edge_ros.nodes import conversions as conv
from vla_edge_ros.nodes import graph
from vla_edge_ros.nodes.interfaces import ActionTokens

pytestmark = pytest.mark.ros
FRAMES_BEFORE_RESTART = 300          # 5 s of the 60 Hz footage


def _action_frame_ids(tokens, since: float = -1.0) -> list:
    return [conv.action_tokens_fields(m)["frame_id"] for t, m in tokens.items() if t > since]


def test_a_restarted_camera_node_does_not_stall_the_state(tiny_model_dir, tmp_path):
    harness = H.RosHarness(H.ros_domain(__name__))
    tokens = harness.collect(ActionTokens, graph.ACTION_TOKENS_TOPIC)
    fallbacks = harness.collect(DiagnosticStatus, graph.FALLBACK_TOPIC)
    diagnostics = harness.collect(DiagnosticArray, graph.DIAGNOSTICS_TOPIC)
    # Room for 12 frames: a reconciliation round every few hundred milliseconds.
    overrides = {"model.path": str(tiny_model_dir), "kv.capacity_tokens": 480}
    core = H.start_graph(harness.domain_id, overrides, names=("reasoning", "reconciler"), log_dir=tmp_path / "core")
    camera_node = None
    camera = H.CameraPublisher(harness, H.footage_rgb(120))
    try:
        camera_node = H.start_graph(harness.domain_id, overrides, names=("camera_ingest",), log_dir=tmp_path / "cam1")
        H.wait_matched(tokens, fallbacks)       # before it, a cycle's outcome could be lost and read as a gap
        camera.start()
        H.wait_until(lambda: int((H.latest_status(diagnostics, "reasoning") or {}).get("swap.swaps", 0)) >= 2,
                     H.GRAPH_START_TIMEOUT_S, "two swaps before the restart")
        # And enough frames numbered before it that the restarted camera's first ones number below them even when
        # the reasoning node discovers the new camera_ingest seconds late (a loaded CI machine): the frames it
        # published before that are lost, and one numbered past the old maximum hides the restart. Two swaps alone
        # took 63-109 frames here (1-2 s), and a CI run failed on the log line at the end: the restart went unseen.
        H.wait_until(lambda: max(_action_frame_ids(tokens), default=0) >= FRAMES_BEFORE_RESTART, 30.0,
                     f"actions on {FRAMES_BEFORE_RESTART} frames before the restart")
        # The footage pauses over the restart, so the reasoning node has discovered the new camera_ingest before
        # its frame numbers start over: otherwise, on a slow machine, the numbers the reasoning node first sees
        # may already be past the old ones and the restart is (harmlessly) invisible to it.
        camera.stop()
        assert camera_node.stop() == {"camera_ingest": 0}
        before_max = max(_action_frame_ids(tokens))
        camera_node = H.start_graph(harness.domain_id, overrides, names=("camera_ingest",), log_dir=tmp_path / "cam2")
        H.wait_until(lambda: harness.node.get_publishers_info_by_topic(graph.FRAME_TOPIC), 10.0,
                     "the new camera_ingest's /vla/frame publisher")
        time.sleep(1.0)
        camera = H.CameraPublisher(harness, H.footage_rgb(120)).start()
        # The restarted camera numbers its frames from 1 again; the state must see them as new ones.
        H.wait_until(lambda: any(f > before_max for f in _action_frame_ids(tokens)), 30.0,
                     "an action on a frame of the restarted camera")
        t_new = time.monotonic()
        first = H.wait_until(lambda: H.latest_status(diagnostics, "reconciler", since=t_new), 5.0, "reconciler diagnostics")
        version = H.wait_until(lambda: H.latest_status(diagnostics, "reasoning", since=t_new), 5.0, "reasoning diagnostics")
        swaps = int(version["swap.swaps"])
        H.wait_until(lambda: int((H.latest_status(diagnostics, "reasoning", since=t_new) or {}).get("swap.swaps", 0))
                     >= swaps + 2, 30.0, "two more swaps on the restarted camera's frames")
        t_swaps = time.monotonic()
        last = H.wait_until(lambda: H.latest_status(diagnostics, "reconciler", since=t_swaps), 5.0, "later reconciler diagnostics")
        camera.stop()
        dead = core.dead()
    finally:
        camera.stop()
        if camera_node is not None:
            camera_node.stop()
        core.stop()
        harness.close()
    assert dead == {}, H.node_log(tmp_path / "core", "reasoning")[-3000:]
    H.assert_no_gaps(H.cycle_outputs(tokens, fallbacks))
    frame_ids = _action_frame_ids(tokens)
    assert frame_ids == sorted(frame_ids), "the state's frame ids went backwards after the camera restart"
    # The reconciler went on mirroring the new frames instead of discarding them as re-sent old ones.
    assert int(last["chunks_mirrored"]) > int(first["chunks_mirrored"]), (first, last)
    assert int(last["duplicate_chunks"]) == 0, last
    assert "camera_ingest restarted?" in H.node_log(tmp_path / "core", "reasoning")
