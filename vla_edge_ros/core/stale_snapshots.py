"""Snapshot directories left behind by reconcilers that died without cleaning up.

A reconciler writes its swap snapshots (a few MB each) into a private directory
`vla_edge_swap_<pid>_<random>` under /dev/shm, which is RAM. A clean stop deletes
it; a SIGKILL or a crash cannot, and /dev/shm is not emptied until reboot. So
every new SnapshotStore first removes the directories whose owner is gone,
told by the pid in the name. A directory of a live process (another graph on
the same machine) is never touched, and a pid that is alive again under
another process is left alone too: the cost of that rare case is one
directory kept, never a live reconciler's files removed.
"""
from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path

from ..model.generation_board import process_alive

log = logging.getLogger(__name__)

SNAPSHOT_DIR_PREFIX = "vla_edge_swap_"     # + "<pid>_<random>"


def snapshot_dir_prefix(pid: int) -> str:
    return f"{SNAPSHOT_DIR_PREFIX}{pid}_"


def private_directory(base: Path) -> Path:
    """A new directory under `base` named for this process (vla_edge_swap_<pid>_<random>): deleted by its owner
    on a clean stop, by the next reconciler's remove_stale_snapshot_dirs once this process is gone."""
    return Path(tempfile.mkdtemp(prefix=snapshot_dir_prefix(os.getpid()), dir=base))


def remove_stale_snapshot_dirs(base: Path) -> list:
    """Delete `base/vla_edge_swap_<pid>_*` directories whose process no longer exists; returns them."""
    removed = []
    try:
        entries = list(Path(base).iterdir())
    except OSError as exc:
        log.warning("cannot list %s for stale snapshot directories: %s", base, exc)
        return removed
    for path in entries:
        pid = _owner_pid(path.name)
        if pid is None or not path.is_dir() or process_alive(pid):
            continue
        shutil.rmtree(path, ignore_errors=True)
        if not path.exists():
            removed.append(path)
    if removed:
        log.info("removed %d snapshot directories of dead reconcilers: %s", len(removed), [p.name for p in removed])
    return removed


def _owner_pid(name: str) -> int | None:
    """'vla_edge_swap_1234_abcd' -> 1234; None for any other name."""
    if not name.startswith(SNAPSHOT_DIR_PREFIX):
        return None
    pid, sep, _ = name[len(SNAPSHOT_DIR_PREFIX):].partition("_")
    return int(pid) if sep and pid.isdigit() and int(pid) > 0 else None
