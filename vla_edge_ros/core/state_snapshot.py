"""A portable copy of the engine's frame state: what a state swap moves.

The snapshot holds the retained frames (oldest first) with their KV rows, so a
second engine (the reconciler) can hand an exactly recomputed state to the
primary. On the CPU backend it travels as an .npz file written atomically
(write to a temporary name, then rename) so a reader never sees half a file.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class SnapshotFrame:
    frame_id: int
    stamp_s: float
    position_start: int          # RoPE position of the frame's first token
    pooled: np.ndarray           # [hidden] float32 pooled vision embedding (semantic eviction)


@dataclass
class StateSnapshot:
    version: int
    frames: list = field(default_factory=list)   # [SnapshotFrame], oldest first
    kv: np.ndarray | None = None                  # [2, layers, len(frames) * tokens_per_frame, kv_dim] float32
    next_position: int = 0                        # first free RoPE position after these frames

    @property
    def frame_ids(self) -> list[int]:
        return [f.frame_id for f in self.frames]

    def save(self, path: str | os.PathLike) -> Path:
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        meta = {"version": self.version, "next_position": self.next_position,
                "frames": [[f.frame_id, f.stamp_s, f.position_start] for f in self.frames]}
        pooled = np.stack([f.pooled for f in self.frames]) if self.frames else np.zeros((0, 0), np.float32)
        with open(tmp, "wb") as fh:
            np.savez(fh, meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8),
                     kv=self.kv if self.kv is not None else np.zeros(0, np.float32), pooled=pooled)
        os.replace(tmp, path)
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> "StateSnapshot":
        with np.load(Path(path)) as z:
            meta = json.loads(bytes(z["meta"]).decode())
            pooled, kv = z["pooled"], z["kv"]
        frames = [SnapshotFrame(int(fid), float(st), int(ps), pooled[i].astype(np.float32))
                  for i, (fid, st, ps) in enumerate(meta["frames"])]
        return cls(version=int(meta["version"]), frames=frames, kv=kv if frames else None,
                   next_position=int(meta["next_position"]))
