"""ROS messages <-> the engine's plain data: frames inside the graph, actions, fallbacks, diagnostics.

Inbound camera images are decoded and validated in nodes/camera_images.py; the
swap service's messages are converted in nodes/swap_wire.py.

Inside the graph frames travel in the typed messages of vla_edge_interfaces
(README "Wire formats"): /vla/frame is a Frame (an rgb8 Image plus the frame's
sequence number), /vla/state_chunk a StateChunk (the Frame plus the state
version in force at admission and the chunk sequence number, 1, 2, ... with no
gaps; core/swap_protocol.py says why). header.frame_id carries the camera's TF
frame (camera.frame_id) and nothing else.

Outbound (reasoning), one cycle -> exactly one of:
    action    sensor_msgs/JointState: stamp = capture stamp of the frame
              answered, name = action.dim_names, position = values in [-1, 1]
              + vla_edge_interfaces/ActionTokens on /vla/action_tokens (cycle id,
              frame number, elapsed time, evictions, new_frame, the tokens;
              header = the frame's stamp and the camera frame)
    fallback  diagnostic_msgs/DiagnosticStatus: message = reason code,
              values = FALLBACK_VALUE_KEYS (cycle_id, frame_id, frame_stamp,
              estimate_ms, budget_ms, elapsed_ms, evictions, new_frame, boundary_skipped,
              given_up, overran_in, detail; given_up 1: a deadline_missed stopped between
              decode steps (its elapsed_ms is not a whole cycle's); boundary_skipped 1: no cycle ran for this
              boundary, the one before overran it, and overran_in says which part
              of its work did: cycle, publish, between (swap apply) or other)
Cycle ids are therefore on every cycle's output; they are consecutive.
"""
from __future__ import annotations

import sys

import numpy as np
from builtin_interfaces.msg import Time
from diagnostic_msgs.msg import DiagnosticStatus
from diagnostic_msgs.msg import KeyValue
from sensor_msgs.msg import Image
from sensor_msgs.msg import JointState

from ..core.cycle_result import CycleResult
from ..core.cycle_result import ENGINE_ERROR
from ..core.cycle_result import MEMORY_CEILING
from ..core.frames import Frame
from .camera_images import image_msg_to_rgb
from .interfaces import ActionTokens
from .interfaces import FrameMsg
from .interfaces import StateChunk

UINT32_MAX = 2 ** 32 - 1
FALLBACK_VALUE_KEYS = ("cycle_id", "frame_id", "frame_stamp", "estimate_ms", "budget_ms", "elapsed_ms",
                       "evictions", "new_frame", "boundary_skipped", "given_up", "overran_in", "detail")


# ----------------------------------------------------------------------------
# Time


def stamp_to_s(stamp: Time) -> float:
    return float(stamp.sec) + float(stamp.nanosec) * 1e-9


def s_to_stamp(t_s: float) -> Time:
    ns = int(round(t_s * 1e9))
    return Time(sec=ns // 1_000_000_000, nanosec=ns % 1_000_000_000)


# ----------------------------------------------------------------------------
# Frames inside the graph (/vla/frame, /vla/state_chunk)


def rgb_to_image_msg(pixels: np.ndarray, stamp: Time, frame_id: str = "") -> Image:
    """[H, W, 3] uint8 RGB -> rgb8 Image (cv-bridge's cv2_to_imgmsg is broken on numpy 2)."""
    if not (isinstance(pixels, np.ndarray) and pixels.dtype == np.uint8 and pixels.ndim == 3 and pixels.shape[2] == 3):
        raise ValueError(f"pixels must be uint8 [H, W, 3], got {getattr(pixels, 'dtype', type(pixels))} "
                         f"{getattr(pixels, 'shape', '')}")
    msg = Image()
    msg.header.stamp = stamp
    msg.header.frame_id = frame_id
    msg.height, msg.width = int(pixels.shape[0]), int(pixels.shape[1])
    msg.encoding = "rgb8"
    msg.is_bigendian = sys.byteorder == "big"
    msg.step = 3 * msg.width
    msg.data = np.ascontiguousarray(pixels).tobytes()
    return msg


def frame_msg(frame: Frame, frame_id: str) -> FrameMsg:
    """/vla/frame: the frame's pixels and capture stamp, its number in `number`; frame_id = the camera's TF frame."""
    return FrameMsg(image=rgb_to_image_msg(frame.pixels, s_to_stamp(frame.stamp_s), frame_id),
                    number=int(frame.frame_id))


def frame_from_msg(msg: FrameMsg, max_pixels: int) -> Frame:
    """A Frame message back into a Frame; camera_images.ImageRejected (a ValueError) for a bad image."""
    return Frame(pixels=image_msg_to_rgb(msg.image, max_pixels), stamp_s=stamp_to_s(msg.image.header.stamp),
                 frame_id=int(msg.number))


def state_chunk_msg(frame: Frame, state_version: int, seq: int, frame_id: str) -> StateChunk:
    """/vla/state_chunk: the admitted frame, the state version in force when it was admitted and the chunk's
    sequence number (1, 2, ... per reasoning state)."""
    if seq < 1:
        raise ValueError(f"state chunks are numbered from 1, got {seq}")
    return StateChunk(frame=frame_msg(frame, frame_id), state_version=int(state_version), seq=int(seq))


def parse_state_chunk(msg: StateChunk, max_pixels: int) -> tuple:
    """(Frame, state version, chunk sequence number) of a /vla/state_chunk message; ValueError when it is not
    usable (a bad image, or sequence number 0: numbering starts at 1)."""
    if msg.seq < 1:
        raise ValueError(f"state chunk of frame {msg.frame.number} has sequence number {msg.seq}; chunks are "
                         f"numbered from 1")
    return frame_from_msg(msg.frame, max_pixels), int(msg.state_version), int(msg.seq)


# ----------------------------------------------------------------------------
# Cycle results


def action_msg(result: CycleResult, dim_names: tuple) -> JointState:
    if not result.is_action or result.action is None:
        raise ValueError(f"cycle {result.cycle_id} is a {result.reason!r} fallback, not an action")
    if len(result.action) != len(dim_names):
        raise ValueError(f"cycle {result.cycle_id}: {len(result.action)} action values for {len(dim_names)} dim_names")
    msg = JointState()
    msg.header.stamp = s_to_stamp(result.frame_stamp_s)
    msg.name = list(dim_names)
    msg.position = [float(v) for v in result.action]
    return msg


def action_tokens_msg(result: CycleResult, frame_id: str) -> ActionTokens:
    """/vla/action_tokens of an answered cycle; header = the answered frame's stamp and the camera's TF frame."""
    if not result.is_action or result.frame_id is None:
        raise ValueError(f"cycle {result.cycle_id} answered no frame ({result.reason!r}): no action tokens")
    msg = ActionTokens()
    msg.header.stamp = s_to_stamp(result.frame_stamp_s)
    msg.header.frame_id = frame_id
    msg.cycle_id = int(result.cycle_id)
    msg.frame_number = int(result.frame_id)
    msg.elapsed_us = min(UINT32_MAX, max(0, int(round(result.elapsed_ms * 1000.0))))
    msg.evictions = len(result.evicted_frame_ids)
    msg.new_frame = bool(result.new_frame)
    msg.tokens = [] if result.tokens is None else [int(t) for t in result.tokens]
    return msg


def action_tokens_fields(msg: ActionTokens) -> dict:
    """{cycle_id, frame_id, stamp_sec, stamp_nanosec, elapsed_us, evictions, new_frame, tokens} of an
    /vla/action_tokens message, for listeners that count and compare (demo report, tests, replay)."""
    return {"cycle_id": msg.cycle_id, "frame_id": msg.frame_number, "stamp_sec": msg.header.stamp.sec,
            "stamp_nanosec": msg.header.stamp.nanosec, "elapsed_us": msg.elapsed_us, "evictions": msg.evictions,
            "new_frame": int(msg.new_frame), "tokens": [int(t) for t in msg.tokens]}


def fallback_msg(result: CycleResult, name: str) -> DiagnosticStatus:
    if result.is_action:
        raise ValueError(f"cycle {result.cycle_id} is an action, not a fallback")
    level = DiagnosticStatus.ERROR if result.reason in (ENGINE_ERROR, MEMORY_CEILING) else DiagnosticStatus.WARN
    values = {
        "cycle_id": result.cycle_id,
        "frame_id": "" if result.frame_id is None else result.frame_id,
        "frame_stamp": "" if result.frame_stamp_s is None else f"{result.frame_stamp_s:.9f}",
        "estimate_ms": f"{result.estimate_ms:.3f}",
        "budget_ms": f"{result.budget_ms:.3f}",
        "elapsed_ms": f"{result.elapsed_ms:.3f}",
        "evictions": len(result.evicted_frame_ids),
        "new_frame": int(bool(result.new_frame)),
        "boundary_skipped": int(bool(result.boundary_skipped)),
        "given_up": int(bool(result.given_up)),
        "overran_in": result.overran_in,
        "detail": result.detail,
    }
    return status_msg(name, level, result.reason, values)


def status_msg(name: str, level, message: str, values: dict, hardware_id: str = "") -> DiagnosticStatus:
    msg = DiagnosticStatus()
    msg.level = level
    msg.name = name
    msg.message = message
    msg.hardware_id = hardware_id
    msg.values = [KeyValue(key=str(k), value=str(v)) for k, v in values.items()]
    return msg


def status_values(msg: DiagnosticStatus) -> dict:
    return {kv.key: kv.value for kv in msg.values}


def flatten(tree: dict, prefix: str = "") -> dict:
    """{'a': {'b': 1.5}} -> {'a.b': '1.5'}: nested summaries as DiagnosticStatus values."""
    out = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, name + "."))
        elif value is None:
            out[name] = ""
        elif isinstance(value, float):
            out[name] = f"{value:.6g}"
        else:
            out[name] = str(value)
    return out
