"""hypothesis strategies for camera images (Image and CompressedImage) and an oracle written from
the message definitions, not from camera_images.py: which rejection kind each message must get.

Shared by test_fuzz_images.py (the conversion, in process) and test_ros_fuzz.py (camera_ingest
as its own process over DDS).
"""
import cv2
import numpy as np
from hypothesis import strategies as st
from sensor_msgs.msg import CompressedImage
from sensor_msgs.msg import Image

MAX_PIXELS = 4096            # small, so "too large" is reachable without big buffers
UINT32_MAX = 2 ** 32 - 1

# bytes per pixel = channels x bytes per channel, from the encoding names of sensor_msgs/image_encodings.h
BYTES_PER_PIXEL = {
    "rgb8": 3, "bgr8": 3, "rgba8": 4, "bgra8": 4, "mono8": 1,
    "rgb16": 6, "bgr16": 6, "rgba16": 8, "bgra16": 8, "mono16": 2,
    "8UC1": 1, "8UC3": 3, "8UC4": 4, "16UC1": 2, "16UC3": 6,
    "bayer_rggb8": 1, "bayer_bggr8": 1, "bayer_gbrg8": 1, "bayer_grbg8": 1,
    "bayer_rggb16": 2, "bayer_bggr16": 2, "bayer_gbrg16": 2, "bayer_grbg16": 2,
    "yuv422": 2,
}
UNSUPPORTED = ["32FC1", "16SC1", "64FC3", "8SC1", "", "rgb", "RGB8", "jpeg", "bgr8 ", "yuv422_yuy2", "nv21"]


def expected_kind(msg: Image):
    """The rejection kind this Image must get, or None when it must convert."""
    bpp = BYTES_PER_PIXEL.get(msg.encoding)
    if bpp is None:
        return "encoding"
    if msg.width == 0 or msg.height == 0:
        return "zero_size"
    if msg.width * msg.height > MAX_PIXELS:
        return "too_large"
    if msg.step < msg.width * bpp:
        return "step"
    if len(msg.data) != msg.step * msg.height:
        return "data_length"
    if msg.encoding == "yuv422" and msg.width % 2:
        return "geometry"          # 4:2:2: two pixels share one U and one V
    return None


def _often(common, *rare):
    """`common` about three times in four, else one of `rare`."""
    return st.integers(0, 3).flatmap(lambda roll: common if roll else st.one_of(*rare))


@st.composite
def raw_images(draw) -> Image:
    """Any encoding (supported or not), sizes from empty to absurd, steps below / at / above the row,
    data of the right length or not, either byte order. Each defect is drawn about one time in four,
    so images that must convert are common too."""
    encoding = draw(_often(st.sampled_from(sorted(BYTES_PER_PIXEL)), st.sampled_from(UNSUPPORTED), st.text(max_size=12)))
    absurd = st.sampled_from([UINT32_MAX, 2 ** 31, 100_000])
    width = draw(_often(st.integers(1, 80), st.just(0), absurd))
    height = draw(_often(st.integers(1, 60), st.just(0), absurd))
    row = width * BYTES_PER_PIXEL.get(encoding, 3)
    step = draw(_often(st.integers(row, row + 16).map(lambda v: min(v, UINT32_MAX)),
                       st.integers(max(0, row - 8), row), st.integers(0, UINT32_MAX)))
    exact = step * height
    length = draw(_often(st.just(exact), st.integers(max(0, exact - 5), exact + 5), st.integers(0, 4096))
                  if exact <= 64 * 1024 else st.integers(0, 4096))     # never allocate the absurd sizes
    seed = draw(st.integers(0, 2 ** 32 - 1))
    msg = Image(height=height, width=width, encoding=encoding, is_bigendian=draw(st.booleans()), step=step)
    msg.data = np.random.default_rng(seed).integers(0, 256, length, dtype=np.uint8).tobytes()
    return msg


@st.composite
def compressed_images(draw):
    """(CompressedImage, expected kind or None, expected RGB or None): real PNG / JPEG of random
    content and size (possibly truncated), random bytes, nothing."""
    kind = draw(st.sampled_from(["png", "jpeg", "truncated", "random", "empty"]))
    width, height = draw(st.integers(1, 90)), draw(st.integers(1, 60))
    rgb = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1))).integers(0, 256, (height, width, 3), dtype=np.uint8)
    expected_rgb, expected = None, None
    if kind == "empty":
        data, expected = b"", "zero_size"
    elif kind == "random":
        data = draw(st.binary(min_size=1, max_size=2048))
        expected = "decode"            # random bytes are neither PNG nor JPEG (checked by the header below)
        if data.startswith((b"\x89PNG", b"\xff\xd8")):
            expected = "any"
    else:
        ok, buf = cv2.imencode(".png" if kind == "png" else ".jpg", rgb[..., ::-1])
        assert ok
        data = buf.tobytes()
        if kind == "truncated":
            data = data[:draw(st.integers(1, max(1, len(data) - 1)))]
            expected = "any"           # a cut JPEG may still decode (with grey rows), a cut PNG not
        elif width * height > MAX_PIXELS:
            expected = "too_large"
        elif kind == "png":
            expected_rgb = rgb         # lossless: the exact pixels back
    msg = CompressedImage(format="png" if kind == "png" else "jpeg", data=data)
    return msg, expected, expected_rgb
