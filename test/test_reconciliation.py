"""Asynchronous State Reconciliation on the CPU: two real engines in one process, HF transformers as the oracle.

The primary and the reconciler are real Engines on separate numpy arenas with
the seeded tiny model; frames are real footage. Reconciler work is driven by
hand (`tick` until nothing is left: an infinitely fast second resource, or no
ticks at all: a slow one) so every scenario is deterministic; the thread mode
is exercised where it matters (the reconciler dying).
"""
import contextlib
import re
import time

import numpy as np

import pytest

from engine_oracle import cosine, oracle_logits

from vla_edge_ros import config as C
from vla_edge_ros.core.engine import Engine
from vla_edge_ros.core.engine_state import FrameState
from vla_edge_ros.core.state_swap import SwapDeferred
from vla_edge_ros.core.frames import Frame
from vla_edge_ros.core.in_process_asr import InProcessAsr
from vla_edge_ros.core.reconciliation import Phase, StateReconciler
from vla_edge_ros.core.state_snapshot import SnapshotError, StateChunk, StateSnapshot
from vla_edge_ros.model.backend import HostKV
from vla_edge_ros.model.errors import DeviceKVUnavailable

COS_EXACT = 0.9999


class Rig:
    """Primary + reconciler engines (capacity 384: 9 frames beside the prefix and one suffix). The reconciler's clock
    is the camera's (`now`, one period per new frame), so its measured rates (core/round_budget.py) are as
    deterministic as the rest: work drained inside one cycle takes no time."""

    def __init__(self, model_dir, model, clip, work="interleaved", reconciler=True, **overrides):
        from vla_edge_ros.model.factory import create_backend_from_weights
        spec, weights, tokenizer = model
        self.cfg = C.load(overrides={"model.path": str(model_dir), "model.backend": "numpy", "cycle.deterministic": True,
                                     "kv.capacity_tokens": 384, **overrides})

        def engine():
            return Engine(self.cfg, create_backend_from_weights("numpy", spec, weights, 384), tokenizer)

        def state():                      # the reconciler owns a frame state and a backend, no cycle
            return FrameState(self.cfg, create_backend_from_weights("numpy", spec, weights, 384), tokenizer,
                              takes_swaps=False)

        self.primary = engine()
        self.now = 0.0
        self.rec = StateReconciler(self.cfg, state(), clock=lambda: self.now) if reconciler else None
        self.driver = InProcessAsr(self.primary, self.rec, work=work)
        self.clip = clip
        self.i = 0

    def frame(self, i):
        return Frame(self.clip[i % len(self.clip)], float(i), i)

    def cycle(self, new=True, reconcile=True):
        """One driver cycle (swap at its boundary); then all reconciler work, unless reconcile=False."""
        if new:
            self.i += 1
            self.now += 1.0 / self.cfg.cycle.camera_hz
        c = self.driver.cycle(self.frame(self.i - 1), float(self.i - 1))
        assert c.result.is_action, c.result.detail
        if reconcile and self.rec is not None and self.driver.work == "interleaved":
            drain(self.rec)
        return c

    def primary_only_cycle(self, new=True):
        """A primary cycle with no swap at its boundary (the offer stays where it is); its chunk is mirrored."""
        if new:
            self.i += 1
            self.now += 1.0 / self.cfg.cycle.camera_hz
        r = self.primary.run_cycle(self.frame(self.i - 1), float(self.i - 1))
        assert r.is_action, r.detail
        if r.new_frame:
            self.rec.mirror_encoded(self.driver.primary_chunk(self.i - 1))
        return r

    def held(self):
        return [r.frame_id for r in self.primary.state.kv.retained()]


def drain(rec):
    while rec.tick():
        pass


@contextlib.contextmanager
def recording(obj, method: str, what):
    """Instrumentation: obj.method still runs; what(*args, **kwargs) of each call goes into the list yielded."""
    seen, real = [], getattr(obj, method)

    def recorded(*args, **kwargs):
        seen.append(what(*args, **kwargs))
        return real(*args, **kwargs)

    setattr(obj, method, recorded)
    try:
        yield seen
    finally:
        delattr(obj, method)


def row_count(x, *args, **kwargs):
    return x.shape[0]


def contiguous(eng) -> bool:
    starts = [r.position_start for r in eng.state.kv.retained()]
    return starts == [eng.state.prefix_tokens + 32 * k for k in range(len(starts))] and \
        eng.state.next_position == eng.state.prefix_tokens + 32 * len(starts)


# ----------------------------------------------------------------------------


def test_versions_advance_one_swap_at_a_time_and_every_swap_leaves_an_exact_state(tiny_model_dir, model, clip):
    rig = Rig(tiny_model_dir, model, clip, **{"asr.mode": "csr", "kv.eviction_policy": "fifo"})
    applied = []
    for _ in range(40):
        c = rig.cycle()
        if c.swap is not None:
            applied.append(c.swap.version)
            assert rig.primary.state.state_version == c.swap.version
            assert contiguous(rig.primary) and rig.primary.state.state_exact
        assert rig.rec.primary_frame_ids == rig.held()        # the shadow tracks the primary without asking it
        assert len(rig.held()) <= rig.primary.state.frame_capacity
        assert rig.rec.k_applied <= rig.rec.k_ready <= rig.rec.version
    assert len(applied) >= 4 and applied == list(range(1, len(applied) + 1))
    assert rig.rec.k_applied == applied[-1]
    # A prompt reconciler swaps before the primary ever has to evict on its own, and each round's first offer
    # is applied (the primary took it at the next boundary: nothing arrived in between to re-offer).
    assert rig.primary.state.kv.evictions == 0 and rig.rec.stats.rounds_aborted == 0
    assert rig.rec.stats.rounds_applied == len(applied) and rig.rec.stats.reoffers == 0
    assert all(r.state_exact for r in [rig.cycle().result for _ in range(3)])
    with pytest.raises(SnapshotError, match="not newer"):
        rig.primary.state.import_state(rig.primary.state.export_state(version=applied[-1]))


@pytest.mark.parametrize("mode,policy", [("csr", "fifo"), ("semantic", "semantic")])
def test_after_the_swap_the_next_logits_match_hf_from_scratch_and_before_it_they_do_not(
        tiny_model_dir, model, clip, hf, mode, policy):
    rig = Rig(tiny_model_dir, model, clip, **{"asr.mode": mode, "kv.eviction_policy": policy,
                                              "asr.semantic_evictions_before_rebuild": 3})
    for _ in range(12):                  # a slow reconciler: the primary fills up and evicts approximately
        rig.cycle(reconcile=False)
    assert rig.primary.state.approximate_evictions == 3 and not rig.primary.state.state_exact
    drain(rig.rec)
    assert rig.rec.phase is Phase.READY

    rig.primary_only_cycle(new=False)    # same frame again: only the suffix is new, the state is the approximate one
    cos_before = cosine(rig.primary.last_prefill_logits, oracle_logits(hf, rig.primary))
    c = rig.cycle(new=False)             # the swap is applied at this boundary; nothing else changes
    assert c.swap is not None and c.swap.late == [] and c.swap.evicted == []
    assert rig.primary.state.state_exact and contiguous(rig.primary)
    cos_after = cosine(rig.primary.last_prefill_logits, oracle_logits(hf, rig.primary))
    print(f"{mode}/{policy}: 1 - cos before the swap {1 - cos_before:.3e}, after {1 - cos_after:.3e}")
    assert cos_after >= COS_EXACT
    assert 1 - cos_before > 100 * max(1 - cos_after, 1e-9)


def test_chunks_arriving_between_ready_and_applied_survive_the_swap_exactly(tiny_model_dir, model, clip, hf):
    rig = Rig(tiny_model_dir, model, clip, **{"asr.mode": "csr", "kv.eviction_policy": "fifo"})
    while rig.rec.phase is not Phase.READY:
        rig.cycle()
    offered = rig.rec.offered_frame_ids
    # Admitted after "ready", before "applied", and not caught up yet (a slow reconciler): 2 <= asr.max_late_chunks.
    late = [rig.primary_only_cycle().frame_id for _ in range(2)]
    c = rig.cycle()
    assert c.swap is not None and c.swap.late == late and c.swap.recompute_ms > 0
    assert rig.held() == offered + late + [rig.i - 1]                 # nothing lost, in order
    assert rig.primary.state.state_exact and contiguous(rig.primary)
    assert cosine(rig.primary.last_prefill_logits, oracle_logits(hf, rig.primary)) >= COS_EXACT
    assert rig.rec.primary_frame_ids == rig.held()
    assert rig.rec.stats.rounds_applied == 1 and rig.rec.stats.rounds_aborted == 0


def test_late_frames_are_recomputed_one_frame_per_forward(tiny_model_dir, model, clip):
    """asr.late_frames_per_forward 1: the late recompute at the boundary runs forwards of one frame's rows only:
    the shape Engine.warm_up prepared (on the GPU a captured graph), never a row count first seen at a swap (on
    the H200 such a forward over the late frames took a swap to 49.7 ms, capturing a graph)."""
    rig = Rig(tiny_model_dir, model, clip, **{"asr.mode": "csr", "kv.eviction_policy": "fifo",
                                              "asr.late_frames_per_forward": 1})
    while rig.rec.phase is not Phase.READY:
        rig.cycle()
    snap = rig.rec.take_offer()
    late = [rig.primary_only_cycle().frame_id for _ in range(2)]
    with recording(rig.primary.state.backend, "forward", row_count) as rows:
        rig.primary.state.import_state(snap)
    assert rig.primary.state.last_swap.late == late and rows == [32, 32]


class TornWhenFinished(HostKV):
    """A snapshot's rows whose copy is found torn only when it is finished, as IpcKV's is when the reconciler
    rewrote its buffer under a copy already queued (the words are read on the device's stream)."""

    dtype = np.dtype(np.float32)                 # what the snapshot's checks ask of a device payload

    def __init__(self, rows):
        super().__init__(rows)
        self.order = []

    def start_write(self, backend, slots):
        self.write_into(backend, slots)
        self.order.append("copy queued")
        return self

    def finish(self):
        self.order.append("copy finished")
        raise DeviceKVUnavailable("reconciler buffer rewritten during the copy (test): torn KV")


def test_a_copy_found_torn_after_the_late_recompute_was_queued_forgets_every_frame(tiny_model_dir, model, clip):
    """The swap queues its late frames' recompute behind the KV copy and checks the copy afterwards: a torn one
    then leaves an empty, exact state (the recomputed frames attended to the mixed KV too), never a mixed one."""
    rig = Rig(tiny_model_dir, model, clip, **{"asr.mode": "csr", "kv.eviction_policy": "fifo"})
    while rig.rec.phase is not Phase.READY:
        rig.cycle()
    snap = rig.rec.take_offer()
    late = [rig.primary_only_cycle().frame_id for _ in range(2)]
    torn = TornWhenFinished(snap.kv)
    snap.kv = torn
    state = rig.primary.state
    with recording(state.backend, "forward", lambda *a, **k: torn.order.append("recompute")):
        with pytest.raises(SnapshotError, match="torn KV"):
            state.import_state(snap)
    # asr.late_frames_per_forward 2 (the default): the two late frames in one forward
    assert torn.order == ["copy queued", "recompute", "copy finished"], torn.order
    assert len(late) == 2 and rig.held() == [] and not state.frames
    assert state.next_position == state.prefix_tokens and state.state_exact
    # The camera has nothing newer yet: the next cycle answers the last frame again, and appends it (it had been
    # skipped as "the last one answered" though the swap had forgotten it: an action over the prefix alone).
    again = rig.primary_only_cycle(new=False)
    assert again.new_frame and rig.held() == [late[-1]] == [rig.i - 1]
    rig.cycle(reconcile=False)                                      # the node goes on
    assert rig.held() == [rig.i - 2, rig.i - 1]


def test_late_frames_batched_per_forward_are_prepared_in_warm_up_and_stay_exact(tiny_model_dir, model, clip, hf):
    """asr.late_frames_per_forward 2: a swap's two late frames in one forward of 64 rows, a shape the warm-up
    prepared (on the GPU captured), and the state after it still the one HF computes from scratch."""
    rig = Rig(tiny_model_dir, model, clip, **{"asr.mode": "csr", "kv.eviction_policy": "fifo",
                                              "asr.late_frames_per_forward": 2})
    backend = rig.primary.state.backend
    with recording(backend, "prepare_forward", lambda row_counts: list(row_counts)) as prepared:
        rig.primary.warm_up(4, clip[0])
    assert [64] in prepared
    while rig.rec.phase is not Phase.READY:
        rig.cycle()
    snap = rig.rec.take_offer()
    late = [rig.primary_only_cycle().frame_id for _ in range(2)]
    with recording(backend, "forward", row_count) as rows:
        rig.primary.state.import_state(snap)
    assert rig.primary.state.last_swap.late == late and rows == [64]
    assert rig.primary.state.state_exact and contiguous(rig.primary)
    rig.primary_only_cycle()                                    # attends to the swapped state and the late frames
    assert cosine(rig.primary.last_prefill_logits, oracle_logits(hf, rig.primary)) >= COS_EXACT


def test_while_ready_the_reconciler_catches_up_and_offers_a_fresher_version(tiny_model_dir, model, clip, hf):
    """Algorithm 1's catch-up does not stop at the first offer: chunks arriving while the primary has not
    applied it are computed too and offered as a fresher version, so the primary has few frames to recompute
    at its boundary however long it takes to apply."""
    rig = Rig(tiny_model_dir, model, clip, **{"asr.mode": "csr", "kv.eviction_policy": "fifo"})
    while rig.rec.phase is not Phase.READY:
        rig.cycle()
    first, offered = rig.rec.live_offer_version, rig.rec.offered_frame_ids
    late = [rig.primary_only_cycle().frame_id for _ in range(3)]      # 3 > asr.max_late_chunks (2)
    assert rig.rec.busy and rig.rec.live_offer_version == first       # the offer stays out meanwhile
    drain(rig.rec)
    assert rig.rec.phase is Phase.READY and rig.rec.live_offer_version == first + 1
    assert rig.rec.offered_frame_ids == offered + late and rig.rec.stats.reoffers == 1
    c = rig.cycle()                      # the boundary takes the newest offer: nothing left to recompute
    assert c.swap is not None and c.swap.version == first + 1 and c.swap.late == []
    assert rig.held() == offered + late + [rig.i - 1]
    assert rig.primary.state.state_exact and contiguous(rig.primary)
    assert cosine(rig.primary.last_prefill_logits, oracle_logits(hf, rig.primary)) >= COS_EXACT
    assert rig.rec.stats.rounds_applied == 1 and rig.rec.k_applied == first + 1


def test_in_the_nodes_order_the_swap_follows_the_cycle_and_recomputes_the_frame_it_admitted(
        tiny_model_dir, model, clip, hf):
    """Given the next boundary, the driver swaps as the reasoning node does: after the cycle (timed apart, not in
    its latency), so the frame that cycle admitted is late for the offer and recomputed over it, exactly; with
    no room left before that boundary the offer waits for the next one (Engine.swap_recompute_budget_frames)."""
    # Not deterministic (the swap's slack is real time), and a 2-core machine under load has given a tiny-model cycle
    # up at 34.8 ms of a 33 ms deadline: the deadline is widened, the swap's bound is the next boundary given here.
    rig = Rig(tiny_model_dir, model, clip, **{"asr.mode": "csr", "kv.eviction_policy": "fifo",
                                              "cycle.deterministic": False, "cycle.deadline_ms": 250.0})

    def node_cycle(slack_s: float):
        rig.i += 1
        c = rig.driver.cycle(rig.frame(rig.i - 1), float(rig.i - 1), next_boundary_perf=time.perf_counter() + slack_s)
        assert c.result.is_action, c.result.detail
        return c

    swaps = []
    while len(swaps) < 2:
        c = node_cycle(10.0)
        assert (c.swap is None) == (c.swap_ms is None)
        if c.swap is not None:
            swaps.append(c)
            assert c.swap.late == [rig.i - 1] and c.swap.recompute_ms > 0 and c.swap_ms >= c.swap.recompute_ms
            assert 0.0 <= c.swap.place_off_cpu_ms <= c.swap.place_ms < c.swap_ms
            assert 0.0 <= c.swap.queue_off_cpu_ms <= c.swap.kv_copy_ms < c.swap_ms
            assert rig.primary.state.state_exact and contiguous(rig.primary)
            c = node_cycle(10.0)                       # the next cycle attends to the swapped state: as from scratch
            assert cosine(rig.primary.last_prefill_logits, oracle_logits(hf, rig.primary)) >= COS_EXACT
        drain(rig.rec)
    assert rig.primary.state.recompute_ms_per_frame is not None      # measured by those swaps
    while rig.rec.phase is not Phase.READY:
        node_cycle(10.0)
        drain(rig.rec)
    version = rig.primary.state.state_version
    offered = rig.rec.live_offer_version
    c = node_cycle(-1.0)                    # the next boundary already passed: not even a swap without late frames
    assert c.swap is None and not rig.driver.deferred and rig.primary.state.state_version == version
    assert rig.rec.live_offer_version == offered       # the offer was left for the next boundary, not taken
    c = node_cycle(10.0)                               # which has room: applied, its late frames recomputed
    assert c.swap is not None and c.swap.version == offered and len(c.swap.late) == 2


def test_a_stale_offer_is_deferred_not_rejected_and_the_round_goes_on(tiny_model_dir, model, clip):
    rig = Rig(tiny_model_dir, model, clip, **{"asr.mode": "csr", "kv.eviction_policy": "fifo",
                                              "asr.max_late_chunks": 1})
    while rig.rec.phase is not Phase.READY:
        rig.cycle()
    version = rig.primary.state.state_version
    late = [rig.primary_only_cycle().frame_id for _ in range(2)]      # 2 > asr.max_late_chunks (1)
    c = rig.cycle(reconcile=False)       # the boundary takes the stale offer and leaves it
    assert c.swap is None and rig.driver.deferred == {"stale": 1}
    assert rig.primary.state.state_version == version and rig.held()[-3:] == late + [rig.i - 1]
    drain(rig.rec)                       # no abort: the 3 chunks are caught up and a fresher version offered
    assert rig.rec.stats.rounds_aborted == 0 and rig.rec.stats.offers_rejected == 0
    assert rig.rec.phase is Phase.READY and rig.rec.stats.reoffers == 1
    c = rig.cycle()
    assert c.swap is not None and c.swap.late == [] and rig.primary.state.state_exact
    assert rig.held()[-4:-1] == late + [rig.i - 2]

    snap = rig.primary.state.export_state(version=rig.primary.state.state_version + 1)
    for _ in range(2):                   # a snapshot with 2 frames after it, at max_late_chunks 1: nothing changes
        rig.primary_only_cycle()
    held = rig.held()
    with pytest.raises(SwapDeferred, match="more than asr.max_late_chunks") as deferred:
        rig.primary.state.import_state(snap)
    assert deferred.value.reason == "stale" and rig.held() == held


def test_a_reconciler_stopped_mid_round_leaves_the_primary_serving_on_its_own(tiny_model_dir, model, clip):
    rig = Rig(tiny_model_dir, model, clip, **{"asr.mode": "csr", "kv.eviction_policy": "semantic"})
    while rig.rec.phase is Phase.IDLE:
        rig.cycle(reconcile=False)
        rig.rec.tick(32)                 # one frame per step: the round takes several ticks
    assert rig.rec.phase is Phase.WARMING
    rig.rec.stop()
    version = rig.primary.state.state_version
    for _ in range(20):
        rig.cycle()                      # every cycle asserts it produced an action
    assert rig.rec.phase is Phase.STOPPED and rig.rec.take_offer() is None
    assert rig.primary.state.state_version == version
    assert rig.primary.state.approximate_evictions > 0 and len(rig.held()) <= rig.primary.state.frame_capacity

    alone = Rig(tiny_model_dir, model, clip, reconciler=False)          # no reconciler at all
    for _ in range(15):
        assert alone.cycle().phase == "absent"
    assert alone.primary.state.kv.evictions > 0


def test_a_reconciler_thread_that_dies_on_a_malformed_chunk_does_not_take_the_primary_down(
        tiny_model_dir, model, clip):
    rig = Rig(tiny_model_dir, model, clip, work="thread", **{"asr.mode": "csr"})
    try:
        for _ in range(4):
            rig.cycle()
        good = rig.driver.primary_chunk(rig.i - 1)
        bad_id = rig.i             # the id the primary's next frame will have (the reconciler then drops that one)
        rig.rec.mirror_encoded(StateChunk(bad_id, 0.0, good.tokens[:7], good.pooled))   # 7 rows, not 32
        for _ in range(8):               # reach the threshold: the round includes the bad chunk and fails on it
            rig.cycle()
        deadline = time.monotonic() + 10.0
        while rig.driver.reconciler_error is None and time.monotonic() < deadline:
            rig.cycle()
        assert isinstance(rig.driver.reconciler_error, ValueError)
        assert f"chunk {bad_id}" in str(rig.driver.reconciler_error)
        assert rig.rec.phase is Phase.STOPPED
        for _ in range(10):
            rig.cycle()                  # still serving, now with its own eviction
        assert len(rig.held()) <= rig.primary.state.frame_capacity
    finally:
        rig.driver.close()


def test_semantic_mode_counts_the_primary_evictions_and_trims_the_rebuild(tiny_model_dir, model, clip):
    n = 4
    rig = Rig(tiny_model_dir, model, clip, **{"asr.mode": "semantic", "kv.eviction_policy": "semantic",
                                              "asr.semantic_evictions_before_rebuild": n, "asr.rebuild_fill": 0.75})
    evicted = []
    while rig.rec.version == 0:
        c = rig.cycle()
        evicted += c.result.evicted_frame_ids
        assert rig.rec.primary_frame_ids == rig.held()
    assert len(evicted) == n == rig.rec.summary()["approximate_evictions"]
    kept = rig.rec.offered_frame_ids
    assert set(kept) <= set(rig.held()) and len(kept) == int(0.75 * rig.primary.state.frame_capacity)
    c = rig.cycle()
    assert c.swap is not None and rig.primary.state.state_exact and rig.rec.summary()["approximate_evictions"] == 0


def test_snapshots_round_trip_through_npz_and_mismatches_are_named(tiny_model_dir, model, clip, tmp_path):
    rig = Rig(tiny_model_dir, model, clip)
    for _ in range(3):
        rig.cycle()
    snap = rig.primary.state.export_state(version=7)
    back = StateSnapshot.load(snap.save(tmp_path / "s.npz"))
    assert back.frame_ids == snap.frame_ids
    np.testing.assert_array_equal(back.prefix_ids, snap.prefix_ids)
    np.testing.assert_array_equal(back.kv, snap.kv)
    np.testing.assert_array_equal(back.rows, snap.rows)

    hand = "You control a robot hand. Answer each camera frame with one action."
    other = Rig(tiny_model_dir, model, clip, **{"prompt.system_prompt": hand})
    with pytest.raises(SnapshotError, match="different static prefix"):
        other.primary.state.import_state(back)
    bad_kv = StateSnapshot(version=8, frames=back.frames, kv=back.kv[:, :, :-1], next_position=back.next_position,
                           prefix_ids=back.prefix_ids)
    with pytest.raises(SnapshotError, match="kv must be float32"):
        rig.primary.state.import_state(bad_kv)
    held = rig.held()
    rig.primary.state.import_state(back)                                     # v7 > 0: applied
    assert rig.held() == held and rig.primary.state.state_version == 7


def test_a_taken_offer_is_reconciled_from_the_shadow_or_abandoned_when_never_applied(tiny_model_dir, model, clip):
    """The cross-process flow: a reader takes the offer at once; the primary applies it later or never."""
    rig = Rig(tiny_model_dir, model, clip, **{"asr.mode": "csr", "kv.eviction_policy": "fifo"})
    while rig.rec.phase is not Phase.READY:
        rig.cycle()
    snap = rig.rec.take_offer()                              # e.g. written to a file for the other process
    late = [rig.primary_only_cycle().frame_id for _ in range(2)]
    drain(rig.rec)                                           # meanwhile a fresher version of the round is offered
    assert rig.rec.phase is Phase.READY and rig.rec.live_offer_version == snap.version + 1
    rig.primary.state.import_state(snap)                     # the primary applies the one it took
    assert rig.primary.state.last_swap.late == late
    rig.rec.notify_applied(snap.version, None)               # no frame list: the shadow works the late ones out
    drain(rig.rec)
    assert rig.rec.k_applied == snap.version and rig.rec.primary_frame_ids == rig.held()
    assert rig.rec.live_offer_version == 0 and rig.rec.take_offer() is None   # the fresher one is moot now
    assert rig.rec.stats.rounds_applied == 1

    while rig.rec.phase is not Phase.READY:                  # next round; this time the offer is taken and lost
        rig.cycle()
    lost = rig.rec.take_offer()
    while rig.rec.stats.rounds_aborted == 0:                 # the primary never applies it and keeps evicting;
        rig.primary_only_cycle()                             # the round keeps catching up until it outgrows
        drain(rig.rec)                                       # the arena
    assert rig.rec.stats.aborts["no_longer_fits"] == 1 and rig.primary.state.state_version == snap.version
    assert rig.rec.summary()["rounds_aborted_by"]["no_longer_fits"] == 1
    while rig.rec.k_applied == snap.version:                 # a fresh round from what the primary holds now
        rig.cycle()
    assert rig.rec.k_applied > lost.version and rig.primary.state.state_exact
    assert rig.rec.primary_frame_ids == rig.held()


def test_a_round_aborted_here_but_applied_there_counts_as_applied(tiny_model_dir, model, clip):
    """Across processes the primary may apply an offer it loaded just before the reconciler gave its round up:
    the round then ended in a swap, and the counts say so (started = applied + aborted + the one in progress)."""
    rig = Rig(tiny_model_dir, model, clip, **{"asr.mode": "csr", "kv.eviction_policy": "fifo",
                                              "asr.max_late_chunks": 9})
    while rig.rec.phase is not Phase.READY:
        rig.cycle()
    taken = rig.rec.take_offer()
    while rig.rec.stats.rounds_aborted == 0:                 # the reconciler gives the round up ...
        rig.primary_only_cycle()
        drain(rig.rec)
    assert rig.rec.live_offer_version == 0
    rig.primary.state.import_state(taken)                    # ... while the primary applies the offer it had
    rig.rec.notify_applied(taken.version, rig.primary.state.last_swap.late)
    drain(rig.rec)
    st = rig.rec.stats
    assert (st.rounds_applied, st.rounds_aborted, sum(st.aborts.values())) == (1, 0, 0)
    assert len(st.trigger_to_applied_ms) == 1 and rig.rec.primary_frame_ids == rig.held()
    assert st.rounds_started - (rig.rec.phase is not Phase.IDLE) == st.rounds_applied + st.rounds_aborted


def test_asr_modes_are_policy_objects_picked_by_name():
    from vla_edge_ros.core.asr_modes import CsrMode, SemanticMode, make_asr_mode
    cfg = C.load()
    assert isinstance(make_asr_mode(cfg.replace({"asr.mode": "csr"})), CsrMode)
    semantic = make_asr_mode(cfg.replace({"asr.mode": "semantic"}))
    assert isinstance(semantic, SemanticMode)
    assert semantic.trigger(10, 20, cfg.asr.semantic_evictions_before_rebuild) == "semantic_evictions"
    assert semantic.trigger(10, 20, cfg.asr.semantic_evictions_before_rebuild - 1) is None
    csr = make_asr_mode(cfg)
    assert csr.trigger(18, 20, 0) == "csr_threshold" and csr.trigger(17, 20, 0) is None
    fill = make_asr_mode(cfg.replace({"asr.mode": "semantic", "asr.semantic_trigger": "fill", "asr.rebuild_fill": 0.5}))
    assert fill.trigger(18, 20, 0) == "semantic_fill" and fill.trigger(17, 20, 99) is None


def test_semantic_fill_trigger_rebuilds_before_the_primary_ever_evicts(tiny_model_dir, model, clip):
    """asr.semantic_trigger fill: a round starts at asr.threshold, keeps asr.rebuild_fill of the capacity chosen by
    the eviction policy, and a reconciler that keeps up swaps before the primary has to evict on its own: the state
    stays exact, where the evictions trigger serves on an approximate one from the first eviction to the swap."""
    rig = Rig(tiny_model_dir, model, clip, **{"asr.mode": "semantic", "asr.semantic_trigger": "fill",
                                              "kv.eviction_policy": "semantic", "asr.rebuild_fill": 0.5})
    cap = rig.primary.state.frame_capacity
    while rig.rec.version == 0:
        c = rig.cycle()
        assert c.result.evicted_frame_ids == [] and rig.primary.state.state_exact
    kept = rig.rec.offered_frame_ids
    assert set(kept) <= set(rig.held()) and len(kept) == int(0.5 * cap)
    swaps = 0
    for _ in range(30):
        c = rig.cycle()
        swaps += c.swap is not None
        assert rig.primary.state.state_exact and rig.rec.primary_frame_ids == rig.held()
    assert swaps >= 3 and rig.primary.state.kv.evictions == 0 and rig.rec.stats.rounds_aborted == 0


@pytest.mark.parametrize("snapshot_rows", [True, False])
def test_an_offer_without_vision_rows_takes_them_from_the_frames_the_primary_admitted(
        tiny_model_dir, model, clip, hf, snapshot_rows):
    """asr.snapshot_rows false: the offer carries no vision rows, and the swapped-in frames, those the primary's
    own policy evicted while the round ran among them, get theirs from the primary's records; a re-base then
    recomputes every frame (none forgotten for want of rows) into HF's from-scratch state."""
    rig = Rig(tiny_model_dir, model, clip, **{"asr.mode": "csr", "kv.eviction_policy": "semantic",
                                              "asr.snapshot_rows": snapshot_rows})
    for _ in range(12):                  # a slow reconciler: the primary fills up and evicts on its own
        rig.cycle(reconcile=False)
    drain(rig.rec)
    assert rig.rec.phase is Phase.READY
    offer = rig.rec._offer               # the snapshot object the primary will take at the next boundary
    assert (offer.rows is None) is (not snapshot_rows)
    released = set(offer.frame_ids) - set(rig.held())
    assert released, "the primary evicted none of the round's frames: nothing here would need released rows"
    c = rig.cycle(new=False)
    assert c.swap is not None and set(released) <= set(rig.held()) and rig.primary.state.state_exact
    assert all(rig.primary.state.frames[f].tokens is not None for f in rig.held())
    if not snapshot_rows:                # the released frames' rows come lent from the store reserved up front
        assert not any(rig.primary.state.frames[f].tokens.flags.writeable for f in released)
    held = rig.held()
    keep, dropped, _ = rig.primary.state.recompute_retained()
    assert keep == held and dropped == []
    rig.primary_only_cycle(new=False)
    assert cosine(rig.primary.last_prefill_logits, oracle_logits(hf, rig.primary)) >= COS_EXACT


def test_a_round_that_cannot_catch_up_is_aborted_once_and_the_next_is_sized_to_finish(tiny_model_dir, model, clip,
                                                                                         caplog):
    """The reconciler rebuilds 2 frames per camera period while 1 arrives: semantic mode's round of rebuild_fill 0.75
    (6 of 9 frames) outgrows the arena before it catches up, so it is aborted (no_longer_fits). Its warm-up measured 6
    frames in 2 periods from the trigger (the first step ran in the trigger's own period), so the next round keeps at
    most floor(margin x 9 x (1 - 1/3)) = 4 frames (core/round_budget.py), catches up and is applied."""
    rig = Rig(tiny_model_dir, model, clip, **{"asr.mode": "semantic", "asr.semantic_trigger": "fill",
                                              "kv.eviction_policy": "semantic", "asr.rebuild_fill": 0.75,
                                              "asr.round_fit_margin": 0.8})
    rec, tpf = rig.rec, rig.cfg.vision.tokens_per_frame
    cap = rig.primary.state.frame_capacity
    st, first_round, at_second = rec.stats, None, None
    for _ in range(60):
        rig.primary_only_cycle()
        rec.receive()
        if first_round is None and rec.live_round:
            first_round = list(rec._round.frame_ids)
        if at_second is None and st.rounds_started == 2:
            at_second = rec.summary()
        rec.step(2 * tpf)                     # one slack window: two frames
        if rec.offer_due:
            break
    assert len(first_round) == int(0.75 * cap) == 6
    assert st.aborts["no_longer_fits"] == 1 and st.rounds_sized_to_fit == 1
    # The abort's log line says where the round stood: still catching up, what it rebuilt, never offered.
    abort_line = next(r.getMessage() for r in caplog.records if "aborted (no_longer_fits)" in r.getMessage())
    assert re.search(r"catching_up \d+ ms after its semantic_fill trigger, rebuilt \d+ of \d+ frames \(6 kept at the "
                     r"trigger\), never offered", abort_line), abort_line
    assert at_second["arrival_frames_per_s"] == pytest.approx(rig.cfg.cycle.camera_hz)
    assert at_second["rebuild_frames_per_s"] == pytest.approx(3 * rig.cfg.cycle.camera_hz)
    assert at_second["round_frame_limit"] == 4 and rec._round.warm == 4 and len(rec._round.frame_ids) <= cap
    snap = rec.make_offer()
    rig.primary.state.import_state(snap)
    rec.notify_applied(snap.version, rig.primary.state.last_swap.late)
    rec.receive()
    assert st.rounds_applied == 1 and rig.primary.state.state_exact and rec.primary_frame_ids == rig.held()


def test_interleaved_work_says_what_each_gap_ran(tiny_model_dir, model, clip):
    """InProcessAsr.last_gap (bench asr's timeline names what made a gap run past its boundary): the inbox first,
    then each step with its frames and an offer when one was made, in order; the steps' frames are the work done."""
    rig = Rig(tiny_model_dir, model, clip)
    tpf, seen = rig.cfg.vision.tokens_per_frame, []
    for _ in range(60):
        rig.cycle(reconcile=False)
        done = rig.driver.work_until(time.perf_counter() + 5.0)
        gap = rig.driver.last_gap
        assert gap[0][0] == "receive" and all(what in ("step", "offer") for what, _, _ in gap[1:]), gap
        assert sum(frames for what, frames, _ in gap if what == "step") * tpf == done
        assert all(ms >= 0.0 for _, _, ms in gap) and all(frames > 0 for what, frames, _ in gap if what == "step")
        assert [what for what, _, _ in gap].count("offer") <= 1 and (gap[-1][0] == "offer" or "offer" not in
                                                                     [what for what, _, _ in gap])
        seen += [what for what, _, _ in gap]
    assert {"receive", "step", "offer"} <= set(seen) and rig.rec.stats.rounds_applied >= 1
    # The steps' contexts reach the step costs only where asr.step_cost_follows_context asks (core/step_costs.py).
    assert all(c is None for t in rig.driver.scheduler.costs.by_frames.values() for c in t.contexts)
    aware = Rig(tiny_model_dir, model, clip, **{"asr.step_cost_follows_context": True})
    for _ in range(20):
        aware.cycle(reconcile=False)
        aware.driver.work_until(time.perf_counter() + 5.0)
    contexts = [c for t in aware.driver.scheduler.costs.by_frames.values() for c in t.contexts]
    assert contexts and all(0 < c <= aware.cfg.kv.capacity_tokens for c in contexts)


def test_with_an_offer_loader_a_boundary_applies_only_offers_it_has_prepared(tiny_model_dir, model, clip):
    """bench asr's driver (offer_loader=True) prepares offers on a thread, as the reasoning node's swap loader does,
    and a boundary takes an offer only once that is done: held back at the gate, the offer waits (still offered);
    released, the next boundary applies it with the layout the loader planned."""
    import threading
    from vla_edge_ros.core.in_process_asr import InProcessAsr
    rig = Rig(tiny_model_dir, model, clip)
    gate, prepared = threading.Event(), []

    def slow_prepare(snap):
        gate.wait(10.0)
        rig.primary.state.prepare_swap(snap)
        prepared.append((snap.version, snap.placement is not None))

    rig.driver = InProcessAsr(rig.primary, rig.rec, work="interleaved", offer_loader=True)
    rig.driver.loader._prepare = slow_prepare
    try:
        for _ in range(40):
            if rig.rec.offered_version is not None:
                break
            rig.cycle()
        version = rig.rec.offered_version
        assert version is not None, "no offer within 40 cycles"
        c = rig.cycle(new=False, reconcile=False)
        assert c.swap is None and rig.rec.offered_version == version and not rig.driver.loader.prepared(version)
        gate.set()
        deadline = time.monotonic() + 10.0
        while not rig.driver.loader.prepared(version) and time.monotonic() < deadline:
            time.sleep(0.005)
        assert prepared and prepared[-1] == (version, True)
        # The boundary takes the version it checked, not a fresher one made meanwhile (take_offer(version)).
        assert rig.rec.take_offer(version + 1) is None and rig.rec.offered_version == version
        c = rig.cycle(new=False, reconcile=False)
        assert c.swap is not None and c.swap.version == version and rig.primary.state.state_version == version
    finally:
        gate.set()
        rig.driver.close()


def test_an_offer_the_loader_cannot_prepare_leaves_it_preparing_the_next(tiny_model_dir, model, clip):
    """An offer whose layout the slots refuse (more frames than fit: the slot manager's own error, not a
    SnapshotError) is marked prepared and left to the boundary's checks, which refuse it; the loader's thread
    lives on and prepares the next offer (it used to end there, and no later offer was ever applied)."""
    from vla_edge_ros.core.offer_loader import OfferLoader
    from vla_edge_ros.core.state_snapshot import SnapshotFrame
    rig = Rig(tiny_model_dir, model, clip)
    state, tpf = rig.primary.state, rig.cfg.vision.tokens_per_frame
    spec, p0 = state.backend.spec, state.prefix_tokens

    def snapshot(version, n):
        frames = [SnapshotFrame(i, 0.0, p0 + i * tpf, np.ones(spec.hidden_size, np.float32)) for i in range(n)]
        kv = np.zeros((2, spec.num_layers, n * tpf, spec.kv_dim), np.float32)
        return StateSnapshot(version, frames, kv, p0 + n * tpf, np.asarray(state.prefix_ids))

    loader = OfferLoader(state.prepare_swap)
    try:
        loader.submit(snapshot(1, state.kv.capacity // tpf + 1))
        loader.submit(snapshot(2, 2))
        deadline = time.monotonic() + 10.0
        while not loader.prepared(2) and time.monotonic() < deadline:
            time.sleep(0.005)
        assert loader.prepared(1) and loader.prepared(2)
        with pytest.raises(SnapshotError, match="slots"):
            state.import_state(snapshot(1, state.kv.capacity // tpf + 1))     # what the boundary says of it
    finally:
        loader.close()


class FailsToQueue(HostKV):
    """A snapshot's rows whose copy cannot even be queued (an arena of another layout, a driver error)."""

    dtype = np.dtype(np.float32)

    def start_write(self, backend, slots):
        raise ValueError("IpcKV.write_into: arena layout differs from the reconciler's (test)")


def test_a_copy_that_cannot_be_queued_leaves_an_empty_exact_state_not_a_half_swapped_one(tiny_model_dir, model, clip):
    """The snapshot's layout is in force and the old records gone when the copy is queued: a failure there other
    than a torn buffer left the slots of the new layout with no frame records. The state is emptied, as for a torn
    copy, the swap rejected with the reason, and the node goes on."""
    rig = Rig(tiny_model_dir, model, clip, **{"asr.mode": "csr", "kv.eviction_policy": "fifo"})
    while rig.rec.phase is not Phase.READY:
        rig.cycle()
    snap = rig.rec.take_offer()
    snap.kv = FailsToQueue(snap.kv)
    state = rig.primary.state
    with pytest.raises(SnapshotError, match="arena layout differs"):
        state.import_state(snap)
    assert not state.frames and rig.held() == [] and state.next_position == state.prefix_tokens
    again = rig.primary_only_cycle(new=False)
    assert again.new_frame and rig.held() == [rig.i - 1]


class OtherArena(HostKV):
    """A snapshot's rows for another arena layout (two nodes configured differently): refused by its check."""

    dtype = np.dtype(np.float32)

    def check_fits(self, backend):
        raise ValueError("IpcKV.write_into: arena layout differs from the reconciler's (test)")


def test_rows_that_do_not_fit_this_arena_are_rejected_before_anything_changes(tiny_model_dir, model, clip):
    """A pair of nodes configured apart offers rows this arena cannot take at every round: rejected by the check
    before the swap changes anything, so the primary keeps its state (emptied at each offer otherwise)."""
    rig = Rig(tiny_model_dir, model, clip, **{"asr.mode": "csr", "kv.eviction_policy": "fifo"})
    while rig.rec.phase is not Phase.READY:
        rig.cycle()
    snap = rig.rec.take_offer()
    snap.kv = OtherArena(snap.kv)
    held = rig.held()
    with pytest.raises(SnapshotError, match="arena layout differs"):
        rig.primary.state.import_state(snap)
    assert rig.held() == held and held
