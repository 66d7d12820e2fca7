"""Latest-only double buffer between a fast camera and a slow reasoning loop.

Two slots and a version counter, after the article's lock-free SPSC buffer,
rewritten for Python objects instead of memcpy'd pixel arrays:

    publish #k (k = 1, 2, ...):   slots[(k - 1) & 1] = (k, frame)    # the slot the consumer is not reading
                                  version = k                          # then make it visible
    consume_latest():             v = version
                                  (k, frame) = slots[(v - 1) & 1]      # the freshest published slot

Neither side waits: there is no lock and no copy. A frame is immutable
(frozen `Frame`; the producer must not write into `frame.pixels` after
publishing it), so handing the object over *is* the handover.

Why this is safe under CPython with one producer thread and one consumer
thread: every shared write is a single reference store (`list[i] = tuple`,
`self._version = int`), which the interpreter performs atomically (under the
GIL, and under per-object locking in free-threaded builds), so a reader sees
either the old or the new tuple, never a torn one. Each counter has exactly one
writer. The one interleaving the version alone does not cover is a producer
pre-empted between its slot store and its version store: a consumer may then
already see frame k in a slot while `version` still says k - 1 or k - 2, and a
later call could read the older neighbour slot. The slot therefore carries its
publish sequence number and the consumer never hands out a sequence lower than
one it already handed out, so the frames a consumer receives are monotonic.
"""
from __future__ import annotations

from dataclasses import dataclass

from .frames import Frame


@dataclass(frozen=True)
class BufferStats:
    published: int      # frames published so far
    consumed: int       # distinct frames handed to the consumer
    overwritten: int    # frames replaced by a newer one before anyone consumed them
    pending: int        # 0 or 1: the latest frame, published but not consumed yet

    # Invariant (exact when both threads are idle): published == consumed + overwritten + pending.


class LatestFrameBuffer:
    """Single-producer / single-consumer latest-only frame handover; see the module docstring."""

    def __init__(self):
        self._slots: list = [None, None]     # each None or (publish sequence, Frame)
        self._version = 0                    # written by the producer only: sequence of the last visible publish
        # Consumer-side state, written by the consumer only.
        self._last_seq = 0
        self._last_frame: Frame | None = None
        self._consumed = 0
        self._skipped = 0                    # frames that were replaced between two consumes

    # ---------------------------------------------------------------- producer

    def publish(self, frame: Frame) -> None:
        """Make `frame` the latest one. Never blocks, never copies."""
        seq = self._write_slot(frame)
        self._make_visible(seq)

    # ---------------------------------------------------------------- consumer

    def consume_latest(self) -> Frame | None:
        """The freshest frame; None before the first publish.

        Returns the same frame again when nothing new arrived since the last
        call (compare `frame_id` to detect that). Never blocks.
        """
        return self._take(self._version)

    # ---------------------------------------------------------------- either side

    def stats(self) -> BufferStats:
        """Counters; exact when both sides are idle, approximate by one frame while they run."""
        published = self._version
        last_seq = self._last_seq
        # Published after the last consume: all but the newest are already replaced.
        after_last = max(0, published - last_seq)
        pending = 1 if after_last else 0
        overwritten = self._skipped + max(0, after_last - 1)
        return BufferStats(published=published, consumed=self._consumed,
                           overwritten=overwritten, pending=pending)

    # ---------------------------------------------------------------- helpers
    # Each side split at the point where the other thread may run in between, so tests can
    # replay the interleavings deterministically.

    def _take(self, version: int) -> Frame | None:
        """Consumer half: read the slot `version` points at (`version` may be stale by now)."""
        if version == 0:
            return None
        seq, frame = self._slots[(version - 1) & 1]
        if seq > self._last_seq:
            self._skipped += seq - self._last_seq - 1
            self._consumed += 1
            self._last_seq = seq
            self._last_frame = frame
        return self._last_frame

    def _write_slot(self, frame: Frame) -> int:
        if not isinstance(frame, Frame):
            raise TypeError(f"LatestFrameBuffer.publish expects a Frame, got {type(frame).__name__}")
        seq = self._version + 1
        self._slots[(seq - 1) & 1] = (seq, frame)   # the slot of publish seq - 1 stays readable
        return seq

    def _make_visible(self, seq: int) -> None:
        self._version = seq
