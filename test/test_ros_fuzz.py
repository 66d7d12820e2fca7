"""Property-based fuzzing of camera_ingest as its own process over DDS (issue 11):

  images      fuzzed sensor_msgs/Image and CompressedImage messages (image_fuzz.py), each followed
              by a good frame: no exception escapes (the node stays up), every rejection is counted
              under its kind in /diagnostics, and every good frame still comes out on /vla/frame;
  parameters  `ros2 param set`-style SetParameters calls with every parameter type, declared and
              undeclared names, odd values: each is answered, successful exactly when the type is
              the declared one and config.py accepts the value, the node keeps the accepted values
              and still answers a good frame.

max_examples is modest: each example is a DDS round trip on a 2-core machine.
"""
import itertools
import math
import time
from collections import Counter

import numpy as np
import pytest
from diagnostic_msgs.msg import DiagnosticArray
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from rcl_interfaces.msg import Parameter
from rcl_interfaces.msg import ParameterType
from rcl_interfaces.msg import ParameterValue
from rcl_interfaces.srv import GetParameters
from rcl_interfaces.srv import SetParameters
from rclpy.qos import QoSProfile
from rclpy.qos import ReliabilityPolicy
from sensor_msgs.msg import CompressedImage
from sensor_msgs.msg import Image

import image_fuzz as F
import ros_helpers as H
from vla_edge_ros.nodes.camera_ingest import LIVE_KEYS as CAMERA_LIVE_KEYS
from vla_edge_ros import config as C
from vla_edge_ros.nodes import camera_images as images
from vla_edge_ros.nodes import conversions as conv
from vla_edge_ros.nodes import graph
from vla_edge_ros.nodes.interfaces import FrameMsg
from vla_edge_ros.nodes.params import ros_type_of
from vla_edge_ros.nodes.params import section_keys

pytestmark = pytest.mark.ros
COMPRESSED_TOPIC = "/camera/image_raw/compressed"
SECTIONS = ("camera", "vision", "cycle", "health")          # what camera_ingest declares
OVERRIDES = {"camera.reliability": "reliable", "camera.max_pixels": F.MAX_PIXELS}
SLOW = settings(max_examples=30, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@pytest.fixture(scope="module")
def ingest(tmp_path_factory):
    """camera_ingest for raw images and a second one for compressed, publishers and collectors."""
    log_dir = tmp_path_factory.mktemp("logs")
    harness = H.RosHarness(H.ros_domain(__name__))
    raw = graph.node("camera_ingest")
    compressed = graph.NodeSpec(name="camera_ingest_compressed", module=raw.module, executable=raw.executable,
                                parameters=(("camera.compressed", "true"), ("camera.input_topic", COMPRESSED_TOPIC)))
    procs = H.GraphProcesses(overrides=OVERRIDES, env=H.graph_env(harness.domain_id), nodes=(raw, compressed),
                             log_dir=log_dir)
    procs.start()
    qos = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE)
    rig = {"harness": harness, "procs": procs, "log_dir": log_dir,
           "raw": harness.node.create_publisher(Image, graph.CAMERA_TOPIC, qos),
           "compressed": harness.node.create_publisher(CompressedImage, COMPRESSED_TOPIC, qos),
           "frames": harness.collect(FrameMsg, graph.FRAME_TOPIC),
           "diagnostics": harness.collect(DiagnosticArray, graph.DIAGNOSTICS_TOPIC),
           "stamps": itertools.count(1)}
    try:
        H.wait_until(lambda: rig["raw"].get_subscription_count() and rig["compressed"].get_subscription_count(),
                     H.GRAPH_START_TIMEOUT_S, "both camera_ingest subscriptions")
        time.sleep(0.5)        # the subscriber side of the match completes a moment after the publisher's
        yield rig
    finally:
        codes = procs.stop()
        harness.close()
        assert set(codes.values()) == {0}, (codes, H.node_log(log_dir, "camera_ingest")[-2000:])


def _good_frame(rig, which: str) -> float:
    """Publish a good frame to one node and wait for it on /vla/frame; returns its stamp."""
    stamp = 5000.0 + next(rig["stamps"])
    rgb = H.footage_rgb(1)[0][:40, :60]                        # real footage, 2400 pixels < MAX_PIXELS
    if which == "raw":
        msg = conv.rgb_to_image_msg(rgb, conv.s_to_stamp(stamp), "camera")
    else:
        import cv2
        msg = CompressedImage(format="png", data=cv2.imencode(".png", rgb[..., ::-1])[1].tobytes())
        msg.header.stamp = conv.s_to_stamp(stamp)
    rig[which].publish(msg)
    H.wait_until(lambda: any(conv.stamp_to_s(m.image.header.stamp) == stamp for m in rig["frames"].messages()), 10.0,
                 f"the good {which} frame after a fuzzed one")
    return stamp


def _cases():
    raw = F.raw_images().map(lambda m: ("raw", m, F.expected_kind(m)))
    compressed = F.compressed_images().map(lambda c: ("compressed", c[0], c[1]))
    return st.one_of(raw, compressed)


def _local_kind(which, msg):
    """For payloads the oracle leaves open (a cut JPEG may decode): what the conversion does here."""
    try:
        images.compressed_msg_to_rgb(msg, F.MAX_PIXELS)
    except images.ImageRejected as exc:
        return exc.kind
    return None


def test_camera_ingest_counts_every_fuzzed_rejection_and_answers_good_frames(ingest):
    sent = {"raw": Counter(), "compressed": Counter()}           # kind (or "accepted") -> count, incl. good ones

    @SLOW
    @given(_cases())
    def fuzz(case):
        which, msg, expected = case
        if expected == "any":
            expected = _local_kind(which, msg)
        event(f"{which}: {expected or 'accepted'}")
        ingest[which].publish(msg)
        time.sleep(0.1)          # the camera subscription keeps the latest message only: let this one be taken
        sent[which][expected or "accepted"] += 1
        _good_frame(ingest, which)
        sent[which]["accepted"] += 1

    fuzz()
    assert ingest["procs"].dead() == {}, H.node_log(ingest["log_dir"], "camera_ingest")[-3000:]

    def counted():
        raw = H.latest_status(ingest["diagnostics"], " camera_ingest")
        comp = H.latest_status(ingest["diagnostics"], "camera_ingest_compressed")
        done = (raw and comp and int(raw["received"]) == sum(sent["raw"].values())
                and int(comp["received"]) == sum(sent["compressed"].values()))
        return done and (raw, comp)
    raw, comp = H.wait_until(counted, 5.0, f"every message counted as received: {sent}")
    for status, which in ((raw, "raw"), (comp, "compressed")):
        for kind in images.REJECTION_KINDS:
            assert int(status[f"rejected_{kind}"]) == sent[which][kind], (which, kind, status, sent[which])
        assert int(status["accepted"]) == sent[which]["accepted"], (which, status, sent[which])


# ----------------------------------------------------------------------------
# Parameters


_DECLARED = section_keys(SECTIONS, C.VlaConfig())
_NAMES = st.one_of(st.sampled_from(sorted(_DECLARED)), st.sampled_from(sorted(_DECLARED)),
                   st.sampled_from(["camera.frobnicate", "kv.capacity_tokens", "camera", "camera.max_pixels.x",
                                    ".max_pixels", "vision.patch_size "]))
_INT64 = st.integers(-2 ** 63, 2 ** 63 - 1)
_SMALL_INT = st.one_of(st.integers(-3, 100_000), _INT64)
_DOUBLE = st.one_of(st.floats(-1e3, 1e4), st.floats(allow_nan=True, allow_infinity=True))
_TEXT = st.one_of(st.sampled_from(["reliable", "best_effort", "sometimes", "", "/camera/image_raw"]), st.text(max_size=20))
_VALUES = {
    ParameterType.PARAMETER_NOT_SET: st.just({}),
    ParameterType.PARAMETER_BOOL: st.booleans().map(lambda v: {"bool_value": v}),
    ParameterType.PARAMETER_INTEGER: _SMALL_INT.map(lambda v: {"integer_value": v}),
    ParameterType.PARAMETER_DOUBLE: _DOUBLE.map(lambda v: {"double_value": v}),
    ParameterType.PARAMETER_STRING: _TEXT.map(lambda v: {"string_value": v}),
    ParameterType.PARAMETER_BYTE_ARRAY: st.binary(max_size=8).map(lambda b: {"byte_array_value": [bytes([x]) for x in b]}),
    ParameterType.PARAMETER_BOOL_ARRAY: st.lists(st.booleans(), max_size=4).map(lambda v: {"bool_array_value": v}),
    ParameterType.PARAMETER_INTEGER_ARRAY: st.lists(_INT64, max_size=4).map(lambda v: {"integer_array_value": v}),
    ParameterType.PARAMETER_DOUBLE_ARRAY: st.lists(_DOUBLE, max_size=4).map(lambda v: {"double_array_value": v}),
    ParameterType.PARAMETER_STRING_ARRAY: st.lists(_TEXT, max_size=4).map(lambda v: {"string_array_value": v}),
}


@st.composite
def _parameter(draw) -> Parameter:
    name = draw(_NAMES)
    declared = _DECLARED.get(name)
    # Half the time the declared type (so values reach config.py), otherwise any type.
    ptype = ros_type_of(declared) if declared is not None and draw(st.booleans()) else draw(st.sampled_from(sorted(_VALUES)))
    return Parameter(name=name, value=ParameterValue(type=ptype, **draw(_VALUES[ptype])))


def _python_value(value: ParameterValue):
    return {ParameterType.PARAMETER_BOOL: value.bool_value, ParameterType.PARAMETER_INTEGER: value.integer_value,
            ParameterType.PARAMETER_DOUBLE: value.double_value,
            ParameterType.PARAMETER_STRING: value.string_value}.get(value.type)


def _should_succeed(param: Parameter, current: dict) -> bool:
    """Declared here, of the declared type, a configuration config.py accepts, and either a key camera_ingest
    applies live or no change of value (the others are fixed while it runs: nodes/params.py)."""
    declared = _DECLARED.get(param.name)
    if declared is None or param.value.type != ros_type_of(declared):
        return False
    try:
        new = C.VlaConfig().replace({**current, param.name: _python_value(param.value)})
    except C.ConfigError:
        return False
    return param.name in CAMERA_LIVE_KEYS or new.flat()[param.name] == C.VlaConfig().replace(current).flat()[param.name]


def test_camera_ingest_answers_every_parameter_update_and_keeps_serving(ingest):
    harness = ingest["harness"]
    current = {k: OVERRIDES.get(k, v) for k, v in _DECLARED.items()}

    @SLOW
    @given(st.lists(_parameter(), min_size=1, max_size=3))
    def fuzz(params):
        results = H.call_service(harness, SetParameters, "/camera_ingest/set_parameters",
                                 SetParameters.Request(parameters=params)).results
        assert len(results) == len(params)
        for param, result in zip(params, results):
            expected = _should_succeed(param, current)
            event(f"{'accepted' if expected else 'refused'}")
            assert result.successful == expected, (param.name, param.value, result.reason)
            if result.successful:
                current[param.name] = _python_value(param.value)

    fuzz()
    assert ingest["procs"].dead() == {}, H.node_log(ingest["log_dir"], "camera_ingest")[-3000:]
    names = sorted(_DECLARED)
    values = H.call_service(harness, GetParameters, "/camera_ingest/get_parameters",
                            GetParameters.Request(names=names)).values
    for name, value in zip(names, values):
        got, want = _python_value(value), current[name]
        assert got == want or (isinstance(want, float) and math.isnan(want) and math.isnan(got)), (name, got, want)
    # The live key may have been fuzzed below the good frame's size (it is then rightly rejected): set it back,
    # then frames must go on as before (every other change applies only at the next start).
    reset = Parameter(name="camera.max_pixels", value=ParameterValue(type=ParameterType.PARAMETER_INTEGER,
                                                                     integer_value=F.MAX_PIXELS))
    results = H.call_service(harness, SetParameters, "/camera_ingest/set_parameters",
                             SetParameters.Request(parameters=[reset])).results
    assert results[0].successful, results[0].reason
    _good_frame(ingest, "raw")
    out = ingest["frames"].messages()[-1].image
    assert (out.width, out.height) == (C.VlaConfig().vision.image_width, C.VlaConfig().vision.image_height)
    assert np.frombuffer(out.data, np.uint8).size == out.width * out.height * 3
