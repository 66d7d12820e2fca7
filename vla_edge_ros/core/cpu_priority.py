"""CPU priorities: the reconciler's whole process lowered, the reasoning node's cycle thread made real-time.

Lowering a whole process's CPU priority: every thread it has now, and (by inheritance) every thread it starts.

On Linux a nice value belongs to a thread, not to the process: `os.nice()` in
one thread leaves the others (rclpy's executor, the DDS threads, a worker
started earlier) where they were. So each task listed in /proc/self/task is
reniced; threads started afterwards inherit the value of the thread that
starts them. Used by the reconciler (asr.niceness): on a 2-core robot computer
it shares the cores with the primary's cycle, which must win them.

Autogroups. With kernel.sched_autogroup_enabled (the default on desktop and
Debian kernels), the scheduler first shares the CPU fairly between *sessions*
and applies thread nice values only within one. bringup starts every node in
a session of its own, so a reniced reconciler would still get as much CPU as
the reasoning node. The session's own nice value (/proc/self/autogroup) is
therefore set too.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)
TASKS = Path("/proc/self/task")
AUTOGROUP = Path("/proc/self/autogroup")
AUTOGROUP_ENABLED = Path("/proc/sys/kernel/sched_autogroup_enabled")


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
    changed = _lower_autogroup(niceness)
    for task in TASKS.iterdir():
        tid = int(task.name)
        try:
            if os.getpriority(os.PRIO_PROCESS, tid) < niceness:
                os.setpriority(os.PRIO_PROCESS, tid, niceness)
                changed += 1
        except ProcessLookupError:          # the thread ended while we walked the list
            continue
    return changed


def autogroup_nice() -> int | None:
    """This session's autogroup nice value; None where autogroups are off or the file reads otherwise than
    "/autogroup-123 nice 0" (seen in containers, where it can be empty)."""
    try:
        if AUTOGROUP_ENABLED.read_text().strip() != "1":
            return None
        return int(AUTOGROUP.read_text().split("nice")[1])
    except (OSError, IndexError, ValueError):
        return None


def _lower_autogroup(niceness: int) -> int:
    """This session's autogroup nice value raised to `niceness` where autogroups are on; 1 if changed."""
    current = autogroup_nice()
    if current is None or current >= niceness:
        return 0
    try:
        AUTOGROUP.write_text(str(niceness))
    except OSError as exc:
        log.warning("could not set the autogroup nice value to %d (%s): the CPU share between this process and "
                    "the others stays as it was", niceness, exc)
        return 0
    return 1


def describe_priority() -> str:
    """'nice 10, autogroup nice 10' of this thread and session (for the logs)."""
    text = f"nice {os.getpriority(os.PRIO_PROCESS, 0)}"
    group = autogroup_nice()
    return text if group is None else f"{text}, autogroup nice {group}"


def make_thread_realtime(priority: int) -> str | None:
    """SCHED_FIFO at `priority` for the calling thread (Linux: the policy is per thread). None when done, else
    why not (no permission, no such policy): the caller logs it and runs with ordinary scheduling.

    A robot's control loop is commonly run this way (ros2_control's controller manager does the same where it
    may): a cycle woken at its boundary then preempts every ordinarily scheduled task at once, instead of
    waiting behind the camera driver, DDS or the reconciler for a share of a busy core. The kernel keeps 5%
    of each second for the rest (kernel.sched_rt_runtime_us), so a runaway cycle cannot lock a core."""
    if not 1 <= priority <= 99:
        raise ValueError(f"real-time priority must be in 1..99, got {priority}")
    if not hasattr(os, "sched_setscheduler"):
        return "this platform has no sched_setscheduler"
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(priority))
    except PermissionError:
        return ("no permission for SCHED_FIFO (run as root, grant CAP_SYS_NICE, or set an rtprio limit in "
                "/etc/security/limits.conf)")
    except OSError as exc:
        return f"sched_setscheduler refused: {exc}"
    return None
