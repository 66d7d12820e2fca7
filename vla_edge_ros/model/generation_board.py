"""The export buffers' generation words on the host: a swap's staleness check without a device read.

A GPU reconciler exports each offer's KV into one of its ring buffers and
marks the buffer's generation word on the device: 2g+1 while export g writes
it, 2g once complete (model/cuda_state_transfer.py). The primary's swap checks
that word at the boundary before anything changes (IpcKV.check_usable), and on
the device that check is a synchronous copy: most of the swap's "checks", 0.2-
0.3 ms p50 and up to 0.6 ms p99 in the H200 soaks of 2026-12-04/05, waiting
for the GPU the reconciler's context shares. The answer is known on the host:
the exporter sets the word from its own thread. So with
asr.host_generation_board the exporter keeps the same words in a small file
in shared memory, which the reasoning process maps once (off the cycle
thread); the boundary's check then reads memory.

    file: int64[1 + buffers]  word 0: the exporter's pid; word 1 + i = 2g+1 while
                              export g writes buffer i, 2g once it has ended, CLOSED
                              after the exporter closed

Order. The host word turns odd before the first device operation of export g
is queued, and even after that export's synchronise. A reader that sees 2g
therefore knows no later export of the buffer had been queued when it looked.
One may still be queued between that read and the primary's copy, exactly as
after the device read: the copy's own reads of the device word, queued in
stream order before and after it (IpcKV.start_write), stay the proof and
report such a copy torn. The host word only lets the boundary refuse a stale
offer earlier and without a device round trip; it never lets a copy through
that the device words would stop.

The board owns the directory it is given (named like the reconciler's
snapshot directories, vla_edge_swap_<pid>_..., so a killed reconciler's is
removed by the next one: core/stale_snapshots.py) and removes it on close,
after marking every word CLOSED; a reader's mapping stays valid and reads
every offer stale from then on. An exporter killed without closing leaves
its last words as they were, so a reader does not trust them once the pid in
word 0 is gone: `GenerationView.word` then answers None and the check reads
the device word, as it does without a board. After either side closed,
writes are ignored and reads answer CLOSED / None, never an exception on the
cycle thread.
"""
from __future__ import annotations

import mmap
import os
import shutil
import stat
from pathlib import Path

import numpy as np

FILE_NAME = "export_generations"
WORD = np.dtype(np.int64)
HEADER_WORDS = 1               # word 0: the exporter's pid
MAX_BUFFERS = 1024             # a reader maps no larger file (asr.export_buffers is a handful)
CLOSED = -1                    # every word once the exporter closed: no offer of it is usable any more


# A generation word's values, on the device (the export buffer's header) and on this board alike:
def writing_word(generation: int) -> int:
    """Export `generation` is writing the buffer."""
    return 2 * int(generation) + 1


def complete_word(generation: int) -> int:
    """Export `generation` has been written completely."""
    return 2 * int(generation)


class GenerationBoard:
    """The exporter's side: `buffers` words in `directory`/FILE_NAME, all 0 (no export yet) at first, after a
    header holding this process's pid. The directory is removed again if the board cannot be made."""

    def __init__(self, buffers: int, directory: Path):
        if buffers < 1:
            raise ValueError(f"GenerationBoard: {buffers} buffers")
        self.buffers = int(buffers)
        self.directory = Path(directory)
        self.path = self.directory / FILE_NAME
        size = WORD.itemsize * (HEADER_WORDS + self.buffers)
        try:
            self.path.write_bytes(bytes(size))
            with open(self.path, "r+b") as f:
                self._map = mmap.mmap(f.fileno(), size)
        except OSError:
            shutil.rmtree(self.directory, ignore_errors=True)
            raise
        self._file = np.frombuffer(self._map, dtype=WORD)           # shared with every reader
        self._file[0] = os.getpid()
        self._words = self._file[HEADER_WORDS:]                     # [buffers]

    def writing(self, index: int, generation: int) -> None:
        """Export `generation` of buffer `index` is about to be queued: call before its first device operation."""
        words = self._words
        if words is not None:                 # closed: nothing to mark (the exporter is shutting down)
            words[index] = writing_word(generation)

    def complete(self, index: int, generation: int) -> None:
        """Export `generation` of buffer `index` has ended on the device (after its synchronise)."""
        words = self._words
        if words is not None:
            words[index] = complete_word(generation)

    def word(self, index: int) -> int:
        words = self._words
        return CLOSED if words is None else int(words[index])

    def close(self) -> None:
        """Every word CLOSED (readers see each offer stale), then the file and its directory removed."""
        words = self._words
        if words is None:
            return
        words[:] = CLOSED
        self._words = self._file = words = None     # the map cannot close while an array still views it
        _unmap(self._map)
        shutil.rmtree(self.directory, ignore_errors=True)


class GenerationView:
    """A reader's mapping of a board (read-only); `word(i)` is one memory read and a check that the exporter
    lives (one system call)."""

    def __init__(self, path: str | os.PathLike):
        self.path = str(path)
        if os.path.basename(self.path) != FILE_NAME:
            raise ValueError(f"{self.path}: a generation board is a file named {FILE_NAME}")
        # The path comes from a peer node: never follow a link, never block on a FIFO, map regular files only.
        fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        try:
            st = os.fstat(fd)
            size = st.st_size
            if (not stat.S_ISREG(st.st_mode) or size < WORD.itemsize * (HEADER_WORDS + 1) or size % WORD.itemsize
                    or size > WORD.itemsize * (HEADER_WORDS + MAX_BUFFERS)):
                raise ValueError(f"{self.path}: {size} bytes is not a generation board")
            self._map = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
        finally:
            os.close(fd)
        self._file = np.frombuffer(self._map, dtype=WORD)
        self.owner = int(self._file[0])
        if self.owner <= 0:
            self._file = None
            self._map.close()
            raise ValueError(f"{self.path}: owner pid {self.owner} is not a process")
        self._words = self._file[HEADER_WORDS:]
        self.buffers = int(self._words.size)

    def word(self, index: int) -> int | None:
        """Buffer `index`'s generation word; None when the board cannot say: this view is closed, or its exporter
        is gone without closing it (killed: its last words may name offers whose memory is going away). The
        caller then reads the device word."""
        words = self._words
        if words is None:
            return None
        value = int(words[index])
        if value != CLOSED and not process_alive(self.owner):
            return None
        return value

    def close(self) -> None:
        if self._words is None:
            return
        self._words = self._file = None
        _unmap(self._map)


def _unmap(mapping: mmap.mmap) -> None:
    """Close `mapping`, unless another thread is reading a word through it this instant (its array still views the
    map): then the mapping goes when that reader drops its array, and nothing raises on either thread."""
    try:
        mapping.close()
    except BufferError:
        pass


def process_alive(pid: int) -> bool:
    """Whether process `pid` exists (the reconciler and the reasoning node share a pid namespace; the snapshot
    directories' clean-up asks the same of their owners: core/stale_snapshots.py)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:               # exists, owned by another user
        return True
    return True
