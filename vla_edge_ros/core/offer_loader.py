"""An in-process stand-in for the reasoning node's swap loader: offers prepared off the cycle thread.

In the ROS graph the reconciler exports an offer and the reasoning node's swap loader
thread (core/swap_protocol.SwapClient.load_offer) checks it and lays its frames out
in the slots (FrameState.prepare_swap) before a cycle boundary applies it; the
boundary takes only offers the loader has finished. `InProcessAsr` (bench asr)
ran that preparation inside the reconciler's make_offer, on the cycle thread: at
32K slots on the H200 one offer of 728 frames took 21.9 ms there, most of it
the host's layout, and ran 12.5 ms past a cycle boundary (2026-12-05, nineteenth
session). With an OfferLoader the preparation runs on a thread of its own, as in
the graph (competing for the interpreter lock as the node's loader does), and
the driver applies an offer once `prepared(version)` says so.
"""
from __future__ import annotations

import logging
import queue
import threading

from .state_snapshot import SnapshotError

log = logging.getLogger(__name__)


class OfferLoader:
    """Runs `prepare(snap)` for each submitted offer on one daemon thread, in submission order."""

    def __init__(self, prepare):
        self._prepare = prepare
        self._queue: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._prepared: set[int] = set()        # versions whose preparation ended (checked or refused)
        self._thread = threading.Thread(target=self._main, name="offer-loader", daemon=True)
        self._thread.start()

    def submit(self, snap) -> None:
        """Queue `snap`'s preparation (what StateReconciler.prepare_offer calls); returns at once."""
        self._queue.put(snap)

    def prepared(self, version: int) -> bool:
        """Whether the offer of this version has been prepared (a refused one counts: the boundary refuses it too)."""
        with self._lock:
            return version in self._prepared

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=5.0)

    def _main(self) -> None:
        while True:
            snap = self._queue.get()
            if snap is None:
                return
            try:
                self._prepare(snap)
            except SnapshotError as exc:      # the boundary rejects it with the same error, in its checks' order
                log.debug("offer v%d not prepared: %s", snap.version, exc)
            except Exception as exc:          # e.g. a layout that does not fit the slots: the boundary's own checks
                # refuse it there; this thread must live on for the next offers (it used to end here, silently)
                log.warning("offer v%d not prepared (%s: %s); left to the boundary's checks", snap.version,
                            type(exc).__name__, exc)
            with self._lock:
                self._prepared.add(snap.version)
                if len(self._prepared) > 64:  # versions only grow: the oldest are never asked about again
                    self._prepared.discard(min(self._prepared))
