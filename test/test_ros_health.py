"""/diagnostics levels that mean something (issue 11, defect 5), on real node processes: a policy
that produces nothing is not OK, a camera_ingest that receives nothing is not OK, and both say
OK again once real footage flows."""
import time

import pytest
from diagnostic_msgs.msg import DiagnosticArray
from diagnostic_msgs.msg import DiagnosticStatus

import ros_helpers as H

pytestmark = pytest.mark.ros


def test_levels_say_when_nothing_comes_in_and_nothing_goes_out(tiny_model_dir, tmp_path):
    domain = H.ros_domain(__name__)
    harness = H.RosHarness(domain)
    diagnostics = harness.collect(DiagnosticArray, "/diagnostics")
    procs = H.start_graph(domain, {"model.path": str(tiny_model_dir)}, names=("camera_ingest", "reasoning"),
                          log_dir=tmp_path)
    camera = H.CameraPublisher(harness, H.footage_rgb(60))
    try:
        # No camera: every cycle is a no_frame fallback (fallback rate 1.0) and no action ever comes. The
        # ERROR needs health.no_action_error_s (1 s) of activity, and is seen at the next diagnostics
        # message (one a second): a fixed 1.1 s after the first message could still read the WARN before it.
        H.wait_until(lambda: H.latest_status(diagnostics, "reasoning") and H.latest_status(diagnostics, "camera_ingest"),
                     H.GRAPH_START_TIMEOUT_S, "diagnostics of both nodes")
        H.wait_until(lambda: (s := H.latest_status_msg(diagnostics, "reasoning")) and s.level == DiagnosticStatus.ERROR,
                     5.0, "reasoning ERROR while nothing comes in")
        reasoning = H.latest_status_msg(diagnostics, "reasoning")
        ingest = H.latest_status_msg(diagnostics, "camera_ingest")
        assert reasoning.level == DiagnosticStatus.ERROR, (reasoning.level, reasoning.message)
        assert "no action published" in reasoning.message and "fallback rate 1.00" in reasoning.message
        assert ingest.level == DiagnosticStatus.WARN and "no image" in ingest.message, (ingest.level, ingest.message)
        # Real footage at 60 Hz: the camera is OK, the policy acts (no ERROR; a deadline miss on this
        # busy machine may still be a WARN, which is what it is).
        camera.start()
        t_flow = time.monotonic()
        H.wait_until(lambda: (s := H.latest_status_msg(diagnostics, "camera_ingest")) and s.level == DiagnosticStatus.OK,
                     15.0, "camera_ingest OK while images arrive")
        H.wait_until(lambda: (s := H.latest_status_msg(diagnostics, "reasoning")) and
                     s.level != DiagnosticStatus.ERROR and "no action" not in s.message, 15.0,
                     "reasoning without ERROR while it acts")
        assert time.monotonic() - t_flow < 15.0
        camera.stop()
        # The camera stops: camera_ingest warns within a diagnostics period, reasoning errs within two.
        H.wait_until(lambda: (s := H.latest_status_msg(diagnostics, "camera_ingest")) and
                     s.level == DiagnosticStatus.WARN and "no image for" in s.message, 5.0, "camera_ingest WARN")
        H.wait_until(lambda: (s := H.latest_status_msg(diagnostics, "reasoning")) and
                     s.level == DiagnosticStatus.ERROR, 5.0, "reasoning ERROR")
        assert procs.dead() == {}
    finally:
        camera.stop()
        codes = procs.stop()
        harness.close()
    assert set(codes.values()) == {0}, codes
    log = H.node_log(tmp_path, "reasoning")
    assert "diagnostics: ERROR: no action published" in log and "callback failed" not in log, log[-2000:]
