"""What the kernel's scheduler says about a thread's waits and about the machine (Linux; None elsewhere).

Two questions a late cycle raises that the thread's own clocks (wall time, CPU time) cannot answer:

- Was the cycle thread runnable but waiting for a core? /proc/thread-self/schedstat's second field is
  the thread's run_delay: nanoseconds spent on a run queue, runnable, while other tasks ran. The rest
  of a cycle's time off the CPU is time blocked (the GIL held by another thread, a page fault, I/O) or
  stolen by the hypervisor, which the guest kernel charges to nobody.
- Did the hypervisor take the machine's CPUs away? /proc/stat's `steal` column: time the virtual CPUs
  were ready but the host ran something else. On the 2-vCPU development machine (a KVM guest) it was
  ~14% of the CPU time while a test suite ran; a cycle thread cannot win a core its machine does not
  have, whatever its priority.

Reading costs a few microseconds: each file is opened once (the schedstat file per thread, since
/proc/thread-self resolves at open) and re-read with pread.
"""
from __future__ import annotations

import os
import threading
import time
import types

SCHEDSTAT = "/proc/thread-self/schedstat"
PROC_STAT = "/proc/stat"
_thread = threading.local()          # the schedstat file of each thread that asks
_process = types.SimpleNamespace()   # /proc/stat, one for the process
_CLOCK_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01


class _File:
    """A file descriptor closed with its holder: a thread's schedstat file goes when the thread ends (its
    threading.local is dropped), so a node that restarts its cycle thread leaks none."""

    def __init__(self, path: str):
        try:
            self.fd = os.open(path, os.O_RDONLY)
        except OSError:
            self.fd = -1                         # absent (not Linux, no schedstats): asked once only

    def __del__(self):
        if self.fd >= 0:
            os.close(self.fd)


def _open_once(holder, attr: str, path: str) -> int | None:
    file = getattr(holder, attr, None)
    if file is None:
        file = _File(path)
        setattr(holder, attr, file)
    return None if file.fd < 0 else file.fd


def run_queue_s() -> float | None:
    """Seconds the calling thread has spent runnable on a run queue since it started; None if unknown."""
    fd = _open_once(_thread, "fd", SCHEDSTAT)
    if fd is None:
        return None
    try:
        return int(os.pread(fd, 96, 0).split()[1]) * 1e-9
    except (OSError, IndexError, ValueError):
        return None


def host_steal_s() -> float | None:
    """Seconds of CPU time the hypervisor has stolen from this machine since boot, summed over its CPUs
    (the counter advances in clock ticks, 10 ms on most kernels); None where /proc/stat has no steal."""
    fd = _open_once(_process, "fd", PROC_STAT)
    if fd is None:
        return None
    try:
        fields = os.pread(fd, 256, 0).split(b"\n", 1)[0].split()
        return int(fields[8]) * _CLOCK_TICK_S        # cpu user nice system idle iowait irq softirq steal
    except (OSError, IndexError, ValueError):
        return None


class StealWatch:
    """The share of the machine's CPU time stolen by the hypervisor between start and stop."""

    def __init__(self):
        self._from = None

    def start(self) -> None:
        self._from = (host_steal_s(), time.monotonic())

    def share(self) -> float | None:
        """Stolen CPU time over (wall time x CPUs) since start(); None where unknown."""
        if self._from is None or self._from[0] is None:
            return None
        steal, wall = host_steal_s(), time.monotonic() - self._from[1]
        cpus = os.cpu_count() or 1
        return None if steal is None or wall <= 0 else (steal - self._from[0]) / (wall * cpus)
