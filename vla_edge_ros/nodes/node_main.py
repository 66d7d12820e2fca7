"""The process entry every node's `main` uses: init, build, spin, shut down cleanly.

Exit codes: 0 after Ctrl-C / SIGINT / SIGTERM / an external shutdown, 2 when
the node cannot start (invalid configuration, an unreadable parameter file,
unusable model; the reason is logged in one line), 1 when the node shut itself down after a failure (`node.failed`).
A callback that hits the context while it is being shut down is part of a
normal shutdown, not a failure.

Stopping is sequential, on the main thread. rclpy's own signal handler shuts
the context down from its signal thread while the executor, a node's worker
thread (the frame publisher, the cycle loop) and its timers may still be
inside rcl calls on that context; a CI run caught camera_ingest aborting
with heap corruption ("malloc(): unaligned tcache chunk detected") during
exactly that shutdown. So rclpy is initialised without signal handlers and
SIGINT/SIGTERM only raise a flag: the spin loop sees it within
SPIN_PERIOD_S, then the node's worker threads are joined (`node.close()`),
the node is destroyed, and only then is the context shut down. A second
signal while that runs interrupts it (KeyboardInterrupt) for a stuck close.
faulthandler is on, so a native crash still prints every thread's Python
stack into the node's log. A node stops (SIGTERM) when the process that
started it dies, even by SIGKILL (parent_death.py).

Nodes spin with `spin_resilient`: one failing callback or message take is
logged and counted, and the node goes on serving. Two failures seen here
motivate it: rclpy 7.1.6's LifecycleNode raises RCLError inside the
ChangeState service for a transition the current state lacks (instead of
answering success=False; the engine nodes now answer those themselves,
engine_node.py), and a subscription take racing the context shutdown
raises a pybind11 RuntimeError. A lifecycle node finalized by its shutdown
transition ends the spin, and the process exits 0.
"""
from __future__ import annotations

import faulthandler
import logging
import signal
import threading

import rclpy
from rclpy.executors import ExternalShutdownException
from rclpy.executors import SingleThreadedExecutor
from rclpy.impl.implementation_singleton import rclpy_implementation as _rclpy
from rclpy.logging import get_logger
from rclpy.signals import SignalHandlerOptions

from ..core.malloc_threshold import pin_mmap_threshold
from .parent_death import exit_with_parent

LOG_FORMAT = "[%(levelname)s] [%(name)s]: %(message)s"
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
SPIN_PERIOD_S = 0.1        # longest wait in the executor, so the longest delay before a stop signal is seen


class StopRequest:
    """SIGINT / SIGTERM turned into a flag the spin loop polls (see the module docstring)."""

    def __init__(self):
        self._event = threading.Event()
        self.signal_name: str | None = None

    def install(self) -> None:
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum, _frame) -> None:
        if self._event.is_set():
            raise KeyboardInterrupt          # asked twice: stop waiting for a clean shutdown
        self.signal_name = signal.Signals(signum).name
        self._event.set()

    def __bool__(self) -> bool:
        return self._event.is_set()


def make_executor(node):
    """The executor cycle.executor names (config.py says why events is the default); a node without our
    parameters gets rclpy's SingleThreadedExecutor. Both raise a failing callback's exception out of
    spin_once, which is what spin_resilient counts on."""
    params = getattr(node, "params", None)
    kind = params.config.cycle.executor if params is not None else "single_threaded"
    if kind == "events":
        from rclpy.experimental import EventsExecutor
        return EventsExecutor(context=node.context)
    return SingleThreadedExecutor(context=node.context)


def spin_resilient(node, stop: StopRequest | None = None) -> None:
    """rclpy.spin that survives a failing callback (logged, throttled, counted in `node.callback_errors`)
    and returns when `stop` is raised, the context is shut down, or a lifecycle node was finalized."""
    executor = make_executor(node)
    executor.add_node(node)
    node.callback_errors = 0
    try:
        while rclpy.ok() and not stop and not getattr(node, "finalized", False):
            try:
                executor.spin_once(timeout_sec=SPIN_PERIOD_S)
            except (KeyboardInterrupt, ExternalShutdownException):
                raise
            except Exception as exc:  # noqa: BLE001 - a robot node must outlive one bad callback
                if not rclpy.ok():
                    break                       # the take raced the shutdown: nothing to report
                node.callback_errors += 1
                node.get_logger().error(f"callback failed ({node.callback_errors} so far): "
                                        f"{type(exc).__name__}: {exc}", throttle_duration_sec=1.0)
    finally:
        executor.shutdown()


def _pin_mmap_threshold(node, name: str) -> None:
    """memory.malloc_mmap_threshold_mib for this process (core/malloc_threshold.py says why)."""
    params = getattr(node, "params", None)
    if params is None:
        return
    why_not = pin_mmap_threshold(params.config.memory.malloc_mmap_threshold_mib)
    if why_not is not None:
        get_logger(name).warning(f"memory.malloc_mmap_threshold_mib not applied: {why_not}")


def run_node(name: str, build, start_errors: tuple, args=None, spin=spin_resilient) -> int:
    """Build the node with `build()` and spin it; `start_errors` are the exceptions meaning 'cannot start'."""
    # core/ and model/ log through Python logging; show their INFO lines beside the node's own.
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    faulthandler.enable()
    stop = StopRequest()
    stop.install()
    exit_with_parent()
    try:
        rclpy.init(args=args, signal_handler_options=SignalHandlerOptions.NO)
    except _rclpy.RCLError as exc:      # e.g. a parameter file that is not valid YAML
        get_logger(name).fatal(f"cannot start: invalid ROS arguments: {exc}")
        return 2
    node = None
    try:
        node = build()
        _pin_mmap_threshold(node, name)
        spin(node, stop)
        if stop:
            get_logger(name).info(f"{stop.signal_name}: shutting down")
    except start_errors as exc:
        get_logger(name).fatal(f"cannot start: {exc}")
        return 2
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    except (_rclpy.RCLError, _rclpy.InvalidHandle):
        if rclpy.ok():
            raise                       # a real failure, not a callback racing the shutdown
    finally:
        if node is not None:
            node.close()
            node.destroy_node()
        rclpy.try_shutdown()
    return 1 if getattr(node, "failed", False) else 0
