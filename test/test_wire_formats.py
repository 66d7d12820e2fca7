"""The graph's wire formats (README "Wire formats"): each message through CDR bytes and back.

Messages are serialized by rclpy exactly as a publisher does, so a field that
did not survive the trip, or a protocol value put in the wrong field, shows up
here without a running graph. What a node must refuse is refused by name.
"""
import numpy as np
import pytest
from rclpy.serialization import deserialize_message
from rclpy.serialization import serialize_message

from vla_edge_ros.core.cycle_result import CycleResult
from vla_edge_ros.core.frames import Frame
from vla_edge_ros.core.swap_protocol import SwapAnswer, SwapOffer, SwapProtocolError
from vla_edge_ros.nodes import conversions as conv
from vla_edge_ros.nodes import swap_wire
from vla_edge_ros.nodes.camera_images import ImageRejected
from vla_edge_ros.nodes.interfaces import ActionTokens, FrameMsg, KvIpcHandle, StateChunk, Swap

MAX_PIXELS = 4096 * 4096


def _cdr(msg):
    """msg after a trip through the bytes a publisher sends."""
    return deserialize_message(serialize_message(msg), type(msg))


@pytest.fixture
def frame():
    pixels = np.random.default_rng(3).integers(0, 256, (32, 64, 3), dtype=np.uint8)
    return Frame(pixels=pixels, stamp_s=1700000000.123456789, frame_id=42)


def test_frame_keeps_pixels_stamp_and_number_and_names_only_the_camera_frame(frame):
    msg = _cdr(conv.frame_msg(frame, "camera"))
    assert msg.image.header.frame_id == "camera" and msg.number == 42 and msg.image.encoding == "rgb8"
    back = conv.frame_from_msg(msg, MAX_PIXELS)
    np.testing.assert_array_equal(back.pixels, frame.pixels)
    assert back.frame_id == 42 and back.stamp_s == pytest.approx(frame.stamp_s, abs=1e-9)


def test_state_chunk_carries_version_and_sequence_in_fields_of_their_own(frame):
    msg = _cdr(conv.state_chunk_msg(frame, state_version=3, seq=17, frame_id="camera"))
    assert (msg.state_version, msg.seq, msg.frame.number) == (3, 17, 42)
    assert msg.frame.image.header.frame_id == "camera"
    back, version, seq = conv.parse_state_chunk(msg, MAX_PIXELS)
    assert (back.frame_id, version, seq) == (42, 3, 17)
    np.testing.assert_array_equal(back.pixels, frame.pixels)


def test_unusable_state_chunks_are_refused_with_the_reason(frame):
    msg = conv.state_chunk_msg(frame, 0, 1, "camera")
    msg.seq = 0                                              # numbering starts at 1: 0 is no chunk's number
    with pytest.raises(ValueError, match="sequence number 0"):
        conv.parse_state_chunk(msg, MAX_PIXELS)
    msg.seq = 5
    msg.frame.image.data = msg.frame.image.data[:-3]          # data shorter than height x step
    with pytest.raises(ImageRejected):
        conv.parse_state_chunk(msg, MAX_PIXELS)
    with pytest.raises(ValueError, match="numbered from 1"):
        conv.state_chunk_msg(frame, 0, 0, "camera")


def test_action_tokens_answer_a_frame_with_its_stamp_and_camera_frame():
    result = CycleResult(cycle_id=9, frame_id=42, frame_stamp_s=1700000000.5, elapsed_ms=12.3456,
                         action=np.zeros(8), tokens=[3, 1, 4, 1, 5, 9, 2, 6], evicted_frame_ids=(7, 8), new_frame=True)
    msg = _cdr(conv.action_tokens_msg(result, "camera"))
    assert msg.header.frame_id == "camera" and conv.stamp_to_s(msg.header.stamp) == pytest.approx(1700000000.5)
    assert (msg.cycle_id, msg.frame_number, msg.elapsed_us, msg.evictions, msg.new_frame) == (9, 42, 12346, 2, True)
    assert list(msg.tokens) == [3, 1, 4, 1, 5, 9, 2, 6]
    assert conv.action_tokens_fields(msg)["frame_id"] == 42
    fallback = CycleResult(cycle_id=10, reason="no_frame")
    with pytest.raises(ValueError, match="no action tokens"):
        conv.action_tokens_msg(fallback, "camera")


KV = {"handle": bytes(range(64)).hex(), "bytes": 4096 + 64, "header_offset": 4096, "generation": 5, "buffer": 1,
      "rows": 96, "shape": [2, 2, 480, 32], "element": "uint16", "finite": True, "device_pci_bus_id": "0000:19:00.0"}

# asr.host_generation_board: the offer names the exporter's host copy of its generation words
KV_BOARD = {**KV, "generation_board": "/dev/shm/vla_edge_swap_4242_ab12/export_generations"}


@pytest.mark.parametrize("kv", [None, KV, KV_BOARD],
                         ids=["kv in the file", "kv by CUDA IPC", "kv by CUDA IPC with a generation board"])
def test_swap_offer_round_trips_through_the_service_response(kv):
    offer = SwapOffer(version=7, path="/dev/shm/x/state_v000007.npz", frames=6, newest_frame_id=112, kv=kv, round=5)
    response = _cdr(swap_wire.fill_response(SwapAnswer(offer), Swap.Response()))
    assert response.offered and len(response.kv) == (kv is not None)
    assert swap_wire.answer_from_response(response) == SwapAnswer(offer)


def test_no_offer_travels_with_its_reason():
    response = _cdr(swap_wire.fill_response(SwapAnswer(reason="no reconciled state yet (phase idle)"),
                                            Swap.Response()))
    assert not response.offered and response.version == 0
    assert swap_wire.answer_from_response(response) == SwapAnswer(reason="no reconciled state yet (phase idle)")


def test_offers_that_break_the_protocol_are_refused_by_name():
    good = swap_wire.fill_response(SwapAnswer(SwapOffer(7, "/tmp/v7.npz", 6, 112, kv=KV, round=5)), Swap.Response())
    for field, value in (("version", 0), ("path", ""), ("round", 9)):
        bad = _cdr(good)
        setattr(bad, field, value)
        with pytest.raises(SwapProtocolError, match="not a usable offer"):
            swap_wire.answer_from_response(bad)
    bad = _cdr(good)
    bad.kv = [KvIpcHandle(handle=list(range(64)), bytes=100, header_offset=200, rows=1, shape=[2, 1, 8, 4])]
    with pytest.raises(SwapProtocolError, match="no KV export"):
        swap_wire.answer_from_response(bad)
    with pytest.raises(ValueError, match="64 bytes"):
        swap_wire.kv_handle_msg({**KV, "handle": "00ff"})


def test_every_message_is_a_generated_ros_type():
    """The names tools print (`ros2 topic info`, bags) are the interface package's."""
    for cls, name in ((FrameMsg, "Frame"), (StateChunk, "StateChunk"), (ActionTokens, "ActionTokens")):
        assert cls.__module__.startswith("vla_edge_interfaces.msg") and cls.__name__ == name
