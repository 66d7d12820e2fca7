"""reasoning: the 33 ms control cycle; exactly one /vla/action or /vla/fallback per cycle while active.

A lifecycle node, like the reconciler, because it owns the GPU:

    unconfigured --configure--> inactive: builds the engine (core/engine_factory.py: weights streamed
                                to the device, kernels compiled, KV arena allocated, CUDA graphs of
                                the cycle captured), runs lifecycle.warmup_cycles warm-up cycles that
                                seed the admission estimate, checks that a cycle over a full state
                                meets the deadline (core/capacity_check.py; a WARNING with the
                                frames that do when not), subscribes /vla/frame and /vla/instruction
    inactive --activate--> active:        starts the cycle thread and the swap requests
    active --deactivate--> inactive:      stops them after the cycle in flight (which still ends in
                                          an action or a fallback)
    inactive --cleanup--> unconfigured:   frees the engine (device memory given back, logged)
A bad model or configuration fails configure with the reason logged; the node stays up, unconfigured.

Threads:
    executor     /vla/frame -> core double buffer (never waits), /vla/instruction,
                 1 Hz /diagnostics, swap requests and their answers, lifecycle transitions
    cycle        waits for each boundary of a fixed grid (hybrid sleep-then-spin,
                 core/clock.py), runs `Engine.run_cycle` on the freshest frame,
                 publishes the result, then - still at the boundary - applies a
                 new instruction or a loaded reconciler snapshot. It holds the
                 engine's CUDA context for its whole life (model/cuda_device.py).
    swap loader  reads a snapshot offered by the reconciler and maps its KV (CUDA IPC on a GPU)
Nothing on the cycle thread waits for the reconciler; if it is gone, requests time out and
the engine's own eviction keeps serving.
"""
from __future__ import annotations

import dataclasses
import os
import sys
import threading
import time
import traceback
from functools import partial

import numpy as np
from diagnostic_msgs.msg import DiagnosticArray
from diagnostic_msgs.msg import DiagnosticStatus
from rclpy.impl.implementation_singleton import rclpy_implementation as _rclpy
from rclpy.lifecycle import LifecycleState
from rclpy.lifecycle import TransitionCallbackReturn
from rclpy.qos import DurabilityPolicy
from rclpy.qos import QoSProfile
from sensor_msgs.msg import JointState
from std_msgs.msg import String

from ..config import ConfigError
from ..core import gc_pauses
from ..core.heap_trim import HeapTrim
from ..core.prompt import instruction_char_limit
from ..core import swap_protocol as swap
from ..core.boundary_overrun import OVERRUN_PARTS, BoundaryWork, overran_in
from ..core.capacity_check import check_capacity, most_frames, take_context_cost
from ..core.clock import CycleGrid, hybrid_sleep_until
from ..core.cpu_priority import make_thread_realtime
from ..core.cycle_clock import CycleClockWriter, clock_path
from ..core.cycle_result import DEADLINE_MISSED
from ..core.double_buffer import LatestFrameBuffer
from ..core.engine import NO_SWAP_ROOM
from ..core.engine_factory import describe_choice, primary_engine, swap_kv_mapper
from ..core.frame_ids import FrameIdEpochs
from ..core.health import HealthLog, ReasoningHealth
from ..core.interpreter_hold import interpreter_held
from ..core.swap_profile import SwapProfile
from ..core.vision_prefetch import VisionPrefetch
from ..model.cuda_device import bound
from . import conversions as conv
from . import graph
from . import health_status
from . import swap_wire
from .engine_node import EngineNode
from .interfaces import ActionTokens, FrameMsg, StateChunk, Swap
from .node_main import run_node
from .params import NodeParameters

DIAGNOSTICS_PERIOD_S = 1.0
WARMUP_SEED = 7            # the synthetic warm-up frame (noise, so every kernel sees real-looking data)
# What configure may fail on without the node going down: unusable model, arena over the memory
# ceiling, no CUDA device for model.backend pycuda, a kernel that does not compile, ... and anything else: an error
# not caught here reaches rclpy's transition callback, which swallows it without a log line (an OverflowError from
# a setting of inf did), leaving an operator no reason at all.
CONFIGURE_ERRORS = (Exception,)
GIB = 1024 ** 3
# Applied while configured: the instruction at the next cycle boundary, the others from the next frame / cycle
# (each read once per frame or per cycle from one config object). Every other key is built into the engine.
LIVE_KEYS = ("prompt.instruction", "camera.max_pixels", "action.dim_names")


class Reasoning(EngineNode):
    def __init__(self):
        self.engine = None
        self.swap = None
        self._subs: list = []
        self._pubs: dict = {}
        self._swap_client = None
        self._swap_timer = None
        self._cycle_thread: threading.Thread | None = None
        self._swap_profile = SwapProfile.from_env()      # VLA_EDGE_PROFILE_SWAPS (core/swap_profile.py); None: off
        self._ipc_mapper = None
        self._cycle_clock = None                           # core/cycle_clock.py: cycle timing for the reconciler
        self._heap_trim = HeapTrim(0.0, 0.0)               # core/heap_trim.py; built from memory.* at activate
        self.prefetch = None                               # core/vision_prefetch.py while active (vision.encode_ahead)
        self.warmup: dict = {}
        self.capacity: dict = {}                     # the configure's capacity check (core/capacity_check.py)
        super().__init__("reasoning")
        self.params = NodeParameters(self, on_change=self._on_config_change, live_keys=LIVE_KEYS,
                                     fixed=lambda: self.engine is not None,
                                     until="deactivate and clean up the node, set it, then configure again")
        self._live_cfg = self.params.config          # what the cycle and frame callbacks read: one reference swap
        self.buffer = LatestFrameBuffer()
        self.frame_ids = FrameIdEpochs()             # camera ids -> state ids that survive a camera restart
        self.rejected_frames = 0
        self.skipped_boundaries = 0
        self.skipped_by_part = dict.fromkeys(OVERRUN_PARTS, 0)   # core/boundary_overrun.py: what overran them
        self._last_work: BoundaryWork | None = None  # when the parts of the latest boundary's work ended
        self._engine_lock = threading.Lock()         # cycle thread vs diagnostics reading the state
        self._pending_instruction: str | None = None
        self._instruction_lock = threading.Lock()
        self._stop = threading.Event()
        self.health = ReasoningHealth(self.params.config.health, start_s=time.monotonic(), active=False)
        self._health_log = HealthLog()                # what /diagnostics levels say (core/health.py)
        self._chunk_seq = 0                          # numbers state chunks so the reconciler sees a missed one
        self.failed = False                          # the cycle thread died: the process exits non-zero
        self.gc = gc_pauses.GcPauses().install()     # collector pauses, in the diagnostics
        self.diag_pub = self.create_publisher(DiagnosticArray, graph.DIAGNOSTICS_TOPIC, 10)
        self.create_timer(DIAGNOSTICS_PERIOD_S, self._publish_diagnostics)
        self.get_logger().info(f"unconfigured; {describe_choice(self.params.config.model.backend)}")

    # ------------------------------------------------------------ lifecycle

    def on_configure(self, state: LifecycleState) -> TransitionCallbackReturn:
        """SUCCESS -> inactive (engine built, warmed up); FAILURE (model or config unusable) stays unconfigured."""
        cfg = self.params.config
        t0 = time.perf_counter()
        steps = {}                          # seconds per configure step, in the log (a cold start says where it went)
        try:
            engine = primary_engine(cfg, steps_s=steps)
        except CONFIGURE_ERRORS as exc:
            self.get_logger().error(f"configure failed: {type(exc).__name__}: {exc}")
            return TransitionCallbackReturn.FAILURE
        step = "warm-up"
        try:
            frame = np.random.default_rng(WARMUP_SEED).integers(
                0, 256, (cfg.vision.image_height, cfg.vision.image_width, 3), dtype=np.uint8)
            t_warm = time.perf_counter()
            self.warmup = engine.warm_up(cfg.lifecycle.warmup_cycles, frame)
            steps[step] = time.perf_counter() - t_warm
            if cfg.lifecycle.capacity_check_cycles:
                step, t_check = "capacity check", time.perf_counter()
                self._check_capacity(engine, cfg, frame)
                steps[step] = time.perf_counter() - t_check
        except CONFIGURE_ERRORS as exc:
            engine.close()
            self.get_logger().error(f"configure failed in the {step}: {type(exc).__name__}: {exc}")
            return TransitionCallbackReturn.FAILURE
        self.engine = engine
        # A fresh state: chunk numbering starts at 1 again, which tells a running reconciler to clear its
        # mirror (core/swap_protocol.py), exactly as for a restarted reasoning process.
        self._chunk_seq = 0
        t_rest = time.perf_counter()
        self._open_interfaces(cfg)
        frozen = gc_pauses.freeze()         # the long-lived heap out of every later collection (core/gc_pauses.py)
        self.gc.reset(frozen)               # from here on, the pauses the cycles can meet
        steps["interfaces and gc freeze"] = time.perf_counter() - t_rest
        self.warmup["configure_steps_s"] = steps
        w = self.warmup
        self.get_logger().info(
            f"configured in {time.perf_counter() - t0:.1f} s ("
            + ", ".join(f"{name} {s:.1f} s" for name, s in steps.items()) +
            f"): {cfg.model.path} on {self._backend_name()}, "
            f"{engine.backend.memory_bytes() / GIB:.2f} GiB; warm-up {w['cycles']} cycles, first {w['first_ms']:.1f} ms, "
            f"steady {w['steady_ms']:.1f} ms of a {cfg.cycle.deadline_ms:g} ms deadline; {frozen} objects frozen out "
            f"of garbage collection")
        return TransitionCallbackReturn.SUCCESS

    def _check_capacity(self, engine, cfg, frame: np.ndarray) -> None:
        """Whether a cycle over a full state meets the deadline (core/capacity_check.py): said once, at INFO when
        it does and as a WARNING when admission will refuse cycles before the state is full."""
        fit = check_capacity(engine, cfg.lifecycle.capacity_check_cycles, frame)
        self.capacity = {} if fit is None else fit.as_dict()
        if fit is None:
            self.get_logger().info(f"capacity check skipped: {most_frames(engine.state)} frames (the most the state "
                                   f"can hold) cannot hold the timed cycles' frames")
        elif fit.fits:
            self.get_logger().info(f"capacity check: {fit.describe()}")
        else:
            self.get_logger().warning(f"capacity check: {fit.describe()}")
        slope = take_context_cost(engine, fit)
        if slope:
            self.get_logger().info(f"admission follows the context: {slope * 1e3:.3f} ms per 1000 tokens held "
                                   f"(admission.context_cost, from the capacity check)")

    def on_activate(self, state: LifecycleState) -> TransitionCallbackReturn:
        """SUCCESS -> active: cycles run, swaps are requested."""
        self._stop.clear()
        if self.params.config.vision.encode_ahead:
            self._start_prefetch()
        mem = self.params.config.memory
        self._heap_trim = HeapTrim(mem.heap_trim_interval_s, mem.heap_trim_min_slack_ms)
        if self._heap_trim.why_off:
            self.get_logger().info(f"free heap memory stays with the process: {self._heap_trim.why_off}")
        self._cycle_thread = threading.Thread(target=self._cycle_loop, name="vla-cycle", daemon=True)
        self._cycle_thread.start()
        self._swap_timer = self.create_timer(self.params.config.asr.swap_poll_ms / 1000.0, self._maybe_request_swap)
        if self.params.config.asr.schedule != "free":    # a reconciler on the slack schedule reads it
            self._cycle_clock = CycleClockWriter(clock_path(os.environ.get("ROS_DOMAIN_ID"), self.get_namespace()),
                                           self.params.config.cycle.period_s)
        cfg = self.params.config
        self.health.set_active(True, time.monotonic())      # "no action" is an ERROR only while active
        self.get_logger().info(f"active: cycle {cfg.cycle.deadline_ms} ms, deterministic={cfg.cycle.deterministic}")
        return super().on_activate(state)

    def on_deactivate(self, state: LifecycleState) -> TransitionCallbackReturn:
        """SUCCESS -> inactive: no more cycles once the one in flight has published its outcome."""
        done = super().on_deactivate(state)
        self.health.set_active(False, time.monotonic())
        return done

    def on_cleanup(self, state: LifecycleState) -> TransitionCallbackReturn:
        """SUCCESS -> unconfigured: the engine's memory is given back (device memory on a GPU, logged)."""
        done = super().on_cleanup(state)
        gc_pauses.unfreeze()
        return done

    # ---------------------------------------------------------------- executor

    def _on_frame(self, msg: FrameMsg) -> None:
        t0 = time.perf_counter()
        try:
            frame = conv.frame_from_msg(msg, self._live_cfg.camera.max_pixels)
        except ValueError as exc:          # camera_images.ImageRejected
            self.rejected_frames += 1
            self.get_logger().error(f"/vla/frame message rejected: {exc}", throttle_duration_sec=1.0)
            return
        restarts = self.frame_ids.restarts
        state_id = self.frame_ids.map(frame.frame_id)
        if self.frame_ids.restarts != restarts:
            self.get_logger().warning(f"camera frame ids went back to {frame.frame_id} (camera_ingest restarted?): "
                                      f"continuing the state's frame ids at {state_id}")
        frame = dataclasses.replace(frame, frame_id=state_id)
        self.buffer.publish(frame)
        if self.engine is not None:
            self.engine.phases.record("frame_decode", (time.perf_counter() - t0) * 1e3)
        prefetch = self.prefetch
        if prefetch is not None:
            prefetch.offer(frame)

    def _on_instruction(self, msg: String) -> None:
        text, limit = msg.data, instruction_char_limit(self._live_cfg.prompt)
        if len(text) > limit:             # its end is what survives as tokens: cut here, not on the cycle thread
            self.get_logger().warning(f"instruction of {len(text)} characters: its last {limit} kept (the prompt "
                                      f"keeps its last {self._live_cfg.prompt.max_suffix_tokens} tokens)",
                                      throttle_duration_sec=1.0)
            text = text[-limit:]
        with self._instruction_lock:
            self._pending_instruction = text

    def _on_config_change(self, cfg, keys) -> None:
        self._live_cfg = cfg
        if "prompt.instruction" in keys:
            with self._instruction_lock:
                self._pending_instruction = cfg.prompt.instruction

    def _maybe_request_swap(self) -> None:
        if not self.swap.want_request() or not self._swap_client.service_is_ready():
            return
        request_id = self.swap.request_sent()
        self._swap_client.call_async(Swap.Request()).add_done_callback(
            lambda future: self._on_swap_answer(future, request_id))

    def _on_swap_answer(self, future, request_id: int) -> None:
        self.health.on_swap_answer(time.monotonic())
        try:
            offer = self.swap.on_response(swap_wire.answer_from_response(future.result()), request_id)
        except swap.SwapProtocolError as exc:
            self.get_logger().warning(f"swap answer ignored: {exc}")
            self.swap.on_request_failed(request_id)
            return
        if offer is not None:
            swap.start_loader(self.swap, offer)

    def _publish_diagnostics(self) -> None:
        values = {"lifecycle_state": self._state_machine.current_state[1], "backend": self._backend_name(),
                  "frames_rejected": self.rejected_frames, **conv.flatten({"gc": self.gc.summary()})}
        detail = values["lifecycle_state"]
        if self.engine is not None:
            # The engine lock only guards the slot bookkeeping (cheap); metrics copy under their own
            # short lock and sort outside it, so diagnostics never hold up a cycle.
            with self._engine_lock:
                state = self.engine.state_summary()
            window = self.engine.metrics.window_summary()
            total = self.engine.metrics.summary()
            stats = self.buffer.stats()
            adm = self.engine.admission
            admission = {"prefill_ms_per_token": adm.ema_prefill_ms_per_token,
                         "decode_ms_per_token": adm.ema_decode_ms_per_token, "other_ms": adm.ema_other_ms,
                         "tail_factor": adm.tail_factor, "spikes_not_learned": adm.spikes}
            values.update(conv.flatten({"window": window, "total": total, "state": state, "swap": self.swap.summary(),
                                        "warmup": self.warmup, "capacity": self.capacity, "admission": admission,
                                        "phase": self.engine.phases.summary()}))
            prefetch = self.prefetch
            if prefetch is not None:
                values.update({f"vision_prefetch.{k}": v for k, v in prefetch.counts.items()})
            values.update({"frames_received": stats.published, "frames_consumed": stats.consumed,
                           "frames_overwritten": stats.overwritten, "skipped_boundaries": self.skipped_boundaries,
                           **{f"skipped_in.{part}": n for part, n in self.skipped_by_part.items()},
                           "instruction": self.engine.instruction})
            detail += f": miss rate {window['deadline_miss_rate']:.3f}, fallback rate {window['fallback_rate']:.3f}"
            self.health.on_swap_timeouts(self.swap.timeouts, time.monotonic())
        health = self.health.assess(time.monotonic())
        health_status.log_change(self.get_logger(), self._health_log, health)
        self.diag_pub.publish(health_status.diagnostics_array(self, health, values, detail))

    # ------------------------------------------------------------ cycle thread

    def _cycle_loop(self) -> None:
        sys.setswitchinterval(self.engine.cfg.cycle.gil_switch_interval_ms / 1000.0)   # process-wide
        priority = self.engine.cfg.cycle.realtime_priority
        if priority:
            why_not = make_thread_realtime(priority)
            if why_not is None:
                self.get_logger().info(f"cycle thread: SCHED_FIFO priority {priority}")
            else:
                self.get_logger().warning(f"cycle thread on ordinary scheduling (cycle.realtime_priority {priority} "
                                          f"not applied: {why_not})")
        try:
            with bound(self.engine.backend.device):      # this thread's CUDA context, for its whole life
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
            if boundary.skipped and not self._answer_skipped(boundary, cfg.cycle.period_s):
                return
            hybrid_sleep_until(boundary.perf_s, stop=self._stop)
            if self._stop.is_set():
                return
            frame = self.buffer.consume_latest()
            now_s = self.get_clock().now().nanoseconds * 1e-9
            with self._engine_lock:
                result = self.engine.run_cycle(frame, now_s, cycle_start_perf=boundary.perf_s)
            t_publish = time.perf_counter()
            self.swap.after_cycle(result)               # what a swap left to this cycle (asr.swap_finish)
            if not self._answer(result, frame):
                return
            t_between = time.perf_counter()
            self._between_cycles(result.cycle_id, boundary.perf_s + cfg.cycle.period_s)
            t_end = time.perf_counter()
            phases = self.engine.phases
            phases.record("publish", (t_between - t_publish) * 1e3)
            phases.record("between", (t_end - t_between) * 1e3)
            trim_ms = self._heap_trim.maybe_trim((boundary.perf_s + cfg.cycle.period_s - t_end) * 1e3)
            if trim_ms is not None:                      # counted as the boundary's work if it ever overran
                phases.record("heap_trim", trim_ms)
                t_end = time.perf_counter()
            self._last_work = BoundaryWork(t_publish, t_between, t_end)
            if self._cycle_clock is not None:            # the reconciler may use the GPU until the next boundary
                self._cycle_clock.cycle_ended(int((boundary.perf_s + cfg.cycle.period_s) * 1e9))

    def _publish_result(self, result, frame) -> None:
        pubs = self._pubs
        camera_frame = self.engine.cfg.camera.frame_id          # fixed while configured
        if result.is_action:
            pubs["tokens"].publish(conv.action_tokens_msg(result, camera_frame))
            pubs["action"].publish(conv.action_msg(result, self._live_cfg.action.dim_names))
        else:
            pubs["fallback"].publish(conv.fallback_msg(result, f"vla_edge: {self.get_name()}"))
        if result.new_frame and frame is not None:
            self._chunk_seq += 1
            pubs["chunk"].publish(conv.state_chunk_msg(frame, self.engine.state.state_version, self._chunk_seq,
                                                       camera_frame))

    def _answer_skipped(self, boundary, period_s: float) -> bool:
        """One deadline_missed fallback per boundary the last cycle (and the work at its boundary) overran, before
        the next cycle runs; False when the node is shutting down."""
        now = time.perf_counter()
        for k in range(boundary.skipped, 0, -1):
            missed_at = boundary.perf_s - k * period_s
            part = overran_in(self._last_work, missed_at)
            self.skipped_by_part[part] += 1
            with self._engine_lock:
                result = self.engine.skipped_boundary((now - missed_at) * 1e3, part)
            if not self._answer(result, None):
                return False
        return True

    def _answer(self, result, frame) -> bool:
        """Count a cycle's outcome in the health rules and publish it; False when the node is shutting down
        (the publishers went away under us)."""
        self.health.on_cycle(result.is_action, result.reason == DEADLINE_MISSED, time.monotonic())
        try:
            self._publish_result(result, frame)
        except (_rclpy.RCLError, _rclpy.InvalidHandle):
            if self._stop.is_set() or not self.context.ok():
                return False
            raise
        return True

    def _between_cycles(self, cycle_id: int, next_boundary_perf: float) -> None:
        """At the boundary after cycle `cycle_id`: new instruction, reconciled state. A swap whose recompute
        of late frames would not end before the next boundary waits for a fresher offer."""
        with self._instruction_lock:
            text, self._pending_instruction = self._pending_instruction, None
        with self._engine_lock:
            if text is not None:
                self.engine.set_instruction(text)
            budget = self.engine.swap_recompute_budget_frames((next_boundary_perf - time.perf_counter()) * 1e3)
            if budget == NO_SWAP_ROOM:          # a loaded offer waits for the next boundary
                self.swap.wait_for_room()
                return
            apply = self.swap.apply_ready if self._swap_profile is None else partial(self._swap_profile.call,
                                                                                       self.swap.apply_ready)
            with interpreter_held(self.engine.cfg.cycle.boundary_switch_interval_ms):
                outcome = apply(self.engine.state, cycle_id, max_recompute=budget,
                                next_cycle_room=self.engine.next_cycle_late_room())
        if outcome is not None:
            self._log_swap(outcome, cycle_id)

    def _log_swap(self, outcome, cycle_id: int) -> None:
        log = self.get_logger()
        if outcome.status == swap.REJECTED:
            log.error(f"reconciled state v{outcome.version} rejected: {outcome.detail}")
            return
        if outcome.status == swap.DEFERRED:
            log.debug(f"reconciled state v{outcome.version} deferred after cycle {cycle_id} ({outcome.detail}): "
                      f"waiting for a fresher one")
            return
        r = outcome.report
        log.debug(f"state v{outcome.version} applied after cycle {cycle_id} in {outcome.apply_ms:.2f} ms (KV copy "
                  f"{r.kv_copy_ms:.2f} ms{', checked by the next cycle' if r.copy_pending else ''}, recompute "
                  f"{r.recompute_ms:.2f} ms): {r.frames} reconciled frames, {len(r.late)} late and {len(r.unseen)} "
                  f"unseen by the reconciler recomputed ({r.in_next_cycle} of them left to the next cycle), "
                  f"{outcome.dropped} dropped")
        # Routine: each swap at DEBUG above, a running total at INFO at most every health.log_summary_s. The counts
        # only: on the cycle thread, between a swap and the next boundary (summary() sorts every timing too).
        total = self.swap.counts()
        log.info(f"{total['swaps']} reconciled states applied so far (latest v{outcome.version} after cycle "
                 f"{cycle_id}, applied in {outcome.apply_ms:.2f} ms); frames recomputed: {total['swap_late_frames']} "
                 f"late, {total['swap_unseen_frames']} unseen; dropped {total['swap_dropped_frames']}; "
                 f"{total['swap_deferred']} offers deferred ({total['swap_deferred_stale']} stale, "
                 f"{total['swap_deferred_no_slack']} without slack for their late frames)",
                 throttle_duration_sec=self.params.config.health.log_summary_s)

    # ------------------------------------------------------------- resources

    def _open_interfaces(self, cfg) -> None:
        """Topics, the swap client and its protocol state, for a configured engine."""
        self._ipc_mapper = swap_kv_mapper(self.engine.backend)
        # A request unanswered for as long as the reconciler counts as lost is abandoned.
        self.swap = swap.SwapClient(cfg.asr.swap_poll_ms / 1000.0, cfg.health.reconciler_silence_s,
                                    open_device_kv=self._ipc_mapper.open if self._ipc_mapper is not None else None,
                                    precheck=self.engine.state.prepare_swap)
        latched = QoSProfile(depth=1, durability=DurabilityPolicy.TRANSIENT_LOCAL)
        self._subs = [self.create_subscription(FrameMsg, graph.FRAME_TOPIC, self._on_frame, QoSProfile(depth=1)),
                      self.create_subscription(String, graph.INSTRUCTION_TOPIC, self._on_instruction, latched)]
        self._pubs = {"action": self.create_publisher(JointState, graph.ACTION_TOPIC, QoSProfile(depth=1)),
                      "tokens": self.create_publisher(ActionTokens, graph.ACTION_TOKENS_TOPIC, QoSProfile(depth=1)),
                      "fallback": self.create_publisher(DiagnosticStatus, graph.FALLBACK_TOPIC, QoSProfile(depth=10)),
                      "chunk": self.create_publisher(StateChunk, graph.STATE_CHUNK_TOPIC, QoSProfile(depth=64))}
        self._swap_client = self.create_client(Swap, graph.SWAP_SERVICE)

    def _start_prefetch(self) -> None:
        """vision.encode_ahead: a worker encodes each newest frame with the engine's encoder as it arrives; the cycle
        takes the encoding of its frame (core/vision_prefetch.py)."""
        engine, log = self.engine, self.get_logger()

        def failed(exc: Exception) -> None:
            log.error(f"vision prefetch: encode failed ({type(exc).__name__}: {exc}); the cycle encodes inline",
                      throttle_duration_sec=5.0)
        self.prefetch = VisionPrefetch(engine.state.encoder.encode,
                                       on_encoded=lambda ms: engine.phases.record("vision_ahead", ms), on_error=failed)
        engine.state.prefetch = self.prefetch
        log.info("vision.encode_ahead: frames encoded on arrival by a worker thread")

    def _stop_prefetch(self) -> None:
        """The worker joined and the cycle back to inline encodes; its counts in the log."""
        if self.prefetch is None:
            return
        self.prefetch.stop()
        if self.prefetch.running:          # an encode that hangs (a stuck device): said before the engine is freed
            self.get_logger().error("the vision prefetch worker did not stop within 2 s (an encode still running)")
        if self.engine is not None:
            self.engine.state.prefetch = None
        c = self.prefetch.counts
        self.get_logger().info(f"vision prefetch stopped: {c['hits']} cycles found their frame encoded ({c['waited']} "
                               f"waited for it), {c['misses']} encoded inline; {c['encoded']} frames encoded ahead, "
                               f"{c['skipped']} skipped, {c['errors']} failed")
        self.prefetch = None

    def _stop_work(self) -> None:
        """The cycle thread joined, the vision prefetch stopped, the cycle clock closed, the swap timer gone."""
        self._stop.set()
        if self._cycle_thread is not None:
            self._cycle_thread.join(timeout=5.0)
            if self._cycle_thread.is_alive():
                self.get_logger().error("the cycle thread did not stop within 5 s")
            self._cycle_thread = None
        if self._swap_profile is not None and (written := self._swap_profile.write()) is not None:
            self.get_logger().info(f"profile of {self._swap_profile.calls} swaps written to {written}")
        self._stop_prefetch()
        if self._cycle_clock is not None:
            self._cycle_clock.close()
            self._cycle_clock = None
        if self._swap_timer is not None:
            self.destroy_timer(self._swap_timer)
            self._swap_timer = None

    def _free(self) -> None:
        for sub in self._subs:
            self.destroy_subscription(sub)
        for pub in self._pubs.values():
            self.destroy_publisher(pub)
        if self._swap_client is not None:
            self.destroy_client(self._swap_client)
        self._subs, self._pubs, self._swap_client = [], {}, None
        if self._ipc_mapper is not None:
            self._ipc_mapper.close()
            self._ipc_mapper = None
        if self.engine is not None:
            device = self.engine.backend.device
            before = device.mem_info()[0] if device is not None else None
            freed = self.engine.close()
            self.engine = None
            if device is not None:
                after = device.mem_info()[0]
                self.get_logger().info(f"engine freed: {freed / GIB:.2f} GiB of device memory released; device free "
                                       f"{before / GIB:.2f} -> {after / GIB:.2f} GiB")

    def _backend_name(self) -> str:
        return "-" if self.engine is None else type(self.engine.backend).__name__


def main(args=None) -> int:
    return run_node("reasoning", Reasoning, (ConfigError,), args)


if __name__ == "__main__":
    sys.exit(main())
