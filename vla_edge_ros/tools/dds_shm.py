"""Fast DDS shared-memory files left behind by processes that died, found and removed before a graph starts.

Fast DDS (the ROS 2 middleware these wheels ship) moves data between processes of one machine through files in
/dev/shm: a segment per participant (fastrtps_<16 characters>) and a file per port (fastrtps_port<N>), each with a
lock file beside it (<name>_el; a port's may be <name>_sl) that the owning process holds with flock(2) for as long
as it lives, plus a port's semaphore (sem.fastrtps_port<N>_mutex). A process killed with SIGKILL, or one that
crashed, never removes them. On the 2-vCPU development machine about 120 such segments (a day of test runs that
kill nodes on purpose) made the camera node's publish call stall for 320-334 ms once in each 20 s demo, three
stale_frame fallbacks each time; with them removed the slowest publish took 3 ms (notes/cpu_notes.md, 2026-12-04).

A file whose lock nobody holds belongs to a dead process: that is the rule eProsima's `fastdds shm clean` applies;
the pip wheels do not ship that tool, so the bringup (tools/bringup.py) and the launch file apply it before they
start the nodes. A lock held by a live process is never taken, so a running graph's files stay.
"""
from __future__ import annotations

import errno
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


def lock_is_held(path: Path) -> bool:
    """Whether a live process holds `path` with flock: we cannot take it exclusively without waiting. A file we
    cannot open (another user's) counts as held: it is not ours to remove."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    except OSError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        return exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def _remove(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass


def remove_dead_shm_files(shm_dir: Path = SHM_DIR) -> DeadShmFiles:
    """Remove every Fast DDS segment and port in shm_dir whose lock file no live process holds (with its lock
    file and, for a port, its other lock and its semaphore); keep the rest. A directory that does not exist (not
    Linux) has nothing to remove."""
    try:
        names = os.listdir(shm_dir)
    except OSError:
        return DeadShmFiles(0, 0, 0)
    segments = ports = in_use = 0
    port_locks: dict[str, list[Path]] = {}
    for name in sorted(names):
        lock = shm_dir / name
        if SEGMENT_LOCK.match(name):
            if lock_is_held(lock):
                in_use += 1
                continue
            _remove(shm_dir / name[:-3])            # the segment, then its lock
            _remove(lock)
            segments += 1
        elif PORT_LOCK.match(name):
            port_locks.setdefault(name[:-3], []).append(lock)
    # A port goes only when none of its lock files is held (one opened by readers in both modes has both).
    for port, locks in port_locks.items():
        held = sum(lock_is_held(lock) for lock in locks)
        if held:
            in_use += held
            continue
        for path in (shm_dir / port, shm_dir / f"sem.{port}_mutex", *locks):
            _remove(path)
        ports += 1
    return DeadShmFiles(segments, ports, in_use)


def clean_before_start(shm_dir: Path = SHM_DIR) -> DeadShmFiles:
    """remove_dead_shm_files, logged at INFO when it removed anything (what a robot's operator wants to know)."""
    found = remove_dead_shm_files(shm_dir)
    if found.segments or found.ports:
        log.info("%s", found.describe())
    return found
