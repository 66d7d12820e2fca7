"""The control cycle: one frame in, one action or one explained fallback out.

`Engine.run_cycle` composes the parts of core/ in the order of DESIGN.md:

    freshest frame -> stale check -> admission (refuse before starting)
      -> vision encoder (32 tokens) -> KV slots (evict by policy if full)
      -> prefill [new frame tokens + dynamic suffix] over the cached prefix and frames
      -> action tokens: the first from the prefill's last logits, the rest from
         single-token decode steps, every argmax restricted to the action bins
      -> deadline check -> CycleResult

The state is the CSR layout of core/prompt.py, held by the engine's
`FrameState` (`engine.state`, core/engine_state.py): a static prefix computed
once at construction, frames appended as chunks of 32 vision tokens (their
vision rows are kept on the host so the state can be recomputed), and a
transient suffix written each cycle and released. Between cycles the state
can be replaced by a reconciled snapshot (`engine.state.import_state`, the
swap of core/reconciliation.py) or recomputed in place
(`engine.state.rebuild_in_place`); both re-base the frames' RoPE positions
right after the prefix, so the result is the state a from-scratch forward
would build. `state.state_version` counts swaps; `state.approximate_evictions`
counts policy evictions since the state was last exact.

The engine owns no thread and no clock loop: the reasoning node, the
benchmarks and the tests drive it. It never raises for a failure inside a
cycle; that becomes an `engine_error` fallback and the next cycle runs.
"""
from __future__ import annotations

import copy
import logging
import time
from contextlib import contextmanager

import numpy as np

from ..config import ACTION_TOKEN, VlaConfig
from . import cycle_result as R
from .action_codec import ActionCodec, NonFiniteLogitsError
from .admission import AdmissionController
from .cycle_phases import PhaseClock, PhaseStats
from .cycle_result import CycleResult
from .engine_state import FrameState, FrameStateError
from .failure_log import FailureLog
from .frames import Frame
from .metrics import CycleMetrics
from .prompt import suffix_ids
from .vision_encoder import VisionEncoder

log = logging.getLogger(__name__)
FAILURE_LOG_PERIOD_S = 5.0      # a failure repeating every cycle: traceback once, then a count every 5 s
NO_SWAP_ROOM = -1               # swap_recompute_budget_frames: the slack cannot take even a swap without late frames
WARMUP_RECOMPUTES = 3           # timed lone-frame recomputes in warm-up: a median the first swaps can plan on


class EngineConfigError(ValueError):
    """The engine cannot be built with this configuration and model (raised at configure time)."""


class Engine:
    """The control cycle over a FrameState it owns (`self.state`); see the module docstring."""

    def __init__(self, cfg: VlaConfig, backend, tokenizer, encoder: VisionEncoder | None = None):
        self.cfg = cfg
        self.backend = backend
        self.tokenizer = tokenizer
        spec = backend.spec
        if backend.capacity != cfg.kv.capacity_tokens:
            raise EngineConfigError(f"backend KV arena has {backend.capacity} slots, kv.capacity_tokens is {cfg.kv.capacity_tokens}")
        rows = cfg.vision.tokens_per_frame + cfg.prompt.max_suffix_tokens
        if rows > backend.max_rows:
            raise EngineConfigError(f"a cycle prefill of vision.tokens_per_frame + prompt.max_suffix_tokens = {rows} "
                                    f"rows exceeds the backend's {backend.max_rows} rows per pass")
        self._check_memory_budget()
        self.codec = ActionCodec(spec.vocab_size, cfg.action)
        _check_action_bins(tokenizer, self.codec)
        self.admission = AdmissionController(cfg.cycle, cfg.admission)
        self.metrics = CycleMetrics(cfg.cycle.deadline_ms)
        self.phases = PhaseStats()                              # where each cycle's time went (core/cycle_phases.py)
        self.cycle_id = 0
        self._last_prefill_logits: np.ndarray | None = None   # [vocab] of the latest cycle's prefill, fetched on demand
        self._prefill_logits_ready = False                      # the latest cycle completed: the backend has them
        self._force_admit = False                               # warm_up: every cycle runs (nothing is refused)
        self._failures = FailureLog(log, FAILURE_LOG_PERIOD_S)
        try:
            self.state = FrameState(cfg, backend, tokenizer, encoder)   # computes the static prefix
        except FrameStateError as exc:
            raise EngineConfigError(str(exc)) from exc
        self.set_instruction(cfg.prompt.instruction)

    # ------------------------------------------------------------------ public

    def set_instruction(self, text: str) -> None:
        """Replace the task instruction; the next cycle's suffix uses it. Cached frames stay valid.
        The backend prepares the two prefill lengths it implies now (CUDA: captures their graphs), so
        no live cycle pays for that."""
        ids = suffix_ids(self.tokenizer, self.cfg.prompt, text)
        s, tpf = int(ids.size), self.cfg.vision.tokens_per_frame
        for rows in (s, tpf + s):
            self.backend.prepare_cycle(rows, self.codec.first_bin_id, self.codec.num_bins)
        self.instruction = text
        self.suffix = ids                                       # [S] int64
        # Embedded once per instruction, not per cycle: on the GPU an embed is a device -> host round
        # trip, and the cycle should have exactly one host sync (the tokens at its end).
        self.suffix_rows = np.ascontiguousarray(self.backend.embed(ids), dtype=np.float32)   # [S, hidden]

    def warm_up(self, cycles: int, frame_pixels: np.ndarray) -> dict:
        """Run `cycles` cycles on a synthetic frame before serving, then forget them.

        What the first cycles of a fresh process cost once (first kernel launches, lazy
        allocations, caches) lands here instead of in the first live cycles, and the
        admission estimate is seeded from the cycles after those: its EMAs start from
        steady-state costs, so the first live seconds are not refused. Afterwards the
        state holds only the prefix again, the metrics and cycle ids start at zero, and
        the admission controller keeps its seeded estimate. Returns what was measured.
        """
        if cycles < 2:
            raise ValueError(f"warm_up needs at least 2 cycles (one new frame, one repeat), got {cycles}")
        elapsed = []
        with self.synthetic_cycles(keep_admission=True):
            for i in range(cycles):
                if i == cycles // 2:
                    # The first half paid the one-time costs; seed admission from the second half only.
                    self.admission = AdmissionController(self.cfg.cycle, self.cfg.admission)
                fid = -1 - i // 2               # pairs: a new frame, then the same frame again (both prefill lengths)
                elapsed.append(self.synthetic_cycle(frame_pixels, fid).elapsed_ms)
            # The RoPE re-base's recompute step, once, so that its first live use pays no one-time cost (on the
            # GPU, capturing forward()'s graph for one frame's rows: a first re-base that paid it ran a cycle late
            # on the H200); then WARMUP_RECOMPUTES times, timed: the first swaps' recompute budget is planned on
            # their median, which one slow measurement does not move.
            self.state.recompute_retained()
            for _ in range(WARMUP_RECOMPUTES):
                t_recompute = time.perf_counter()
                kept, _dropped, _forgotten = self.state.recompute_retained()
                self.state.note_recompute((time.perf_counter() - t_recompute) * 1e3, len(kept))
            # A swap recomputing its late frames several per forward (asr.late_frames_per_forward) uses those
            # shapes too: prepared here (captured on the GPU), never first met at a boundary.
            self.backend.prepare_forward([self.cfg.vision.tokens_per_frame * k
                                          for k in range(2, self.late_frames_per_forward() + 1)])
        return {"cycles": cycles, "first_ms": elapsed[0], "last_ms": elapsed[-1],
                "steady_ms": float(np.median(elapsed[cycles // 2:])),
                "estimate_prefill_ms_per_token": self.admission.ema_prefill_ms_per_token,
                "estimate_decode_ms_per_token": self.admission.ema_decode_ms_per_token}

    def late_frames_per_forward(self) -> int:
        """Frames per forward when a swap recomputes its late frames: the shapes warm_up prepares."""
        asr = self.cfg.asr
        return min(asr.late_frames_per_forward, max(1, asr.max_late_chunks))

    def synthetic_cycle(self, frame_pixels: np.ndarray, frame_id: int) -> CycleResult:
        """One cycle on a synthetic frame inside synthetic_cycles(); EngineConfigError unless it ran to its end."""
        r = self.run_cycle(Frame(pixels=frame_pixels, stamp_s=0.0, frame_id=frame_id), now_s=0.0)
        if r.tokens is None:             # the model did not run to the end (a late cycle still counts)
            raise EngineConfigError(f"synthetic cycle {r.cycle_id} failed: {r.reason}: {r.detail}")
        return r

    @contextmanager
    def synthetic_cycles(self, keep_admission: bool):
        """Cycles before serving (warm-up, the capacity check): every one is admitted, and afterwards the state
        holds only the prefix again and the metrics, phases and cycle ids start at zero, as if none had run.
        keep_admission: keep what they taught admission (the warm-up seeds it); else it is put back as it was."""
        saved = None if keep_admission else copy.deepcopy(self.admission)
        self._force_admit = True
        try:
            yield
        finally:
            self._force_admit = False
            if saved is not None:
                self.admission = saved
            # Forced cycles are neither refusals the probe counts nor spikes of the live estimate.
            self.admission.refusals_in_a_row = self.admission.spikes_in_a_row = 0
            self.state.reset_frames()
            self.state.last_frame_id = None
            self.cycle_id = 0
            self.metrics = CycleMetrics(self.cfg.cycle.deadline_ms)
            self.phases = PhaseStats()
            for key in ("frames", "suffix", "decode"):
                self.state.computed_tokens[key] = 0

    def close(self) -> int:
        """Free the backend's memory now (device memory on a GPU); returns the bytes freed."""
        return self.backend.close()

    def run_cycle(self, frame: Frame | None, now_s: float, cycle_start_perf: float | None = None) -> CycleResult:
        t0 = time.perf_counter() if cycle_start_perf is None else cycle_start_perf
        clock = PhaseClock(t0)
        clock.lap("wake")
        result = CycleResult(cycle_id=self.cycle_id)
        self.cycle_id += 1
        torn = rebased = False
        try:                      # what a swap left to this cycle, and a re-base: failures end it as an engine error
            torn = self._finish_swap(result)
            if result.swap_settle_ms is not None or result.swap_frames:
                clock.lap("swap_finish")
            rebased = self.state.rebase_positions_if_needed(self._rebase_budget_frames())
            if rebased:
                clock.lap("rebase")
            ready = True
        except Exception as exc:  # noqa: BLE001 - a cycle must end in a fallback, never an exception
            self._failures.report(f"cycle {result.cycle_id} (before it ran)", exc)
            self._fail(result, R.ENGINE_ERROR, f"before the cycle: {type(exc).__name__}: {exc}")
            ready = False
        self.state.in_cycle = True
        try:
            if ready:
                self._run(frame, now_s, t0, result, clock)
        except NonFiniteLogitsError as exc:
            self._fail(result, R.ENGINE_ERROR, f"non-finite logits: {exc}")
        except Exception as exc:  # noqa: BLE001 - a cycle must end in a fallback, never an exception
            self._failures.report(f"cycle {result.cycle_id}", exc)
            self._fail(result, R.ENGINE_ERROR, f"{type(exc).__name__}: {exc}")
        finally:
            self.state.kv.release_transient()
            self.state.drop_unwritten_frame()
            self.state.in_cycle = False
        clock.lap("finish")
        clock.stop_cpu_watch()
        result.elapsed_ms = (clock.last_perf - t0) * 1000.0       # the laps add up to it exactly
        result.state_exact = self.state.state_exact
        late = result.elapsed_ms > self.cfg.cycle.deadline_ms
        result.phases_ms = clock.ms
        self.phases.record_cycle(clock.ms, late)
        if late and result.is_action:
            result.overran = True
            if not self.cfg.cycle.deterministic:
                # Acting on an answer that arrived after its deadline is exactly what we refuse to do.
                result.reason = R.DEADLINE_MISSED
                result.action = None          # tokens stay for debugging; nothing actionable leaves
                result.detail = f"finished at {result.elapsed_ms:.2f} ms > deadline {self.cfg.cycle.deadline_ms} ms"
        if rebased:
            rb = self.state.last_rebase
            result.detail = (result.detail + "; " if result.detail else "") + (
                f"RoPE positions re-based (state recomputed: {rb['kept']} frames kept, {rb['forgotten']} forgotten)")
        if torn:
            result.detail = (result.detail + "; " if result.detail else "") + (
                "the last swap's KV copy was torn: every frame forgotten before this cycle read it")
        self.metrics.record(result)
        return result

    # ------------------------------------------------------------- the cycle

    def _run(self, frame, now_s, t0, result: CycleResult, clock: PhaseClock) -> None:
        cyc = self.cfg.cycle
        if frame is None:
            return self._fail(result, R.NO_FRAME, "no camera frame received yet")
        result.frame_id, result.frame_stamp_s = frame.frame_id, frame.stamp_s
        age_ms = (now_s - frame.stamp_s) * 1000.0
        if age_ms > cyc.stale_frame_ms and not self._force_admit:
            return self._fail(result, R.STALE_FRAME, f"freshest frame is {age_ms:.1f} ms old > {cyc.stale_frame_ms} ms")
        if -age_ms > cyc.stale_frame_ms and not self._force_admit:
            # A stamp this far ahead of the clock never ages: one bad stamp (or a camera clock ahead of this host's)
            # kept the policy acting on a frozen image after the camera stopped, for as long as the skew lasted.
            return self._fail(result, R.STALE_FRAME, f"freshest frame is stamped {-age_ms:.1f} ms in the future "
                                                     f"(> {cyc.stale_frame_ms} ms): its age cannot be known")
        if self.backend.memory_bytes() > self.cfg.memory.vram_ceiling_bytes:
            return self._fail(result, R.MEMORY_CEILING, "engine memory above memory.vram_ceiling_gib")

        st = self.state
        # A frame the state holds (the last one answered, or one a swap brought in) is not appended again, and any
        # other is. Not "unless it was the last one answered": a re-base that kept no frame, a torn swap copy, or a
        # failed late recompute forgot that frame while last_frame_id still named it, and the next cycle on the same
        # camera frame answered it without it in the state.
        new = frame.frame_id not in st.frames
        tpf = self.cfg.vision.tokens_per_frame
        prefill_tokens = (tpf if new else 0) + int(self.suffix.size)
        decode_steps = self.cfg.action.num_tokens - 1
        result.context_tokens = st.kv.used_slots
        decision = self.admission.decide((time.perf_counter() - t0) * 1000.0, prefill_tokens, decode_steps,
                                         result.context_tokens)
        result.estimate_ms, result.budget_ms, result.probe = decision.estimate_ms, decision.budget_ms, decision.probe
        clock.lap("admission")
        if not decision.admit and not (cyc.deterministic or self._force_admit):
            return self._fail(result, R.REFUSED_BUDGET,
                              f"estimate {decision.estimate_ms:.2f} ms > budget {decision.budget_ms:.2f} ms")
        clock.start_cpu_watch()
        prefill, decode_slots, decode_positions = self._cycle_inputs(frame, new, result, clock)
        # A probe, and the first cycle (which seeds the estimate), run to their end: they are there to measure.
        measuring = decision.probe or not self.admission.has_sample
        give_up = None if (cyc.deterministic or self._force_admit or measuring) else self._late_cycle_check(t0)
        tokens, result.prefill_ms, result.decode_ms = self._prefill_decode(prefill, decode_slots, decode_positions,
                                                                           give_up)
        clock.lap_split("prefill", result.prefill_ms, "decode")    # the lap since "slots", prefill's share first
        self._take_tokens(tokens, new, prefill_tokens, decode_steps, result, clock, t0)

    def _cycle_inputs(self, frame, new: bool, result: CycleResult, clock: PhaseClock) -> tuple:
        """(prefill inputs, decode slots, decode positions): the new frame through the vision encoder into slots
        its policy makes room for, the suffix after it, transient slots for the decoded tokens."""
        st, tpf, s = self.state, self.cfg.vision.tokens_per_frame, int(self.suffix.size)
        decode_steps = self.cfg.action.num_tokens - 1
        rows, positions, write_slots = [], [], []
        if new:
            chunk = st.encode_chunk(frame)
            clock.lap("vision")
            frame_slots, result.evicted_frame_ids = st.admit_chunk(chunk, st.next_position)
            st.mark_unwritten(frame.frame_id)                                  # until the prefill succeeds
            rows.append(chunk.tokens)                                           # [32, hidden]
            positions.append(np.arange(st.next_position, st.next_position + tpf))
            write_slots.append(frame_slots)
            st.next_position += tpf
            st.last_frame_id = frame.frame_id
            result.new_frame = True
        context = st.context_without_newest(len(write_slots))        # the new frame, if any, is the newest
        suffix_slots = st.kv.alloc_transient(s + decode_steps)
        rows.append(self.suffix_rows)                                           # [S, hidden]
        positions.append(np.arange(st.next_position, st.next_position + s))
        write_slots.append(suffix_slots[:s])
        prefill = (np.concatenate(rows).astype(np.float32, copy=False), np.concatenate(positions).astype(np.int64),
                   np.concatenate(write_slots).astype(np.int32), context)
        decode_slots = suffix_slots[s:s + decode_steps]
        decode_positions = np.arange(st.next_position + s, st.next_position + s + decode_steps, dtype=np.int64)
        clock.lap("slots")
        return prefill, decode_slots, decode_positions

    def _take_tokens(self, tokens, new: bool, prefill_tokens: int, decode_steps: int, result: CycleResult,
                     clock: PhaseClock, t0: float) -> None:
        """The decoded tokens into the result and the state's counts, the cycle into admission's estimate; a
        cycle given up between decode steps ends as deadline_missed, any other as an action."""
        st, cyc = self.state, self.cfg.cycle
        steps_done = len(tokens) - 1
        st.computed_tokens["frames"] += self.cfg.vision.tokens_per_frame if new else 0
        st.computed_tokens["suffix"] += int(self.suffix.size)
        st.computed_tokens["decode"] += steps_done
        result.prefill_tokens = prefill_tokens
        other_ms = clock.ms.get("vision", 0.0) + clock.ms["slots"]      # the cycle's fixed cost besides the model
        result.tokens = np.asarray(tokens, dtype=np.int64)
        st.mark_written()                               # finite logits all the way: the frame's KV is good
        given_up = steps_done < decode_steps
        whole_decode_ms = result.decode_ms
        if given_up:
            # Given up between decode steps: learned from as the whole cycle it would have been (the steps not run
            # at this cycle's own rate, or the estimate's before the first), so that a slow spell raises the
            # estimate and admission starts refusing, as it would after late cycles.
            per_step = result.decode_ms / steps_done if steps_done else self.admission.ema_decode_ms_per_token
            whole_decode_ms += (decode_steps - steps_done) * per_step
        self.admission.observe(result.prefill_ms, prefill_tokens, whole_decode_ms, max(decode_steps, 1), other_ms,
                               context_tokens=result.context_tokens, probe=result.probe)
        if given_up:                                    # never acted on
            result.given_up = True
            return self._fail(result, R.DEADLINE_MISSED,
                              f"given up after {steps_done + 1} of {decode_steps + 1} action tokens at "
                              f"{(time.perf_counter() - t0) * 1e3:.1f} ms: it would have finished after the "
                              f"{cyc.deadline_ms:g} ms deadline (the next boundary stays free)")
        result.action = self.codec.to_values(result.tokens)

    def _late_cycle_check(self, t0: float):
        """The question a host-loop backend asks before each decode step (Backend.run_cycle_tokens give_up):
        would the steps left end after the cycle's deadline less the safety margin (what finishing and
        publishing need), even at the faster of this cycle's own rate so far and the admission's per-token
        estimate? A cycle that will be late anyway stops at once instead of running on past the next boundary,
        which it would take from the cycle after it: in a 10-minute soak on the 2-vCPU machine 69 of 123
        skipped boundaries were late cycles running on. (Projecting at this cycle's own rate alone gave up
        cycles that would have made it: one slow first step is not a slow cycle.)"""
        cyc = self.cfg.cycle
        deadline_at = t0 + (cyc.deadline_ms - cyc.safety_margin_ms) / 1000.0
        estimate_ms = self.admission.ema_decode_ms_per_token

        def give_up(steps_done: int, steps_left: int, decode_ms: float) -> bool:
            per_step_ms = min(decode_ms / steps_done, estimate_ms) if steps_done else estimate_ms
            return time.perf_counter() + steps_left * per_step_ms / 1000.0 > deadline_at
        return give_up

    def _prefill_decode(self, prefill, decode_slots, decode_positions, give_up=None) -> tuple:
        """The backend's cycle (CUDA: prefill, restricted argmax and decode steps feeding tokens back on the
        device, one host sync; numpy: a loop of forward calls, which `give_up` may stop early).
        -> (tokens, prefill ms, decode ms)"""
        x, positions, write_slots, context = prefill
        self._last_prefill_logits = None                  # fetched from the backend only when asked for
        self._prefill_logits_ready = False
        t0 = time.perf_counter()
        tokens = self.backend.run_cycle_tokens(x, positions, write_slots, context, decode_slots, decode_positions,
                                               self.codec.first_bin_id, int(decode_slots.size) + 1, self.codec.num_bins,
                                               give_up=give_up)
        total_ms = (time.perf_counter() - t0) * 1000.0
        self._prefill_logits_ready = True
        # The backend splits its own time (device events on the GPU); host overhead (uploads, launches,
        # the sync) is shared out in the same proportion, so the admission model still sums to the truth.
        dev_prefill, dev_decode = self.backend.last_cycle_ms
        share = dev_prefill / max(dev_prefill + dev_decode, 1e-9)
        return tokens, total_ms * share, total_ms * (1.0 - share)

    @property
    def last_prefill_logits(self) -> np.ndarray | None:
        """[vocab] logits of the latest cycle's last prefill row, for exactness checks (the device cycle
        scores only the action bins, so full logits are computed on demand); None after a failed cycle."""
        if self._last_prefill_logits is None and self._prefill_logits_ready:
            self._last_prefill_logits = self.backend.prefill_logits()
        return self._last_prefill_logits

    def skipped_boundary(self, late_ms: float, overran_in: str = "other") -> CycleResult:
        """The answer for a boundary that passed while the cycle before it, or the work at that cycle's
        boundary, still ran: no cycle ran for it. A deadline_missed fallback with its own cycle id, so a
        controller still gets one output per period and the miss is counted, never silent. `overran_in`:
        the part of that work still running when the boundary passed (core/boundary_overrun.py)."""
        result = CycleResult(cycle_id=self.cycle_id, reason=R.DEADLINE_MISSED, boundary_skipped=True,
                             overran_in=overran_in,
                             detail=f"no cycle ran for this boundary: the previous cycle and the work at its boundary "
                                    f"ended {late_ms:.1f} ms after it ({overran_in} was still running)")
        self.cycle_id += 1
        result.elapsed_ms = late_ms
        result.state_exact = self.state.state_exact
        self.metrics.record(result)
        return result

    def swap_recompute_budget_frames(self, slack_ms: float) -> int | None:
        """Frames a swap at this boundary may recompute with `slack_ms` left before the next boundary: the
        slack less the safety margin and the slow end of what a swap costs besides its recompute
        (FrameState.swap_fixed_ms_tail), over the cost of one frame's recompute times the admission's tail factor.
        That cost is the larger of the admission's per-frame prefill estimate and the measured recomputes
        (FrameState.recompute_ms_per_frame: a lone frame's forward costs more per token than a cycle's longer
        prefill), and the tail factor plans the swap on the slow end of recent cycles, as a cycle is. On a CPU
        demo the cycle's rate priced a 16-row frame at ~2.6 ms, its recomputes took 5.8 ms (p50) to 10 ms, and
        every skipped boundary was a swap that overran. Once enough recomputes were measured, their own tail
        (FrameState.recompute_ms_per_frame_tail) where it is the larger: in a 10-minute soak planned without
        it, 18 swaps still overran. On top, kv.recompute_headroom, as a re-base plans. The measured recomputes
        count up to kv.recompute_estimate_cap x the prefill estimate (_frame_recompute_ms says why). None (no
        bound) with nothing measured yet, or in deterministic mode; NO_SWAP_ROOM when not even a swap without
        late frames fits (the caller leaves the offer for the next boundary)."""
        per_frame = self._frame_recompute_ms()
        if per_frame is None:
            return None
        room_ms = slack_ms - self.cfg.cycle.safety_margin_ms - self.state.swap_fixed_ms_tail
        if room_ms < 0.0:
            return NO_SWAP_ROOM
        tail = min(self.state.recompute_ms_per_frame_tail or 0.0, self._recompute_cap_ms())
        per_frame = max(per_frame * self.admission.tail_factor, tail)
        per_frame *= self.cfg.kv.recompute_headroom
        return int(room_ms // per_frame)

    def _finish_swap(self, result: CycleResult) -> bool:
        """At the cycle's start, what the swap at the last boundary left to it (asr.swap_finish next_cycle):
        its KV copy checked, then its late frames written (FrameState.write_pending), before anything reads
        the state; in result.swap_settle_ms and result.swap_frames. True when the copy was found torn (every
        frame forgotten). A failure writing the late frames forgets them and is reported, never raised: the
        cycle goes on, on an exact state without them."""
        st = self.state
        torn_before = st.torn_after_apply
        result.swap_settle_ms = st.settle_swap_copy()
        try:
            result.swap_frames = st.write_pending()
        except Exception as exc:  # noqa: BLE001 - the cycle must still end in an action or a fallback
            self._failures.report(f"cycle {result.cycle_id}: a swap's late frames", exc)
        return st.torn_after_apply > torn_before

    def next_cycle_late_room(self) -> int:
        """How many of a swap's late frames the next cycle may write at its start (asr.swap_finish next_cycle):
        0 with asr.swap_finish boundary; else at most asr.max_late_chunks, and with something measured (and not in
        deterministic mode) only as many as leave the cycle's own admission estimate inside the deadline less the
        safety margin, at the planned cost of a frame's recompute (_frame_recompute_ms times the admission's tail
        factor and kv.recompute_headroom, as a swap at the boundary is planned)."""
        asr, cyc, adm = self.cfg.asr, self.cfg.cycle, self.admission
        if asr.swap_finish != "next_cycle":
            return 0
        per_frame = self._frame_recompute_ms()
        if per_frame is None:
            return asr.max_late_chunks
        tpf, decode = self.cfg.vision.tokens_per_frame, max(self.cfg.action.num_tokens - 1, 1)
        cycle_ms = adm.mean_ms(tpf + int(self.suffix.size), decode) * adm.tail_factor
        room_ms = cyc.deadline_ms - cyc.safety_margin_ms - cycle_ms
        per_frame *= adm.tail_factor * self.cfg.kv.recompute_headroom
        return max(0, min(asr.max_late_chunks, int(room_ms // per_frame)))

    def _rebase_budget_frames(self) -> int | None:
        """Frames a re-base may recompute in this cycle without making it late: the slack the admission
        estimate leaves, over its prefill cost per frame. None (all of them) with nothing measured yet, or
        in deterministic mode (offline replay: exactness over time)."""
        per_frame = self._frame_recompute_ms()
        if per_frame is None or self._force_admit:
            return None
        adm, cyc = self.admission, self.cfg.cycle
        tpf = self.cfg.vision.tokens_per_frame
        cycle_ms = adm.mean_ms(tpf + int(self.suffix.size), max(self.cfg.action.num_tokens - 1, 1)) * adm.tail_factor
        slack_ms = cyc.deadline_ms - cyc.safety_margin_ms - cycle_ms
        return max(0, int(slack_ms // (self.cfg.kv.recompute_headroom * per_frame)))

    def _frame_recompute_ms(self) -> float | None:
        """What recomputing one frame (one frame per forward) is planned to cost: the measured recomputes
        (their median) once TAIL_MIN_SAMPLES of them are in, before that the larger of those and the admission
        estimate of a frame's prefill; measured recomputes count at most kv.recompute_estimate_cap x that
        estimate. Recomputes are measured only when one runs, so an estimate that prices every swap and re-base
        out of the slack never gets a sample to correct it (a 10-minute CPU soak: one 86 ms swap folded into an
        average, then 1056 rounds aborted and every re-base forgot all its frames); the median ignores one such
        sample, and the cap bounds what slow samples alone can do, against the cycles' estimate that every cycle
        refreshes. Why the cycles' estimate stops being a floor: on a GPU the two run different kernels. The
        cycle's short prefill is mostly fixed cost (1.5B shape on the H200: 0.27 ms per token, 8.8 ms for a
        32-token frame) while a swap's late frames go through the bulk prefill (~0.4 ms a frame: 216 late frames
        in 0.75 ms p50 per swap of ~2), so with the tail factor and kv.recompute_headroom the floor planned each
        late frame at ~12.6 ms, about all the room a boundary has after a 16.5 ms cycle; on a CPU the recomputes
        measure dearer than the cycles' rate and are what was planned on anyway. None in deterministic mode or
        with no cycle measured (then recomputes are not bounded by time)."""
        adm = self.admission
        if self.cfg.cycle.deterministic or not adm.has_sample or adm.ema_prefill_ms_per_token <= 0:
            return None
        measured = min(self.state.recompute_ms_per_frame or 0.0, self._recompute_cap_ms())
        if self.state.recompute_ms_per_frame_tail is not None and measured > 0.0:   # enough measured: their cost
            return measured
        return max(adm.ema_prefill_ms_per_token * self.cfg.vision.tokens_per_frame, measured)

    def _recompute_cap_ms(self) -> float:
        """The most a measured recompute of one frame counts for in a plan (see _frame_recompute_ms)."""
        frame_ms = self.admission.ema_prefill_ms_per_token * self.cfg.vision.tokens_per_frame
        return self.cfg.kv.recompute_estimate_cap * frame_ms

    def state_summary(self) -> dict:
        """The frame state's token accounting, with this cycle's suffix, for the diagnostics."""
        return self.state.state_summary(int(self.suffix.size))

    # --------------------------------------------------------------- helpers

    def _fail(self, result: CycleResult, reason: str, detail: str) -> None:
        result.reason, result.detail = reason, detail
        result.action = result.tokens = None

    def _check_memory_budget(self) -> None:
        used = self.backend.memory_bytes()
        if used > self.cfg.memory.vram_ceiling_bytes:
            raise EngineConfigError(
                f"model + KV arena need {used / 2**30:.2f} GiB > memory.vram_ceiling_gib={self.cfg.memory.vram_ceiling_gib}")



def _check_action_bins(tokenizer, codec: ActionCodec) -> None:
    """EngineConfigError when the tokenizer names its action bins and action.num_bins disagrees with them: bins
    are the last num_bins vocabulary ids, so another count shifts and rescales every action without an error
    (action.num_bins 128 on a 256-bin model published bin 128, +0.004, as -1.0). A tokenizer without named bins
    (a stock model, bins by position only) is not checked."""
    token_to_id = getattr(tokenizer, "token_to_id", None)
    first = token_to_id(ACTION_TOKEN.format(0)) if token_to_id is not None else None
    if first is None:
        return
    named = 0
    while token_to_id(ACTION_TOKEN.format(named)) is not None:
        named += 1
    if first != codec.first_bin_id or named != codec.num_bins:
        raise EngineConfigError(f"action.num_bins is {codec.num_bins} (bins from vocabulary id {codec.first_bin_id}), "
                                f"but the model's tokenizer names {named} action bins from id {first}: set "
                                f"action.num_bins to {named}")
