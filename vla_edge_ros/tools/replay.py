"""`vla-edge replay BAG`: publish a bag's images with their recorded timing.

Reads rosbag2 directories in mcap or sqlite3 storage with `rosbags` (no
rosbag2 install needed); the raw CDR bytes are deserialized by rclpy into
sensor_msgs/Image or CompressedImage and published at the recorded spacing,
scaled by `--rate`, optionally `--loop`ing. By default each message is
re-stamped with the time it is published, as a live camera would stamp it
(the reasoning node refuses frames older than cycle.stale_frame_ms);
`--keep-stamps` publishes the recorded stamps (for nodes on sim time).

`--lockstep` is the frame-driven mode for offline evaluation: the next image
is published only after the graph answered the previous one (an
/vla/action_tokens message whose header carries its stamp, or a /vla/fallback
whose frame_stamp value does), so every
frame is appended to the state exactly once whatever the machine's load; the
recorded timing is then ignored. Only answers that arrive after an image was
published count for it (the reasoning node answers its latest frame again
every cycle), a re-sent image keeps its stamp, and the report counts how each
image was answered: by an action that appended it, or by a fallback and its
reason. A fallback answer means the frame was not processed as asked (e.g.
stale_frame on a loaded machine), so such a run exits 1.

`--keep-stamps` and the graph's clock: the reasoning node ages a frame by its
own clock, and replay publishes no /clock, so recorded stamps older than
cycle.stale_frame_ms are answered stale_frame by a graph on wall time (the
run says so at its start and in its counts).

On a robot with ROS installed, `ros2 bag play BAG` drives the same graph.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

STAMP_MATCH_S = 5e-6          # answer stamps went through float seconds; allow for the rounding
ANSWER_TIMEOUT_S = 5.0
MATCH_TIMEOUT_S = 10.0        # wait this long for a subscriber before the first image (DDS discovery)
LOCKSTEP_ATTEMPTS = 3         # a best-effort camera subscription may drop a frame: publish it again
IMAGE_TYPES = ("sensor_msgs/msg/Image", "sensor_msgs/msg/CompressedImage")


class ReplayError(RuntimeError):
    """The bag cannot be replayed (not a bag, no image topic, no answer in lockstep mode)."""


def add_arguments(parser) -> None:
    parser.add_argument("bag", help="rosbag2 directory (mcap or sqlite3)")
    parser.add_argument("--rate", type=float, default=1.0, help="playback speed factor (default 1.0)")
    parser.add_argument("--loop", action="store_true", help="start again at the end, until Ctrl-C")
    parser.add_argument("--topic", default=None, help="publish on this topic (default: the recorded topic)")
    parser.add_argument("--from-topic", default=None, help="bag topic to read when it holds several image topics")
    parser.add_argument("--keep-stamps", action="store_true", help="publish the recorded header stamps")
    parser.add_argument("--lockstep", action="store_true",
                        help="publish the next image only after the graph answered the previous one")


def run(args) -> int:
    import rclpy
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.impl.implementation_singleton import rclpy_implementation as _rclpy

    if not args.rate > 0:
        raise SystemExit(f"--rate must be > 0, got {args.rate}")
    rclpy.init()
    stop = threading.Event()
    rclpy.get_default_context().on_shutdown(stop.set)       # Ctrl-C: rclpy shuts the context down
    node = rclpy.create_node("vla_edge_replay")
    executor = SingleThreadedExecutor()
    executor.add_node(node)
    spinner = threading.Thread(target=_spin_until_shutdown, args=(executor,), daemon=True)
    spinner.start()
    replayer = None
    try:
        replayer = BagReplayer(node, args.bag, out_topic=args.topic, from_topic=args.from_topic, rate=args.rate,
                               keep_stamps=args.keep_stamps, lockstep=args.lockstep)
        if args.keep_stamps:
            print("vla-edge replay: --keep-stamps: the graph ages frames by its own clock and this replay publishes "
                  "no /clock; recorded stamps older than cycle.stale_frame_ms are answered stale_frame")
        stats = replayer.run(loop=args.loop, stop=stop)
        print(_summary(replayer, stats))
        if not stats.matched:
            print(f"vla-edge replay: no subscriber ever matched {replayer.out_topic} ({replayer.msg_type}): nothing "
                  f"received the images. {replayer.subscribers_elsewhere()}")
            return 1
        return 1 if stats.answered_by_fallback else 0
    except ReplayError as exc:
        print(f"vla-edge replay: {exc}")
        return 1
    except KeyboardInterrupt:
        if replayer is not None:                          # --loop ends here: say what ran
            print(_summary(replayer, replayer.stats) + " (stopped)")
        return 130
    except (_rclpy.RCLError, _rclpy.InvalidHandle):
        if rclpy.ok():
            raise
        return 0                      # Ctrl-C: the context went away under a publish or a graph query
    finally:
        executor.shutdown()
        spinner.join(timeout=2.0)
        node.destroy_node()
        rclpy.try_shutdown()


def _summary(replayer, stats) -> str:
    text = (f"vla-edge replay: published {stats.published} images on {replayer.out_topic} "
            f"({stats.loops} pass(es), {stats.retries} lockstep re-sends)")
    if replayer.lockstep:
        fallbacks = ", ".join(f"{reason} {n}" for reason, n in sorted(stats.fallback_reasons.items())) or "none"
        text += (f"; answered by an action {stats.answered_by_action}, by a fallback {stats.answered_by_fallback} "
                 f"({fallbacks})")
    return text


def _spin_until_shutdown(executor) -> None:
    from rclpy.executors import ExternalShutdownException
    try:
        executor.spin()
    except ExternalShutdownException:
        pass                          # Ctrl-C: the main thread notices through its stop event


def bag_image_topics(bag) -> dict:
    """{topic: msgtype} of the image topics in a bag."""
    from rosbags.rosbag2 import Reader
    from rosbags.rosbag2.errors import ReaderError
    try:
        with Reader(Path(bag)) as reader:
            return {c.topic: c.msgtype for c in reader.connections if c.msgtype in IMAGE_TYPES}
    except (ReaderError, FileNotFoundError) as exc:        # rosbags: FileNotFoundError without metadata.yaml
        raise ReplayError(f"{bag}: not a readable rosbag2 ({exc})") from exc


def read_images(bag, topic: str | None = None):
    """Yield (recorded time ns, deserialized message) of one image topic, in recorded order."""
    from rclpy.serialization import deserialize_message
    from rosbags.rosbag2 import Reader
    from sensor_msgs.msg import CompressedImage, Image

    topics = bag_image_topics(bag)
    if not topics:
        raise ReplayError(f"{bag}: no {' or '.join(IMAGE_TYPES)} topic in the bag")
    if topic is None:
        if len(topics) > 1:
            raise ReplayError(f"{bag}: several image topics {sorted(topics)}; choose one with --from-topic")
        topic = next(iter(topics))
    if topic not in topics:
        raise ReplayError(f"{bag}: no image topic {topic!r}; image topics: {sorted(topics)}")
    cls = Image if topics[topic] == IMAGE_TYPES[0] else CompressedImage
    with Reader(Path(bag)) as reader:
        conns = [c for c in reader.connections if c.topic == topic]
        for index, (_conn, t_ns, raw) in enumerate(reader.messages(connections=conns)):
            try:
                msg = deserialize_message(bytes(raw), cls)
            except Exception as exc:                 # rclpy's RMWError: a message cut short or not of this type
                raise ReplayError(f"{bag}: message {index} of {topic} (log time {t_ns} ns) does not deserialize "
                                  f"as {topics[topic]}: {exc}") from exc
            yield t_ns, msg


@dataclass
class ReplayStats:
    published: int = 0
    loops: int = 0
    retries: int = 0
    matched: bool = False                  # a subscriber matched the image topic at some point
    answered_by_action: int = 0            # lockstep: images whose first answer was an action
    answered_by_fallback: int = 0          # ... or a fallback (not processed as asked)
    fallback_reasons: Counter = field(default_factory=Counter)


class BagReplayer:
    """Publishes one image topic of a bag from `node` (which someone else spins)."""

    def __init__(self, node, bag, out_topic: str | None = None, from_topic: str | None = None, rate: float = 1.0,
                 keep_stamps: bool = False, lockstep: bool = False, answer_timeout_s: float = ANSWER_TIMEOUT_S):
        from rclpy.qos import QoSProfile
        from sensor_msgs.msg import CompressedImage, Image

        if not rate > 0:
            raise ValueError(f"rate must be > 0, got {rate}")
        self.node = node
        self.bag = Path(bag)
        topics = bag_image_topics(self.bag)
        if not topics:
            raise ReplayError(f"{bag}: no {' or '.join(IMAGE_TYPES)} topic in the bag")
        self.from_topic = from_topic or (next(iter(topics)) if len(topics) == 1 else None)
        if self.from_topic is None or self.from_topic not in topics:
            raise ReplayError(f"{bag}: choose one image topic of {sorted(topics)} (--from-topic)")
        self.out_topic = out_topic or self.from_topic
        self.rate = rate
        self.keep_stamps = keep_stamps
        self.lockstep = lockstep
        self.answer_timeout_s = answer_timeout_s
        cls = Image if topics[self.from_topic] == IMAGE_TYPES[0] else CompressedImage
        self.msg_type = topics[self.from_topic]
        self.publisher = node.create_publisher(cls, self.out_topic, QoSProfile(depth=1))
        self.stats = ReplayStats()
        self._answers: list = []                         # (stamp s, fallback reason or None) since the last publish
        self._answers_lock = threading.Lock()
        self._last_stamp = None
        self._answered = threading.Event()
        self._answer_subscriptions: list = []
        if lockstep:
            self._subscribe_answers()

    def run(self, loop: bool = False, stop: threading.Event | None = None) -> ReplayStats:
        from ..core.clock import hybrid_sleep_until

        stats = self.stats = ReplayStats()
        self._wait_for_subscriber(stop)
        while True:
            start_perf = time.perf_counter()
            first_ns = last_ns = None
            count = 0
            for t_ns, msg in read_images(self.bag, self.from_topic):
                if stop is not None and stop.is_set():
                    return stats
                first_ns = t_ns if first_ns is None else first_ns
                last_ns = t_ns
                if not self.lockstep:
                    hybrid_sleep_until(start_perf + (t_ns - first_ns) * 1e-9 / self.rate, stop=stop)
                if stop is not None and stop.is_set():
                    return stats
                self._publish(msg, stats)
                count += 1
            stats.loops += 1
            if not loop or first_ns is None:
                return stats
            # The next pass starts one mean frame interval after this pass's last frame.
            interval_s = (last_ns - first_ns) * 1e-9 / self.rate / max(count - 1, 1)
            hybrid_sleep_until(time.perf_counter() + interval_s, stop=stop)

    # ------------------------------------------------------------- internals

    def subscribers_elsewhere(self) -> str:
        """What subscribes where the images were meant to go: another message type on the topic (camera.compressed
        decides which one camera_ingest takes), or the image topics the graph does subscribe to."""
        found = {name: types for name, types in self.node.get_topic_names_and_types()
                 if any(t in IMAGE_TYPES for t in types) and self.node.count_subscribers(name)}
        if not found:
            return "No image topic of the graph has a subscriber (is camera_ingest running on this ROS domain?)."
        return ("Subscribed image topics: " + ", ".join(f"{n} ({'/'.join(t)})" for n, t in sorted(found.items()))
                + "; --topic chooses where to publish, camera.compressed which type camera_ingest takes.")

    def _wait_for_subscriber(self, stop) -> None:
        """Images published before discovery matched a subscriber would be lost."""
        deadline = time.monotonic() + MATCH_TIMEOUT_S
        answers = self._answer_subscriptions
        while (self.publisher.get_subscription_count() == 0
               or any(sub.get_publisher_count() == 0 for sub in answers)):
            if time.monotonic() > deadline:
                if self.lockstep:
                    raise ReplayError(f"no subscriber on {self.out_topic} or no publisher of "
                                      f"{[sub.topic_name for sub in answers]} after {MATCH_TIMEOUT_S:.0f} s")
                log.warning("no subscriber on %s yet; publishing anyway", self.out_topic)
                return
            if stop is not None and stop.wait(0.05):
                return
            time.sleep(0.05)

    def _publish(self, msg, stats: ReplayStats) -> None:
        if not self.keep_stamps:
            msg.header.stamp = self.node.get_clock().now().to_msg()      # once: a re-send is the same image
        stamp = (msg.header.stamp.sec, msg.header.stamp.nanosec)
        if self.lockstep and self.keep_stamps:
            if stamp == (0, 0):
                raise ReplayError("lockstep --keep-stamps: an image has no stamp (0); camera_ingest stamps it with "
                                  "its receive time, so its answer cannot be told from others")
            if stamp == self._last_stamp:
                raise ReplayError(f"lockstep --keep-stamps: two images in a row stamped {stamp[0]}.{stamp[1]:09d}; "
                                  f"their answers cannot be told apart (replay without --keep-stamps)")
        self._last_stamp = stamp
        stats.matched = stats.matched or self.publisher.get_subscription_count() > 0
        for attempt in range(LOCKSTEP_ATTEMPTS if self.lockstep else 1):
            with self._answers_lock:
                self._answers.clear()                # only answers after this publish count for it
            self._answered.clear()
            self.publisher.publish(msg)
            stats.published += attempt == 0
            if not self.lockstep:
                return
            reason = self._wait_answer(msg.header.stamp)
            if reason is not False:
                if reason is None:
                    stats.answered_by_action += 1
                else:
                    stats.answered_by_fallback += 1
                    stats.fallback_reasons[reason] += 1
                return
            stats.retries += 1
            log.warning("no answer to the image stamped %d.%09d within %.1f s; publishing it again",
                        msg.header.stamp.sec, msg.header.stamp.nanosec, self.answer_timeout_s)
        raise ReplayError(f"lockstep: the graph did not answer an image after {LOCKSTEP_ATTEMPTS} attempts (is the "
                          f"reasoning node running on this ROS domain? camera_ingest's /diagnostics counts the "
                          f"images it received and rejected)")

    def _wait_answer(self, stamp):
        """The first answer to the image of `stamp` published last: None for an action, the fallback's reason, or
        False when none came within answer_timeout_s."""
        want = stamp.sec + stamp.nanosec * 1e-9
        deadline = time.monotonic() + self.answer_timeout_s
        while time.monotonic() < deadline:
            with self._answers_lock:
                answered = [reason for s, reason in self._answers if abs(s - want) < STAMP_MATCH_S]
            if answered:
                return answered[0]
            self._answered.wait(timeout=0.05)
            self._answered.clear()
        return False

    def _subscribe_answers(self) -> None:
        from diagnostic_msgs.msg import DiagnosticStatus

        from ..nodes import conversions as conv
        from ..nodes import graph
        from ..nodes.interfaces import ActionTokens

        def on_tokens(msg):
            self._note(conv.stamp_to_s(msg.header.stamp), None)

        def on_fallback(msg):
            stamp = conv.status_values(msg).get("frame_stamp", "")
            if stamp:
                self._note(float(stamp), msg.message or "fallback")

        self._answer_subscriptions = [
            self.node.create_subscription(ActionTokens, graph.ACTION_TOKENS_TOPIC, on_tokens, 10),
            self.node.create_subscription(DiagnosticStatus, graph.FALLBACK_TOPIC, on_fallback, 10)]

    def _note(self, stamp_s: float, fallback_reason: str | None) -> None:
        with self._answers_lock:
            self._answers.append((stamp_s, fallback_reason))
        self._answered.set()
