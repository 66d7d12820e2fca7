"""What `ros2 topic echo` shows: every topic the graph publishes, read by a generic subscriber.

The three nodes run as separate processes over real DDS with real footage. The
test knows no topic and no type in advance: it asks the ROS graph what each of
our nodes publishes, resolves each type name to its Python class the way
`ros2 topic echo` does (rosidl_runtime_py.utilities.get_message; that package
has no wheel, so the three lines of it are below), subscribes with raw CDR
bytes and deserializes them itself. Every header.frame_id in every message,
nested ones included (a StateChunk's frame's image), must be a TF frame name:
the configured camera frame where the message is about a camera frame, empty
elsewhere; no protocol data ('#', '@', numbers glued to a prefix).
"""
import importlib
import time

import pytest
from rclpy.qos import QoSProfile
from rclpy.qos import ReliabilityPolicy
from rclpy.serialization import deserialize_message

import ros_helpers as H
from vla_edge_ros import config as C
from vla_edge_ros.config import TF_FRAME_NAME
from vla_edge_ros.nodes import graph

pytestmark = pytest.mark.ros
CAMERA_FRAME = "vla_test_camera"      # not the default: proves the name comes from camera.frame_id
LISTEN_S = 3.0
HEADER_FIELD_TYPE = "std_msgs/Header"          # how get_fields_and_field_types() names a header field
# Topics whose headers name the camera's frame; every other header has an empty frame_id.
CAMERA_FRAME_TOPICS = {graph.FRAME_TOPIC, graph.STATE_CHUNK_TOPIC, graph.ACTION_TOKENS_TOPIC}
# Published all the time while frames come in and cycles run: each must be heard.
MUST_HEAR = {graph.FRAME_TOPIC, graph.STATE_CHUNK_TOPIC, graph.ACTION_TOKENS_TOPIC, graph.ACTION_TOPIC,
             graph.DIAGNOSTICS_TOPIC}


def message_class(type_name: str):
    """'pkg/msg/Name' -> the generated class, as rosidl_runtime_py.utilities.get_message resolves it."""
    package, kind, name = type_name.split("/")
    return getattr(importlib.import_module(f"{package}.{kind}"), name)


def headers(msg, path: str = ""):
    """(field path, std_msgs/Header) of every header inside `msg`, at any depth."""
    fields = getattr(msg, "get_fields_and_field_types", None)
    if fields is None:
        return
    for name, type_name in fields().items():
        value = getattr(msg, name)
        if type_name == HEADER_FIELD_TYPE:
            yield f"{path}.{name}", value
        elif isinstance(value, list):                          # sequences of messages (primitives are arrays)
            for i, item in enumerate(value):
                yield from headers(item, f"{path}.{name}[{i}]")
        else:
            yield from headers(value, f"{path}.{name}")


@pytest.fixture(scope="module")
def echoed(tmp_path_factory, tiny_model_dir):
    """{topic: (type name, [deserialized messages])} of everything the three nodes publish."""
    logs = tmp_path_factory.mktemp("logs")
    domain = H.ros_domain(__name__)
    harness = H.RosHarness(domain)
    camera = H.CameraPublisher(harness, H.footage_rgb(120))
    overrides = {"model.path": str(tiny_model_dir), "camera.frame_id": CAMERA_FRAME,
                 "cycle.deadline_ms": H.PLUMBING_DEADLINE_MS}
    procs = H.start_graph(domain, overrides, log_dir=logs)
    raw: dict = {}
    try:
        camera.start()
        node = harness.node
        published = H.wait_until(lambda: (found := _published_topics(node)).keys() >= MUST_HEAR and found,
                                 H.GRAPH_START_TIMEOUT_S, f"publishers of {sorted(MUST_HEAR)}")
        # Every publisher of the graph is reliable; a reliable reader sees each message that was kept for it.
        qos = QoSProfile(depth=1000, reliability=ReliabilityPolicy.RELIABLE)
        for topic, type_name in published.items():
            raw[topic] = (type_name, [])
            node.create_subscription(message_class(type_name), topic, raw[topic][1].append, qos, raw=True)
        H.wait_until(lambda: all(raw[t][1] for t in MUST_HEAR), H.GRAPH_START_TIMEOUT_S,
                     f"a message on each of {sorted(MUST_HEAR)}")
        time.sleep(LISTEN_S)
        dead = procs.dead()
    finally:
        camera.stop()
        procs.stop()
        harness.close()
    assert dead == {}, {n: H.node_log(logs, n)[-2000:] for n in dead}
    return {topic: (type_name, [deserialize_message(bytes(b), message_class(type_name)) for b in list(blobs)])
            for topic, (type_name, blobs) in raw.items()}


def _published_topics(node) -> dict:
    """{topic: type name} of what the graph's nodes publish, from DDS discovery."""
    out = {}
    for spec in graph.NODES:
        try:
            pairs = node.get_publisher_names_and_types_by_node(spec.name, "/")
        except Exception:  # noqa: BLE001 - rclpy raises NodeNameNonExistentError until the node is discovered
            continue
        for topic, types in pairs:
            out[topic] = types[0]
    return out


def test_the_graph_publishes_typed_messages_on_its_internal_topics(echoed):
    types = {topic: type_name for topic, (type_name, _) in echoed.items()}
    assert types[graph.FRAME_TOPIC] == "vla_edge_interfaces/msg/Frame"
    assert types[graph.STATE_CHUNK_TOPIC] == "vla_edge_interfaces/msg/StateChunk"
    assert types[graph.ACTION_TOKENS_TOPIC] == "vla_edge_interfaces/msg/ActionTokens"
    assert types[graph.ACTION_TOPIC] == "sensor_msgs/msg/JointState"        # controllers keep standard types
    assert types[graph.FALLBACK_TOPIC] == "diagnostic_msgs/msg/DiagnosticStatus"


def test_every_header_frame_id_is_a_tf_frame_name(echoed):
    checked = 0
    for topic, (type_name, messages) in echoed.items():
        want = CAMERA_FRAME if topic in CAMERA_FRAME_TOPICS else ""
        for msg in messages:
            for path, header in headers(msg):
                frame_id = header.frame_id
                assert frame_id == "" or TF_FRAME_NAME.fullmatch(frame_id), (topic, path, frame_id)
                assert not any(c in frame_id for c in "#@ \t"), (topic, path, frame_id)
                assert frame_id == want, f"{topic} ({type_name}) {path}.frame_id = {frame_id!r}, want {want!r}"
                checked += 1
    assert checked > 0


def test_protocol_fields_travel_in_fields_of_their_own(echoed):
    """What used to ride in frame_id ("vla_frame_<n>@v<k>#<s>") is in typed fields, consistent with itself."""
    frames = echoed[graph.FRAME_TOPIC][1]
    numbers = [m.number for m in frames]
    assert numbers == sorted(numbers) and numbers[0] >= 1          # camera_ingest's sequence numbers
    chunks = echoed[graph.STATE_CHUNK_TOPIC][1]
    seqs = [c.seq for c in chunks]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), seqs  # no gaps (reliable, keep last 64)
    assert all(c.frame.image.encoding == "rgb8" and c.frame.number >= 1 for c in chunks)
    tokens = echoed[graph.ACTION_TOKENS_TOPIC][1]
    assert tokens and all(len(m.tokens) == C.load().action.num_tokens and m.cycle_id >= 1 for m in tokens)
