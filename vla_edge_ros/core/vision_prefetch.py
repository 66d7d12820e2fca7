"""The newest camera frame encoded before the cycle boundary asks for it (vision.encode_ahead).

Why: the cycle's vision phase (resize + patch projection) sits on its critical path, ~0.5 ms p50 and 1.65 ms p99
in the H200 graph (2026-12-03 soak, vision on the GPU): part of what the graph spends beyond the engine's bench.
The frame a cycle takes is the newest one the camera delivered before the boundary, and at 60 Hz that one has
usually been waiting ~8 ms: time enough to have encoded it already.

How: the frame callback offers every frame it puts in the latest-frame buffer; one worker thread encodes the
newest one offered (older ones not yet started are skipped: the cycle never asks for them) with the engine's own
encoder, so the rows are the bits an inline encode gives. The cycle takes the encoding of its frame when it is
done, waits for it when it is being encoded (at most `wait_s`: it is a fraction of a millisecond from done), and
otherwise encodes inline as before. A failed encode is counted and logged by the caller; the cycle then encodes
inline and meets the same error there, explained the usual way.

Cost: every frame is encoded, ~2 per cycle at 60 Hz, on a thread beside the cycle's; on a CPU-only machine that
is host time the cycle's cores would otherwise have (off by default; measured on the GPU graph before it is
turned on anywhere).
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Callable

from .frames import Frame
from .vision_encoder import EncodedFrame

KEEP = 2                   # finished encodings kept: the newest, and the one before it (a boundary may lag one frame)
WAIT_S = 0.005             # longest a cycle waits for the encode of its own frame in progress


class VisionPrefetch:
    """Encodes the newest offered frame on a worker thread; `take(frame)` hands its encoding to the cycle."""

    def __init__(self, encode: Callable[[object], EncodedFrame], on_encoded: Callable[[float], None] | None = None,
                 on_error: Callable[[Exception], None] | None = None, wait_s: float = WAIT_S):
        self._encode = encode
        self._on_encoded = on_encoded
        self._on_error = on_error
        self.wait_s = float(wait_s)
        self._cv = threading.Condition()
        self._pending: Frame | None = None
        self._busy: tuple | None = None                      # (frame_id, stamp_s) being encoded
        self._done: OrderedDict = OrderedDict()             # (frame_id, stamp_s) -> EncodedFrame
        self._stop = False
        self.counts = {"offered": 0, "encoded": 0, "skipped": 0, "errors": 0, "hits": 0, "waited": 0, "misses": 0}
        self._thread = threading.Thread(target=self._work, name="vision-prefetch", daemon=True)
        self._thread.start()

    def offer(self, frame: Frame) -> None:
        """The camera's newest frame (the frame callback, after putting it in the latest-frame buffer)."""
        with self._cv:
            if self._stop:
                return
            self.counts["offered"] += 1
            if self._pending is not None:
                self.counts["skipped"] += 1                  # superseded before its encode began
            self._pending = frame
            self._cv.notify_all()

    def take(self, frame: Frame) -> EncodedFrame | None:
        """The encoding of `frame` (same id and stamp) if it is done or finishes within wait_s, else None: the
        caller encodes inline (and a worker encode of it not yet begun is dropped: it would be wasted)."""
        key = _key(frame)
        with self._cv:
            encoded = self._done.get(key)
            if encoded is None and self._busy == key:
                self.counts["waited"] += 1
                self._cv.wait_for(lambda: self._busy != key, timeout=self.wait_s)
                encoded = self._done.get(key)
            if encoded is None and self._pending is not None and _key(self._pending) == key:
                self._pending = None
            self.counts["hits" if encoded is not None else "misses"] += 1
            return encoded

    def stop(self, timeout_s: float = 2.0) -> None:
        """End the worker (its encode in progress finishes first); offers after this are ignored."""
        with self._cv:
            self._stop = True
            self._pending = None
            self._cv.notify_all()
        self._thread.join(timeout_s)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def _work(self) -> None:
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._stop or self._pending is not None)
                if self._stop:
                    return
                frame, self._pending = self._pending, None
                self._busy = _key(frame)
            t0 = time.perf_counter()
            encoded, error = None, None
            try:
                encoded = self._encode(frame.pixels)
            except Exception as exc:      # any encoder failure: the cycle encodes inline and reports it there
                error = exc
            ms = (time.perf_counter() - t0) * 1e3
            with self._cv:
                if encoded is not None:
                    self._done[self._busy] = encoded
                    while len(self._done) > KEEP:
                        self._done.popitem(last=False)
                    self.counts["encoded"] += 1
                else:
                    self.counts["errors"] += 1
                self._busy = None
                self._cv.notify_all()
            if error is not None and self._on_error is not None:
                self._on_error(error)
            elif encoded is not None and self._on_encoded is not None:
                self._on_encoded(ms)


def _key(frame: Frame) -> tuple:
    return frame.frame_id, frame.stamp_s
