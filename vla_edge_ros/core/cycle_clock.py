"""The primary's cycle timing, shared with the reconciler process so its GPU work runs only in the slack.

On one GPU the reconciler's rebuild and the control cycle compete for the
same SMs and memory bandwidth (DESIGN.md, "Sharing one GPU"): measured on the
H200, a rebuild running beside the cycles made three cycles in a row take
~50 ms instead of ~24. The cycle is periodic and its end is known, so the
reconciler can instead run in the gap between the end of one cycle and the
next boundary. The reasoning node publishes when each cycle ended and when
the next one starts; the reconciler reads it before each chunk of work.

Layout of the shared file (/dev/shm, 32 bytes, little endian):
    seq              uint64   even: stable; odd: being written (a seqlock)
    cycle_end_ns     int64    CLOCK_MONOTONIC (time.perf_counter_ns on Linux) when the latest cycle's work ended
    next_boundary_ns int64    when the next cycle starts
    period_ns        int64    the cycle period

CLOCK_MONOTONIC is one clock for every process of the machine, so the two
nodes compare times directly. One writer (the reasoning node's cycle thread),
any number of readers; a reader that finds no file, or a last cycle older than
STALE_PERIODS periods (the primary is inactive or gone), gets None and works
freely: there is no cycle to protect.
"""
from __future__ import annotations

import mmap
import os
import re
import struct
import time
from pathlib import Path

LAYOUT = struct.Struct("<Qqqq")
SHM_DIR = Path("/dev/shm")
STALE_PERIODS = 3
READ_RETRIES = 100


def clock_path(domain_id: str | int | None, namespace: str = "/") -> Path:
    """The file one graph's two nodes share: keyed by ROS domain and namespace, so graphs side by side
    on one machine (tests, a second robot in simulation) keep apart."""
    base = SHM_DIR if SHM_DIR.is_dir() else Path("/tmp")
    ns = re.sub(r"[^A-Za-z0-9]+", "_", namespace).strip("_") or "root"
    return base / f"vla_edge_cycle_clock_d{domain_id or 0}_{ns}"


class CycleClockWriter:
    """The reasoning node's side: `cycle_ended(next_boundary_ns)` after each cycle."""

    def __init__(self, path: Path, period_s: float):
        self.path = Path(path)
        self.period_ns = int(period_s * 1e9)
        # A new file renamed into place, never one truncated under a reader's mapping (that would SIGBUS it).
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.ftruncate(fd, LAYOUT.size)
            self._map = mmap.mmap(fd, LAYOUT.size)
            self._inode = os.fstat(fd).st_ino
        finally:
            os.close(fd)
        self._seq = 0
        self._write(0, 0)
        os.replace(tmp, self.path)

    def cycle_ended(self, next_boundary_ns: int, end_ns: int | None = None) -> None:
        self._write(time.perf_counter_ns() if end_ns is None else end_ns, next_boundary_ns)

    def close(self) -> None:
        """No more cycles (deactivated, shutting down): readers see that at once, then the file goes."""
        if self._map is not None:
            self._write(0, 0)
            self._map.close()
            self._map = None
            try:
                if os.stat(self.path).st_ino == self._inode:      # still ours, not a newer writer's
                    self.path.unlink()
            except FileNotFoundError:
                pass

    def _write(self, end_ns: int, next_ns: int) -> None:
        self._seq += 1                                            # odd: readers retry
        LAYOUT.pack_into(self._map, 0, self._seq, end_ns, next_ns, self.period_ns)
        self._seq += 1                                            # even: stable
        LAYOUT.pack_into(self._map, 0, self._seq, end_ns, next_ns, self.period_ns)


class CycleClockReader:
    """The reconciler's side: the current slack window, or None when there is no live cycle to protect."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._map = None

    def window(self, now_ns: int | None = None) -> tuple[int, int] | None:
        """(sequence number of the latest cycle end, ns left until the next boundary); None without a live primary.
        The sequence number tells a new cycle end from the one already used."""
        gap = self.gap_window(now_ns)
        return None if gap is None else gap[:2]

    def gap_window(self, now_ns: int | None = None) -> tuple[int, int, int] | None:
        """As window(), with the whole gap (ns from the cycle's end to the next boundary) as a third value."""
        snap = self._read()
        if snap is None:
            return None
        seq, end_ns, next_ns, period_ns = snap
        now = time.perf_counter_ns() if now_ns is None else now_ns
        if end_ns == 0 or period_ns <= 0 or now - end_ns > STALE_PERIODS * period_ns:
            self.close()                   # look for the file again next time: a restarted primary writes a new one
            return None
        return seq, next_ns - now, next_ns - end_ns

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None

    def _read(self):
        if self._map is None:
            try:
                fd = os.open(self.path, os.O_RDONLY)
            except FileNotFoundError:
                return None
            try:
                if os.fstat(fd).st_size < LAYOUT.size:
                    return None
                self._map = mmap.mmap(fd, LAYOUT.size, prot=mmap.PROT_READ)
            finally:
                os.close(fd)
        for _ in range(READ_RETRIES):
            first = LAYOUT.unpack_from(self._map, 0)
            if first[0] % 2 == 0 and LAYOUT.unpack_from(self._map, 0)[0] == first[0]:
                return first
        return None
