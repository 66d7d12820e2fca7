"""60 Hz camera, slow consumer: only the freshest frame is processed, overwritten frames are
counted, the camera's publisher never blocks.

camera_ingest and reasoning run as separate processes; the reasoning cycle is
made slow (cycle.deadline_ms = 200: 5 cycles/s against 60 frames/s), so about
11 of every 12 frames must be overwritten in the reasoning node's double buffer.
"""
import time

import numpy as np
import pytest
from diagnostic_msgs.msg import DiagnosticArray
from diagnostic_msgs.msg import DiagnosticStatus

import ros_helpers as H
from vla_edge_ros.nodes import conversions as conv
from vla_edge_ros.nodes import graph
from vla_edge_ros.nodes.interfaces import ActionTokens

pytestmark = pytest.mark.ros
CAMERA_HZ = 60.0
CYCLE_MS = 200.0
RUN_S = 4.0


@pytest.fixture(scope="module")
def run(tiny_model_dir):
    model = tiny_model_dir
    domain = H.ros_domain(__name__)
    harness = H.RosHarness(domain)
    tokens = harness.collect(ActionTokens, graph.ACTION_TOKENS_TOPIC)
    fallbacks = harness.collect(DiagnosticStatus, graph.FALLBACK_TOPIC)
    diagnostics = harness.collect(DiagnosticArray, graph.DIAGNOSTICS_TOPIC)
    camera = H.CameraPublisher(harness, H.footage_rgb(60), hz=CAMERA_HZ)
    procs = H.start_graph(domain, {"model.path": str(model), "cycle.deadline_ms": CYCLE_MS},
                          names=("camera_ingest", "reasoning"))
    try:
        H.wait_until(lambda: len(tokens) + len(fallbacks) > 0, H.GRAPH_START_TIMEOUT_S, "the first cycle")
        # camera_ingest must have matched the camera before it starts: Fast DDS sometimes misses its first
        # announcements and matches seconds later, which would drop the first frames and stall one publish
        # call inside the measured run (seen: 72 of 242 frames received, one 335 ms publish).
        H.wait_until(lambda: camera.publisher.get_subscription_count() > 0, H.GRAPH_START_TIMEOUT_S,
                     "camera_ingest subscribed to the camera")
        clock_offset = time.time() - time.monotonic()          # ROS time here is the system clock
        camera.start()
        time.sleep(RUN_S)
        camera.stop()
        n_diag = len(diagnostics)
        H.wait_until(lambda: len(diagnostics) >= n_diag + 2, 5.0, "diagnostics after the camera stopped")
    finally:
        procs.stop()
        harness.close()
    yield {"tokens": tokens, "camera": camera, "diagnostics": diagnostics, "clock_offset": clock_offset}


def test_publisher_never_blocks(run):
    sent = run["camera"].sent
    # The very first publish() of a new publisher sets up its DDS writer (up to ~0.3 s here); not a wait.
    durations = np.array([after - before for _, before, after in sent[1:]])
    span = sent[-1][1] - sent[0][1]
    rate = (len(sent) - 1) / span
    # A publisher that waited for the 5 Hz consumer would take ~200 ms per call and publish at 5 Hz.
    assert rate > 0.9 * CAMERA_HZ, f"camera published at {rate:.1f} Hz"
    assert np.median(durations) < 0.005 and durations.max() < 0.5 * CYCLE_MS / 1000.0, \
        f"publish() took median {np.median(durations) * 1e3:.2f} ms, max {durations.max() * 1e3:.2f} ms"


def test_overwritten_frames_are_counted(run):
    reasoning = H.latest_status(run["diagnostics"], "reasoning")
    ingest = H.latest_status(run["diagnostics"], "camera_ingest")
    received, consumed, overwritten = (int(reasoning[k]) for k in
                                       ("frames_received", "frames_consumed", "frames_overwritten"))
    sent = len(run["camera"].sent)
    assert int(ingest["received"]) >= 0.8 * sent, (ingest, sent)
    assert received >= 0.8 * sent, f"reasoning got {received} of {sent} frames"
    # Each frame is consumed once or overwritten once (the newest may still be pending).
    assert 0 <= received - consumed - overwritten <= 1, (received, consumed, overwritten)
    # 60 frames/s into 5 cycles/s: at most one frame per cycle can be consumed.
    cycles = int(reasoning["total.cycles"])
    assert consumed <= cycles + 1, (consumed, cycles)
    # So every other frame was overwritten. The share depends on how many cycles the loaded
    # machine ran; with 5 cycles/s against 60 frames/s it is far above half.
    assert overwritten >= received - cycles - 2, (received, cycles, overwritten)
    assert overwritten >= 0.5 * received, f"only {overwritten} of {received} frames overwritten"


def test_only_the_freshest_frame_is_processed(run):
    sent_stamps = np.array([s for s, _, _ in run["camera"].sent])
    ages = []
    for received_mono, msg in run["tokens"].items():
        f = conv.action_tokens_fields(msg)
        if not f["new_frame"]:
            continue
        stamp = f["stamp_sec"] + f["stamp_nanosec"] * 1e-9
        answered_at = received_mono + run["clock_offset"]
        if answered_at > sent_stamps[-1]:
            continue                 # after the camera stopped, the last frame simply ages
        assert np.min(np.abs(sent_stamps - stamp)) < 2e-6, "answered a frame the camera never sent"
        ages.append(answered_at - stamp)
    assert len(ages) >= 5, f"only {len(ages)} frames processed"
    ages = np.array(ages)
    # Freshest frame at each cycle start: age at the answer ~ one camera period + transport + compute.
    # A FIFO consumer would fall behind by 12 frames (200 ms) more with every cycle.
    assert np.percentile(ages, 90) < 0.1 and ages.max() < CYCLE_MS / 1000.0, \
        f"ages of processed frames at answer time (ms): {np.round(ages * 1e3, 1).tolist()}"
