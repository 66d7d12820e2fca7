"""Fast DDS shared-memory files left behind by processes that died, found and removed before a graph starts.

Fast DDS (the ROS 2 middleware these wheels ship) moves data between processes of one machine through files in
/dev/shm: a segment per participant (fastrtps_<16 characters>, with a lock file <name>_el its owner holds with
flock(2) while it lives) and a port per receiver, found by number (fastrtps_port<N>, its lock files <name>_el or
_sl while a receiver has it, and its semaphore sem.fastrtps_port<N>_mutex). A process killed with SIGKILL, or one
that crashed, never removes them, and /dev/shm is memory: processes killed while they published images left 8.5 MB
there for 15 participants on the development machine (notes/cpu_notes.md, 2026-12-04), kept until reboot; a node
that crash-loops under the supervisor's respawn adds to it at every restart. A writer killed mid-send can also leave a port with no lock file
and its semaphore taken, which the next process given that port number finds.

The rule: a segment goes when its lock is free (as eProsima's `fastdds shm clean` has it; the pip wheels do not ship
that tool); a port goes when none of its files is mapped or open in a live process (/proc/<pid>/maps and fd) and
none of its locks is held. Only this user's files. The bringup (tools/bringup.py) and the launch file call it before
they start the nodes.

What this does not fix: the CPU demos' camera publish call that stalled for ~330 ms once, ~2.5 s after the camera
started (three stale_frame fallbacks; 5 of 13 demos with no leftovers at all). That was Fast DDS's check of a port
it opens, sleeping a third of the port's 1000 ms health-check time; tools/dds_profile.py bounds it
(notes/cpu_notes.md, 2026-12-04 fifteenth and sixteenth sessions).
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
PROC = Path("/proc")
# A participant's segment (with its lock file), and a port (its lock files and its semaphore).
SEGMENT = re.compile(r"^(fastrtps_[0-9a-z]{16})(_el)?$")
PORT = re.compile(r"^(?:sem\.)?(fastrtps_port\d{1,5})(?:_el|_sl|_mutex)?$")


@dataclass(frozen=True)
class DeadShmFiles:
    segments: int                 # dead participants' segments removed
    ports: int                    # dead ports removed
    in_use: int                   # segments and ports a live process maps, holds open or locked, or another user's

    def describe(self) -> str:
        return (f"removed {self.segments} Fast DDS shared-memory segments and {self.ports} ports left by processes "
                f"that died ({self.in_use} in use or not ours)")


def files_in_use(shm_dir: Path = SHM_DIR, proc: Path = PROC) -> set[str]:
    """Names of the files in shm_dir that some process maps or holds open (/proc/<pid>/maps and fd). A process
    this one may not inspect is passed over: another user's uses its own files (the caller removes only this
    user's), and a supervisor that hides its maps (a sandbox's init) runs no participant."""
    prefix = str(shm_dir) + "/"
    used: set[str] = set()
    for pid in os.listdir(proc):
        if not pid.isdigit():
            continue
        try:
            with open(proc / pid / "maps") as maps:
                for line in maps:
                    fields = line.split(maxsplit=5)
                    if len(fields) == 6 and fields[5].startswith(prefix):
                        used.add(fields[5][len(prefix):].split(" (deleted)")[0].strip())
            for fd in os.listdir(proc / pid / "fd"):
                try:
                    target = os.readlink(proc / pid / "fd" / fd)
                except OSError:
                    continue                        # closed meanwhile
                if target.startswith(prefix):
                    used.add(target[len(prefix):])
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue                                # ended meanwhile, or not ours to inspect
    return used


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


def _remove_group(shm_dir: Path, names: list[str], used: set[str] | None) -> bool:
    """Remove one segment's or port's files when every lock file among them is free (taken while the files go, so
    no process can take one over in between) and, given `used`, no process maps or holds any of them; whether it
    did."""
    if used is not None and any(name in used for name in names):
        return False
    try:
        if any(os.stat(shm_dir / name).st_uid != os.getuid() for name in names):
            return False                            # another user's graph: its files, its cleanup
    except FileNotFoundError:
        return False                                # removed meanwhile (another cleanup, its owner)
    locks = [name for name in names if name.endswith(("_el", "_sl"))]
    fds = [_take_if_free(shm_dir / name) for name in locks]
    try:
        if any(fd is None and (shm_dir / name).exists() for fd, name in zip(fds, locks)):
            return False
        for name in sorted(names, key=lambda n: n in locks):     # the data files first, their locks last
            try:
                (shm_dir / name).unlink()
            except FileNotFoundError:
                pass
        return True
    finally:
        for fd in fds:
            if fd is not None:
                os.close(fd)


def remove_dead_shm_files(shm_dir: Path = SHM_DIR, proc: Path = PROC) -> DeadShmFiles:
    """Remove every Fast DDS segment whose lock file no live process holds, and every port that no live process
    maps, holds open or holds locked (with its lock files and its semaphore); keep the rest. A port a process
    killed while it wrote left without lock files counts too (its semaphore may still be taken by the dead
    writer). Only this user's files are removed; nothing when shm_dir does not exist (not Linux). Call it before
    the graph's nodes start: a process opening a dead port by number in the same instant could still lose it, as
    with `fastdds shm clean`."""
    try:
        names = os.listdir(shm_dir)
    except OSError:
        return DeadShmFiles(0, 0, 0)
    groups: dict[tuple[str, str], list[str]] = {}
    for name in names:
        if match := SEGMENT.match(name):
            groups.setdefault(("segment", match.group(1)), []).append(name)
        elif match := PORT.match(name):
            groups.setdefault(("port", match.group(1)), []).append(name)
    if not groups:
        return DeadShmFiles(0, 0, 0)
    used = files_in_use(shm_dir, proc)
    removed = {"segment": 0, "port": 0}
    in_use = 0
    for (kind, _), group in sorted(groups.items()):
        # A dead participant's segment goes by its lock alone, as Fast DDS's own tool has it: a live peer that
        # read from it keeps its mapping (unlinking a file leaves mappings alone) and no one opens it again. A port
        # is a rendezvous by number: one a live process still maps or holds stays, or a writer would go on writing
        # into a file the port's next owner no longer sees.
        by_lock = kind == "segment" and any(name.endswith("_el") for name in group)   # else as a port
        if _remove_group(shm_dir, group, None if by_lock else used):
            removed[kind] += 1
        else:
            in_use += 1
    return DeadShmFiles(removed["segment"], removed["port"], in_use)


def clean_before_start(shm_dir: Path = SHM_DIR) -> DeadShmFiles:
    """remove_dead_shm_files, logged at INFO when it removed anything (what a robot's operator wants to know)."""
    found = remove_dead_shm_files(shm_dir)
    if found.segments or found.ports:
        log.info("%s", found.describe())
    return found
