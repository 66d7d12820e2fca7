"""Fast DDS shared-memory files left behind by processes that died, found and removed before a graph starts.

Fast DDS (the ROS 2 middleware these wheels ship) moves data between processes of one machine through files in
/dev/shm: a segment per participant (fastrtps_<16 characters>) and a file per port (fastrtps_port<N>), each with a
lock file beside it (<name>_el; a port's may be <name>_sl) that the owning process holds with flock(2) for as long
as it lives, plus a port's semaphore (sem.fastrtps_port<N>_mutex). A process killed with SIGKILL, or one that
crashed, never removes them. On the 2-vCPU development machine those of a day of test runs that kill nodes on
purpose made the camera node's publish call stall for 320-334 ms once in each 20 s demo, three stale_frame
fallbacks each time; the same came back with the files of processes killed while they published images (145
segments, 11 ports), not with those of 120 idle ones, and went with them: slowest publish 6 ms
(notes/cpu_notes.md, 2026-12-04).

A file whose lock nobody holds belongs to a dead process: that is the rule eProsima's `fastdds shm clean` applies;
the pip wheels do not ship that tool, so the bringup (tools/bringup.py) and the launch file apply it before they
start the nodes. A lock held by a live process is never taken, so a running graph's files stay.
"""
from __future__ import annotations

import fcntl
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

SHM_DIR = Path("/dev/shm")
# A participant's segment lock, and a port's (two kinds of lock file).
SEGMENT_LOCK = re.compile(r"^fastrtps_[0-9a-z]{16}_el$")
PORT_LOCK = re.compile(r"^fastrtps_port\d{1,5}_(el|sl)$")


@dataclass(frozen=True)
class DeadShmFiles:
    segments: int                 # dead participants' segments removed
    ports: int                    # dead ports removed
    in_use: int                   # lock files a live process holds (left alone)

    def describe(self) -> str:
        return (f"removed {self.segments} Fast DDS shared-memory segments and {self.ports} ports left by processes "
                f"that died ({self.in_use} in use)")


def _take_if_free(path: Path) -> int | None:
    """An open descriptor of `path` holding its flock exclusively, or None when a live process holds it (or the
    file cannot be opened or locked for any other reason: then it is not ours to remove)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def _remove(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass


def remove_dead_shm_files(shm_dir: Path = SHM_DIR) -> DeadShmFiles:
    """Remove every Fast DDS segment and port in shm_dir whose lock files no live process holds (with its lock
    files and, for a port, its semaphore); keep the rest. The files go while we hold their locks, so a process
    cannot take one over in between; one that opens a dead port by number in that instant can still lose it, as
    with `fastdds shm clean`: call this before the graph's nodes start. A directory that does not exist (not
    Linux) has nothing to remove."""
    try:
        names = os.listdir(shm_dir)
    except OSError:
        return DeadShmFiles(0, 0, 0)
    segments = ports = in_use = 0
    port_locks: dict[str, list[Path]] = {}
    for name in sorted(names):
        if SEGMENT_LOCK.match(name):
            lock = shm_dir / name
            fd = _take_if_free(lock)
            if fd is None:
                in_use += lock.exists()
                continue
            try:
                _remove(shm_dir / name[:-3])        # the segment, then its lock
                _remove(lock)
            finally:
                os.close(fd)
            segments += 1
        elif PORT_LOCK.match(name):
            port_locks.setdefault(name[:-3], []).append(shm_dir / name)
    # A port goes only when none of its lock files is held (one opened by readers in both modes has both).
    for port, locks in port_locks.items():
        fds = [_take_if_free(lock) for lock in locks]
        try:
            held = sum(fd is None and lock.exists() for fd, lock in zip(fds, locks))
            if held:
                in_use += held
                continue
            for path in (shm_dir / port, shm_dir / f"sem.{port}_mutex", *locks):
                _remove(path)
            ports += 1
        finally:
            for fd in fds:
                if fd is not None:
                    os.close(fd)
    return DeadShmFiles(segments, ports, in_use)


def clean_before_start(shm_dir: Path = SHM_DIR) -> DeadShmFiles:
    """remove_dead_shm_files, logged at INFO when it removed anything (what a robot's operator wants to know)."""
    found = remove_dead_shm_files(shm_dir)
    if found.segments or found.ports:
        log.info("%s", found.describe())
    return found
