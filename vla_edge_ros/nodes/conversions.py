"""ROS messages <-> the engine's plain data, with the validation a camera stream needs.

Inbound (camera_ingest): sensor_msgs/Image or CompressedImage -> uint8 RGB
[H, W, 3]. A bad image raises a subclass of `ImageRejected` whose `kind`
names the defect (the node counts rejections per kind) and whose message
names the offending field:

    kind "encoding"     encoding not in SUPPORTED_ENCODINGS
    kind "zero_size"    width or height 0, or an empty compressed payload
    kind "too_large"    width * height above camera.max_pixels
    kind "step"         step smaller than width * bytes per pixel
    kind "data_length"  len(data) != step * height
    kind "decode"       a compressed payload that does not decode

The PyPI `cv-bridge` (a pure-Python port) decodes and colour-converts the
common 8-bit encodings and the compressed formats. Where that port is wrong
or silent we decode with numpy instead, so every encoding gives the same
pixels either way: it ignores `step` padding, maps 16UC* to 8-bit types, has
no 16-bit -> 8-bit conversion, no yuv422 type, byte-swaps with
`ndarray.newbyteorder` and builds messages with `ndarray.tostring` (both gone
in numpy 2; outbound images are built here), and with OpenCV 5 its channel
arithmetic (written for OpenCV 4's type layout) reads rgb8 as 9 channels. The
bridge path is therefore used only for encodings whose (dtype, channels) it
reports the same as the table below.
16-bit images are scaled to 8 bit by keeping the high byte.

Inside the graph (/vla/frame, /vla/state_chunk) frames travel as rgb8 Images
whose header.frame_id carries the frame sequence number ("vla_frame_<n>"),
so the reasoning and reconciler nodes agree on frame ids; a state chunk also
carries the reasoning node's state version at admission ("vla_frame_<n>@v<k>",
core/swap_protocol.py says why).

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

import cv2
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

FRAME_ID_PREFIX = "vla_frame_"
STATE_VERSION_SEP = "@v"
ACTION_TOKEN_HEADER = ("cycle_id", "frame_id", "stamp_sec", "stamp_nanosec", "elapsed_us", "evictions", "new_frame")
ACTION_TOKENS_LABEL = ",".join(ACTION_TOKEN_HEADER) + ",tokens"
FALLBACK_VALUE_KEYS = ("cycle_id", "frame_id", "frame_stamp", "estimate_ms", "budget_ms", "elapsed_ms",
                       "evictions", "new_frame", "detail")


# ----------------------------------------------------------------------------
# Errors


class ImageRejected(ValueError):
    kind = "invalid"


class UnsupportedEncodingError(ImageRejected):
    kind = "encoding"


class EmptyImageError(ImageRejected):
    kind = "zero_size"


class ImageTooLargeError(ImageRejected):
    kind = "too_large"


class StepMismatchError(ImageRejected):
    kind = "step"


class DataLengthMismatchError(ImageRejected):
    kind = "data_length"


class ImageDecodeError(ImageRejected):
    kind = "decode"


REJECTION_KINDS = tuple(c.kind for c in (UnsupportedEncodingError, EmptyImageError, ImageTooLargeError,
                                         StepMismatchError, DataLengthMismatchError, ImageDecodeError))


# ----------------------------------------------------------------------------
# Encodings: name -> (element dtype, channels, conversion of the 8-bit array to RGB)

def _keep(a):
    return a


def _cvt(code):
    return lambda a: cv2.cvtColor(np.ascontiguousarray(a), code)


_LAYOUTS = {
    "rgb8": (np.uint8, 3, _keep),
    "bgr8": (np.uint8, 3, _cvt(cv2.COLOR_BGR2RGB)),
    "rgba8": (np.uint8, 4, _cvt(cv2.COLOR_RGBA2RGB)),
    "bgra8": (np.uint8, 4, _cvt(cv2.COLOR_BGRA2RGB)),
    "mono8": (np.uint8, 1, _cvt(cv2.COLOR_GRAY2RGB)),
    "rgb16": (np.uint16, 3, _keep),
    "bgr16": (np.uint16, 3, _cvt(cv2.COLOR_BGR2RGB)),
    "rgba16": (np.uint16, 4, _cvt(cv2.COLOR_RGBA2RGB)),
    "bgra16": (np.uint16, 4, _cvt(cv2.COLOR_BGRA2RGB)),
    "mono16": (np.uint16, 1, _cvt(cv2.COLOR_GRAY2RGB)),
    # OpenCV type names: no colour semantics; OpenCV's own channel order (BGR) is assumed.
    "8UC1": (np.uint8, 1, _cvt(cv2.COLOR_GRAY2RGB)),
    "8UC3": (np.uint8, 3, _cvt(cv2.COLOR_BGR2RGB)),
    "8UC4": (np.uint8, 4, _cvt(cv2.COLOR_BGRA2RGB)),
    "16UC1": (np.uint16, 1, _cvt(cv2.COLOR_GRAY2RGB)),
    "16UC3": (np.uint16, 3, _cvt(cv2.COLOR_BGR2RGB)),
    # Bayer mosaics: ROS names the 2x2 pattern from the top-left, OpenCV from the second row.
    "bayer_rggb8": (np.uint8, 1, _cvt(cv2.COLOR_BayerBG2RGB)),
    "bayer_bggr8": (np.uint8, 1, _cvt(cv2.COLOR_BayerRG2RGB)),
    "bayer_gbrg8": (np.uint8, 1, _cvt(cv2.COLOR_BayerGR2RGB)),
    "bayer_grbg8": (np.uint8, 1, _cvt(cv2.COLOR_BayerGB2RGB)),
    "bayer_rggb16": (np.uint16, 1, _cvt(cv2.COLOR_BayerBG2RGB)),
    "bayer_bggr16": (np.uint16, 1, _cvt(cv2.COLOR_BayerRG2RGB)),
    "bayer_gbrg16": (np.uint16, 1, _cvt(cv2.COLOR_BayerGR2RGB)),
    "bayer_grbg16": (np.uint16, 1, _cvt(cv2.COLOR_BayerGB2RGB)),
    "yuv422": (np.uint8, 2, _cvt(cv2.COLOR_YUV2RGB_UYVY)),
}
SUPPORTED_ENCODINGS = tuple(_LAYOUTS)
# Encodings whose cv-bridge conversion to rgb8 is correct for packed rows.
_BRIDGE_RGB8 = ("rgb8", "bgr8", "rgba8", "bgra8", "mono8", "bayer_rggb8", "bayer_bggr8", "bayer_gbrg8")
_NOT_CAMERA = ("8S", "16S", "32S", "32F", "64F")

_bridge = None
_bridge_ok: dict = {}     # encoding -> cv-bridge agrees with _LAYOUTS (checked once)


def _cv_bridge():
    # Built on first use: CvBridge() imports cv2 and builds its type tables.
    global _bridge
    if _bridge is None:
        from cv_bridge import CvBridge
        _bridge = CvBridge()
    return _bridge


# ----------------------------------------------------------------------------
# Inbound images


def image_msg_to_rgb(msg: Image, max_pixels: int) -> np.ndarray:
    """sensor_msgs/Image of any supported encoding -> [H, W, 3] uint8 RGB; raises ImageRejected."""
    dtype, channels, to_rgb = _layout(msg.encoding)
    height, width, step = int(msg.height), int(msg.width), int(msg.step)
    if height == 0 or width == 0:
        raise EmptyImageError(f"image is empty: width={width} height={height} (encoding {msg.encoding!r})")
    if height * width > max_pixels:
        raise ImageTooLargeError(f"image {width}x{height} has {height * width} pixels > camera.max_pixels {max_pixels}")
    row_bytes = width * channels * np.dtype(dtype).itemsize
    if step < row_bytes:
        raise StepMismatchError(f"step {step} < width {width} * {channels} channels * "
                                f"{np.dtype(dtype).itemsize} bytes = {row_bytes} (encoding {msg.encoding!r})")
    if len(msg.data) != step * height:
        raise DataLengthMismatchError(f"len(data) = {len(msg.data)} but step * height = {step} * {height} = {step * height}")

    # (cv-bridge byte-swaps with ndarray.newbyteorder, gone in numpy 2: big-endian rows take the numpy path.)
    if step == row_bytes and not msg.is_bigendian and _bridge_agrees(msg.encoding):
        return np.ascontiguousarray(_cv_bridge().imgmsg_to_cv2(msg, "rgb8"))     # [H, W, 3]
    raw = np.frombuffer(msg.data, dtype=np.uint8).reshape(height, step)[:, :row_bytes]   # [H, row_bytes]
    order = ">" if msg.is_bigendian else "<"
    pixels = np.ascontiguousarray(raw).view(np.dtype(dtype).newbyteorder(order))   # [H, W * C]
    pixels = pixels.reshape(height, width, channels) if channels > 1 else pixels.reshape(height, width)
    if pixels.dtype.itemsize == 2:
        pixels = (pixels.astype(np.uint16) >> 8).astype(np.uint8)   # 16 -> 8 bit: keep the high byte
    return np.ascontiguousarray(to_rgb(pixels), dtype=np.uint8)    # [H, W, 3]


def compressed_msg_to_rgb(msg, max_pixels: int) -> np.ndarray:
    """sensor_msgs/CompressedImage (jpeg, png, ...) -> [H, W, 3] uint8 RGB; raises ImageRejected."""
    if len(msg.data) == 0:
        raise EmptyImageError(f"compressed image has no data (format {msg.format!r})")
    try:
        decoded = _cv_bridge().compressed_imgmsg_to_cv2(msg, "passthrough")    # BGR(A) or gray, or None
    except cv2.error as exc:
        raise ImageDecodeError(f"compressed image ({len(msg.data)} bytes, format {msg.format!r}) does not decode: {exc}") from exc
    if decoded is None or decoded.size == 0:
        raise ImageDecodeError(f"compressed image ({len(msg.data)} bytes, format {msg.format!r}) does not decode")
    height, width = decoded.shape[:2]
    if height * width > max_pixels:
        raise ImageTooLargeError(f"image {width}x{height} has {height * width} pixels > camera.max_pixels {max_pixels}")
    if decoded.ndim == 2:
        return cv2.cvtColor(decoded, cv2.COLOR_GRAY2RGB)
    if decoded.shape[2] == 4:
        return cv2.cvtColor(decoded, cv2.COLOR_BGRA2RGB)
    return cv2.cvtColor(decoded, cv2.COLOR_BGR2RGB)


def _bridge_agrees(encoding: str) -> bool:
    """cv-bridge converts this encoding to rgb8 and reads its layout as we do (see module docstring)."""
    if encoding not in _bridge_ok:
        ok = encoding in _BRIDGE_RGB8
        if ok:
            dtype, channels = _cv_bridge().encoding_to_dtype_with_channels(encoding)
            ok = np.dtype(dtype) == np.dtype(_LAYOUTS[encoding][0]) and channels == _LAYOUTS[encoding][1]
        _bridge_ok[encoding] = ok
    return _bridge_ok[encoding]


def _layout(encoding: str):
    if encoding in _LAYOUTS:
        return _LAYOUTS[encoding]
    if encoding.startswith(_NOT_CAMERA):
        raise UnsupportedEncodingError(f"encoding {encoding!r} is a signed or floating-point image (depth, flow), "
                                       f"not a camera colour image; supported: {', '.join(SUPPORTED_ENCODINGS)}")
    raise UnsupportedEncodingError(f"unsupported image encoding {encoding!r}; supported: {', '.join(SUPPORTED_ENCODINGS)}")


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


def state_chunk_msg(frame: Frame, state_version: int) -> Image:
    """/vla/state_chunk: the admitted frame, tagged with the state version in force when it was admitted."""
    return rgb_to_image_msg(frame.pixels, s_to_stamp(frame.stamp_s),
                            f"{FRAME_ID_PREFIX}{frame.frame_id}{STATE_VERSION_SEP}{int(state_version)}")


def parse_state_chunk(msg: Image, max_pixels: int) -> tuple:
    """(Frame, state version) of a /vla/state_chunk message."""
    frame_id, version = _parse_frame_header(msg.header.frame_id)
    if version is None:
        raise ValueError(f"header.frame_id {msg.header.frame_id!r} carries no state version "
                         f"('{FRAME_ID_PREFIX}<n>{STATE_VERSION_SEP}<k>')")
    frame = Frame(pixels=image_msg_to_rgb(msg, max_pixels), stamp_s=stamp_to_s(msg.header.stamp), frame_id=frame_id)
    return frame, version


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
