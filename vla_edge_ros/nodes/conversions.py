"""ROS messages <-> the engine's plain data: frames inside the graph, actions, fallbacks, diagnostics.

Inbound camera images are decoded and validated in nodes/camera_images.py.

Inside the graph (/vla/frame, /vla/state_chunk) frames travel as rgb8 Images
whose header.frame_id carries the frame sequence number ("vla_frame_<n>"),
so the reasoning and reconciler nodes agree on frame ids; a state chunk also
carries the reasoning node's state version at admission and its chunk
sequence number ("vla_frame_<n>@v<k>#<s>", s = 1, 2, ... with no gaps, so the
reconciler can tell when it missed one; core/swap_protocol.py says why).

Outbound (reasoning), one cycle -> exactly one of:
    action    sensor_msgs/JointState: stamp = capture stamp of the frame
              answered, name = action.dim_names, position = values in [-1, 1]
              + std_msgs/Int32MultiArray on /vla/action_tokens, layout
              data = [cycle_id, frame_id, stamp_sec, stamp_nanosec, elapsed_us,
                      evictions, new_frame, token_0 .. token_{N-1}]
              (layout.dim[0].label = ACTION_TOKENS_LABEL; new_frame is 1 when
              the cycle appended its frame to the state, 0 when it answered
              an already appended frame again)
    fallback  diagnostic_msgs/DiagnosticStatus: message = reason code,
              values = FALLBACK_VALUE_KEYS (cycle_id, frame_id, frame_stamp,
              estimate_ms, budget_ms, elapsed_ms, evictions, new_frame, detail)
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
from std_msgs.msg import Int32MultiArray
from std_msgs.msg import MultiArrayDimension

from ..core.cycle_result import CycleResult
from ..core.cycle_result import ENGINE_ERROR
from ..core.cycle_result import MEMORY_CEILING
from ..core.frames import Frame
from .camera_images import image_msg_to_rgb

FRAME_ID_PREFIX = "vla_frame_"
STATE_VERSION_SEP = "@v"
CHUNK_SEQ_SEP = "#"
ACTION_TOKEN_HEADER = ("cycle_id", "frame_id", "stamp_sec", "stamp_nanosec", "elapsed_us", "evictions", "new_frame")
ACTION_TOKENS_LABEL = ",".join(ACTION_TOKEN_HEADER) + ",tokens"
FALLBACK_VALUE_KEYS = ("cycle_id", "frame_id", "frame_stamp", "estimate_ms", "budget_ms", "elapsed_ms",
                       "evictions", "new_frame", "detail")


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


def frame_to_image_msg(frame: Frame) -> Image:
    return rgb_to_image_msg(frame.pixels, s_to_stamp(frame.stamp_s), f"{FRAME_ID_PREFIX}{frame.frame_id}")


def frame_from_image_msg(msg: Image, max_pixels: int) -> Frame:
    """An rgb8 frame of the graph back into a Frame; the id comes from header.frame_id."""
    frame_id, version = _parse_frame_header(msg.header.frame_id)
    if version is not None:
        raise ValueError(f"header.frame_id {msg.header.frame_id!r} is a state chunk's, not a frame's")
    return Frame(pixels=image_msg_to_rgb(msg, max_pixels), stamp_s=stamp_to_s(msg.header.stamp), frame_id=frame_id)


def state_chunk_msg(frame: Frame, state_version: int, seq: int) -> Image:
    """/vla/state_chunk: the admitted frame, tagged with the state version in force when it was admitted
    and the chunk's sequence number (1, 2, ... per reasoning process)."""
    return rgb_to_image_msg(frame.pixels, s_to_stamp(frame.stamp_s),
                            f"{FRAME_ID_PREFIX}{frame.frame_id}{STATE_VERSION_SEP}{int(state_version)}"
                            f"{CHUNK_SEQ_SEP}{int(seq)}")


def parse_state_chunk(msg: Image, max_pixels: int) -> tuple:
    """(Frame, state version, chunk sequence number) of a /vla/state_chunk message."""
    name, sep, seq = msg.header.frame_id.partition(CHUNK_SEQ_SEP)
    if not sep or not seq.isdigit():
        raise ValueError(f"header.frame_id {msg.header.frame_id!r} carries no chunk sequence number "
                         f"('{FRAME_ID_PREFIX}<n>{STATE_VERSION_SEP}<k>{CHUNK_SEQ_SEP}<s>')")
    frame_id, version = _parse_frame_header(name)
    if version is None:
        raise ValueError(f"header.frame_id {msg.header.frame_id!r} carries no state version "
                         f"('{FRAME_ID_PREFIX}<n>{STATE_VERSION_SEP}<k>{CHUNK_SEQ_SEP}<s>')")
    frame = Frame(pixels=image_msg_to_rgb(msg, max_pixels), stamp_s=stamp_to_s(msg.header.stamp), frame_id=frame_id)
    return frame, version, int(seq)


def _parse_frame_header(name: str) -> tuple:
    """'vla_frame_12' -> (12, None); 'vla_frame_12@v3' -> (12, 3); ValueError otherwise."""
    body = name[len(FRAME_ID_PREFIX):] if name.startswith(FRAME_ID_PREFIX) else ""
    ident, sep, version = body.partition(STATE_VERSION_SEP)
    if not ident.isdigit() or (sep and not version.isdigit()):
        raise ValueError(f"header.frame_id {name!r} does not carry a frame id ('{FRAME_ID_PREFIX}<n>' or "
                         f"'{FRAME_ID_PREFIX}<n>{STATE_VERSION_SEP}<k>')")
    return int(ident), (int(version) if sep else None)


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


def action_tokens_msg(result: CycleResult) -> Int32MultiArray:
    """data = [cycle_id, frame_id, stamp_sec, stamp_nanosec, elapsed_us, evictions, new_frame, tokens...]."""
    tokens = [] if result.tokens is None else [int(t) for t in result.tokens]
    stamp = s_to_stamp(result.frame_stamp_s or 0.0)
    header = [int(result.cycle_id), -1 if result.frame_id is None else int(result.frame_id), stamp.sec, stamp.nanosec,
              int(round(result.elapsed_ms * 1000.0)), len(result.evicted_frame_ids), int(bool(result.new_frame))]
    msg = Int32MultiArray()
    size = len(header) + len(tokens)
    msg.layout.dim = [MultiArrayDimension(label=ACTION_TOKENS_LABEL, size=size, stride=size)]
    msg.data = header + tokens
    return msg


def parse_action_tokens(msg: Int32MultiArray) -> dict:
    """{cycle_id, frame_id, stamp_sec, ..., new_frame, tokens} of an /vla/action_tokens message."""
    n = len(ACTION_TOKEN_HEADER)
    if not msg.layout.dim or msg.layout.dim[0].label != ACTION_TOKENS_LABEL or len(msg.data) < n:
        raise ValueError(f"not an action_tokens message: layout {[d.label for d in msg.layout.dim]}, {len(msg.data)} values")
    data = [int(v) for v in msg.data]
    out = dict(zip(ACTION_TOKEN_HEADER, data[:n]))
    out["tokens"] = data[n:]
    return out


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
