"""Asynchronous State Reconciliation (ASR): exact forgetting without stalling the primary.

The primary engine serves cycles and, when it must, evicts approximately (its
policy drops a frame; the frames after it keep KV computed with the dropped
one in context, and the RoPE positions keep a hole). The reconciler, on a
second engine (second context / device; on the CPU a second arena), rebuilds
the exact state of the frames to keep and offers it; the primary swaps it in
at a cycle boundary (`FrameState.import_state`). This is Algorithm 1 of
reference/csr-asr-paper.md: warm up, catch up, swap.

Phases of `StateReconciler` (one "round" per trigger; its offers are versions k, k+1, ...):

    idle --trigger--> warming --kept frames computed--> catching_up --all computed--> ready (offer k)
      ^                                                     ^                           |
      |                                                     +--- a chunk arrives -------+  (offer k stays out)
      +------------------ the primary applied any offer of the round ------------------+
    a round whose frames no longer fit its arena is aborted (back to idle; the trigger fires again);
    stop() from any phase -> stopped: the primary keeps serving and evicting on its own.

    warming      chunked prefill of the kept frames with positions re-based right after the prefix,
                 steps of at most asr.warmup_tokens_per_step tokens (whole frames)
    catching_up  the same for the chunks that arrived since the trigger; once all are computed the
                 round offers its state (`make_offer`, `offer_due`): the first offer of a round has
                 the round's version, every fresher re-offer the next version
    ready        the newest offer holds every chunk of the round. Chunks keep arriving while the
                 primary takes and applies it: each goes back to catching_up, and the caught-up state
                 is offered again as a fresher version. An offer is never withdrawn: the primary
                 applies whichever it has (recomputing the frames it admitted after it, at most
                 asr.max_late_chunks of them; a staler offer it defers, core/state_swap.SwapDeferred),
                 so the frames it has to recompute at its boundary stay few however long it takes

Triggers (asr.mode, core/asr_modes.py):
    csr       the primary's frames reach asr.threshold of its frame capacity: keep the newest
              (1 - asr.evict_fraction) of them (the paper's rule)
    semantic  the primary has made asr.semantic_evictions_before_rebuild approximate evictions
              since its state was last exact: rebuild the frames it still holds, trimmed by its
              eviction policy to asr.rebuild_fill of the frame capacity

A round keeps no more frames than it can rebuild and catch up within the reconciler's arena at the
measured arrival and rebuild rates (core/round_budget.py, asr.round_fit_margin): a round that
outgrows the arena is aborted and its work lost, and the next one would be as large.

Aborted rounds are counted by reason (ABORT_REASONS), never by free text.

What the primary holds is tracked without asking it: a "shadow" KVSlotManager
with the primary's capacity, prefix, suffix reserve and eviction policy replays
every mirrored chunk, so it evicts exactly what the primary's policy evicts.
Chunks this side never saw (before it first listened, while inactive, lost in
transit: `mark_gap`) leave gaps; snapshots list them (`StateSnapshot.unseen`)
and the primary keeps such frames rather than reading their absence as a
decision to forget them.

Who calls what (the ROS reconciler node, or `InProcessAsr` in core/in_process_asr.py). The primary
side only appends to a queue or takes a finished snapshot, so it never waits
for reconciler work; everything else runs on the reconciler's side:

    primary side   mirror_encoded(chunk)                         each admitted frame, in order
                   mark_gap()                                    chunks may have been missed
                   restart_mirror()                              the primary restarted, state empty
                   take_offer() -> StateSnapshot | None          at a cycle boundary (the newest offer, once)
                   notify_applied(version, late_ids) / notify_rejected(version, reason)
    reconciler     tick(max_tokens) -> tokens computed           drain the queue, one bounded step, offer if due
                   or, scheduled piece by piece (core/slack_scheduler.py):
                   receive(); step(max_tokens) while frames_to_compute; make_offer() when offer_due
"""
from __future__ import annotations

import enum
import logging
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field

from ..config import VlaConfig
from .asr_modes import make_asr_mode
from .engine_state import FrameState
from .kv_slots import KVCapacityError, KVSlotManager, make_policy
from .metrics import percentile
from .round_budget import RoundBudget
from .state_snapshot import SnapshotError, StateChunk, StateSnapshot

log = logging.getLogger(__name__)

MAX_GAPS = 64                 # gaps in the mirror a snapshot reports (the newest; each is one inactive spell or loss)
MAX_OFFERS_TRACKED = 32       # recent offers whose frames are remembered, so that applying any of them is understood
MAX_ROUND_TIMES = 1024        # trigger -> ready / applied times kept (the newest)

# Why a round was aborted (ReconcilerStats.aborts):
ABORT_NO_LONGER_FITS = "no_longer_fits"          # the round's frames outgrew the arena: no swap for too long
ABORT_OWN_EVICTION = "own_policy_evicted"        # the reconciler's own policy evicted during the rebuild
ABORT_REJECTED = "rejected_by_primary"           # the primary refused an offer of the round (SnapshotError)
ABORT_PRIMARY_RESTARTED = "primary_restarted"    # the primary came back empty: the round's frames are gone
ABORT_REASONS = (ABORT_NO_LONGER_FITS, ABORT_OWN_EVICTION, ABORT_REJECTED, ABORT_PRIMARY_RESTARTED)


class Phase(str, enum.Enum):
    IDLE = "idle"
    WARMING = "warming"
    CATCHING_UP = "catching_up"
    READY = "ready"
    STOPPED = "stopped"


# ----------------------------------------------------------------------------
# The state machine


@dataclass
class Round:
    """One reconciliation: versions first_version .. version (its first offer, then each fresher one)."""
    version: int                  # the round's newest version: planned at the trigger, +1 per re-offer
    trigger: str
    frame_ids: list               # rebuild order: the kept frames, then chunks that arrived during the round
    warm: int                     # frame_ids[:warm] is the warm-up set (the kept frames)
    dropped: list                 # frames the primary held at the trigger that the round leaves out
    started_s: float
    first_version: int = 0
    done: int = 0                 # frame_ids[:done] are computed in the reconciler's arena
    offered: int = 0              # frame_ids[:offered] are in the newest offer
    ready_s: float | None = None  # when the first offer was made
    measured: bool = False        # its rebuild rate went to the round budget (once: at the end of warm-up or abort)

    def holds(self, version: int) -> bool:
        return self.first_version <= version <= self.version


@dataclass
class ReconcilerStats:
    rounds_started: int = 0
    rounds_offered: int = 0       # rounds that reached their first offer
    rounds_applied: int = 0       # rounds one of whose offers the primary applied
    rounds_aborted: int = 0
    reoffers: int = 0             # fresher versions offered while the primary had not applied the round yet
    rounds_sized_to_fit: int = 0  # rounds that kept fewer frames than their mode's rule, to finish (round_budget)
    round_frame_limit: int = 0    # the newest round's bound from the measured rates (0: none yet)
    offers_rejected: int = 0
    tokens_computed: int = 0
    chunks_mirrored: int = 0
    duplicate_chunks: int = 0
    aborts: dict = field(default_factory=lambda: dict.fromkeys(ABORT_REASONS, 0))    # reason -> rounds
    trigger_to_ready_ms: list = field(default_factory=list)
    trigger_to_applied_ms: list = field(default_factory=list)


class StateReconciler:
    """ASR on a second engine; see the module docstring for phases, triggers and callers.

    `state` is the reconciler's own FrameState (its own backend arena, same
    configuration and prefix as the primary; no control cycle). It is rebuilt
    each round; its static prefix is computed once, at its construction.
    """

    def __init__(self, cfg: VlaConfig, state: FrameState, clock=time.perf_counter):
        if state.cfg.kv.capacity_tokens != cfg.kv.capacity_tokens:
            raise ValueError(f"reconciler state has {state.cfg.kv.capacity_tokens} KV slots, "
                             f"kv.capacity_tokens is {cfg.kv.capacity_tokens}")
        self.cfg = cfg
        self.state = state
        self.clock = clock
        self.tpf = cfg.vision.tokens_per_frame
        self.policy = make_policy(cfg.kv.eviction_policy, cfg.kv.window_frames)
        self.mode = make_asr_mode(cfg)             # when to reconcile and what to keep (asr.mode)
        self.budget = RoundBudget(cfg.asr.round_fit_margin)    # and at most what can finish (measured rates)
        self.phase = Phase.IDLE
        self.version = 0                  # newest version planned
        self.k_ready = 0                  # newest version offered
        self.k_applied = 0                # newest version the primary reported applied
        self.stats = ReconcilerStats()
        self._round: Round | None = None
        self._in_flight: list | None = None     # frame ids of a step running piece by piece (begin_step)
        self._inbox: deque = deque()      # ("chunk", StateChunk) | ("applied", v, ids) | ("rejected", v, why)
        self.drained_items = 0            # items the latest receive() handled
        self._offer_lock = threading.Lock()
        self._offer: StateSnapshot | None = None    # the newest offer, until taken
        # In one process: the applying engine's work that needs no boundary (FrameState.prepare_swap), run on an
        # offer as it is made, as the graph's swap loader runs it; None: the boundary does all of it.
        self.prepare_offer = None
        self._live: tuple | None = None             # (version, frame ids) of the current round's newest offer
        self.epoch = 0                    # primary restarts seen (restart_mirror); offers belong to one epoch
        self._clear_mirror()

    def _clear_mirror(self) -> None:
        """What this side knows of the primary's frames: nothing yet (at start, and after a restart)."""
        self._chunks: dict[int, StateChunk] = {}
        # Recent offers (any may still be applied): version -> (frame ids, its round's first version, the round's
        # start), and rounds aborted while one of their offers may still be applied: first version -> reason.
        self._offers: OrderedDict = OrderedDict()
        self._aborted: OrderedDict = OrderedDict()
        self._last_chunk_id = -1
        # Gaps in the mirror: open intervals (lo, hi) of frame ids never seen. Nothing is seen before
        # the first chunk (the primary may have admitted frames before this reconciler listened);
        # mark_gap() opens another (inactive spell, lost chunk messages). Snapshots carry them so the
        # primary keeps those frames instead of dropping them as if this side had decided to.
        self._unseen: list[tuple[int, int]] = []
        self._gap_open = True
        self._approx_evictions = 0        # shadow (primary) policy evictions since the primary was last exact
        self._shadow = self._new_shadow()

    # ------------------------------------------------------------ primary side

    def mirror_encoded(self, chunk: StateChunk) -> None:
        """A frame the primary admitted, with its vision rows (the primary's own in one process; in the graph
        encoded by the reconciler node as the chunk arrives, ReconcilerWorker.on_chunk). Never blocks."""
        self._inbox.append(("chunk", chunk))

    def restart_mirror(self) -> None:
        """The primary restarted with an empty state: forget the mirror, the round and any offer
        (processed in order with the chunks). `epoch` counts these restarts. Never blocks."""
        self._inbox.append(("restart",))

    def mark_gap(self) -> None:
        """Chunks may have been missed before the next one (the caller was not listening, or a
        message was lost). Never blocks."""
        self._inbox.append(("gap",))

    @property
    def offered_version(self) -> int | None:
        """The version of the offer take_offer would hand out now (None: none), without taking it."""
        with self._offer_lock:
            return None if self._offer is None else self._offer.version

    def take_offer(self, version: int | None = None) -> StateSnapshot | None:
        """The newest offer not taken yet, once (call at a cycle boundary, then apply it and notify); with
        `version`, only if the offer is still that version (a fresher one may have replaced it meanwhile)."""
        with self._offer_lock:
            if version is not None and (self._offer is None or self._offer.version != version):
                return None
            snap, self._offer = self._offer, None
            return snap

    def notify_applied(self, version: int, late_frame_ids=None) -> None:
        """The primary applied `version` (any offer of the round, or a recent earlier one); late_frame_ids:
        frames it recomputed after the snapshot (FrameState.last_swap.late); None: the shadow decides."""
        self._inbox.append(("applied", int(version), None if late_frame_ids is None else list(late_frame_ids)))

    def notify_rejected(self, version: int, reason: str) -> None:
        """The primary refused `version` (SnapshotError: it does not fit). A deferral (SwapDeferred: too
        stale) is no rejection and is not reported: a fresher version follows anyway."""
        self._inbox.append(("rejected", int(version), reason))

    def stop(self) -> None:
        """Give up: withdraw any offer and do no more work (the primary keeps evicting on its own)."""
        with self._offer_lock:
            self._offer = None
            self._live = None
            self.phase = Phase.STOPPED
        self._round = None

    # -------------------------------------------------------- reconciler side

    def tick(self, max_tokens: int | None = None) -> int:
        """Drain the inbox, then at most one chunked-prefill step, then an offer if one is due; returns the
        tokens computed. A step begun in pieces (begin_step) is finished first, all its pieces at once: the node's
        worker ticks when there are no primary cycles to leave room for."""
        if not self.receive():
            return 0
        if self._in_flight is not None:
            tokens = 0
            while self._in_flight is not None:
                tokens = self.step_piece()
        else:
            tokens = self._step(max_tokens or self.cfg.asr.warmup_tokens_per_step)
        if self.offer_due:
            self.make_offer()
        return tokens

    def step(self, max_tokens: int) -> int:
        """One chunked-prefill step of the round without draining the inbox first (call receive() for that) and
        without offering (make_offer): what a scheduler times as the reconciler's device work. Returns the tokens
        computed (0 when every frame of the round is computed)."""
        if self.phase not in (Phase.WARMING, Phase.CATCHING_UP):
            return 0
        self.state.require_no_append_in_flight("step")
        return self._step(max_tokens)

    def begin_step(self, max_tokens: int, pieces: int) -> int:
        """Start a step whose forward runs in `pieces` runs of layers (asr.step_layer_pieces; core/layered_append.py),
        one per step_piece() call, so that a step longer than any gap spreads over several. Nothing is computed
        yet. Returns the frames started (0: nothing to compute, or the round was aborted)."""
        if self.phase not in (Phase.WARMING, Phase.CATCHING_UP):
            return 0
        self.state.require_no_append_in_flight("begin_step")
        batch = self._next_batch(max_tokens)
        if not batch:
            return 0
        try:
            self.state.begin_append([self._chunks[f] for f in batch], pieces)
        except KVCapacityError as exc:
            self._abort(ABORT_NO_LONGER_FITS, str(exc))
            return 0
        if not self._still_exact():
            return 0
        self._in_flight = list(batch)
        return len(batch)

    def step_piece(self) -> int:
        """The next piece of the step in flight (begin_step); returns the tokens of its frames once the last piece
        has run (they are computed then), else 0. With no step in flight (the round ended meanwhile), 0."""
        if self._in_flight is None:
            return 0
        if self._round is None or self.phase not in (Phase.WARMING, Phase.CATCHING_UP):
            self._drop_step_in_flight()
            return 0
        try:
            if not self.state.continue_append():
                return 0
        except BaseException:
            self._in_flight = None          # the state abandoned the append: no step is in flight any more
            raise
        batch, self._in_flight = self._in_flight, None
        return self._computed(batch)

    def give_up_step(self) -> None:
        """Give up the step in flight, if any: the pieces run so far are lost, its frames are computed by a later
        step (the slack schedule's way out when its pieces no longer fit the gaps, core/gap_steps.py)."""
        if self._in_flight is not None:
            self._drop_step_in_flight()

    @property
    def step_in_flight(self) -> bool:
        """A step runs piece by piece (begin_step) and has pieces left."""
        return self._in_flight is not None and self.state.appending

    @property
    def step_pieces_left(self) -> int:
        return self.state.append_pieces_left if self._in_flight is not None else 0

    @property
    def in_flight_frames(self) -> int:
        return len(self._in_flight) if self._in_flight is not None else 0

    def receive(self) -> bool:
        """Drain the inbox only (cheap bookkeeping, may start a round); True when a step or an offer is due."""
        if self.phase is Phase.STOPPED:
            return False
        self._drain()
        return self.phase in (Phase.WARMING, Phase.CATCHING_UP)

    @property
    def frames_to_compute(self) -> int:
        """Frames of the current round not computed yet."""
        r = self._round
        if r is None or self.phase not in (Phase.WARMING, Phase.CATCHING_UP):
            return 0
        return len(r.frame_ids) - r.done

    @property
    def offer_due(self) -> bool:
        """Every frame of the round is computed and the newest offer (if any) holds fewer of them."""
        r = self._round
        return (self.phase in (Phase.WARMING, Phase.CATCHING_UP) and r is not None and r.done == len(r.frame_ids)
                and (r.ready_s is None or r.offered < r.done))

    def make_offer(self) -> StateSnapshot:
        """Export the round's state as its next version and offer it (replacing an untaken older offer)."""
        r = self._round
        if not self.offer_due:
            raise RuntimeError(f"make_offer: nothing to offer in phase {self.phase.value}")
        if r.ready_s is not None:          # a fresher version of a round the primary has not applied yet
            self.version += 1
            r.version = self.version
        snap = self.state.export_state(r.version, with_rows=self.cfg.asr.snapshot_rows)
        snap.unseen = list(self._unseen)
        snap.round = r.first_version
        r.offered = r.done
        self._offers[r.version] = (snap.frame_ids, r.first_version, r.started_s)
        while len(self._offers) > MAX_OFFERS_TRACKED:
            self._offers.popitem(last=False)
        if r.ready_s is None:
            r.ready_s = self.clock()
            _append_capped(self.stats.trigger_to_ready_ms, (r.ready_s - r.started_s) * 1e3)
            self.stats.rounds_offered += 1
        else:
            self.stats.reoffers += 1
        if self.prepare_offer is not None:
            try:
                self.prepare_offer(snap)
            except SnapshotError:           # the boundary rejects it with the same error, in the order of its checks
                pass
        with self._offer_lock:
            if self.phase is Phase.STOPPED:      # stopped from another thread while this round ran
                return snap
            self._offer = snap
            self._live = (r.version, snap.frame_ids)
            self.phase = Phase.READY
        self.k_ready = r.version
        return snap

    @property
    def busy(self) -> bool:
        """True while a round is warming up or catching up (reconciler work pending)."""
        return self.phase in (Phase.WARMING, Phase.CATCHING_UP) or bool(self._inbox)

    @property
    def live_offer_version(self) -> int:
        """The current round's newest offer (taken or not), 0 when none: a round applied, aborted or not
        offered yet has nothing to hand out."""
        live = self._live
        return 0 if live is None else live[0]

    @property
    def live_round(self) -> int:
        """The current round's first version (0: no round): the round an offer of it belongs to."""
        r = self._round
        return 0 if r is None else r.first_version

    @property
    def offered_frame_ids(self) -> list[int] | None:
        """Frame ids of the current round's newest offer (None when it has none)."""
        live = self._live
        return None if live is None else list(live[1])

    @property
    def primary_frame_ids(self) -> list[int]:
        """What the shadow says the primary holds, oldest first."""
        return [r.frame_id for r in self._shadow.retained()]

    def summary(self) -> dict:
        r = self._round
        st = self.stats
        applied = list(st.trigger_to_applied_ms)
        ready = list(st.trigger_to_ready_ms)
        arrival, rebuild = self.budget.arrival_frames_per_s, self.budget.rebuild_frames_per_s
        return {"phase": self.phase.value, "version": self.version, "k_ready": self.k_ready,
                "k_applied": self.k_applied, "round_frames": len(r.frame_ids) if r else 0,
                "round_done": r.done if r else 0, "round_offered": r.offered if r else 0,
                "primary_frames": len(self._shadow.retained()), "approximate_evictions": self._approx_evictions,
                **{k: v for k, v in vars(st).items() if not isinstance(v, (list, dict))},
                "rounds_aborted_by": dict(st.aborts),
                "trigger_to_ready_ms_p50": percentile(ready, 50) if ready else "",
                "trigger_to_applied_ms_p50": percentile(applied, 50) if applied else "",
                "trigger_to_applied_ms_max": max(applied) if applied else "",
                "arrival_frames_per_s": arrival if arrival is not None else "",
                "rebuild_frames_per_s": rebuild if rebuild is not None else "",
                "offer_to_swap_ms_max": self.budget.offer_to_swap_s * 1e3}

    # ------------------------------------------------------------- internals

    def _new_shadow(self) -> KVSlotManager:
        shadow = KVSlotManager(self.cfg.kv.capacity_tokens, self.tpf, self.policy)
        shadow.reserve_prefix(self.state.prefix_tokens)
        return shadow

    def _drain(self) -> None:
        self.drained_items = len(self._inbox)     # the gap ledger times the drains that had work
        now = self.clock() if self._inbox else 0.0
        while self._inbox:
            kind, *rest = self._inbox.popleft()
            if kind == "chunk":
                self.budget.frame_arrived(now)
                self._on_chunk(rest[0])
            elif kind == "gap":
                self._gap_open = True
            elif kind == "restart":
                self._on_restart()
            elif kind == "applied":
                self._on_applied(*rest)
            else:
                self._on_rejected(*rest)

    def _on_chunk(self, chunk: StateChunk) -> None:
        if chunk.frame_id <= self._last_chunk_id:
            self.stats.duplicate_chunks += 1     # re-sent or out of order: frame ids only grow
            return
        if self._gap_open:
            if chunk.frame_id > self._last_chunk_id + 1:
                self._unseen = (self._unseen + [(self._last_chunk_id, chunk.frame_id)])[-MAX_GAPS:]
            self._gap_open = False
        self._last_chunk_id = chunk.frame_id
        self.stats.chunks_mirrored += 1
        self._chunks[chunk.frame_id] = chunk
        admission = self._shadow.add_frame(chunk.frame_id, chunk.pooled, 0, reserve=self.state.suffix_reserve)
        self._approx_evictions += len(admission.evicted)
        r = self._round
        if r is not None and self.phase is not Phase.STOPPED:
            # The primary holds it too: the round catches it up (while READY too: the offer stays out and a
            # fresher version follows once it is computed; its size is checked before the next step).
            r.frame_ids.append(chunk.frame_id)
            if self.phase is Phase.READY:
                self.phase = Phase.CATCHING_UP
        self._prune_chunks()
        if self.phase is Phase.IDLE:
            self._maybe_start_round()

    def _maybe_start_round(self) -> None:
        retained = self._shadow.retained()
        why = self.mode.trigger(len(retained), self.state.frame_capacity, self._approx_evictions)
        if why is None:
            return
        keep = self.mode.keep(retained, self.state.frame_capacity, self.policy)
        limit = self.budget.frame_limit(self.state.frame_capacity)
        self.stats.round_frame_limit = limit or 0
        if limit is not None and len(keep) > limit:       # the mode's round could not finish at the measured rates
            keep = self.mode.keep(retained, self.state.frame_capacity, self.policy, limit)
            self.stats.rounds_sized_to_fit += 1
        self.version += 1
        kept = set(keep)
        self._round = Round(version=self.version, first_version=self.version, trigger=why, frame_ids=list(keep),
                            warm=len(keep), dropped=[r.frame_id for r in retained if r.frame_id not in kept],
                            started_s=self.clock())
        self.state.reset_frames()
        self.phase = Phase.WARMING
        self.stats.rounds_started += 1
        log.debug("ASR round v%d (%s): rebuilding %d of %d frames", self.version, why, len(keep), len(retained))

    def _step(self, max_tokens: int) -> int:
        batch = self._next_batch(max_tokens)
        if not batch:
            return 0
        try:
            self.state.append_chunks([self._chunks[f] for f in batch], allow_evict=False)
        except KVCapacityError as exc:
            self._abort(ABORT_NO_LONGER_FITS, str(exc))
            return 0
        if not self._still_exact():
            return 0
        return self._computed(batch)

    def _drop_step_in_flight(self) -> None:
        """Give up the step running piece by piece, if any (its frames are forgotten by the state)."""
        self._in_flight = None
        self.state.abandon_append()

    def _next_batch(self, max_tokens: int) -> list:
        """The frames the next step computes (the round's next ones, whole frames up to max_tokens); [] when none
        are left or the round no longer fits (aborted here)."""
        r = self._round
        if len(r.frame_ids) > self.state.frame_capacity:
            self._abort(ABORT_NO_LONGER_FITS, f"{len(r.frame_ids)} frames no longer fit the reconciler's "
                                              f"{self.state.frame_capacity}")
            return []
        return r.frame_ids[r.done:][:max(1, max_tokens // self.tpf)]

    def _still_exact(self) -> bool:
        """False (the round aborted) when the reconciler's own policy evicted while it admitted a step."""
        if self.state.state_exact:
            return True
        self._abort(ABORT_OWN_EVICTION, f"the reconciler's own {self.policy.name} policy evicted during "
                                        f"the rebuild")      # e.g. a sliding_window policy capped the rebuild
        return False

    def _computed(self, batch: list) -> int:
        """A step's frames are computed: the round moves on; returns their tokens."""
        r = self._round
        r.done += len(batch)
        tokens = len(batch) * self.tpf
        self.stats.tokens_computed += tokens
        if r.done >= r.warm:
            self._measure_round(r)
        if self.phase is not Phase.STOPPED:
            self.phase = Phase.WARMING if r.done < r.warm else Phase.CATCHING_UP
        return tokens

    def _on_applied(self, version: int, late_ids) -> None:
        entry = self._offers.get(version)
        if entry is None or version <= self.k_applied:
            log.warning("primary applied v%s, which is not a recent offer (newest applied v%d)", version,
                        self.k_applied)
            return
        offered, round_first, round_started = entry
        if late_ids is None:        # what the primary keeps by its own rule: frames newer than the snapshot
            newest = max(offered, default=-1)
            late_ids = [f for f in self.primary_frame_ids if f > newest]
        # The primary now holds the snapshot, then the late frames: replay that into the shadow (frames this side
        # never saw are left out: the shadow cannot model them), placed at once where no eviction is due.
        # The old shadow's unit vectors serve the new one: a frame id names one frame, so they are its bits.
        units = {f.frame_id: f.unit for f in self._shadow.retained()}
        self._shadow = self._new_shadow()
        known = [(fid, self._chunks[fid].pooled, 0) for fid in list(offered) + list(late_ids) if fid in self._chunks]
        self._approx_evictions = self._shadow.admit_all(known, reserve=self.state.suffix_reserve, known_units=units)
        self.k_applied = version
        for v in [v for v in self._offers if v <= version]:
            del self._offers[v]
        r = self._round
        if r is not None and r.holds(version):
            self.stats.rounds_applied += 1
            now = self.clock()
            _append_capped(self.stats.trigger_to_applied_ms, (now - r.started_s) * 1e3)
            if r.ready_s is not None:
                self.budget.round_applied(now - r.ready_s)
            with self._offer_lock:        # the round's fresher offers are moot: the primary is exact already
                self._offer = None
                self._live = None
                if self.phase is not Phase.STOPPED:
                    self.phase = Phase.IDLE
            self._round = None
            self._drop_step_in_flight()   # frames after the applied offer: the next round computes them
        elif round_first in self._aborted:
            # Taken before this side aborted its round, and applied: the round ended in a swap after all.
            reason = self._aborted.pop(round_first)
            self.stats.rounds_aborted -= 1
            self.stats.aborts[reason] -= 1
            self.stats.rounds_applied += 1
            _append_capped(self.stats.trigger_to_applied_ms, (self.clock() - round_started) * 1e3)
            # Routine under load (the stats say how often): DEBUG, as every other per-swap line.
            log.debug("primary applied v%d of a round aborted here meanwhile (%s): counted as applied", version, reason)
        self._prune_chunks()
        log.debug("ASR v%d applied by the primary (%d late frames recomputed there)", version, len(late_ids))
        if self.phase is Phase.IDLE:
            self._maybe_start_round()

    def _on_restart(self) -> None:
        if self._round is not None and self.phase is not Phase.STOPPED:
            self._count_abort(ABORT_PRIMARY_RESTARTED)
        with self._offer_lock:
            self._offer = None
            self._live = None
            if self.phase is not Phase.STOPPED:
                self.phase = Phase.IDLE
        self._round = None
        self._clear_mirror()
        self._drop_step_in_flight()
        self.state.reset_frames()
        self.epoch += 1
        log.info("primary restarted: mirror cleared (epoch %d)", self.epoch)

    def _on_rejected(self, version: int, reason: str) -> None:
        self.stats.offers_rejected += 1
        if self._round is not None and self._round.holds(version):
            self._abort(ABORT_REJECTED, f"primary rejected v{version}: {reason}")

    def _measure_round(self, r: Round) -> None:
        """The round's rebuild rate while it had a backlog (trigger to end of warm-up) -> the round budget."""
        if not r.measured:
            r.measured = True
            self.budget.round_measured(r.done, self.clock() - r.started_s)

    def _abort(self, reason: str, detail: str) -> None:
        log.warning("ASR round v%d aborted (%s): %s; %s", self._round.version, reason, detail,
                    self._round_history(self._round))
        self._measure_round(self._round)
        self._count_abort(reason)
        if self._round.ready_s is not None:       # an offer of it may be on its way to the primary still
            self._aborted[self._round.first_version] = reason
            while len(self._aborted) > MAX_OFFERS_TRACKED:
                self._aborted.popitem(last=False)
        with self._offer_lock:
            self._offer = None
            self._live = None
        self._round = None
        self.phase = Phase.IDLE
        self._drop_step_in_flight()
        self._prune_chunks()

    def _round_history(self, r: Round) -> str:
        """Where a round stood when it ended: what makes an abort diagnosable from the node's log (a round that
        never caught up, against one whose offers the primary did not take in time)."""
        now = self.clock()
        offered = ("never offered" if r.ready_s is None else
                   f"first offered {(now - r.ready_s) * 1e3:.0f} ms ago, {r.version - r.first_version} re-offers, "
                   f"{r.offered} frames in the newest offer")
        return (f"{self.phase.value} {(now - r.started_s) * 1e3:.0f} ms after its {r.trigger} trigger, rebuilt "
                f"{r.done} of {len(r.frame_ids)} frames ({r.warm} kept at the trigger), {offered}")

    def _count_abort(self, reason: str) -> None:
        self.stats.rounds_aborted += 1
        self.stats.aborts[reason] += 1

    def _prune_chunks(self) -> None:
        """Keep the rows of frames the primary holds, the round needs or an offer the primary may still apply holds;
        nothing else. Of the aborted rounds' offers only the newest such round's count: the primary holds one offer
        at a time and applies or drops it within a few cycles, before another round can be offered and aborted.
        Keeping every tracked offer's frames (up to MAX_OFFERS_TRACKED rounds' worth, 192 KiB of rows a frame at the
        1.5B shape, until the primary next applied one) made the reconciler's RSS grow while rounds kept aborting:
        +14.6 MiB after the first minute of the H200 semantic soak (128 of 153 rounds aborted); on the CPU, the
        same rounds replayed at that row width kept 281 frames at most (+16 MiB RSS), 194 with this rule.
        An older offer applied after all is still understood (_on_applied); its frames whose rows are gone are
        left out of the shadow, as unseen ones are."""
        needed = set(self.primary_frame_ids)
        if self._round is not None:
            needed.update(self._round.frame_ids)                 # its own offers hold some of these
        newest_aborted = next(reversed(self._aborted), None)     # the newest aborted round that offered
        for version, (frame_ids, round_first, _started) in self._offers.items():
            if version > self.k_applied and round_first == newest_aborted:
                needed.update(frame_ids)          # maybe taken before the round was aborted, still to be applied
        for fid in [f for f in self._chunks if f not in needed]:
            del self._chunks[fid]


def _append_capped(values: list, value: float) -> None:
    """Append, keeping the newest MAX_ROUND_TIMES (a list: callers serialise the stats as they are)."""
    values.append(float(value))
    if len(values) > MAX_ROUND_TIMES:
        del values[:len(values) - MAX_ROUND_TIMES]
