"""The process entry every node's `main` uses: init, build, spin, shut down cleanly.

Exit codes: 0 after Ctrl-C / SIGTERM / an external shutdown, 2 when the node
cannot start (invalid configuration, unusable model; the reason is logged),
1 when the node shut itself down after a failure (`node.failed`).
A callback that hits the context while it is being shut down (a timer
publishing as SIGINT arrives) is part of a normal shutdown, not a failure.

Nodes spin with `spin_resilient`: one failing callback or message take is
logged and counted, and the node goes on serving. Two failures seen here
motivate it: rclpy 7.1.6's LifecycleNode raises RCLError inside the
ChangeState service for a transition the current state lacks (instead of
answering success=False), and a subscription take racing the context shutdown
raises a pybind11 RuntimeError.
"""
from __future__ import annotations

import logging

import rclpy
from rclpy.executors import ExternalShutdownException
from rclpy.executors import SingleThreadedExecutor
from rclpy.impl.implementation_singleton import rclpy_implementation as _rclpy
from rclpy.logging import get_logger

LOG_FORMAT = "[%(levelname)s] [%(name)s]: %(message)s"


def spin_resilient(node) -> None:
    """rclpy.spin that survives a failing callback (logged, throttled, counted in `node.callback_errors`)."""
    executor = SingleThreadedExecutor()
    executor.add_node(node)
    node.callback_errors = 0
    try:
        while rclpy.ok():
            try:
                executor.spin_once(timeout_sec=0.5)
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


def run_node(name: str, build, start_errors: tuple, args=None, spin=spin_resilient) -> int:
    """Build the node with `build()` and spin it; `start_errors` are the exceptions meaning 'cannot start'."""
    # core/ and model/ log through Python logging; show their INFO lines beside the node's own.
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    rclpy.init(args=args)
    node = None
    try:
        node = build()
        spin(node)
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
