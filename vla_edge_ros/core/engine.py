"""The control cycle: one frame in, one action or one explained fallback out.

`Engine.run_cycle` composes the parts of core/ in the order of DESIGN.md:

    freshest frame -> stale check -> admission (refuse before starting)
      -> vision encoder (32 tokens) -> KV slots (evict by policy if full)
      -> prefill [new frame tokens + dynamic suffix] over the cached prefix and frames
      -> action tokens: the first from the prefill's last logits, the rest from
         single-token decode steps, every argmax restricted to the action bins
      -> deadline check -> CycleResult

The state is the CSR layout of core/prompt.py: a static prefix computed once
at construction, frames appended as chunks of 32 vision tokens (their vision
rows are kept on the host so the state can be recomputed), and a transient
suffix written each cycle and released. Between cycles the state can be
replaced by a reconciled snapshot (`import_state`, the swap of core/
reconciliation.py) or recomputed in place (`rebuild_in_place`); both re-base
the frames' RoPE positions right after the prefix, so the result is the state
a from-scratch forward would build. `state_version` counts swaps;
`approximate_evictions` counts policy evictions since the state was last exact.

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
from .kv_slots import KVCapacityError, KVSlotManager, make_policy
from .metrics import CycleMetrics
from .prompt import encode_text, prefix_text, suffix_ids
from .state_snapshot import SnapshotError, SnapshotFrame, StateChunk, StateSnapshot
from .vision_encoder import VisionEncoder

log = logging.getLogger(__name__)


class EngineConfigError(ValueError):
    """The engine cannot be built with this configuration and model (raised at configure time)."""


class SwapTimingError(RuntimeError):
    """A state swap or rebuild was attempted inside a cycle; they happen only at cycle boundaries."""


@dataclass
class FrameRecord:
    """What the engine remembers about a retained frame beyond its KV slots."""
    frame_id: int
    stamp_s: float
    tokens: np.ndarray | None = None     # [tokens_per_frame, hidden] float32 vision rows (None: not known here)


@dataclass(frozen=True)
class SwapReport:
    """What `import_state` did (also kept as `Engine.last_swap`)."""
    version: int                 # state version now in force
    frames: int                  # frames taken from the snapshot
    dropped: list                # frame ids this engine held that the snapshot left out
    late: list                   # frame ids newer than the snapshot, recomputed over it
    late_lost: list              # late frames without vision rows: could not be recomputed, dropped
    evicted: list                # frames the policy evicted while the late ones were appended
    next_position: int


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
        self._in_cycle = False
        self.state_version = 0                  # bumped by every applied swap
        self.approximate_evictions = 0          # policy evictions since the state was last exact
        # Rows written to the KV arena per segment since construction (CSR accounting).
        self.computed_tokens = {"prefix": 0, "frames": 0, "suffix": 0, "decode": 0}
        self._last_prefill_logits: np.ndarray | None = None   # [vocab] of the latest cycle's prefill
        # A backend that can run the whole cycle on the device (CudaBackend) does so: no logits cross to
        # the host per token. The generic forward path stays for everything else (prefix, rebuilds, swaps).
        self.device_cycle = hasattr(backend, "run_cycle_tokens")
        self._device_prefills = 0
        if self.device_cycle:
            rows = cfg.vision.tokens_per_frame + cfg.prompt.max_suffix_tokens
            if rows > backend.max_rows:
                raise EngineConfigError(f"a cycle prefill of vision.tokens_per_frame + prompt.max_suffix_tokens = {rows} "
                                        f"rows exceeds the device backend's {backend.max_rows} rows per pass")
        self.last_swap: SwapReport | None = None
        # How export_state packs the KV rows: None reads them to the host (numpy array); a callable
        # (backend, slots) -> KV holder keeps them on the device (model/cuda_state_transfer.DeviceKvExporter).
        self.kv_export = None
        self._check_memory_budget()
        self._prefill_prefix()
        self.set_instruction(cfg.prompt.instruction)

    @classmethod
    def from_config(cls, cfg: VlaConfig) -> "Engine":
        from ..model.factory import create_backend_from_weights, load_model
        from .cpu_threads import limit_cpu_threads
        limit_cpu_threads(cfg.model.cpu_threads)
        spec, weights, tokenizer = load_model(cfg.model.path)
        backend = create_backend_from_weights(cfg.model.backend, spec, weights,
                                              capacity=cfg.kv.capacity_tokens, dtype=cfg.model.dtype)
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
        rebased = self._rebase_positions_if_needed()
        self._in_cycle = True
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
            self._in_cycle = False
        result.elapsed_ms = (time.perf_counter() - t0) * 1000.0
        late = result.elapsed_ms > self.cfg.cycle.deadline_ms
        if late and result.is_action:
            result.overran = True
            if not self.cfg.cycle.deterministic:
                # Acting on an answer that arrived after its deadline is exactly what we refuse to do.
                result.reason = R.DEADLINE_MISSED
                result.action = None          # tokens stay for debugging; nothing actionable leaves
                result.detail = f"finished at {result.elapsed_ms:.2f} ms > deadline {self.cfg.cycle.deadline_ms} ms"
        if rebased:
            result.detail = (result.detail + "; " if result.detail else "") + "RoPE positions re-based (state recomputed)"
        self.metrics.record(result)
        return result

    def _rebase_positions_if_needed(self) -> bool:
        """Keep RoPE positions inside the model's trained range when no swap has re-based them.

        Positions only grow between swaps (about 1000 per second at 30 Hz). A
        reconciler's swap re-bases them; without one (absent, dead) the next
        frame would eventually pass `max_position_embeddings`, where the model
        was never trained and float32 angles lose precision. Then the retained
        frames are recomputed in place right after the prefix: one slow cycle,
        reported in its detail, instead of a slow decay of every later answer.
        """
        limit = self.backend.spec.max_position_embeddings
        if self.next_position + self.cfg.vision.tokens_per_frame + self.suffix_reserve <= limit:
            return False
        keep = [r.frame_id for r in self.kv.retained() if self.frames[r.frame_id].tokens is not None]
        dropped = self.rebuild_in_place(keep)
        log.warning("RoPE positions reached %d of %d: %d frames recomputed from position %d, %d dropped",
                    limit - self.cfg.vision.tokens_per_frame - self.suffix_reserve, limit, len(keep),
                    self.prefix_tokens, len(dropped))
        return True

    def append_frame(self, frame: Frame) -> list[int]:
        """Add a frame to the state exactly (no action decode): the reconciler's mirror path.

        Returns the frame ids the eviction policy removed to make room.
        """
        evicted = self.append_chunks([self.encode_chunk(frame)], allow_evict=True)
        self.last_frame_id = frame.frame_id
        return evicted

    def encode_chunk(self, frame: Frame) -> StateChunk:
        """Run the vision encoder: the frame as a state chunk (rows + pooled embedding)."""
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
        chunks = list(chunks)
        if not chunks:
            return []
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
            _slots, out = self._admit_chunk(c, self.next_position + i * tpf)
            evicted += out
        # A policy may evict a frame of this very batch: it was never computed, so it simply is not.
        kept = [r for r in self.kv.retained() if r.frame_id in {c.frame_id for c in chunks}]    # oldest first
        if not kept:
            self.next_position += len(chunks) * tpf
            return evicted
        by_id = {c.frame_id: c for c in chunks}
        slots = np.concatenate([r.slots for r in kept])                                      # [k * tpf]
        rows = np.concatenate([by_id[r.frame_id].tokens for r in kept])                      # [k * tpf, hidden]
        positions = np.concatenate([np.arange(r.position_start, r.position_start + tpf) for r in kept]).astype(np.int64)
        done = False
        try:
            self.backend.forward(rows, positions, slots, self._context_excluding([slots]), logits="none")
            done = True
        finally:
            if not done:    # garbage KV: forget these frames rather than attend to them later
                self.kv.evict_frames([r.frame_id for r in kept])
                for r in kept:
                    self.frames.pop(r.frame_id, None)
        self.next_position += len(chunks) * tpf
        self.computed_tokens["frames"] += rows.shape[0]
        return evicted

    def reset_frames(self) -> None:
        """Forget every frame; the static prefix stays (it is never recomputed). The state is exact again."""
        self._require_boundary("reset_frames")
        self.kv.evict_frames([r.frame_id for r in self.kv.retained()])
        self.frames.clear()
        self.next_position = self.prefix_tokens
        self.approximate_evictions = 0

    def rebuild_in_place(self, keep_ids, tokens_per_step: int | None = None) -> list[int]:
        """Synchronous exact recompute: keep these frames (oldest first), recompute their KV from the
        stored vision rows with re-based positions, chunked `tokens_per_step` rows per forward.

        This is what ASR avoids: the whole recompute happens on the serving engine, between two
        cycles. Returns the frame ids dropped.
        """
        self._require_boundary("rebuild_in_place")
        keep = [int(f) for f in keep_ids]
        held = {r.frame_id for r in self.kv.retained()}
        missing = [f for f in keep if f not in held]
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
        self.last_frame_id = last
        return dropped

    def export_state(self, version: int = 0) -> StateSnapshot:
        """The retained frames with their KV rows (and vision rows when known), oldest first."""
        retained = self.kv.retained()
        frames = [SnapshotFrame(r.frame_id, self.frames[r.frame_id].stamp_s, r.position_start, r.pooled)
                  for r in retained]
        slots = np.concatenate([r.slots for r in retained]) if retained else np.zeros(0, np.int32)
        kv = None
        if retained:
            kv = self.backend.read_kv(slots) if self.kv_export is None else self.kv_export(self.backend, slots)
        tokens = [self.frames[r.frame_id].tokens for r in retained]
        rows = np.stack(tokens) if retained and all(t is not None for t in tokens) else None
        return StateSnapshot(version=version, frames=frames, kv=kv, next_position=self.next_position,
                             prefix_ids=self.prefix_ids.copy(), rows=rows)

    def import_state(self, snap: StateSnapshot) -> list[int]:
        """Replace the frame state with `snap` at a cycle boundary (the swap); returns the frame ids dropped.

        The snapshot's frames, KV and positions are taken as they are (a
        reconciled snapshot has them re-based after the prefix) and
        `next_position` becomes the snapshot's. Frames this engine appended
        after the snapshot's newest frame ("late": they arrived between
        "ready" and "applied") are not lost: they are recomputed from their
        stored vision rows over the swapped state, so the result is still the
        from-scratch state. Everything is checked before anything changes: a
        snapshot that does not fit raises SnapshotError and the state stays.
        Details of the swap are kept in `last_swap`.
        """
        self._require_boundary("import_state")
        if snap.version <= self.state_version:
            raise SnapshotError(f"snapshot v{snap.version} is not newer than the state in force (v{self.state_version})")
        spec, tpf = self.backend.spec, self.cfg.vision.tokens_per_frame
        snap.check_against(prefix_ids=self.prefix_ids, tokens_per_frame=tpf, num_layers=spec.num_layers,
                           kv_dim=spec.kv_dim, hidden_size=spec.hidden_size)
        if hasattr(snap.kv, "check_usable"):
            snap.kv.check_usable()          # KV left on a device: still the snapshot's (SnapshotError if not)
        need = len(snap.frames) * tpf + self.suffix_reserve
        room = self.cfg.kv.capacity_tokens - self.prefix_tokens
        if need > room:
            raise SnapshotError(f"snapshot v{snap.version}: {len(snap.frames)} frames + suffix reserve need {need} slots, "
                                f"{room} exist after the prefix")
        newest = snap.newest_frame_id
        mine = self.kv.retained()
        taken = set(snap.frame_ids)
        late = [r for r in mine if r.frame_id > newest]
        late_chunks = [StateChunk(r.frame_id, self.frames[r.frame_id].stamp_s, self.frames[r.frame_id].tokens, r.pooled)
                       for r in late if self.frames[r.frame_id].tokens is not None]
        late_lost = [r.frame_id for r in late if self.frames[r.frame_id].tokens is None]
        if late_lost:
            log.warning("swap v%d: late frames %s have no vision rows and are dropped", snap.version, late_lost)
        dropped = [r.frame_id for r in mine if r.frame_id not in taken and r.frame_id <= newest] + late_lost

        self.kv.evict_frames([r.frame_id for r in mine])
        self.frames.clear()
        slots = []
        for i, f in enumerate(snap.frames):
            adm = self.kv.add_frame(f.frame_id, f.pooled, f.position_start, reserve=self.suffix_reserve)
            slots.append(adm.slots)
            rows = snap.rows[i] if snap.rows is not None else None
            self.frames[f.frame_id] = FrameRecord(f.frame_id, f.stamp_s, rows)
        if slots:
            if hasattr(snap.kv, "write_into"):          # device-resident KV: device-to-device into our arena
                snap.kv.write_into(self.backend, np.concatenate(slots))
            else:
                self.backend.write_kv(np.concatenate(slots), snap.kv)
        self.next_position = snap.next_position
        self.approximate_evictions = 0
        evicted = self.append_chunks(late_chunks, allow_evict=True)
        if self.frames and (self.last_frame_id is None or max(self.frames) > self.last_frame_id):
            self.last_frame_id = max(self.frames)
        self.state_version = snap.version
        self.last_swap = SwapReport(version=snap.version, frames=len(snap.frames), dropped=dropped,
                                    late=[c.frame_id for c in late_chunks], late_lost=late_lost, evicted=evicted,
                                    next_position=self.next_position)
        log.info("state v%d applied: %d frames, %d dropped, %d late recomputed", snap.version, len(snap.frames),
                 len(dropped), len(late_chunks))
        return dropped

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

    def state_summary(self) -> dict:
        """Token accounting of the CSR layout: prefix, chunks (frames) and the transient suffix, separately."""
        retained = self.kv.retained()
        tpf = self.cfg.vision.tokens_per_frame
        return {
            "prefix_tokens": self.prefix_tokens,
            "frames": len(retained),
            "frame_tokens": len(retained) * tpf,
            "suffix_tokens": int(self.suffix.size),
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

        # A frame already in the state (the last one answered, or one a swap brought in) is not appended again.
        new = frame.frame_id != self.last_frame_id and frame.frame_id not in self.frames
        tpf = self.cfg.vision.tokens_per_frame
        prefill_tokens = (tpf if new else 0) + int(self.suffix.size)
        decode_steps = self.cfg.action.num_tokens - 1
        decision = self.admission.decide((time.perf_counter() - t0) * 1000.0, prefill_tokens, decode_steps)
        result.estimate_ms, result.budget_ms, result.probe = decision.estimate_ms, decision.budget_ms, decision.probe
        if not decision.admit and not cyc.deterministic:
            return self._fail(result, R.REFUSED_BUDGET,
                              f"estimate {decision.estimate_ms:.2f} ms > budget {decision.budget_ms:.2f} ms")

        rows, positions, write_slots = [], [], []
        if new:
            chunk = self.encode_chunk(frame)
            frame_slots, result.evicted_frame_ids = self._admit_chunk(chunk, self.next_position)
            self._unwritten_frame = frame.frame_id                              # until the prefill succeeds
            rows.append(chunk.tokens)                                           # [32, hidden]
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
        prefill = (np.concatenate(rows).astype(np.float32, copy=False), np.concatenate(positions).astype(np.int64),
                   np.concatenate(write_slots).astype(np.int32), context)
        decode_slots = suffix_slots[s:s + decode_steps]
        decode_positions = np.arange(self.next_position + s, self.next_position + s + decode_steps, dtype=np.int64)
        run = self._prefill_decode_on_device if self.device_cycle else self._prefill_decode_on_host
        tokens, result.prefill_ms, result.decode_ms = run(prefill, decode_slots, decode_positions)
        self.computed_tokens["frames"] += tpf if new else 0
        self.computed_tokens["suffix"] += s
        self.computed_tokens["decode"] += decode_steps
        result.prefill_tokens = prefill_tokens
        self.admission.observe(result.prefill_ms, prefill_tokens, result.decode_ms, max(decode_steps, 1))
        result.tokens = np.asarray(tokens, dtype=np.int64)
        result.action = self.codec.to_values(result.tokens)
        self._unwritten_frame = None                    # finite logits all the way: the frame's KV is good

    def _prefill_decode_on_host(self, prefill, decode_slots, decode_positions) -> tuple:
        """Backend.forward per step, logits to the host, codec picks each token. -> (tokens, prefill ms, decode ms)"""
        x, positions, write_slots, context = prefill
        t_prefill = time.perf_counter()
        out = self.backend.forward(x, positions, write_slots, context, logits="last")
        self._last_prefill_logits = out.logits[-1]                              # [vocab]
        tokens = [self.codec.select(out.logits[-1])]
        t_decode = time.perf_counter()
        # Decode: each step attends to everything so far, including the suffix and earlier action tokens.
        ctx = np.concatenate([context, write_slots]).astype(np.int32)
        for slot, pos in zip(decode_slots, decode_positions):
            slot = np.asarray([slot], dtype=np.int32)
            out = self.backend.forward(self.backend.embed(np.asarray(tokens[-1:], dtype=np.int64)),
                                       np.asarray([pos], dtype=np.int64), slot, ctx, logits="last")
            tokens.append(self.codec.select(out.logits[-1]))
            ctx = np.concatenate([ctx, slot])
        t_end = time.perf_counter()
        return tokens, (t_decode - t_prefill) * 1000.0, (t_end - t_decode) * 1000.0

    def _prefill_decode_on_device(self, prefill, decode_slots, decode_positions) -> tuple:
        """The whole cycle on the device (CudaBackend.run_cycle_tokens: prefill, restricted argmax and
        decode steps feeding tokens back on the device; one host sync). -> (tokens, prefill ms, decode ms)"""
        x, positions, write_slots, context = prefill
        self._last_prefill_logits = None                  # fetched from the device only when asked for
        self._device_prefills += 1
        t0 = time.perf_counter()
        tokens = self.backend.run_cycle_tokens(x, positions, write_slots, context, decode_slots, decode_positions,
                                               self.codec.first_bin_id, int(decode_slots.size) + 1, self.codec.num_bins)
        total_ms = (time.perf_counter() - t0) * 1000.0
        # The host clock sees one span; the device events split it. Host overhead (uploads, launches,
        # the sync) is shared out in the same proportion, so the admission model still sums to the truth.
        dev_prefill, dev_decode = self.backend.last_cycle_device_ms
        share = dev_prefill / max(dev_prefill + dev_decode, 1e-9)
        return [int(t) for t in tokens], total_ms * share, total_ms * (1.0 - share)

    @property
    def last_prefill_logits(self) -> np.ndarray | None:
        """[vocab] logits of the latest cycle's last prefill row (for exactness checks; the device
        cycle computes only the action bins, so there they are computed on demand)."""
        if self._last_prefill_logits is None and self._device_prefills:
            self._last_prefill_logits = self.backend.prefill_logits()
        return self._last_prefill_logits

    # --------------------------------------------------------------- helpers

    def _fail(self, result: CycleResult, reason: str, detail: str) -> None:
        result.reason, result.detail = reason, detail
        result.action = result.tokens = None

    def _admit_chunk(self, chunk: StateChunk, position_start: int) -> tuple[np.ndarray, list[int]]:
        """Slots for a new frame starting at `position_start` (the policy evicts if full); remembers its rows."""
        admission = self.kv.add_frame(chunk.frame_id, chunk.pooled, position_start, reserve=self.suffix_reserve)
        evicted = [f.frame_id for f in admission.evicted]
        for fid in evicted:
            self.frames.pop(fid, None)
        # Every policy eviction leaves a hole (and stale context) that a from-scratch forward would not have.
        self.approximate_evictions += len(evicted)
        self.frames[chunk.frame_id] = FrameRecord(chunk.frame_id, chunk.stamp_s, chunk.tokens)
        return admission.slots, evicted

    def _drop_unwritten_frame(self) -> None:
        """A frame whose prefill failed has garbage KV: forget it rather than attend to it later."""
        fid, self._unwritten_frame = self._unwritten_frame, None
        if fid is not None:
            (gone,) = self.kv.evict_frames([fid])
            self.frames.pop(fid, None)
            self.last_frame_id = None
            # It was the newest frame: give its positions back so the next one follows without a gap.
            self.next_position = gone.position_start

    def _pooled_of(self, frame_id: int) -> np.ndarray:
        return next(r.pooled for r in self.kv.retained() if r.frame_id == frame_id)

    def _require_boundary(self, what: str) -> None:
        if self._in_cycle:
            raise SwapTimingError(f"{what} called inside cycle {self.cycle_id - 1}: "
                                  "state changes happen at cycle boundaries")

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
        self.prefix_ids = ids                                   # [P] int64
        if ids.size:
            self.backend.forward(self.backend.embed(ids), np.arange(ids.size, dtype=np.int64),
                                 self.prefix_slots, np.zeros(0, dtype=np.int32), logits="none")
        self.computed_tokens["prefix"] += int(ids.size)
        self.next_position = int(ids.size)

    def _check_memory_budget(self) -> None:
        used = self.backend.memory_bytes()
        if used > self.cfg.memory.vram_ceiling_bytes:
            raise EngineConfigError(
                f"model + KV arena need {used / 2**30:.2f} GiB > memory.vram_ceiling_gib={self.cfg.memory.vram_ceiling_gib}")
