"""Property-based fuzzing of the camera image path (nodes/camera_images.py), in process: whatever
arrives, the conversion either returns uint8 RGB of the message's size or raises ImageRejected of
the kind the message definition implies; no other exception escapes."""
import numpy as np
from sensor_msgs.msg import Image
from hypothesis import HealthCheck, event, example, given, settings

import image_fuzz as F
from vla_edge_ros.nodes import camera_images as images

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(F.raw_images())
# Found by this test: OpenCV's UYVY conversion asserts on an odd width (was a cv2.error, not a rejection).
@example(Image(height=1, width=1, encoding="yuv422", step=2, data=[95, 130]))
def test_any_raw_image_converts_or_is_rejected_with_its_kind(msg):
    expected = F.expected_kind(msg)
    event(f"expected {expected or 'accepted'}")
    try:
        rgb = images.image_msg_to_rgb(msg, F.MAX_PIXELS)
    except images.ImageRejected as exc:
        assert exc.kind == expected, (exc.kind, expected, str(exc))
        assert exc.kind in images.REJECTION_KINDS
        return
    assert expected is None, f"accepted, expected a {expected} rejection"
    assert rgb.dtype == np.uint8 and rgb.shape == (msg.height, msg.width, 3)


@FUZZ
@given(F.compressed_images())
def test_any_compressed_payload_decodes_or_is_rejected_with_its_kind(case):
    msg, expected, expected_rgb = case
    event(f"expected {expected or 'decoded'}")
    try:
        rgb = images.compressed_msg_to_rgb(msg, F.MAX_PIXELS)
    except images.ImageRejected as exc:
        assert exc.kind in images.REJECTION_KINDS
        assert expected in (exc.kind, "any"), (exc.kind, expected, str(exc))
        return
    assert expected in (None, "any"), f"decoded, expected a {expected} rejection"
    assert rgb.dtype == np.uint8 and rgb.ndim == 3 and rgb.shape[2] == 3
    if expected_rgb is not None:
        np.testing.assert_array_equal(rgb, expected_rgb)
