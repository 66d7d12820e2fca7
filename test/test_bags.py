"""A recorded bag replayed through the graph gives the action tokens of feeding the same frames
directly to the engine (cycle.deterministic: no refusals).

How each frame is processed exactly once: `vla-edge replay --lockstep` publishes
the next image only after the graph answered the previous one (its stamp came
back on /vla/action_tokens or /vla/fallback). The first cycle that sees a frame
appends it to the state (new_frame = 1 in the action_tokens layout); cycles
that answer the same frame again do not touch the state. The graph's sequence
is therefore the new_frame = 1 answers in cycle order.
"""
import time

import numpy as np
import pytest
from diagnostic_msgs.msg import DiagnosticStatus

import ros_helpers as H
from vla_edge_ros.core.engine_factory import primary_engine
from vla_edge_ros import config as C
from vla_edge_ros.core.footage import resize_rgb
from vla_edge_ros.core.frames import Frame
from vla_edge_ros.nodes import camera_images as images
from vla_edge_ros.nodes import conversions as conv
from vla_edge_ros.nodes import graph
from vla_edge_ros.nodes.interfaces import ActionTokens
from vla_edge_ros.tools.record import record_footage
from vla_edge_ros.tools.replay import BagReplayer, ReplayError, read_images

FRAMES = 24
HZ = 60.0
# 12 frames fit (prefix 25 + suffix 56 + 12 x 32 = 465 <= 480): the run includes semantic evictions.
OVERRIDES = {"cycle.deterministic": True, "camera.reliability": "reliable", "kv.capacity_tokens": 480}


@pytest.fixture(scope="module")
def bags(tmp_path_factory):
    root = tmp_path_factory.mktemp("bags")
    start = 1_700_000_000.0
    mcap = root / "footage_mcap"
    sqlite = root / "footage_sqlite3"
    assert record_footage(mcap, seconds=FRAMES / HZ, hz=HZ, storage="mcap", start_s=start) == FRAMES
    assert record_footage(sqlite, seconds=FRAMES / HZ, hz=HZ, storage="sqlite3", start_s=start) == FRAMES
    return mcap, sqlite


def test_record_writes_60hz_footage_in_both_storages(bags):
    mcap, sqlite = bags
    assert (mcap / "metadata.yaml").is_file() and list(mcap.glob("*.mcap"))
    assert list(sqlite.glob("*.db3"))
    a, b = list(read_images(mcap)), list(read_images(sqlite))
    assert len(a) == len(b) == FRAMES
    times = np.array([t for t, _ in a])
    np.testing.assert_allclose(np.diff(times) * 1e-9, 1.0 / HZ, atol=1e-6)
    for (ta, ma), (tb, mb) in zip(a, b):
        assert ta == tb and conv.stamp_to_s(ma.header.stamp) == pytest.approx(ta * 1e-9, abs=1e-6)
        assert ma.encoding == "rgb8" and bytes(ma.data) == bytes(mb.data)
    # Real footage: consecutive frames differ.
    assert bytes(a[0][1].data) != bytes(a[1][1].data)


def test_replay_refuses_what_is_not_a_bag(tmp_path):
    with pytest.raises(ReplayError, match="not a readable rosbag2"):
        list(read_images(tmp_path))


def test_record_refuses_an_existing_bag_and_a_duration_of_no_image(bags, tmp_path, capsys):
    from vla_edge_ros import cli
    assert cli.main(["record", "--out", str(bags[0]), "--seconds", "1"]) == 1
    assert "exists already" in capsys.readouterr().out
    assert cli.main(["record", "--out", str(tmp_path / "short"), "--seconds", "0.001"]) == 1
    assert "is no image" in capsys.readouterr().out and not (tmp_path / "short").exists()


def _write_bag(path, entries):
    """A rosbag2 (mcap) of `entries` [(topic, type, log time ns, CDR bytes)], written with rosbags."""
    from rosbags.rosbag2 import StoragePlugin, Writer
    from rosbags.typesys import Stores, get_typestore
    store = get_typestore(Stores.ROS2_JAZZY)
    writer = Writer(path, version=9, storage_plugin=StoragePlugin.MCAP)
    writer.open()
    connections = {}
    for topic, msgtype, t_ns, raw in entries:
        if topic not in connections:
            connections[topic] = writer.add_connection(topic, msgtype, typestore=store)
        writer.write(connections[topic], t_ns, raw)
    writer.close()
    return path


def test_replay_names_a_bag_without_images_and_a_message_that_does_not_deserialize(tmp_path):
    """A bag of no image topic was "choose one image topic of []"; a message cut short was an rclpy traceback."""
    from rclpy.serialization import serialize_message
    from std_msgs.msg import String
    no_image = _write_bag(tmp_path / "no_image", [("/chatter", "std_msgs/msg/String", 1000 + i,
                                                   serialize_message(String(data="hi"))) for i in range(3)])
    with pytest.raises(ReplayError, match="no sensor_msgs/msg/Image or sensor_msgs/msg/CompressedImage topic"):
        BagReplayer(None, no_image)                       # refused before any node is touched
    image = serialize_message(conv.rgb_to_image_msg(np.zeros((8, 8, 3), np.uint8), conv.s_to_stamp(1.0), "camera"))
    cut = _write_bag(tmp_path / "cut", [("/camera/image_raw", "sensor_msgs/msg/Image", 1000 + i,
                                         image if i != 2 else image[:40]) for i in range(4)])
    with pytest.raises(ReplayError, match="message 2 of /camera/image_raw .* does not deserialize"):
        list(read_images(cut))


def _direct_tokens(model, bag) -> list:
    cfg = C.load(overrides={**OVERRIDES, "model.path": str(model)})
    engine = primary_engine(cfg)
    tokens = []
    for i, (t_ns, msg) in enumerate(read_images(bag)):
        rgb = images.image_msg_to_rgb(msg, cfg.camera.max_pixels)
        frame = Frame(resize_rgb(rgb, cfg.vision.image_width, cfg.vision.image_height), t_ns * 1e-9, i + 1)
        result = engine.run_cycle(frame, now_s=t_ns * 1e-9)
        assert result.is_action and result.new_frame, (result.reason, result.detail)
        tokens.append([int(t) for t in result.tokens])
    assert engine.state.kv.evictions > 0, "the comparison should cover evictions"
    return tokens


@pytest.mark.ros
@pytest.mark.parametrize("storage", ["mcap", "sqlite3"])
def test_bag_through_the_graph_matches_the_engine(bags, storage, tiny_model_dir, tmp_path):
    bag = bags[0] if storage == "mcap" else bags[1]
    model = tiny_model_dir
    harness = H.RosHarness(H.ros_domain(__name__ + storage))
    tokens = harness.collect(ActionTokens, graph.ACTION_TOKENS_TOPIC)
    fallbacks = harness.collect(DiagnosticStatus, graph.FALLBACK_TOPIC)
    procs = H.start_graph(harness.domain_id, {**OVERRIDES, "model.path": str(model)},
                          names=("camera_ingest", "reasoning"), log_dir=tmp_path)
    try:
        H.wait_matched(tokens, fallbacks)
        # Matched on our side is not yet matched on the writer's side: see the reasoning node's
        # no_frame fallbacks arrive before the first image is sent.
        H.wait_until(lambda: len(fallbacks) >= 5, 10.0, "no_frame fallbacks from the reasoning node")
        time.sleep(0.5)
        stats = BagReplayer(harness.node, bag, lockstep=True).run()
        assert procs.dead() == {}
    finally:
        procs.stop()
        harness.close()
    assert stats.published == FRAMES and stats.matched
    assert stats.answered_by_action == FRAMES and stats.answered_by_fallback == 0, stats
    answers = sorted((conv.action_tokens_fields(m) for m in tokens.messages()), key=lambda f: f["cycle_id"])
    appended = [f for f in answers if f["new_frame"]]
    with_frames = [(m.message, conv.status_values(m)) for m in fallbacks.messages() if conv.status_values(m)["frame_id"]]
    assert not with_frames, f"fallbacks for replayed frames: {with_frames[:3]}"
    assert len(appended) == FRAMES, f"{len(appended)} frames appended for {FRAMES} images ({stats.retries} re-sends)"
    assert len({(f["stamp_sec"], f["stamp_nanosec"]) for f in appended}) == FRAMES
    assert [f["tokens"] for f in appended] == _direct_tokens(model, bag)
