"""The process entry every node's `main` uses: init, build, spin, shut down cleanly.

Exit codes: 0 after Ctrl-C / SIGTERM / an external shutdown, 2 when the node
cannot start (invalid configuration, unusable model; the reason is logged),
1 when the node shut itself down after a failure (`node.failed`).
A callback that hits the context while it is being shut down (a timer
publishing as SIGINT arrives) is part of a normal shutdown, not a failure.
"""
from __future__ import annotations

import logging

import rclpy
from rclpy.executors import ExternalShutdownException
from rclpy.impl.implementation_singleton import rclpy_implementation as _rclpy
from rclpy.logging import get_logger

LOG_FORMAT = "[%(levelname)s] [%(name)s]: %(message)s"


def run_node(name: str, build, start_errors: tuple, args=None, spin=rclpy.spin) -> int:
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
