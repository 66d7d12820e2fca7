"""Lower a whole process's CPU priority: every thread it has now, and (by inheritance) every thread it starts.

On Linux a nice value belongs to a thread, not to the process: `os.nice()` in
one thread leaves the others (rclpy's executor, the DDS threads, a worker
started earlier) where they were. So each task listed in /proc/self/task is
reniced; threads started afterwards inherit the value of the thread that
starts them. Used by the reconciler (asr.niceness): on a 2-core robot computer
it shares the cores with the primary's cycle, which must win them.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)
TASKS = Path("/proc/self/task")


def lower_process_priority(niceness: int) -> int:
    """Set every thread of this process to `niceness` where that lowers its priority (never raises one);
    returns the number of threads changed. Where /proc is absent (not Linux) only the calling thread."""
    if not 0 <= niceness <= 19:
        raise ValueError(f"niceness must be in 0..19, got {niceness}")
    if not TASKS.is_dir():
        current = os.getpriority(os.PRIO_PROCESS, 0)
        if niceness > current:
            os.nice(niceness - current)
            return 1
        return 0
    changed = 0
    for task in TASKS.iterdir():
        tid = int(task.name)
        try:
            if os.getpriority(os.PRIO_PROCESS, tid) < niceness:
                os.setpriority(os.PRIO_PROCESS, tid, niceness)
                changed += 1
        except ProcessLookupError:          # the thread ended while we walked the list
            continue
    return changed
