"""`vla-edge record --out BAG`: the real footage as a rosbag2, written with `rosbags`.

Frames of `core.footage.demo_sequence()` (looping) become sensor_msgs/msg/Image
rgb8 messages on /camera/image_raw, one per tick of a virtual 60 Hz camera
(cycle.camera_hz): message i has header.stamp = recorded time = start + i / hz.
The clips are 25-30 fps, so the recording plays them about twice as fast as
they were filmed; the footage (~500 frames) loops, so a recording longer than
~8 s at 60 Hz starts over with its first frame. Frames are scaled to `--width`
(aspect kept; 0 keeps the clip size) so a 20 s bag stays around 100 MB.

Messages are serialized by rclpy (the same CDR bytes a live publisher sends);
`rosbags` supplies the message definition and writes mcap (default) or sqlite3.
"""
from __future__ import annotations

import itertools
import logging
import time
from pathlib import Path

log = logging.getLogger(__name__)

IMAGE_TYPE = "sensor_msgs/msg/Image"
DEFAULT_WIDTH = 320
STORAGES = ("mcap", "sqlite3")


def add_arguments(parser) -> None:
    parser.add_argument("--out", required=True, metavar="BAG", help="bag directory to create (must not exist)")
    parser.add_argument("--seconds", type=float, default=10.0, help="recorded duration (default 10)")
    parser.add_argument("--width", type=int, default=DEFAULT_WIDTH, help="frame width, aspect kept; 0 = clip size")
    parser.add_argument("--storage", choices=STORAGES, default="mcap", help="rosbag2 storage plugin (default mcap)")
    parser.add_argument("--topic", default=None, help="topic name (default camera.input_topic, /camera/image_raw)")


def run(args) -> int:
    from ..config import load
    cfg = load()
    topic = args.topic or cfg.camera.input_topic
    try:
        n = record_footage(args.out, seconds=args.seconds, hz=cfg.cycle.camera_hz, storage=args.storage, topic=topic,
                           width=args.width, frame_id=cfg.camera.frame_id)
    except ValueError as exc:
        print(f"vla-edge record: {exc}")
        return 1
    print(f"vla-edge record: wrote {n} images ({args.seconds:g} s at {cfg.cycle.camera_hz:g} Hz) on {topic} to "
          f"{args.out} ({args.storage})")
    return 0


def footage_frames(width: int):
    """Endless real footage: uint8 RGB frames, scaled to `width` (0: as decoded)."""
    from ..core.footage import demo_sequence, resize_rgb
    for item in itertools.chain.from_iterable(demo_sequence() for _ in itertools.count()):
        pixels = item.pixels
        if width:
            h, w = pixels.shape[:2]
            pixels = resize_rgb(pixels, width, max(1, round(h * width / w)))
        yield pixels


def record_footage(out, seconds: float, hz: float, storage: str = "mcap", topic: str = "/camera/image_raw",
                   width: int = DEFAULT_WIDTH, start_s: float | None = None, frames=None,
                   frame_id: str = "camera") -> int:
    """Write round(seconds * hz) images to a new bag at `out`; returns the count.

    `frames` (an iterable of uint8 RGB arrays) replaces the footage, e.g. for tests; `frame_id` is the
    camera's TF frame in every header.
    """
    from rclpy.serialization import serialize_message
    from rosbags.rosbag2 import StoragePlugin, Writer
    from rosbags.typesys import Stores, get_typestore

    from ..nodes.conversions import rgb_to_image_msg, s_to_stamp

    if storage not in STORAGES:
        raise ValueError(f"storage must be one of {STORAGES}, got {storage!r}")
    if not (seconds > 0 and hz > 0):
        raise ValueError(f"seconds ({seconds}) and hz ({hz}) must be > 0")
    count = int(round(seconds * hz))
    if count < 1:
        raise ValueError(f"{seconds} s at {hz} Hz is no image: record at least 1 / hz = {1 / hz:.4f} s")
    if Path(out).exists():
        raise ValueError(f"{out}: exists already; a bag is written to a new directory")
    start_s = time.time() if start_s is None else start_s
    source = iter(frames) if frames is not None else footage_frames(width)
    plugin = StoragePlugin.MCAP if storage == "mcap" else StoragePlugin.SQLITE3
    writer = Writer(Path(out), version=9, storage_plugin=plugin)
    writer.open()
    try:
        conn = writer.add_connection(topic, IMAGE_TYPE, typestore=get_typestore(Stores.ROS2_JAZZY))
        written = 0
        for i, pixels in zip(range(count), source):
            t_s = start_s + i / hz
            msg = rgb_to_image_msg(pixels, s_to_stamp(t_s), frame_id)
            writer.write(conn, int(round(t_s * 1e9)), serialize_message(msg))
            written += 1
    finally:
        writer.close()
    log.info("recorded %d images to %s", written, out)
    return written
