"""reasoning: the 33 ms control cycle; exactly one /vla/action or /vla/fallback per cycle.

Threads:
    executor     /vla/frame -> core double buffer (never waits), /vla/instruction,
                 1 Hz /diagnostics, swap requests and their answers
    cycle        waits for each boundary of a fixed grid (hybrid sleep-then-spin,
                 core/clock.py), runs `Engine.run_cycle` on the freshest frame,
                 publishes the result, then - still at the boundary - applies a
                 new instruction or a loaded reconciler snapshot
    swap loader  reads a snapshot file offered by the reconciler (core/swap_protocol.py)
Nothing on the cycle thread waits for the reconciler; if it is gone, requests time out and
the engine's own eviction keeps serving.
"""
from __future__ import annotations

import dataclasses
import sys
import threading
import time
import traceback

from diagnostic_msgs.msg import DiagnosticArray
from diagnostic_msgs.msg import DiagnosticStatus
from rclpy.impl.implementation_singleton import rclpy_implementation as _rclpy
from rclpy.node import Node
from rclpy.qos import DurabilityPolicy
from rclpy.qos import QoSProfile
from sensor_msgs.msg import Image
from sensor_msgs.msg import JointState
from std_msgs.msg import Int32MultiArray
from std_msgs.msg import String
from std_srvs.srv import Trigger

from ..config import ConfigError
from ..core import swap_protocol as swap
from ..core.clock import CycleGrid, hybrid_sleep_until
from ..core.cycle_result import DEADLINE_MISSED
from ..core.double_buffer import LatestFrameBuffer
from ..core.engine import Engine, EngineConfigError
from ..core.frame_ids import FrameIdEpochs
from ..core.health import HealthLog, ReasoningHealth
from ..core.state_snapshot import SnapshotError
from ..model.spec import ModelFormatError
from . import conversions as conv
from . import graph
from . import health_status
from .node_main import run_node
from .params import NodeParameters

DIAGNOSTICS_PERIOD_S = 1.0
SWAP_TIMEOUT_POLLS = 20    # a swap request unanswered for 20 memory-sample periods is abandoned


class Reasoning(Node):
    def __init__(self):
        super().__init__("reasoning")
        self.params = NodeParameters(self, on_change=self._on_config_change)
        cfg = self.params.config
        self.engine = Engine.from_config(cfg)
        self.buffer = LatestFrameBuffer()
        self.frame_ids = FrameIdEpochs()             # camera ids -> state ids that survive a camera restart
        self.rejected_frames = 0
        self.skipped_boundaries = 0
        self._engine_lock = threading.Lock()         # cycle thread vs diagnostics reading the state
        self._pending_instruction: str | None = None
        self._instruction_lock = threading.Lock()
        self._stop = threading.Event()
        self.failed = False                          # the cycle thread died: the process exits non-zero
        self.health = ReasoningHealth(cfg.health, start_s=time.monotonic())    # what /diagnostics levels say
        self._health_log = HealthLog()
        poll_s = cfg.memory.sample_period_ms / 1000.0
        self.swap = swap.SwapClient(poll_s, SWAP_TIMEOUT_POLLS * poll_s)

        self.create_subscription(Image, graph.FRAME_TOPIC, self._on_frame, QoSProfile(depth=1))
        latched = QoSProfile(depth=1, durability=DurabilityPolicy.TRANSIENT_LOCAL)
        self.create_subscription(String, graph.INSTRUCTION_TOPIC, self._on_instruction, latched)
        self.action_pub = self.create_publisher(JointState, graph.ACTION_TOPIC, QoSProfile(depth=1))
        self.tokens_pub = self.create_publisher(Int32MultiArray, graph.ACTION_TOKENS_TOPIC, QoSProfile(depth=1))
        self.fallback_pub = self.create_publisher(DiagnosticStatus, graph.FALLBACK_TOPIC, QoSProfile(depth=10))
        self.chunk_pub = self.create_publisher(Image, graph.STATE_CHUNK_TOPIC, QoSProfile(depth=64))
        self._chunk_seq = 0                          # numbers state chunks so the reconciler sees a missed one
        self.diag_pub = self.create_publisher(DiagnosticArray, graph.DIAGNOSTICS_TOPIC, 10)
        self.swap_client = self.create_client(Trigger, graph.SWAP_SERVICE)
        self.create_timer(poll_s, self._maybe_request_swap)
        self.create_timer(DIAGNOSTICS_PERIOD_S, self._publish_diagnostics)
        self._cycle_thread = threading.Thread(target=self._cycle_loop, name="vla-cycle", daemon=True)
        self._cycle_thread.start()
        self.get_logger().info(f"cycle {cfg.cycle.deadline_ms} ms, model {cfg.model.path} "
                               f"({type(self.engine.backend).__name__}), deterministic={cfg.cycle.deterministic}")

    # ---------------------------------------------------------------- executor

    def _on_frame(self, msg: Image) -> None:
        try:
            frame = conv.frame_from_image_msg(msg, self.params.config.camera.max_pixels)
        except ValueError as exc:          # camera_images.ImageRejected or a frame_id without a frame number
            self.rejected_frames += 1
            self.get_logger().error(f"/vla/frame message rejected: {exc}", throttle_duration_sec=1.0)
            return
        restarts = self.frame_ids.restarts
        state_id = self.frame_ids.map(frame.frame_id)
        if self.frame_ids.restarts != restarts:
            self.get_logger().warning(f"camera frame ids went back to {frame.frame_id} (camera_ingest restarted?): "
                                      f"continuing the state's frame ids at {state_id}")
        self.buffer.publish(dataclasses.replace(frame, frame_id=state_id))

    def _on_instruction(self, msg: String) -> None:
        with self._instruction_lock:
            self._pending_instruction = msg.data

    def _on_config_change(self, cfg, keys) -> None:
        if "prompt.instruction" in keys:
            with self._instruction_lock:
                self._pending_instruction = cfg.prompt.instruction

    def _maybe_request_swap(self) -> None:
        if not self.swap.want_request() or not self.swap_client.service_is_ready():
            return
        self.swap.request_sent()
        self.swap_client.call_async(Trigger.Request()).add_done_callback(self._on_swap_answer)

    def _on_swap_answer(self, future) -> None:
        self.health.on_swap_answer(time.monotonic())
        try:
            answer = future.result()
            offer = self.swap.on_response(answer.success, answer.message)
        except swap.SwapProtocolError as exc:
            self.get_logger().warning(f"swap answer ignored: {exc}")
            self.swap.on_request_failed()
            return
        if offer is not None:
            swap.start_loader(self.swap, offer)

    def _publish_diagnostics(self) -> None:
        # The engine lock only guards the slot bookkeeping (cheap); metrics copy under their own
        # short lock and sort outside it, so diagnostics never hold up a cycle.
        with self._engine_lock:
            state = self.engine.state_summary()
        window = self.engine.metrics.window_summary()
        total = self.engine.metrics.summary()
        stats = self.buffer.stats()
        values = conv.flatten({"window": window, "total": total, "state": state, "swap": self.swap.summary()})
        values.update({"frames_received": stats.published, "frames_consumed": stats.consumed,
                       "frames_overwritten": stats.overwritten, "frames_rejected": self.rejected_frames,
                       "skipped_boundaries": self.skipped_boundaries, "backend": type(self.engine.backend).__name__,
                       "instruction": self.engine.instruction})
        now = time.monotonic()
        self.health.on_swap_timeouts(self.swap.timeouts, now)
        health = self.health.assess(now)
        health_status.log_change(self.get_logger(), self._health_log, health)
        detail = f"miss rate {window['deadline_miss_rate']:.3f}, fallback rate {window['fallback_rate']:.3f}"
        self.diag_pub.publish(health_status.diagnostics_array(self, health, values, detail))

    # ------------------------------------------------------------ cycle thread

    def _cycle_loop(self) -> None:
        try:
            self._run_cycles()
        except Exception:  # noqa: BLE001 - anything escaping here would stop the cycles silently
            self.get_logger().fatal(f"cycle thread failed, shutting the node down:\n{traceback.format_exc()}")
            self.failed = True
            self.context.try_shutdown()

    def _run_cycles(self) -> None:
        cfg = self.params.config
        grid = CycleGrid(cfg.cycle.period_s)
        while not self._stop.is_set():
            boundary = grid.next_boundary()
            self.skipped_boundaries += boundary.skipped
            hybrid_sleep_until(boundary.perf_s, stop=self._stop)
            if self._stop.is_set():
                return
            frame = self.buffer.consume_latest()
            now_s = self.get_clock().now().nanoseconds * 1e-9
            with self._engine_lock:
                result = self.engine.run_cycle(frame, now_s, cycle_start_perf=boundary.perf_s)
            self.health.on_cycle(result.is_action, result.reason == DEADLINE_MISSED, time.monotonic())
            try:
                self._publish_result(result, frame)
            except (_rclpy.RCLError, _rclpy.InvalidHandle):
                if self._stop.is_set() or not self.context.ok():
                    return                 # shutting down: the publishers went away under us
                raise
            self._between_cycles(result.cycle_id)

    def _publish_result(self, result, frame) -> None:
        if result.is_action:
            self.tokens_pub.publish(conv.action_tokens_msg(result))
            self.action_pub.publish(conv.action_msg(result, self.params.config.action.dim_names))
        else:
            self.fallback_pub.publish(conv.fallback_msg(result, f"vla_edge: {self.get_name()}"))
        if result.new_frame and frame is not None:
            self._chunk_seq += 1
            self.chunk_pub.publish(conv.state_chunk_msg(frame, self.engine.state_version, self._chunk_seq))

    def _between_cycles(self, cycle_id: int) -> None:
        """At the boundary after cycle `cycle_id`: new instruction, reconciled state."""
        with self._instruction_lock:
            text, self._pending_instruction = self._pending_instruction, None
        with self._engine_lock:
            if text is not None:
                self.engine.set_instruction(text)
            snap = self.swap.take_ready()
            if snap is not None:
                self._apply(snap, cycle_id)

    def _apply(self, snap, cycle_id: int) -> None:
        try:
            dropped = self.engine.import_state(snap)
        except SnapshotError as exc:
            self.swap.mark_rejected(snap.version)
            self.get_logger().error(f"reconciled state v{snap.version} rejected: {exc}")
            return
        report = self.engine.last_swap
        self.swap.mark_applied(snap.version, cycle_id, len(dropped), len(report.late), len(report.unseen))
        self.get_logger().debug(f"state v{snap.version} applied after cycle {cycle_id}: {len(snap.frames)} "
                                f"reconciled frames, {len(report.late)} late and {len(report.unseen)} unseen by the "
                                f"reconciler recomputed, {len(dropped)} dropped")
        # Routine: each swap at DEBUG above, a running total at INFO at most every health.log_summary_s.
        total = self.swap.summary()
        self.get_logger().info(f"{total['swaps']} reconciled states applied so far (latest v{snap.version} after "
                               f"cycle {cycle_id}); frames recomputed: {total['swap_late_frames']} late, "
                               f"{total['swap_unseen_frames']} unseen; dropped {total['swap_dropped_frames']}",
                               throttle_duration_sec=self.params.config.health.log_summary_s)

    def close(self) -> None:
        """Stop the cycle thread (before the node is destroyed)."""
        self._stop.set()
        self._cycle_thread.join(timeout=2.0)


def main(args=None) -> int:
    return run_node("reasoning", Reasoning, (ConfigError, EngineConfigError, ModelFormatError), args)


if __name__ == "__main__":
    sys.exit(main())
