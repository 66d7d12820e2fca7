"""What bringup and its supervisor share about node processes: their error, and how one is stopped."""
from __future__ import annotations

import logging
import signal
import subprocess

from ..config import SupervisorConfig

log = logging.getLogger(__name__)

STOP_TIMEOUT_S = SupervisorConfig().stop_timeout_s   # per escalation step: SIGINT, then SIGTERM, then SIGKILL


class BringupError(RuntimeError):
    """A node process died or a lifecycle transition did not succeed."""


def stop_process(proc, timeout_s: float = STOP_TIMEOUT_S) -> int:
    """SIGINT, then SIGTERM, then SIGKILL, each given `timeout_s`; returns the exit code."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
        if proc.poll() is not None:
            break
        proc.send_signal(sig)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            log.warning("pid %d did not exit on %s", proc.pid, signal.Signals(sig).name)
    return proc.wait()
