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

    file: int64[buffers]      word i = 2g+1 while export g writes buffer i,
                              2g once it has ended, CLOSED after the exporter closed

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
every offer stale from then on.
"""
from __future__ import annotations

import mmap
import os
import shutil
from pathlib import Path

import numpy as np

FILE_NAME = "export_generations"
WORD = np.dtype(np.int64)
CLOSED = -1                    # every word once the exporter closed: no offer of it is usable any more


# A generation word's values, on the device (the export buffer's header) and on this board alike:
def writing_word(generation: int) -> int:
    """Export `generation` is writing the buffer."""
    return 2 * int(generation) + 1


def complete_word(generation: int) -> int:
    """Export `generation` has been written completely."""
    return 2 * int(generation)


class GenerationBoard:
    """The exporter's side: `buffers` words in `directory`/FILE_NAME, all 0 (no export yet) at first."""

    def __init__(self, buffers: int, directory: Path):
        if buffers < 1:
            raise ValueError(f"GenerationBoard: {buffers} buffers")
        self.buffers = int(buffers)
        self.directory = Path(directory)
        self.path = self.directory / FILE_NAME
        self.path.write_bytes(bytes(WORD.itemsize * self.buffers))
        with open(self.path, "r+b") as f:
            self._map = mmap.mmap(f.fileno(), WORD.itemsize * self.buffers)
        self._words = np.frombuffer(self._map, dtype=WORD)          # [buffers], shared with every reader

    def writing(self, index: int, generation: int) -> None:
        """Export `generation` of buffer `index` is about to be queued: call before its first device operation."""
        self._words[index] = writing_word(generation)

    def complete(self, index: int, generation: int) -> None:
        """Export `generation` of buffer `index` has ended on the device (after its synchronise)."""
        self._words[index] = complete_word(generation)

    def word(self, index: int) -> int:
        return int(self._words[index])

    def close(self) -> None:
        """Every word CLOSED (readers see each offer stale), then the file and its directory removed."""
        if self._words is None:
            return
        self._words[:] = CLOSED
        self._words = None                  # the map cannot close while an array still views it
        self._map.close()
        shutil.rmtree(self.directory, ignore_errors=True)


class GenerationView:
    """A reader's mapping of a board (read-only); `word(i)` is one memory read."""

    def __init__(self, path: str | os.PathLike):
        self.path = str(path)
        with open(self.path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size == 0 or size % WORD.itemsize:
                raise ValueError(f"{self.path}: {size} bytes is not a generation board")
            self._map = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ)
        self._words = np.frombuffer(self._map, dtype=WORD)
        self.buffers = int(self._words.size)

    def word(self, index: int) -> int:
        return int(self._words[index])

    def close(self) -> None:
        if self._words is None:
            return
        self._words = None
        self._map.close()
