"""Camera images in: sensor_msgs/Image or CompressedImage -> uint8 RGB [H, W, 3], validated.

Used by camera_ingest, and by conversions.py for frames inside the graph. A
bad image raises a subclass of `ImageRejected` whose `kind` names the defect
(the node counts rejections per kind) and whose message names the offending
field:

    kind "encoding"     encoding not in SUPPORTED_ENCODINGS
    kind "zero_size"    width or height 0, or an empty compressed payload
    kind "too_large"    width * height above camera.max_pixels
    kind "step"         step smaller than width * bytes per pixel
    kind "data_length"  len(data) != step * height
    kind "geometry"     a size the encoding cannot have (yuv422: odd width)
    kind "decode"       a compressed payload that does not decode

The PyPI `cv-bridge` (a pure-Python port) decodes and colour-converts the
common 8-bit encodings and the compressed formats. Where that port is wrong
or silent we decode with numpy instead, so every encoding gives the same
pixels either way: it ignores `step` padding, maps 16UC* to 8-bit types, has
no 16-bit -> 8-bit conversion, no yuv422 type, byte-swaps with
`ndarray.newbyteorder` and builds messages with `ndarray.tostring` (both gone
in numpy 2; outbound images are built in conversions.py), and with OpenCV 5 its channel
arithmetic (written for OpenCV 4's type layout) reads rgb8 as 9 channels. The
bridge path is therefore used only for encodings whose (dtype, channels) it
reports the same as the table below.
16-bit images are scaled to 8 bit by keeping the high byte.
"""
from __future__ import annotations

import cv2
import numpy as np
from sensor_msgs.msg import Image

# ----------------------------------------------------------------------------
# Errors


class ImageRejected(ValueError):
    """An image the node will not turn into a frame; `kind` names why, as a counter in /diagnostics
    (camera_ingest's rejected_<kind>). Each subclass gives its kind where it is declared."""
    kind = "invalid"
    kinds: list = []          # every subclass's kind, in declaration order

    def __init_subclass__(cls, kind: str, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.kind = kind
        ImageRejected.kinds.append(kind)


class UnsupportedEncodingError(ImageRejected, kind="encoding"):
    """An encoding (or a compressed format) this module has no conversion for."""


class EmptyImageError(ImageRejected, kind="zero_size"):
    """Width or height zero, or no data."""


class ImageTooLargeError(ImageRejected, kind="too_large"):
    """More pixels than camera.max_pixels: refused before anything is allocated for it."""


class StepMismatchError(ImageRejected, kind="step"):
    """A row stride (step) shorter than one row of pixels."""


class DataLengthMismatchError(ImageRejected, kind="data_length"):
    """A data length other than height x step."""


class ImageDecodeError(ImageRejected, kind="decode"):
    """Pixels that could not be converted to RGB, or a compressed image that does not decode."""


class GeometryError(ImageRejected, kind="geometry"):
    """A size the encoding cannot have (an odd width where two pixels share one U/V pair)."""


REJECTION_KINDS = tuple(ImageRejected.kinds)


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
# 4:2:2 chroma: two horizontally adjacent pixels share one U and one V, so rows hold whole pairs.
_EVEN_WIDTH = ("yuv422",)
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
    if msg.encoding in _EVEN_WIDTH and width % 2:
        raise GeometryError(f"{msg.encoding} packs two pixels per U/V pair: width {width} must be even")

    # (cv-bridge byte-swaps with ndarray.newbyteorder, gone in numpy 2: big-endian rows take the numpy path.)
    if step == row_bytes and not msg.is_bigendian and _bridge_agrees(msg.encoding):
        return np.ascontiguousarray(_cv_bridge().imgmsg_to_cv2(msg, "rgb8"))     # [H, W, 3]
    raw = np.frombuffer(msg.data, dtype=np.uint8).reshape(height, step)[:, :row_bytes]   # [H, row_bytes]
    order = ">" if msg.is_bigendian else "<"
    pixels = np.ascontiguousarray(raw).view(np.dtype(dtype).newbyteorder(order))   # [H, W * C]
    pixels = pixels.reshape(height, width, channels) if channels > 1 else pixels.reshape(height, width)
    if pixels.dtype.itemsize == 2:
        pixels = (pixels.astype(np.uint16) >> 8).astype(np.uint8)   # 16 -> 8 bit: keep the high byte
    try:
        rgb = to_rgb(pixels)
    except cv2.error as exc:       # a size OpenCV's conversion refuses and the checks above missed
        raise ImageDecodeError(f"{msg.encoding} image {width}x{height} cannot be converted to RGB: {exc}") from exc
    return np.ascontiguousarray(rgb, dtype=np.uint8)    # [H, W, 3]


def compressed_msg_to_rgb(msg, max_pixels: int) -> np.ndarray:
    """sensor_msgs/CompressedImage (jpeg, png, ...) -> [H, W, 3] uint8 RGB; raises ImageRejected. A PNG or JPEG
    whose header declares more than max_pixels is refused before it is decoded: a 255 KB PNG of 16384 x 16384
    took camera_ingest from 89 to 594 MiB, and a 2.9 MB one of 32000 x 32000 17 s and ~3 GB, on the thread that
    takes every image."""
    if len(msg.data) == 0:
        raise EmptyImageError(f"compressed image has no data (format {msg.format!r})")
    declared = declared_size(bytes(msg.data[:JPEG_SCAN_BYTES]))
    if declared is not None and declared[0] * declared[1] > max_pixels:
        width, height = declared
        raise ImageTooLargeError(f"compressed image declares {width}x{height} = {width * height} pixels > "
                                 f"camera.max_pixels {max_pixels} (not decoded)")
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


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
JPEG_SCAN_BYTES = 1 << 16        # a JPEG's frame header follows its tables: looked for in the first 64 KB
# JPEG start-of-frame markers (baseline, progressive, lossless, arithmetic): each says the image's size
JPEG_SOF_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


def declared_size(head: bytes) -> tuple | None:
    """(width, height) a PNG's IHDR or a JPEG's frame header declares, from the first bytes of the file; None for
    another format, or a header not found there (then the decoder's own checks apply)."""
    if head.startswith(PNG_SIGNATURE) and len(head) >= 24 and head[12:16] == b"IHDR":
        return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")
    if head[:2] != b"\xff\xd8":
        return None
    i = 2
    while i + 9 <= len(head):
        if head[i] != 0xFF:
            return None                                      # not at a marker: a stream we do not walk
        marker = head[i + 1]
        if marker == 0xFF:                                   # fill byte
            i += 1
            continue
        if marker in (0x01, *range(0xD0, 0xD8)):             # markers without a length
            i += 2
            continue
        length = int.from_bytes(head[i + 2:i + 4], "big")
        if marker in JPEG_SOF_MARKERS:
            return int.from_bytes(head[i + 7:i + 9], "big"), int.from_bytes(head[i + 5:i + 7], "big")
        if marker == 0xDA or length < 2:                     # scan data before any frame header: give up
            return None
        i += 2 + length
    return None


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
