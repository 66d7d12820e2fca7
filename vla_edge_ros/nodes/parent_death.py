"""A node process never outlives the process that started it.

`vla-edge bringup` / `demo` (tools/supervisor.py) stop their nodes on SIGINT,
SIGTERM and SIGHUP. A supervisor killed with SIGKILL cannot, so each node asks
the kernel to send it SIGTERM when its parent dies (Linux prctl
PR_SET_PDEATHSIG); SIGTERM is then the ordinary clean stop of node_main.py.
Two gaps are closed here:
  - the parent may die between fork and the prctl call (the node was still
    importing rclpy): the supervisor passes its pid in VLA_EDGE_PARENT_PID, and
    a node whose parent is already someone else stops at once;
  - where prctl is missing (not Linux), a daemon thread polls the parent pid.
The kernel's death signal follows the parent *thread* that forked the child,
which is why the supervisor starts every node from its main thread.
"""
from __future__ import annotations

import ctypes
import os
import signal
import threading
import time

PARENT_PID_ENV = "VLA_EDGE_PARENT_PID"
PR_SET_PDEATHSIG = 1          # <linux/prctl.h>
WATCH_PERIOD_S = 0.5          # fallback parent watch (no prctl)


def exit_with_parent(sig: int = signal.SIGTERM) -> str:
    """Arrange for `sig` to reach this process when its parent dies; returns 'prctl' or 'watch'."""
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
        how = "prctl"
    except (OSError, AttributeError):
        threading.Thread(target=_watch, args=(parent, sig), name="parent-watch", daemon=True).start()
        how = "watch"
    expected = os.environ.get(PARENT_PID_ENV, "")
    if expected.isdigit() and os.getppid() != int(expected):
        os.kill(os.getpid(), sig)             # the supervisor died before the prctl call
    return how


def _watch(parent: int, sig: int) -> None:
    while os.getppid() == parent:
        time.sleep(WATCH_PERIOD_S)
    os.kill(os.getpid(), sig)
