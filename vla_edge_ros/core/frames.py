"""Plain data carried between the camera, the engine and the nodes (no ROS types)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Frame:
    pixels: np.ndarray      # [H, W, 3] uint8 RGB (camera_ingest delivers the encoder size)
    stamp_s: float          # capture time in seconds, on the clock the consumer compares against
    frame_id: int           # producer sequence number, strictly increasing

    def __post_init__(self):
        p = self.pixels
        if not (isinstance(p, np.ndarray) and p.dtype == np.uint8 and p.ndim == 3 and p.shape[2] == 3):
            raise ValueError(f"Frame.pixels must be uint8 [H, W, 3], got {getattr(p, 'dtype', type(p))} {getattr(p, 'shape', '')}")
        if p.shape[0] == 0 or p.shape[1] == 0:
            raise ValueError(f"Frame.pixels is empty: shape {p.shape}")
