"""camera_ingest: camera images in, the freshest encoder-sized frame out on /vla/frame.

/vla/frame is a vla_edge_interfaces/Frame: the rgb8 image at the encoder's size with
the capture stamp and the camera's TF frame (camera.frame_id), and the frame's
sequence number (1, 2, ... per process) in its own field.

The subscription callback converts (cv_bridge, any supported encoding),
resizes to the encoder grid and writes the core double buffer; it never
waits. A publisher thread, woken per frame, hands the freshest frame to
/vla/frame with its capture stamp, so a slow publish overwrites frames rather
than queueing them. Bad images are rejected, counted per kind and logged
(throttled); the node keeps running. Counters go out on /diagnostics at 1 Hz.
"""
from __future__ import annotations

import sys
import threading
import time
from collections import Counter

from diagnostic_msgs.msg import DiagnosticArray
from rclpy.impl.implementation_singleton import rclpy_implementation as _rclpy
from rclpy.node import Node
from rclpy.qos import QoSProfile
from rclpy.qos import ReliabilityPolicy
from sensor_msgs.msg import CompressedImage
from sensor_msgs.msg import Image

from ..config import ConfigError
from ..core.double_buffer import LatestFrameBuffer
from ..core.footage import resize_rgb
from ..core.frames import Frame
from ..core.health import CameraHealth, HealthLog
from . import camera_images as images
from . import conversions as conv
from . import graph
from . import health_status
from .interfaces import FrameMsg
from .node_main import run_node
from .params import NodeParameters

LOG_THROTTLE_S = 1.0      # at most one rejection error per second in the log; every one is counted
DIAGNOSTICS_PERIOD_S = 1.0

# Applied from the next image; every other key is fixed once the node has started (params.py).
LIVE_KEYS = ("camera.max_pixels",)

class CameraIngest(Node):
    def __init__(self):
        super().__init__("camera_ingest")
        # Frame size and the rest stay those of the start (a live vision.* change would send frames of a size
        # the reasoning node's encoder was not built for); the pixel limit applies from the next image.
        self.params = NodeParameters(self, sections=("camera", "vision", "cycle", "health", "memory"),
                                     live_keys=LIVE_KEYS, on_change=self._on_config_change)
        self.cfg = cfg = self.params.config
        self.health = CameraHealth(cfg.health, cfg.cycle.stale_frame_ms, start_s=time.monotonic())
        self._health_log = HealthLog()
        self.buffer = LatestFrameBuffer()
        self.counts = Counter()                      # received, accepted, unstamped, stamp_backwards, published,
                                                     # rejected_<kind>
        self._last_stamp_s = 0.0
        self._next_id = 1
        self._wake = threading.Event()
        self._stop = threading.Event()
        reliability = ReliabilityPolicy.RELIABLE if cfg.camera.reliability == "reliable" else ReliabilityPolicy.BEST_EFFORT
        msg_type = CompressedImage if cfg.camera.compressed else Image
        self.create_subscription(msg_type, cfg.camera.input_topic, self._on_image,
                                 QoSProfile(depth=1, reliability=reliability))
        self.frame_pub = self.create_publisher(FrameMsg, graph.FRAME_TOPIC, QoSProfile(depth=1))
        self.diag_pub = self.create_publisher(DiagnosticArray, graph.DIAGNOSTICS_TOPIC, 10)
        self.create_timer(DIAGNOSTICS_PERIOD_S, self._publish_diagnostics)
        self._publisher = threading.Thread(target=self._publish_loop, name="frame-publisher", daemon=True)
        self._publisher.start()
        self.get_logger().info(f"reading {cfg.camera.input_topic} ({msg_type.__name__}, {cfg.camera.reliability}), "
                               f"frames {cfg.vision.image_width}x{cfg.vision.image_height} on {graph.FRAME_TOPIC}")

    def _on_config_change(self, cfg, keys) -> None:
        self.cfg = cfg                   # only live keys get here (params.py); one reference swap, read once per image

    def _on_image(self, msg) -> None:
        cfg = self.cfg
        self.counts["received"] += 1
        try:
            if isinstance(msg, CompressedImage):
                rgb = images.compressed_msg_to_rgb(msg, cfg.camera.max_pixels)
            else:
                rgb = images.image_msg_to_rgb(msg, cfg.camera.max_pixels)
        except images.ImageRejected as exc:
            self.counts[f"rejected_{exc.kind}"] += 1
            self.counts["rejected"] += 1
            self.health.on_rejected(time.monotonic())
            self.get_logger().error(f"image rejected ({exc.kind}): {exc}", throttle_duration_sec=LOG_THROTTLE_S)
            return
        stamp_s = conv.stamp_to_s(msg.header.stamp)
        if stamp_s == 0.0:
            # An unstamped camera: the receive time is the best capture time we have; counted, not hidden.
            self.counts["unstamped"] += 1
            stamp_s = self.get_clock().now().nanoseconds * 1e-9
        if stamp_s < self._last_stamp_s:
            # Passed on (the newest received is still the freshest the camera sent), but counted: a camera clock that
            # jumps back, or two publishers on one topic, shows here.
            self.counts["stamp_backwards"] += 1
        self._last_stamp_s = stamp_s
        pixels = resize_rgb(rgb, cfg.vision.image_width, cfg.vision.image_height)   # [h, w, 3]
        self.buffer.publish(Frame(pixels=pixels, stamp_s=stamp_s, frame_id=self._next_id))
        self._next_id += 1
        self.counts["accepted"] += 1
        self.health.on_image(time.monotonic())
        self._wake.set()

    def _publish_loop(self) -> None:
        last_id = None
        while not self._stop.is_set():
            self._wake.wait()
            self._wake.clear()
            frame = self.buffer.consume_latest()
            if frame is None or frame.frame_id == last_id or self._stop.is_set():
                continue
            last_id = frame.frame_id
            try:
                self.frame_pub.publish(conv.frame_msg(frame, self.cfg.camera.frame_id))
            except (_rclpy.RCLError, _rclpy.InvalidHandle):
                if self._stop.is_set() or not self.context.ok():
                    return                 # shutting down: the publisher went away under us
                raise
            self.counts["published"] += 1

    def _publish_diagnostics(self) -> None:
        stats = self.buffer.stats()
        values = {k: self.counts.get(k, 0) for k in ("received", "accepted", "published", "unstamped", "stamp_backwards",
                                                      "rejected")}
        values.update({f"rejected_{kind}": self.counts.get(f"rejected_{kind}", 0) for kind in images.REJECTION_KINDS})
        values["overwritten"] = stats.overwritten
        health = self.health.assess(time.monotonic())
        health_status.log_change(self.get_logger(), self._health_log, health)
        self.diag_pub.publish(health_status.diagnostics_array(self, health, values))

    def close(self) -> None:
        """Stop the publisher thread (before the node is destroyed)."""
        self._stop.set()
        self._wake.set()
        self._publisher.join(timeout=1.0)


def main(args=None) -> int:
    return run_node("camera_ingest", CameraIngest, (ConfigError,), args)


if __name__ == "__main__":
    sys.exit(main())
