"""A portable copy of the engine's frame state: what a state swap moves.

A snapshot holds the retained frames (oldest first) with their KV rows and,
optionally, the vision rows they were computed from, so a second engine (the
reconciler) can hand an exactly recomputed state to the primary. Its RoPE
positions are whatever the producing engine used; a reconciled snapshot has
them re-based, contiguous right after the static prefix:

    position  0 .. P-1        static prefix (not in the snapshot: every engine computes it once)
              P + 32 i ..     frame i of the snapshot (i = 0 oldest)
    next_position = P + 32 n  where the next frame / the dynamic suffix goes

Between processes it travels as an .npz file written atomically (write to a
temporary name, then rename) so a reader never sees half a file. The file
holds the KV rows only when they are on the host (numpy backend); KV left on
a GPU (model/cuda_state_transfer.DeviceKV) goes by CUDA IPC instead, and the
file carries the rest: frames, positions, pooled and vision rows.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..model.backend import kv_payload
from .kv_slots import unit_vectors_of


class SnapshotError(ValueError):
    """A snapshot does not fit the engine that is asked to apply it (names the mismatch)."""


@dataclass
class FrameRecord:
    """What the engine remembers about a retained frame beyond its KV slots."""
    frame_id: int
    stamp_s: float
    tokens: np.ndarray | None = None     # [tokens_per_frame, hidden] float32 vision rows (None: not known here)


@dataclass(frozen=True)
class StateChunk:
    """One admitted frame as the state stores it: enough to recompute its KV anywhere."""
    frame_id: int
    stamp_s: float
    tokens: np.ndarray           # [tokens_per_frame, hidden] float32 vision-encoder rows
    pooled: np.ndarray           # [hidden] float32 pooled embedding (semantic eviction)


@dataclass(frozen=True)
class SnapshotFrame:
    frame_id: int
    stamp_s: float
    position_start: int          # RoPE position of the frame's first token
    pooled: np.ndarray           # [hidden] float32 pooled embedding (semantic eviction)


@dataclass
class StateSnapshot:
    version: int
    frames: list = field(default_factory=list)   # [SnapshotFrame], oldest first
    kv: np.ndarray | None = None                  # [2, layers, len(frames) * tokens_per_frame, kv_dim] float32
    next_position: int = 0                        # first free RoPE position after these frames
    prefix_ids: np.ndarray | None = None          # [P] int64 static prefix the KV was computed after (None: unchecked)
    rows: np.ndarray | None = None                # [len(frames), tokens_per_frame, hidden] float32 vision rows, optional
    # Frame ids the snapshot's author never saw: open intervals (lo, hi) of ids, e.g. while the reconciler
    # was inactive or after lost chunk messages. It made no decision about those frames (see never_saw).
    unseen: list = field(default_factory=list)
    # The version of the first offer of the reconciliation round this snapshot belongs to: a round offers
    # fresher versions while it waits for the primary, and once one of them is applied the others are moot.
    round: int = 0
    # [len(frames), hidden] float64 unit vectors of the pooled embeddings (kv_slots.unit_vectors), computed off the
    # cycle thread by prepare_units (the swap loader) so that placing ~125 frames at the boundary does not; None:
    # the swap computes them there.
    units: np.ndarray | None = None
    # Its frames laid into the applying engine's slots (kv_slots.Placement), planned by the swap's loader
    # (FrameState.prepare_swap) so that the boundary only puts the layout in force; None: planned there.
    placement: object | None = field(default=None, repr=False, compare=False)
    # What check_against last passed: the engine dimensions it was given and which arrays it looked at. The
    # swap's loader checks a loaded snapshot off the cycle thread (SwapClient's precheck); the boundary then
    # finds the same key and skips the work. A snapshot is not changed after its loader hands it over.
    _checked: tuple | None = field(default=None, repr=False, compare=False)

    def prepare_units(self) -> None:
        """Compute `units` now, on the loader thread: placing 60 frames of the 1.5B shape took 0.70 ms with
        them computed at the boundary and 0.13 ms with them given (the build machine)."""
        try:
            self.units = unit_vectors_of([f.pooled for f in self.frames])
        except ValueError:          # not finite, or of mixed widths: check_against names what is wrong
            self.units = None

    def never_saw(self, frame_id: int) -> bool:
        """True when `frame_id` fell in a gap of the author's mirror: not dropped on purpose."""
        return any(lo < frame_id < hi for lo, hi in self.unseen)

    @property
    def frame_ids(self) -> list[int]:
        return [f.frame_id for f in self.frames]

    @property
    def newest_frame_id(self) -> int:
        return max(self.frame_ids, default=-1)

    def save(self, path: str | os.PathLike) -> Path:
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        prefix = None if self.prefix_ids is None else [int(t) for t in self.prefix_ids]
        meta = {"version": self.version, "next_position": self.next_position, "prefix_ids": prefix,
                "frames": [[f.frame_id, f.stamp_s, f.position_start] for f in self.frames],
                "unseen": [[int(lo), int(hi)] for lo, hi in self.unseen], "round": int(self.round)}
        pooled = np.stack([f.pooled for f in self.frames]) if self.frames else np.zeros((0, 0), np.float32)
        # KV left on a device (a DeviceKV) travels by its IPC handle in the swap offer, not in the file.
        payload = kv_payload(self.kv)
        host_kv = payload.rows if payload is not None and not payload.on_device else np.zeros(0, np.float32)
        arrays = {"meta": np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8), "kv": host_kv, "pooled": pooled}
        if self.rows is not None:
            arrays["rows"] = self.rows
        with open(tmp, "wb") as fh:
            np.savez(fh, **arrays)
        os.replace(tmp, path)
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> "StateSnapshot":
        with np.load(Path(path)) as z:
            meta = json.loads(bytes(z["meta"]).decode())
            pooled, kv = z["pooled"], z["kv"]
            rows = z["rows"] if "rows" in z.files else None
        frames = [SnapshotFrame(int(fid), float(st), int(ps), pooled[i].astype(np.float32))
                  for i, (fid, st, ps) in enumerate(meta["frames"])]
        prefix = meta.get("prefix_ids")
        return cls(version=int(meta["version"]), frames=frames, kv=kv if frames else None,
                   next_position=int(meta["next_position"]),
                   prefix_ids=None if prefix is None else np.asarray(prefix, dtype=np.int64),
                   rows=rows if frames else None,
                   unseen=[(int(lo), int(hi)) for lo, hi in meta.get("unseen", [])], round=int(meta.get("round", 0)))

    def check_against(self, *, prefix_ids: np.ndarray, tokens_per_frame: int, num_layers: int, kv_dim: int,
                      hidden_size: int) -> None:
        """Raise SnapshotError naming the first field that does not fit an engine of these dimensions. Passed
        once (e.g. on the loader thread), the same call again returns at once; a failed one is re-run, so
        it raises the same error wherever it is asked."""
        key = (tokens_per_frame, num_layers, kv_dim, hidden_size, np.asarray(prefix_ids).tobytes(),
               id(self.frames), len(self.frames), id(self.kv), id(self.rows), id(self.prefix_ids), self.next_position)
        if self._checked == key:
            return
        self._check_fields(tokens_per_frame, num_layers, kv_dim, hidden_size, prefix_ids)
        self._checked = key

    def _check_fields(self, tokens_per_frame: int, num_layers: int, kv_dim: int, hidden_size: int,
                      prefix_ids: np.ndarray) -> None:
        n = len(self.frames)
        ids = self.frame_ids
        if len(set(ids)) != n:
            raise SnapshotError(f"snapshot v{self.version}: frame ids must be unique, got {ids[:16]}")
        starts = [f.position_start for f in self.frames]
        if any(b < a + tokens_per_frame for a, b in zip(starts, starts[1:])):
            raise SnapshotError(f"snapshot v{self.version}: frame positions must increase by at least "
                                f"{tokens_per_frame}, got starts {starts[:16]}")
        if self.prefix_ids is not None and not np.array_equal(self.prefix_ids, prefix_ids):
            raise SnapshotError(f"snapshot v{self.version}: computed after a different static prefix "
                                f"({self.prefix_ids.size} tokens) than this engine's ({len(prefix_ids)} tokens)")
        expected = (2, num_layers, n * tokens_per_frame, kv_dim)
        if n and (self.kv is None or self.kv.shape != expected or self.kv.dtype != np.float32):
            got = None if self.kv is None else f"{self.kv.dtype} {self.kv.shape}"
            raise SnapshotError(f"snapshot v{self.version}: kv must be float32 {expected}, got {got}")
        if n and not kv_payload(self.kv).all_finite():
            raise SnapshotError(f"snapshot v{self.version}: kv contains NaN or Inf")
        # Checked here, not first when the frames are placed: by then the state in force is already gone.
        shapes = {np.shape(f.pooled) for f in self.frames}
        if n and shapes != {(hidden_size,)}:
            raise SnapshotError(f"snapshot v{self.version}: pooled embeddings must be vectors of {hidden_size}, "
                                f"got shapes {sorted(shapes)[:4]}")
        if n and not np.isfinite(np.stack([np.asarray(f.pooled) for f in self.frames])).all():
            raise SnapshotError(f"snapshot v{self.version}: pooled embeddings contain NaN or Inf")
        if self.rows is not None and self.rows.shape != (n, tokens_per_frame, hidden_size):
            raise SnapshotError(f"snapshot v{self.version}: rows must be {(n, tokens_per_frame, hidden_size)}, "
                                f"got {self.rows.shape}")
        if n and self.next_position < self.frames[-1].position_start + tokens_per_frame:
            raise SnapshotError(f"snapshot v{self.version}: next_position {self.next_position} is inside its newest "
                                f"frame (starts at {self.frames[-1].position_start})")
