"""The engine's frame state between cycles: append, rebuild, export and import (the swap).

`FrameState` owns the CSR state itself: the KV slot bookkeeping of the arena
(prefix, frames as chunks, the transient suffix), the frames' vision rows,
their RoPE positions and the state version. Its operations are the ones the
control cycle and the reconciler share: frames appended exactly as chunks
(the reconciler's mirror and chunked prefill), the synchronous rebuild in
place, the snapshot a reconciled swap carries (`export_state`; applying
one, `import_state`, is core/state_swap.py's mixin `SwapImport`), RoPE
re-basing before positions leave the model's trained range, and the token
accounting. The cycle (core/engine.py, `Engine`) owns
one FrameState; the reconciler (core/reconciliation.py) owns one too, with
its own backend, and no cycle.

Every operation here changes the state only at a cycle boundary
(`SwapTimingError` otherwise), and re-bases positions right after the static
prefix, so the result is the state a from-scratch forward would build.
"""
from __future__ import annotations

import logging

import numpy as np

from ..config import VlaConfig
from .frames import Frame
from .kv_slots import KVCapacityError, KVSlotManager, RetainedFrame, make_policy
from .layered_append import AppendBatch, LayeredAppend
from .prompt import encode_text, prefix_text
from .released_rows import ReleasedRows
from .sample_window import SampleWindow
from .state_snapshot import FrameRecord, SnapshotFrame, StateChunk, StateSnapshot
from .state_swap import SwapImport, SwapReport
from .vision_encoder import VisionEncoder

log = logging.getLogger(__name__)


class SwapTimingError(RuntimeError):
    """A state swap or rebuild was attempted inside a cycle; they happen only at cycle boundaries."""


class FrameStateError(ValueError):
    """A frame state cannot be built with this configuration and model (the prefix leaves no room)."""


class FrameState(SwapImport, LayeredAppend):
    """The CSR frame state on one backend (see the module docstring).

    Built on a backend whose arena is empty: the static prefix is computed here, once.
    """

    def __init__(self, cfg: VlaConfig, backend, tokenizer, encoder: VisionEncoder | None = None,
                 takes_swaps: bool = True):
        """takes_swaps: False for a reconciler's state, which exports states and imports none (it keeps no
        released rows)."""
        self.cfg = cfg
        self.backend = backend
        self.encoder = encoder or VisionEncoder(cfg.vision, backend.spec.hidden_size, backend)
        self.prefetch = None          # a core/vision_prefetch.VisionPrefetch while the reasoning node runs one
        self.kv = KVSlotManager(cfg.kv.capacity_tokens, cfg.vision.tokens_per_frame,
                                make_policy(cfg.kv.eviction_policy, cfg.kv.window_frames))
        # Transient slots a cycle may need: the longest suffix plus the decoded tokens fed back.
        self.suffix_reserve = cfg.prompt.max_suffix_tokens + cfg.action.num_tokens
        self.frames: dict[int, FrameRecord] = {}
        self.last_frame_id: int | None = None
        self.in_cycle = False                   # set by the cycle around its work: state changes wait for the boundary
        self._unwritten_frame: int | None = None
        # asr.swap_finish next_cycle: the latest swap's late frames, admitted (slots, positions, rows) but their KV
        # not written: the next cycle writes them at its start (write_pending), oldest first.
        self._pending: list[int] = []
        # asr.swap_finish next_cycle: the latest swap's KV copy, queued and not yet checked (version, KvWrite);
        # settle_swap_copy waits for it and checks it was not torn before anything reads the state.
        self._swap_copy: tuple | None = None
        self.torn_after_apply = 0               # swaps whose copy settle_swap_copy found torn (state emptied)
        self.state_version = 0                  # bumped by every applied swap
        self.approximate_evictions = 0          # policy evictions since the state was last exact
        # Rows written to the KV arena per segment since construction (CSR accounting).
        self.computed_tokens = {"prefix": 0, "frames": 0, "suffix": 0, "decode": 0}
        self.last_swap: SwapReport | None = None
        self.last_rebase: dict | None = None    # what the latest re-base kept and forgot
        # Measured ms to recompute one frame over the state (a swap's late frames, the warm-up's re-base step,
        # one frame per forward unless asr.late_frames_per_forward batches a swap's): the median of recent
        # samples (note_recompute); None until measured. A lone frame's forward costs more per token than a
        # cycle's longer prefill (on the CPU model ~2x), so the swap budget needs this, not the cycle's rate.
        self.recompute_ms_per_frame: float | None = None
        self._recompute_samples = SampleWindow(cfg.admission.tail_window)   # per-frame ms, for the median and tail
        self._recompute_tail: float | None = None
        # What a swap costs besides its recompute (checks, placing the frames, the KV copy), measured per swap:
        # the swap budget keeps room for its slow end before it prices late frames (swap_fixed_ms_tail).
        self._swap_fixed_samples = SampleWindow(cfg.admission.tail_window)
        self.swap_fixed_ms_tail = 0.0
        # How export_state packs the KV rows: None reads them to the host (numpy array); a callable
        # (backend, slots) -> KV holder keeps them on the device (model/cuda_state_transfer.DeviceKvExporter).
        self.kv_export = None
        self._prefill_prefix(tokenizer)
        # asr.snapshot_rows false: offers come without vision rows, and a swap takes them from the frames it holds
        # or from here: the rows of the frames its policy evicted, the newest frame_capacity of them. Enough: a
        # round's frames were all held here at its trigger or admitted since, the policy evicts at most one frame
        # per frame admitted, and a round is aborted before more than frame_capacity frames are admitted. In
        # memory reserved now (core/released_rows.py says why).
        self._released_rows: ReleasedRows | None = (
            None if cfg.asr.snapshot_rows or not takes_swaps or self.frame_capacity <= 0
            else ReleasedRows(self.frame_capacity, cfg.vision.tokens_per_frame, backend.spec.hidden_size))

    def append_frame(self, frame: Frame) -> list[int]:
        """Add a frame to the state exactly (no action decode): the reconciler's mirror path.

        Returns the frame ids the eviction policy removed to make room.
        """
        evicted = self.append_chunks([self.encode_chunk(frame)], allow_evict=True)
        self.last_frame_id = frame.frame_id
        return evicted

    def encode_chunk(self, frame: Frame) -> StateChunk:
        """The frame as a state chunk (rows + pooled embedding): its encoding made ahead of the boundary where a
        prefetch has it (vision.encode_ahead, core/vision_prefetch.py: the same encoder, the same bits), else the
        vision encoder run now."""
        encoded = self.prefetch.take(frame) if self.prefetch is not None else None
        if encoded is None:
            encoded = self.encoder.encode(frame.pixels)
        return StateChunk(frame.frame_id, frame.stamp_s, encoded.tokens, encoded.pooled)

    def append_chunks(self, chunks, allow_evict: bool = False) -> list[int]:
        """Append pre-encoded frames after the newest one, with contiguous positions, in one forward.

        allow_evict=False: raise KVCapacityError (state untouched) unless all of
        them fit with one cycle's suffix reserve and no eviction: the
        reconciler's chunked prefill, which must stay exact.
        allow_evict=True: the policy makes room as in a cycle (approximate).
        Returns the frame ids evicted to make room.
        """
        self._require_boundary("append_chunks")
        self.require_no_append_in_flight("append_chunks")
        evicted, batch = self._admit_batch(list(chunks), allow_evict)
        if batch is None:
            return evicted
        done = False
        try:
            self.backend.forward(batch.rows, batch.positions, batch.slots, batch.context, logits="none")
            done = True
        finally:
            if not done:    # garbage KV: forget these frames rather than attend to them later
                self._forget_batch(batch)
        self._commit_batch(batch)
        return evicted

    def _admit_batch(self, chunks: list, allow_evict: bool) -> tuple[list, AppendBatch | None]:
        """append_chunks' admission (see it): the frames into slots with contiguous positions; returns the frames
        the policy evicted and what the forward must compute (None when nothing is left to compute: no chunk,
        or the policy evicted every one of them; the positions have advanced then)."""
        if self._pending:      # they are the newest and unwritten: a forward here would attend to garbage KV
            raise RuntimeError(f"append_chunks: frames {self._pending} wait for the next cycle (write_pending)")
        if not chunks:
            return [], None
        tpf, hidden = self.cfg.vision.tokens_per_frame, self.backend.spec.hidden_size
        for c in chunks:
            if c.tokens.shape != (tpf, hidden) or c.tokens.dtype != np.float32:
                raise ValueError(f"chunk {c.frame_id}: tokens must be float32 {(tpf, hidden)}, "
                                 f"got {c.tokens.dtype} {c.tokens.shape}")
        need = len(chunks) * tpf + self.suffix_reserve
        if not allow_evict and self.kv.free_slots < need:
            raise KVCapacityError(f"append_chunks: {len(chunks)} frames + suffix reserve need {need} free slots, "
                                  f"{self.kv.free_slots} free ({len(self.frames)} frames retained)")
        evicted: list[int] = []
        for i, c in enumerate(chunks):
            _slots, out = self.admit_chunk(c, self.next_position + i * tpf)
            evicted += out
        # A policy may evict a frame of this very batch: it was never computed, so it simply is not.
        by_id = {c.frame_id: c for c in chunks}
        kept = [r for r in self.kv.retained() if r.frame_id in by_id]                        # oldest first
        if not kept:
            self.next_position += len(chunks) * tpf
            return evicted, None
        slots = np.concatenate([r.slots for r in kept])                                      # [k * tpf]
        rows = np.concatenate([by_id[r.frame_id].tokens for r in kept])                      # [k * tpf, hidden]
        positions = np.concatenate([np.arange(r.position_start, r.position_start + tpf) for r in kept]).astype(np.int64)
        return evicted, AppendBatch(frame_ids=[r.frame_id for r in kept], rows=rows, positions=positions, slots=slots,
                                    context=self.context_without_newest(len(kept)), chunks=len(chunks))

    def _commit_batch(self, batch: AppendBatch) -> None:
        """The batch's forward has written its K/V: the positions move past all of its chunks."""
        self.next_position += batch.chunks * self.cfg.vision.tokens_per_frame
        self.computed_tokens["frames"] += batch.rows.shape[0]

    def _forget_batch(self, batch: AppendBatch) -> None:
        """The batch's forward failed or was given up: its frames are forgotten (their K/V is garbage)."""
        self.kv.evict_frames(batch.frame_ids)
        for fid in batch.frame_ids:
            self.frames.pop(fid, None)

    def reset_frames(self) -> None:
        """Forget every frame; the static prefix stays (it is never recomputed). The state is exact again."""
        self._require_boundary("reset_frames")
        self.abandon_append()
        self.kv.evict_all()
        self.frames.clear()
        self._pending = []
        self.next_position = self.prefix_tokens
        self.approximate_evictions = 0
        self.last_frame_id = None                   # it names a held frame or none

    def rebuild_in_place(self, keep_ids, tokens_per_step: int | None = None) -> list[int]:
        """Synchronous exact recompute: keep these frames (oldest first), recompute their KV from the
        stored vision rows with re-based positions, chunked `tokens_per_step` rows per forward.

        This is what ASR avoids: the whole recompute happens on the serving engine, between two
        cycles. Returns the frame ids dropped.
        """
        self._require_boundary("rebuild_in_place")
        keep = [int(f) for f in keep_ids]
        missing = [f for f in keep if not self.kv.holds(f)]
        if missing:
            raise KeyError(f"rebuild_in_place: frames {missing} are not retained")
        no_rows = [f for f in keep if self.frames[f].tokens is None]
        if no_rows:
            raise ValueError(f"rebuild_in_place: frames {no_rows} have no stored vision rows to recompute from")
        chunks = [StateChunk(f, self.frames[f].stamp_s, self.frames[f].tokens, self._pooled_of(f)) for f in keep]
        keep_set = set(keep)
        dropped = [r.frame_id for r in self.kv.retained() if r.frame_id not in keep_set]
        last = self.last_frame_id
        self.reset_frames()
        per = max(1, (tokens_per_step or len(chunks) * self.cfg.vision.tokens_per_frame) // self.cfg.vision.tokens_per_frame)
        for i in range(0, len(chunks), per):
            self.append_chunks(chunks[i:i + per], allow_evict=False)
        self.last_frame_id = last if last in self.frames else None
        return dropped

    def export_state(self, version: int = 0, with_rows: bool = True) -> StateSnapshot:
        """The retained frames with their KV rows and, with_rows and where known, their vision rows, oldest
        first (asr.snapshot_rows says when a reconciler leaves them out)."""
        self.require_no_append_in_flight("export_state")
        retained = self.kv.retained()
        frames = [SnapshotFrame(r.frame_id, self.frames[r.frame_id].stamp_s, r.position_start, r.pooled)
                  for r in retained]
        slots = np.concatenate([r.slots for r in retained]) if retained else np.zeros(0, np.int32)
        kv = None
        if retained:
            kv = self.backend.read_kv(slots) if self.kv_export is None else self.kv_export(self.backend, slots)
        tokens = [self.frames[r.frame_id].tokens for r in retained] if with_rows else []
        rows = np.stack(tokens) if tokens and all(t is not None for t in tokens) else None
        return StateSnapshot(version=version, frames=frames, kv=kv, next_position=self.next_position,
                             prefix_ids=self.prefix_ids.copy(), rows=rows)

    def _release(self, record: FrameRecord | None) -> None:
        """A frame the policy evicted: its vision rows are kept (copied) for a swap whose offer comes without them."""
        if self._released_rows is None or record is None or record.tokens is None:
            return
        self._released_rows.keep(record.frame_id, record.tokens)

    def rebase_positions_if_needed(self, max_frames: int | None = None) -> bool:
        """Keep RoPE positions inside the model's trained range when no swap has re-based them.

        Positions only grow between swaps (about 1000 per second at 30 Hz). A
        reconciler's swap re-bases them; without one (absent, inactive, starved)
        the next frame would eventually pass `max_position_embeddings`, where the
        model was never trained and float32 angles lose precision. Then the
        retained frames are recomputed in place right after the prefix, exactly.
        `max_frames` bounds that recompute: only the newest max_frames frames are
        kept and the older ones are forgotten (an exact, smaller state), so the
        cycle that pays for it still ends on time. Measured on the H200 with the
        1.5B shape at 4096 slots: recomputing all 125 frames took ~400 ms, a
        cycle started 12 boundaries late. The frames are recomputed one per
        forward (recompute_retained, which Engine.warm_up has run once), so that
        each costs what the budget plans (a first forward over several frames
        also captured a CUDA graph for that row count). `last_rebase` says what
        happened.
        """
        limit = self.backend.spec.max_position_embeddings
        if self.next_position + self.cfg.vision.tokens_per_frame + self.suffix_reserve <= limit:
            return False
        keep, dropped, forgotten = self.recompute_retained(max_frames)
        self.last_rebase = {"kept": len(keep), "forgotten": len(dropped), "budget_frames": max_frames}
        log.warning("RoPE positions reached %d of %d: %d frames recomputed from position %d, %d forgotten "
                    "(%d of them to keep the recompute within the cycle's budget)",
                    limit - self.cfg.vision.tokens_per_frame - self.suffix_reserve, limit, len(keep),
                    self.prefix_tokens, len(dropped), forgotten)
        return True

    def recompute_retained(self, max_frames: int | None = None) -> tuple[list[int], list[int], int]:
        """Recompute the retained frames that have stored vision rows in place, right after the prefix,
        exactly, one frame per forward (the re-base's step; Engine.warm_up runs it once so that its first
        live use pays no one-time cost); only the newest max_frames of them when given. Returns (the frame
        ids kept, the frame ids dropped, how many of those were dropped for max_frames)."""
        keep = [r.frame_id for r in self.kv.retained() if self.frames[r.frame_id].tokens is not None]
        forgotten = 0
        if max_frames is not None and len(keep) > max_frames:
            forgotten, keep = len(keep) - max_frames, keep[len(keep) - max_frames:]
        return keep, self.rebuild_in_place(keep, tokens_per_step=self.cfg.vision.tokens_per_frame), forgotten

    @property
    def prefix_tokens(self) -> int:
        return int(self.prefix_slots.size)

    @property
    def frame_capacity(self) -> int:
        """Frames that fit beside the prefix and one cycle's suffix reserve."""
        return (self.cfg.kv.capacity_tokens - self.prefix_tokens - self.suffix_reserve) // self.cfg.vision.tokens_per_frame

    @property
    def state_exact(self) -> bool:
        """True when the frame KV is what a from-scratch forward of the retained frames would give."""
        return self.approximate_evictions == 0

    def state_summary(self, suffix_tokens: int = 0) -> dict:
        """Token accounting of the CSR layout: prefix, chunks (frames) and the transient suffix (of
        `suffix_tokens` tokens, the cycle's), separately."""
        retained = self.kv.retained()
        tpf = self.cfg.vision.tokens_per_frame
        return {
            "prefix_tokens": self.prefix_tokens,
            "frames": len(retained),
            "frame_tokens": len(retained) * tpf,
            "suffix_tokens": int(suffix_tokens),
            "suffix_reserve": self.suffix_reserve,
            "transient_tokens": self.kv.transient_slots,
            "frame_capacity": self.frame_capacity,
            "kv_capacity": self.cfg.kv.capacity_tokens,
            "kv_fill": self.kv.fill_fraction,
            "evictions": self.kv.evictions,
            "approximate_evictions": self.approximate_evictions,
            "state_exact": self.state_exact,
            "state_version": self.state_version,
            "next_position": self.next_position,
            "computed_tokens": dict(self.computed_tokens),
            "memory_bytes": self.backend.memory_bytes(),
        }

    # --------------------------------------------------------------- helpers

    def admit_chunk(self, chunk: StateChunk, position_start: int,
                    held_before: RetainedFrame | None = None) -> tuple[np.ndarray, list[int]]:
        """Slots for a new frame starting at `position_start` (the policy evicts if full); remembers its rows.
        held_before: the slot manager's record of the same frame from before a swap (its pooled embedding is the
        chunk's), re-admitted without redoing its checks."""
        if held_before is not None:
            admission = self.kv.readmit(held_before, position_start, reserve=self.suffix_reserve)
        else:
            admission = self.kv.add_frame(chunk.frame_id, chunk.pooled, position_start, reserve=self.suffix_reserve)
        evicted = [f.frame_id for f in admission.evicted]
        for fid in evicted:
            self._release(self.frames.pop(fid, None))
        # Every policy eviction leaves a hole (and stale context) that a from-scratch forward would not have.
        self.approximate_evictions += len(evicted)
        self.frames[chunk.frame_id] = FrameRecord(chunk.frame_id, chunk.stamp_s, chunk.tokens)
        return admission.slots, evicted

    def drop_unwritten_frame(self) -> None:
        """A frame whose prefill failed has garbage KV: forget it rather than attend to it later."""
        fid, self._unwritten_frame = self._unwritten_frame, None
        if fid is not None:
            self._forget_newest([fid])
            self.last_frame_id = None

    def _forget_newest(self, frame_ids: list) -> None:
        """Forget these frames, the newest retained ones, whose KV was never written (a failed forward): their
        slots and records go, and their positions are given back so the next frame follows without a gap."""
        gone = self.kv.evict_frames(frame_ids)
        for fid in frame_ids:
            self.frames.pop(fid, None)
        self.next_position = min(g.position_start for g in gone)

    def _pooled_of(self, frame_id: int) -> np.ndarray:
        return next(r.pooled for r in self.kv.retained() if r.frame_id == frame_id)

    def _require_boundary(self, what: str) -> None:
        if self.in_cycle:
            raise SwapTimingError(f"{what} called inside a cycle: state changes happen at cycle boundaries")

    def mark_unwritten(self, frame_id: int) -> None:
        """The frame's KV is not written until the cycle's prefill succeeds (drop_unwritten_frame forgets it)."""
        self._unwritten_frame = frame_id

    def mark_written(self) -> None:
        self._unwritten_frame = None

    def _prefill_prefix(self, tokenizer) -> None:
        ids = encode_text(tokenizer, prefix_text(self.cfg.prompt))
        free_after = self.cfg.kv.capacity_tokens - ids.size - self.suffix_reserve
        if free_after < self.cfg.vision.tokens_per_frame:
            raise FrameStateError(
                f"prompt prefix ({ids.size} tokens) leaves no room for one frame in kv.capacity_tokens={self.cfg.kv.capacity_tokens}")
        self.prefix_slots = self.kv.reserve_prefix(int(ids.size))
        self.prefix_ids = ids                                   # [P] int64
        if ids.size:
            self.backend.forward(self.backend.embed(ids), np.arange(ids.size, dtype=np.int64),
                                 self.prefix_slots, np.zeros(0, dtype=np.int32), logits="none")
        self.computed_tokens["prefix"] += int(ids.size)
        self.next_position = int(ids.size)

    def context_without_newest(self, frames: int) -> np.ndarray:
        """Cached slots (prefix + retained frames, in order) without the newest `frames` frames: the ones the
        forward asking is writing (they were just admitted, so they are the newest)."""
        return self.kv.context_slots(without_newest=frames)
