"""The control cycle: one frame in, one action or one explained fallback out.

`Engine.run_cycle` composes the parts of core/ in the order of DESIGN.md:

    freshest frame -> stale check -> admission (refuse before starting)
      -> vision encoder (32 tokens) -> KV slots (evict by policy if full)
      -> prefill [new frame tokens + dynamic suffix] over the cached prefix and frames
      -> action tokens: the first from the prefill's last logits, the rest from
         single-token decode steps, every argmax restricted to the action bins
      -> deadline check -> CycleResult

The engine owns no thread and no clock loop: the reasoning node, the
benchmarks and the tests drive it. It never raises for a failure inside a
cycle; that becomes an `engine_error` fallback and the next cycle runs.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np

from ..config import VlaConfig
from . import cycle_result as R
from .action_codec import ActionCodec, NonFiniteLogitsError
from .admission import AdmissionController
from .cycle_result import CycleResult
from .frames import Frame
from .kv_slots import KVSlotManager, make_policy
from .metrics import CycleMetrics
from .prompt import encode_text, prefix_text, suffix_ids
from .state_snapshot import SnapshotFrame, StateSnapshot
from .vision_encoder import VisionEncoder

log = logging.getLogger(__name__)


class EngineConfigError(ValueError):
    """The engine cannot be built with this configuration and model (raised at configure time)."""


@dataclass
class FrameRecord:
    """What the engine remembers about a retained frame beyond its KV slots."""
    frame_id: int
    stamp_s: float


class Engine:
    def __init__(self, cfg: VlaConfig, backend, tokenizer, encoder: VisionEncoder | None = None):
        self.cfg = cfg
        self.backend = backend
        self.tokenizer = tokenizer
        spec = backend.spec
        if backend.capacity != cfg.kv.capacity_tokens:
            raise EngineConfigError(f"backend KV arena has {backend.capacity} slots, kv.capacity_tokens is {cfg.kv.capacity_tokens}")
        self.encoder = encoder or VisionEncoder(cfg.vision, spec.hidden_size)
        self.codec = ActionCodec(spec.vocab_size, cfg.action)
        self.admission = AdmissionController(cfg.cycle, cfg.admission)
        self.metrics = CycleMetrics(cfg.cycle.deadline_ms)
        self.kv = KVSlotManager(cfg.kv.capacity_tokens, cfg.vision.tokens_per_frame,
                                make_policy(cfg.kv.eviction_policy, cfg.kv.window_frames))
        # Transient slots a cycle may need: the longest suffix plus the decoded tokens fed back.
        self.suffix_reserve = cfg.prompt.max_suffix_tokens + cfg.action.num_tokens
        self.frames: dict[int, FrameRecord] = {}
        self.cycle_id = 0
        self.last_frame_id: int | None = None
        self._unwritten_frame: int | None = None
        self._check_memory_budget()
        self._prefill_prefix()
        self.set_instruction(cfg.prompt.instruction)

    @classmethod
    def from_config(cls, cfg: VlaConfig) -> "Engine":
        from ..model.factory import create_backend, load_model
        _spec, _weights, tokenizer = load_model(cfg.model.path)
        backend = create_backend(cfg.model.backend, cfg.model.path, capacity=cfg.kv.capacity_tokens)
        return cls(cfg, backend, tokenizer)

    # ------------------------------------------------------------------ public

    def set_instruction(self, text: str) -> None:
        """Replace the task instruction; the next cycle's suffix uses it. Cached frames stay valid."""
        ids = suffix_ids(self.tokenizer, self.cfg.prompt, text)
        self.instruction = text
        self.suffix = ids                                       # [S] int64

    def run_cycle(self, frame: Frame | None, now_s: float, cycle_start_perf: float | None = None) -> CycleResult:
        t0 = time.perf_counter() if cycle_start_perf is None else cycle_start_perf
        result = CycleResult(cycle_id=self.cycle_id)
        self.cycle_id += 1
        try:
            self._run(frame, now_s, t0, result)
        except NonFiniteLogitsError as exc:
            self._fail(result, R.ENGINE_ERROR, f"non-finite logits: {exc}")
        except Exception as exc:  # noqa: BLE001 - a cycle must end in a fallback, never an exception
            log.exception("cycle %d failed", result.cycle_id)
            self._fail(result, R.ENGINE_ERROR, f"{type(exc).__name__}: {exc}")
        finally:
            self.kv.release_transient()
            self._drop_unwritten_frame()
        result.elapsed_ms = (time.perf_counter() - t0) * 1000.0
        late = result.elapsed_ms > self.cfg.cycle.deadline_ms
        if late and result.is_action:
            result.overran = True
            if not self.cfg.cycle.deterministic:
                # Acting on an answer that arrived after its deadline is exactly what we refuse to do.
                result.reason = R.DEADLINE_MISSED
                result.action = None          # tokens stay for debugging; nothing actionable leaves
                result.detail = f"finished at {result.elapsed_ms:.2f} ms > deadline {self.cfg.cycle.deadline_ms} ms"
        self.metrics.record(result)
        return result

    def append_frame(self, frame: Frame) -> list[int]:
        """Add a frame to the state exactly (no action decode): the reconciler's mirror path."""
        evicted = self._append(frame)
        self.last_frame_id = frame.frame_id
        return evicted

    def export_state(self, version: int = 0) -> StateSnapshot:
        """The retained frames and their KV rows, oldest first (what a reconciler offers in a swap)."""
        retained = self.kv.retained()
        frames = [SnapshotFrame(r.frame_id, self.frames[r.frame_id].stamp_s, r.position_start, r.pooled)
                  for r in retained]
        slots = np.concatenate([r.slots for r in retained]) if retained else np.zeros(0, np.int32)
        kv = self.backend.read_kv(slots) if retained else None
        return StateSnapshot(version=version, frames=frames, kv=kv, next_position=self.next_position)

    def import_state(self, snap: StateSnapshot) -> list[int]:
        """Replace the frame state with `snap` at a cycle boundary.

        Frames this engine appended after the newest frame of the snapshot are
        kept (with their own KV) after the snapshot's frames: a swap never
        loses a chunk that arrived while the snapshot was being prepared.
        Returns the frame ids dropped by the swap.
        """
        newest = max(snap.frame_ids, default=-1)
        mine = self.kv.retained()
        later = [r for r in mine if r.frame_id > newest]
        later_kv = [self.backend.read_kv(r.slots) for r in later]
        later_meta = [(r, self.frames[r.frame_id]) for r in later]
        dropped = [r.frame_id for r in mine if r.frame_id not in snap.frame_ids and r.frame_id <= newest]
        self.kv.evict_frames([r.frame_id for r in mine])
        self.frames.clear()
        tpf = self.cfg.vision.tokens_per_frame
        for i, f in enumerate(snap.frames):
            adm = self.kv.add_frame(f.frame_id, f.pooled, f.position_start, reserve=self.suffix_reserve)
            self.backend.write_kv(adm.slots, snap.kv[:, :, i * tpf:(i + 1) * tpf])
            self.frames[f.frame_id] = FrameRecord(f.frame_id, f.stamp_s)
        for (r, rec), kv in zip(later_meta, later_kv):
            adm = self.kv.add_frame(r.frame_id, r.pooled, r.position_start, reserve=self.suffix_reserve)
            self.backend.write_kv(adm.slots, kv)
            self.frames[r.frame_id] = rec
        self.next_position = max(self.next_position, snap.next_position)
        return dropped

    def state_summary(self) -> dict:
        retained = self.kv.retained()
        return {
            "prefix_tokens": int(self.prefix_slots.size),
            "frames": len(retained),
            "frame_tokens": len(retained) * self.cfg.vision.tokens_per_frame,
            "suffix_tokens": int(self.suffix.size),
            "kv_capacity": self.cfg.kv.capacity_tokens,
            "kv_fill": self.kv.fill_fraction,
            "evictions": self.kv.evictions,
            "next_position": self.next_position,
            "memory_bytes": self.backend.memory_bytes(),
        }

    # ------------------------------------------------------------- the cycle

    def _run(self, frame, now_s, t0, result: CycleResult) -> None:
        cyc = self.cfg.cycle
        if frame is None:
            return self._fail(result, R.NO_FRAME, "no camera frame received yet")
        result.frame_id, result.frame_stamp_s = frame.frame_id, frame.stamp_s
        age_ms = (now_s - frame.stamp_s) * 1000.0
        if age_ms > cyc.stale_frame_ms:
            return self._fail(result, R.STALE_FRAME, f"freshest frame is {age_ms:.1f} ms old > {cyc.stale_frame_ms} ms")
        if self.backend.memory_bytes() > self.cfg.memory.vram_ceiling_bytes:
            return self._fail(result, R.MEMORY_CEILING, "engine memory above memory.vram_ceiling_gib")

        new = frame.frame_id != self.last_frame_id
        tpf = self.cfg.vision.tokens_per_frame
        prefill_tokens = (tpf if new else 0) + int(self.suffix.size)
        decode_steps = self.cfg.action.num_tokens - 1
        decision = self.admission.decide((time.perf_counter() - t0) * 1000.0, prefill_tokens, decode_steps)
        result.estimate_ms, result.budget_ms = decision.estimate_ms, decision.budget_ms
        if not decision.admit and not cyc.deterministic:
            return self._fail(result, R.REFUSED_BUDGET,
                              f"estimate {decision.estimate_ms:.2f} ms > budget {decision.budget_ms:.2f} ms")

        t_prefill = time.perf_counter()
        rows, positions, write_slots = [], [], []
        if new:
            encoded = self.encoder.encode(frame.pixels)
            frame_slots, result.evicted_frame_ids = self._admit_frame(frame, encoded.pooled)
            self._unwritten_frame = frame.frame_id                              # until the prefill succeeds
            rows.append(encoded.tokens)                                         # [32, hidden]
            positions.append(np.arange(self.next_position, self.next_position + tpf))
            write_slots.append(frame_slots)
            self.next_position += tpf
            self.last_frame_id = frame.frame_id
            result.new_frame = True
        context = self._context_excluding(write_slots)
        suffix_slots = self.kv.alloc_transient(int(self.suffix.size) + decode_steps)
        s = int(self.suffix.size)
        rows.append(self.backend.embed(self.suffix))                            # [S, hidden]
        positions.append(np.arange(self.next_position, self.next_position + s))
        write_slots.append(suffix_slots[:s])
        out = self.backend.forward(np.concatenate(rows).astype(np.float32, copy=False),
                                   np.concatenate(positions).astype(np.int64),
                                   np.concatenate(write_slots).astype(np.int32),
                                   context, logits="last")
        tokens = [self.codec.select(out.logits[-1])]
        t_decode = time.perf_counter()

        # Decode: each step attends to everything so far, including the suffix and earlier action tokens.
        ctx = np.concatenate([context] + write_slots).astype(np.int32)
        pos = self.next_position + s
        for step in range(decode_steps):
            slot = suffix_slots[s + step: s + step + 1]
            out = self.backend.forward(self.backend.embed(np.asarray(tokens[-1:], dtype=np.int64)),
                                       np.asarray([pos + step], dtype=np.int64), slot, ctx, logits="last")
            tokens.append(self.codec.select(out.logits[-1]))
            ctx = np.concatenate([ctx, slot])
        t_end = time.perf_counter()

        result.prefill_ms = (t_decode - t_prefill) * 1000.0
        result.decode_ms = (t_end - t_decode) * 1000.0
        result.prefill_tokens = prefill_tokens
        self.admission.observe(result.prefill_ms, prefill_tokens, result.decode_ms, max(decode_steps, 1))
        result.tokens = np.asarray(tokens, dtype=np.int64)
        result.action = self.codec.to_values(result.tokens)
        self._unwritten_frame = None                    # finite logits all the way: the frame's KV is good

    # --------------------------------------------------------------- helpers

    def _fail(self, result: CycleResult, reason: str, detail: str) -> None:
        result.reason, result.detail = reason, detail
        result.action = result.tokens = None

    def _admit_frame(self, frame: Frame, pooled: np.ndarray) -> tuple[np.ndarray, list[int]]:
        admission = self.kv.add_frame(frame.frame_id, pooled, self.next_position, reserve=self.suffix_reserve)
        evicted = [f.frame_id for f in admission.evicted]
        for fid in evicted:
            self.frames.pop(fid, None)
        self.frames[frame.frame_id] = FrameRecord(frame.frame_id, frame.stamp_s)
        return admission.slots, evicted

    def _drop_unwritten_frame(self) -> None:
        """A frame whose prefill failed has garbage KV: forget it rather than attend to it later."""
        fid, self._unwritten_frame = self._unwritten_frame, None
        if fid is not None:
            self.kv.evict_frames([fid])
            self.frames.pop(fid, None)
            self.last_frame_id = None

    def _append(self, frame: Frame) -> list[int]:
        encoded = self.encoder.encode(frame.pixels)
        slots, evicted = self._admit_frame(frame, encoded.pooled)
        tpf = self.cfg.vision.tokens_per_frame
        context = self._context_excluding([slots])
        self.backend.forward(encoded.tokens, np.arange(self.next_position, self.next_position + tpf, dtype=np.int64),
                             slots, context, logits="none")
        self.next_position += tpf
        return evicted

    def _context_excluding(self, written: list) -> np.ndarray:
        """Cached slots (prefix + retained frames) minus the ones this call is writing."""
        ctx = self.kv.context_slots()
        if written:
            ctx = ctx[~np.isin(ctx, np.concatenate(written))]
        return ctx.astype(np.int32)

    def _prefill_prefix(self) -> None:
        ids = encode_text(self.tokenizer, prefix_text(self.cfg.prompt))
        free_after = self.cfg.kv.capacity_tokens - ids.size - self.suffix_reserve
        if free_after < self.cfg.vision.tokens_per_frame:
            raise EngineConfigError(
                f"prompt prefix ({ids.size} tokens) leaves no room for one frame in kv.capacity_tokens={self.cfg.kv.capacity_tokens}")
        self.prefix_slots = self.kv.reserve_prefix(int(ids.size))
        if ids.size:
            self.backend.forward(self.backend.embed(ids), np.arange(ids.size, dtype=np.int64),
                                 self.prefix_slots, np.zeros(0, dtype=np.int32), logits="none")
        self.next_position = int(ids.size)

    def _check_memory_budget(self) -> None:
        used = self.backend.memory_bytes()
        if used > self.cfg.memory.vram_ceiling_bytes:
            raise EngineConfigError(
                f"model + KV arena need {used / 2**30:.2f} GiB > memory.vram_ceiling_gib={self.cfg.memory.vram_ceiling_gib}")
