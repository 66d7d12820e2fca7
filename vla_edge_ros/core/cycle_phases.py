"""Where a control cycle's time goes: one duration per phase per cycle, and their percentiles.

The phases, in the order a cycle meets them (all in ms):

    wake        boundary -> the cycle starts (the sleep's overshoot, taking the frame, reading the clock)
    swap_finish what a swap at the last boundary left to this cycle (asr.swap_finish next_cycle; only in the
                cycle after such a swap): the check of its queued KV copy and the forward of its late frames
    rebase      RoPE re-base of the state (rare; recomputes frames)
    admission   the admission decision
    vision      frame pixels -> 32 vision tokens (the vision encoder)
    slots       KV slot bookkeeping: the chunk admitted, evictions, the context list
    prefill     the backend's prefill (device time on the GPU, plus its share of the host overhead)
    decode      the backend's decode steps (likewise)
    finish      tokens -> action values, the state's bookkeeping, transient slots released (and whatever
                else lands there: a garbage-collection pause, a preemption)
    publish     the result as ROS messages (after the deadline check: it is not in elapsed_ms)
    between     at the boundary after a cycle: a new instruction, a reconciled state swapped in
    heap_trim   after `between`, now and then: free heap memory handed back to the OS (core/heap_trim.py)
    frame_decode  per received frame, on the executor thread: a ROS Image -> RGB pixels
    vision_ahead  per frame encoded ahead of the boundary (vision.encode_ahead, core/vision_prefetch.py), on its
                worker thread; a cycle that finds its frame encoded has a vision phase of ~0
    off_cpu     of the cycle from admission on, the time its thread was not running (wall minus the
                thread's CPU time): preempted by other processes, waiting for the GIL held by
                another thread of the node, or its machine's CPU taken by the hypervisor.
    run_queue   of off_cpu, the time the thread was runnable but waiting for a core while other
                tasks ran (the kernel's run_delay, core/sched_stats.py; absent where unknown). The
                rest of off_cpu is blocked (the GIL, a page fault) or stolen by the hypervisor.
    stolen      of off_cpu, about what the hypervisor took: the machine's steal counter over the
                cycle (/proc/stat, all CPUs, in clock ticks of 10 ms: coarse, and on a machine of
                several CPUs possibly another CPU's), at most off_cpu. off_cpu, run_queue and
                stolen are not phases of their own: they overlap the ones above.

`wake` .. `finish` add up to the cycle's elapsed_ms (up to the few microseconds
between laps). Each phase's distribution covers the cycles in which it ran (a
refused cycle has no vision, prefill or decode). The same numbers are also kept
for the late cycles alone (elapsed over the deadline), so a report can say which
phase a late cycle lost its time in.
"""
from __future__ import annotations

import threading
import time

import numpy as np

from .sched_stats import host_steal_s, run_queue_s

IN_CYCLE = ("wake", "swap_finish", "rebase", "admission", "vision", "slots", "prefill", "decode", "finish")
AFTER_CYCLE = ("publish", "between", "heap_trim")
PER_FRAME = ("frame_decode", "vision_ahead")
OVERLAPPING = ("off_cpu", "run_queue", "stolen")
PHASES = IN_CYCLE + AFTER_CYCLE + PER_FRAME + OVERLAPPING
DEFAULT_SAMPLES = 20_000      # per phase: the last ~11 minutes at 30 Hz; a bounded record for a node that runs forever


class PhaseClock:
    """Laps within one cycle: `lap(name)` charges the time since the previous lap to `name`."""

    def __init__(self, start_perf: float):
        self._last = start_perf
        self.ms: dict = {}
        self._cpu_from: tuple | None = None          # (wall, thread CPU, run queue, steal) where off_cpu starts

    @property
    def last_perf(self) -> float:
        """perf_counter() of the latest lap."""
        return self._last

    def start_cpu_watch(self) -> None:
        self._cpu_from = (time.perf_counter(), time.thread_time(), run_queue_s(), host_steal_s())

    def stop_cpu_watch(self) -> None:
        if self._cpu_from is not None:
            wall, cpu = time.perf_counter() - self._cpu_from[0], time.thread_time() - self._cpu_from[1]
            off_cpu = self.ms["off_cpu"] = max(0.0, wall - cpu) * 1e3
            queued, queued_from = run_queue_s(), self._cpu_from[2]
            if queued is not None and queued_from is not None:
                self.ms["run_queue"] = max(0.0, queued - queued_from) * 1e3
            steal, steal_from = host_steal_s(), self._cpu_from[3]
            if steal is not None and steal_from is not None:
                self.ms["stolen"] = min(off_cpu, max(0.0, steal - steal_from) * 1e3)
            self._cpu_from = None

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.add(name, (now - self._last) * 1e3)
        self._last = now

    def add(self, name: str, ms: float) -> None:
        if name not in PHASES:
            raise ValueError(f"unknown cycle phase {name!r}; known: {PHASES}")
        self.ms[name] = self.ms.get(name, 0.0) + float(ms)

    def lap_split(self, first: str, first_ms: float, rest: str) -> None:
        """One lap shared by two phases: `first_ms` of it (at most all) to `first`, the remainder to `rest`."""
        now = time.perf_counter()
        lap_ms = (now - self._last) * 1e3
        self._last = now
        head = min(max(float(first_ms), 0.0), lap_ms)
        self.add(first, head)
        self.add(rest, lap_ms - head)


class _Ring:
    """The last `size` values in a preallocated array: recording is one store, reading one copy (no Python
    iteration over thousands of floats while the 1 Hz diagnostics hold the GIL the cycle thread needs)."""

    def __init__(self, size: int):
        self._values = np.empty(size, dtype=np.float64)
        # Written now, so resident from the start: left to the samples, its pages were touched one by one as the
        # rings filled (~420 samples a second in the reasoning node, ~0.2 MiB a minute for the first ~11 minutes),
        # a slope a soak's memory check reads as growth (the reasoning node's RSS rose 0.3 MiB a minute between
        # its steps in the H200 soaks of 2026-12-04, thirteenth session, +4.7 and +4.9 MiB of the 5 MiB bound).
        self._values.fill(0.0)
        self._count = 0

    def add(self, value: float) -> None:
        self._values[self._count % self._values.size] = value
        self._count += 1

    def copy(self) -> np.ndarray:
        return self._values[:min(self._count, self._values.size)].copy()


class PhaseStats:
    """Recent per-phase durations of all cycles and of the late ones; thread-safe (the cycle thread and the
    executor record, the diagnostics timer reads)."""

    def __init__(self, samples: int = DEFAULT_SAMPLES):
        if samples <= 0:
            raise ValueError(f"PhaseStats: samples must be > 0, got {samples}")
        self._all = {p: _Ring(samples) for p in PHASES}
        self._late = {p: _Ring(samples) for p in PHASES}
        self._late_cycles = 0
        self._lock = threading.Lock()

    def record_cycle(self, phases_ms: dict, late: bool) -> None:
        with self._lock:
            for name, ms in phases_ms.items():
                self._all[name].add(ms)
                if late:
                    self._late[name].add(ms)
            self._late_cycles += bool(late)

    def record(self, name: str, ms: float) -> None:
        """One duration outside a cycle's own record (publish, between, heap_trim, frame_decode, vision_ahead)."""
        with self._lock:
            self._all[name].add(float(ms))

    def summary(self) -> dict:
        """{phase: {n, p50, p99, max, late_p50}} for every phase seen, plus {'late_cycles': n}."""
        with self._lock:                                  # copies only; the percentiles outside the lock
            every = {p: r.copy() for p, r in self._all.items()}
            late = {p: r.copy() for p, r in self._late.items()}
            late_cycles = self._late_cycles
        out: dict = {}
        for name, values in every.items():
            if values.size == 0:
                continue
            p50, p99 = np.percentile(values, (50, 99))
            out[name] = {"n": int(values.size), "p50": float(p50), "p99": float(p99), "max": float(values.max()),
                         "late_p50": float(np.percentile(late[name], 50)) if late[name].size else None}
        out["late_cycles"] = late_cycles
        return out
