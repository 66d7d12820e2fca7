"""Frame ids that only grow, even when the camera node restarts and numbers its frames from 1 again.

The state keys frames by id and assumes ids increase: the engine takes a
frame it already holds as "answered before", and the reconciler ignores a
chunk whose id is not newer than the last one (a re-sent message). A
restarted camera_ingest breaks both: its ids start over, so new frames would
collide with retained ones and the reconciler would stop mirroring until the
new ids passed the old maximum. The reasoning node therefore maps the
camera's ids through `FrameIdEpochs`: when an id goes backwards, a new epoch
starts right after the last id handed out.
"""
from __future__ import annotations


class FrameIdEpochs:
    """raw camera frame id -> id used by the state (one caller thread)."""

    def __init__(self):
        self._last_raw: int | None = None
        self._offset = 0
        self.restarts = 0          # times the raw numbering went backwards

    def map(self, raw_id: int) -> int:
        raw_id = int(raw_id)
        if self._last_raw is not None and raw_id < self._last_raw:
            # Numbering started over: the new epoch's first id follows the last one handed out.
            self._offset += self._last_raw + 1 - raw_id
            self.restarts += 1
        self._last_raw = raw_id
        return raw_id + self._offset
