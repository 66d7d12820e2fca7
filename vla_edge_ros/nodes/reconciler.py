"""reconciler: a lifecycle node that mirrors the reasoning state and offers reconciled swaps.

    unconfigured --configure--> inactive: loads the model into an engine of its own (backend
                                asr.backend: numpy by default; pycuda in this process's CUDA
                                context, its snapshots' KV then offered by CUDA IPC), a
                                StateReconciler (core/reconciliation.py) and its snapshot directory
    inactive --activate--> active:        subscribes /vla/state_chunk, starts the worker
                                          thread, serves /vla/reconciler/swap, 1 Hz /diagnostics
    active --deactivate--> inactive:      unsubscribes, stops the worker and the service
    inactive --cleanup--> unconfigured:   frees the engine and deletes the snapshot files
What to reconcile and when is core/reconciliation.py; how offers travel between the
two processes is core/swap_protocol.py; this node only carries the messages.
"""
from __future__ import annotations

import os
import sys

from diagnostic_msgs.msg import DiagnosticArray
from rclpy.lifecycle import LifecycleState
from rclpy.lifecycle import TransitionCallbackReturn
from rclpy.qos import QoSProfile

from ..config import ConfigError
from ..core.cpu_priority import describe_priority, lower_process_priority
from ..core.cycle_clock import CycleClockReader, clock_path
from ..core.engine_factory import describe_choice, reconciler_state
from ..core.health import reconciler_health
from ..core.reconciliation import StateReconciler
from ..core.swap_protocol import ReconcilerWorker, SnapshotStore
from . import conversions as conv
from . import graph
from . import health_status
from . import swap_wire
from .engine_node import EngineNode
from .interfaces import StateChunk, Swap
from .node_main import run_node
from .params import NodeParameters

DIAGNOSTICS_PERIOD_S = 1.0


class Reconciler(EngineNode):
    def __init__(self):
        self.worker: ReconcilerWorker | None = None
        self._chunk_sub = None
        self._swap_srv = None
        self._diag_timer = None
        self.rejected_chunks = 0
        super().__init__("reconciler")
        self.params = NodeParameters(self, fixed=lambda: self.worker is not None,
                                     until="deactivate and clean up the node, set it, then configure again")
        self.diag_pub = self.create_publisher(DiagnosticArray, graph.DIAGNOSTICS_TOPIC, 10)

    def on_configure(self, state: LifecycleState) -> TransitionCallbackReturn:
        """SUCCESS -> inactive; FAILURE (model or config unusable) stays unconfigured."""
        cfg = self.params.config
        state = None
        try:
            state = reconciler_state(cfg)
            reconciler = StateReconciler(cfg, state)
            clock = None
            on_gpu = state.backend.device is not None
            if cfg.asr.schedule == "slack" or (cfg.asr.schedule == "auto" and on_gpu):
                # Work only in the reasoning node's slack: on one GPU the two would meet inside a cycle.
                clock = CycleClockReader(clock_path(os.environ.get("ROS_DOMAIN_ID"), self.get_namespace()))
            self.worker = ReconcilerWorker(reconciler, SnapshotStore(), clock=clock)
        except Exception as exc:        # any: rclpy's transition callback would swallow it without a log line
            # Unusable model, arena over the memory ceiling, no CUDA device for asr.backend pycuda, ...
            if state is not None:
                if state.kv_export is not None:     # its buffers and generation board (directory) too
                    state.kv_export.close()
                state.backend.close()
            self.get_logger().error(f"configure failed: {type(exc).__name__}: {exc}")
            return TransitionCallbackReturn.FAILURE
        if cfg.asr.niceness:
            lower_process_priority(cfg.asr.niceness)    # the primary's cycle gets the cores first
        kv_path = "CUDA IPC (KV stays on the GPU)" if state.kv_export is not None else "the snapshot file"
        if getattr(state.kv_export, "board", None) is not None:
            kv_path += f", generation words also at {state.kv_export.board.path}"
        kv_path += f"; schedule {'slack' if self.worker.clock is not None else 'free'} (asr.schedule {cfg.asr.schedule})"
        where = f" on {state.backend.device.describe()}" if state.backend.device is not None else ""
        self.get_logger().info(f"configured: {cfg.model.path} on {type(state.backend).__name__}{where} "
                               f"({describe_choice(cfg.asr.backend)}), snapshots in {self.worker.store.directory}, "
                               f"KV by {kv_path}; CPU {describe_priority()}")
        return TransitionCallbackReturn.SUCCESS

    def on_activate(self, state: LifecycleState) -> TransitionCallbackReturn:
        """SUCCESS -> active: mirroring and serving the swap."""
        self.worker.start()
        self._chunk_sub = self.create_subscription(StateChunk, graph.STATE_CHUNK_TOPIC, self._on_chunk,
                                                   QoSProfile(depth=64))
        self._swap_srv = self.create_service(Swap, graph.SWAP_SERVICE, self._on_swap)
        self._diag_timer = self.create_timer(DIAGNOSTICS_PERIOD_S, self._publish_diagnostics)
        return super().on_activate(state)

    # ------------------------------------------------------------- callbacks

    def _on_chunk(self, msg: StateChunk) -> None:
        try:
            frame, primary_version, seq = conv.parse_state_chunk(msg, self.params.config.camera.max_pixels)
        except ValueError as exc:          # camera_images.ImageRejected, or sequence number 0
            self.rejected_chunks += 1
            self.get_logger().error(f"state chunk rejected: {exc}", throttle_duration_sec=1.0)
            return
        self.worker.on_chunk(frame, primary_version, seq)

    def _on_swap(self, request: Swap.Request, response: Swap.Response) -> Swap.Response:
        return swap_wire.fill_response(self.worker.answer(), response)

    def _publish_diagnostics(self) -> None:
        values = conv.flatten(self.worker.summary())
        values["rejected_chunks"] = self.rejected_chunks
        health = reconciler_health(values["worker_error"])
        self.diag_pub.publish(health_status.diagnostics_array(self, health, values, "active"))

    # ------------------------------------------------------------- resources

    def _stop_work(self) -> None:
        """Deactivated: no more chunks, no swap service; the mirrored state is kept."""
        if self.worker is not None:
            self.worker.stop()
        for handle, destroy in ((self._chunk_sub, self.destroy_subscription), (self._swap_srv, self.destroy_service),
                                (self._diag_timer, self.destroy_timer)):
            if handle is not None:
                destroy(handle)
        self._chunk_sub = self._swap_srv = self._diag_timer = None

    def _free(self) -> None:
        """The worker stopped, the snapshot files deleted, the engine freed (destroy_node then releases the
        ROS handles)."""
        if self.worker is not None:
            self.worker.stop()
            self.worker.store.close()
            if self.worker.clock is not None:
                self.worker.clock.close()
            state = self.worker.reconciler.state
            if state.kv_export is not None:
                state.kv_export.close()
            freed = state.backend.close()
            self.worker = None
            if freed:
                self.get_logger().info(f"engine freed: {freed / 2**30:.2f} GiB of device memory released")


def main(args=None) -> int:
    return run_node("reconciler", Reconciler, (ConfigError,), args)


if __name__ == "__main__":
    sys.exit(main())
