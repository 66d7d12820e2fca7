"""asr.swap_finish next_cycle: a swap's device work leaves the boundary for the cycle after it.

The boundary only queues the snapshot's KV copy and admits the late frames' slots; the next cycle, at its start,
checks the copy and writes the late frames before anything reads the state.
Two real engines on the seeded tiny model and real footage (test_reconciliation.py's Rig), HF transformers as the
oracle of the state after that cycle; the swap client of the reasoning node (core/swap_protocol.py) with an offer
whose KV copy is queued as a GPU's is, checked only when finished.
"""
import numpy as np
import pytest

from engine_oracle import cosine, oracle_logits
from test_reconciliation import COS_EXACT, Rig, TornWhenFinished, contiguous, recording, row_count
from vla_edge_ros import config as C
from vla_edge_ros.core.admission import AdmissionController
from vla_edge_ros.core.engine_factory import primary_engine
from vla_edge_ros.core.footage import read_clip, resize_rgb
from vla_edge_ros.core.frames import Frame
from vla_edge_ros.core.reconciliation import Phase
from vla_edge_ros.core.swap_protocol import SwapAnswer, SwapClient, SwapOffer
from vla_edge_ros.model.backend import HostKV

NEXT = {"asr.mode": "csr", "kv.eviction_policy": "fifo", "asr.swap_finish": "next_cycle"}


def frames_in(x, positions, write_slots, context_slots, *args, **kwargs):
    """What a forward writes and what it attends to besides itself, in whole 32-row frames (the prefix's slots
    counted in with the frames, rounded down)."""
    return x.shape[0] // 32, context_slots.size // 32


def ready_with_late_frames(rig, late: int = 2):
    """Run the rig until its reconciler offers a state, take the offer, and let `late` frames arrive after it."""
    while rig.rec.phase is not Phase.READY:
        rig.cycle()
    snap = rig.rec.take_offer()
    offered = list(snap.frame_ids)
    return snap, offered, [rig.primary_only_cycle().frame_id for _ in range(late)]


def test_the_late_frames_are_written_by_the_next_cycle_before_its_prefill_and_the_state_is_exact(
        tiny_model_dir, model, clip, hf):
    rig = Rig(tiny_model_dir, model, clip, **NEXT)
    eng = rig.primary
    snap, offered, late = ready_with_late_frames(rig)
    assert eng.next_cycle_late_room() == 2
    with recording(eng.state.backend, "forward", row_count) as boundary_rows:
        eng.state.import_state(snap, None, eng.next_cycle_late_room())
    swap = eng.state.last_swap
    assert boundary_rows == [] and swap.recompute_ms == 0.0     # no forward at the boundary
    assert swap.late == late and swap.in_next_cycle == 2 and eng.state.pending_frames == 2
    assert swap.admit_ms > 0.0                                   # their admission, timed as a share of the rest
    assert rig.held() == offered + late                          # their slots and positions are in force already
    suffix, prefix_frames = int(eng.suffix.size), eng.state.prefix_tokens // 32
    order = []
    with recording(eng.backend, "forward", lambda *a, **k: order.append(("late", frames_in(*a, **k)))), \
            recording(eng.backend, "run_cycle_tokens", lambda x, *a, **k: order.append(("cycle", x.shape[0]))):
        result = rig.primary_only_cycle()
    # One forward of both late frames over the swapped-in state (asr.late_frames_per_forward 2), then the cycle's
    # own prefill of its frame and the suffix, as always.
    assert order == [("late", (2, len(offered) + prefix_frames)), ("cycle", 32 + suffix)], order
    assert result.swap_frames == 2 and result.prefill_tokens == 32 + suffix and "swap_finish" in result.phases_ms
    assert eng.state.pending_frames == 0 and rig.held() == offered + late + [result.frame_id]
    assert eng.state.state_exact and contiguous(eng)
    assert cosine(eng.last_prefill_logits, oracle_logits(hf, eng)) >= COS_EXACT
    rig.primary_only_cycle(new=False)                            # and the cycle after it reads the same state
    assert cosine(eng.last_prefill_logits, oracle_logits(hf, eng)) >= COS_EXACT


def test_with_the_default_the_boundary_recomputes_them_and_the_room_is_zero(tiny_model_dir, model, clip):
    rig = Rig(tiny_model_dir, model, clip, **{**NEXT, "asr.swap_finish": "boundary"})
    eng = rig.primary
    snap, _offered, late = ready_with_late_frames(rig)
    assert eng.next_cycle_late_room() == 0
    with recording(eng.state.backend, "forward", row_count) as rows:
        eng.state.import_state(snap, None, eng.next_cycle_late_room())
    assert rows == [64] and eng.state.last_swap.in_next_cycle == 0 and eng.state.pending_frames == 0
    result = rig.primary_only_cycle()
    assert result.swap_frames == 0 and "swap_finish" not in result.phases_ms


def test_the_room_is_what_the_next_cycles_planned_cost_leaves(tiny_model_dir, model, clip):
    """As many late frames as fit beside the next cycle's own estimate inside the deadline less the margin, at the
    planned cost of a frame's recompute; all of them (asr.max_late_chunks) with nothing measured yet."""
    rig = Rig(tiny_model_dir, model, clip, **{**NEXT, "cycle.deterministic": False})
    eng, cyc = rig.primary, rig.cfg.cycle
    suffix, decode, tpf = int(eng.suffix.size), eng.cfg.action.num_tokens - 1, 32
    assert eng.next_cycle_late_room() == 2
    headroom = eng.cfg.kv.recompute_headroom
    for room in (2, 1, 0):
        # A measured cycle whose estimate leaves room for `room` frames and a half at a frame's planned cost.
        eng.admission = AdmissionController(cyc, eng.cfg.admission)
        prefill_ms = 0.5
        frame_ms = prefill_ms / (tpf + suffix) * tpf * headroom
        decode_ms = cyc.deadline_ms - cyc.safety_margin_ms - prefill_ms - (room + 0.5) * frame_ms
        eng.admission.observe(prefill_ms, tpf + suffix, decode_ms, decode)
        assert eng.next_cycle_late_room() == room


def test_a_cycle_that_ends_in_a_fallback_still_writes_them_first(tiny_model_dir, model, clip, hf):
    rig = Rig(tiny_model_dir, model, clip, **NEXT)
    eng = rig.primary
    snap, offered, late = ready_with_late_frames(rig)
    eng.state.import_state(snap, None, eng.next_cycle_late_room())
    stale = eng.run_cycle(rig.frame(rig.i), now_s=rig.i + 10.0)     # its frame is 10 s old: a fallback, no prefill
    assert stale.reason == "stale_frame" and stale.swap_frames == 2 and eng.state.pending_frames == 0
    assert rig.held() == offered + late and eng.state.state_exact and contiguous(eng)
    result = rig.primary_only_cycle()
    assert result.swap_frames == 0 and rig.held() == offered + late + [result.frame_id]
    assert cosine(eng.last_prefill_logits, oracle_logits(hf, eng)) >= COS_EXACT


def test_a_failed_late_forward_forgets_those_frames_and_the_cycle_still_acts_on_an_exact_state(
        tiny_model_dir, model, clip, hf, caplog):
    rig = Rig(tiny_model_dir, model, clip, **NEXT)
    eng = rig.primary
    snap, offered, _late = ready_with_late_frames(rig)
    eng.state.import_state(snap, None, eng.next_cycle_late_room())
    real = eng.state.backend.forward

    def fails(*args, **kwargs):
        raise RuntimeError("device fault (test)")
    eng.state.backend.forward = fails
    try:
        result = eng.run_cycle(rig.frame(rig.i), float(rig.i))
    finally:
        eng.state.backend.forward = real
    assert result.is_action and result.swap_frames == 0 and "device fault" in caplog.text
    assert rig.held() == offered + [rig.i] and eng.state.pending_frames == 0 and eng.state.state_exact
    assert contiguous(eng)                                       # their positions given back before its frame
    assert cosine(eng.last_prefill_logits, oracle_logits(hf, eng)) >= COS_EXACT


class QueuedCopy(HostKV):
    """A snapshot's rows whose copy, like a GPU's, is queued by start_write and checked by finish()."""

    dtype = np.dtype(np.float32)

    def __init__(self, rows, order):
        super().__init__(rows)
        self.order = order

    def start_write(self, backend, slots):
        self.write_into(backend, slots)
        self.order.append("copy queued")
        return self

    def finish(self):
        self.order.append("copy checked")


def test_a_copy_found_torn_by_the_next_cycle_empties_the_state_before_it_reads_it(tiny_model_dir, model, clip, hf):
    rig = Rig(tiny_model_dir, model, clip, **NEXT)
    eng = rig.primary
    snap, _offered, _late = ready_with_late_frames(rig)
    torn = TornWhenFinished(snap.kv)
    snap.kv = torn
    with recording(eng.backend, "run_cycle_tokens", lambda *a, **k: torn.order.append("cycle")), \
            recording(eng.backend, "forward", lambda *a, **k: torn.order.append("late frames")):
        eng.state.import_state(snap, None, eng.next_cycle_late_room())   # no error at the boundary
        assert eng.state.last_swap.copy_pending and eng.state.swap_copy_pending
        assert torn.order == ["copy queued"]
        result = eng.run_cycle(rig.frame(rig.i), float(rig.i))
    # Checked before anything read it: the late frames, written over it otherwise, are forgotten with the rest.
    assert torn.order == ["copy queued", "copy finished", "cycle"]
    assert result.is_action and "torn" in result.detail and result.swap_settle_ms is not None
    assert eng.state.torn_after_apply == 1 and result.swap_frames == 0
    assert rig.held() == [rig.i] and eng.state.state_exact             # only its own frame, exact
    assert cosine(eng.last_prefill_logits, oracle_logits(hf, eng)) >= COS_EXACT


def test_the_swap_client_sends_no_request_until_the_cycle_after_the_swap_checked_its_copy(
        tiny_model_dir, tmp_path):
    cfg = C.load(overrides={"model.path": str(tiny_model_dir), "kv.capacity_tokens": 480,
                            "cycle.deterministic": True, "asr.swap_finish": "next_cycle"})
    clip = read_clip("bikes.mp4", max_frames=6)
    frames = [Frame(resize_rgb(px, cfg.vision.image_width, cfg.vision.image_height), 10.0 + i / 60, i + 1)
              for i, px in enumerate(clip)]
    primary = primary_engine(cfg)
    for f in frames[:3]:
        assert primary.run_cycle(f, f.stamp_s).new_frame
    snap = primary.state.export_state(version=1)
    snap.round = 1
    path = snap.save(tmp_path / "v1.npz")
    assert primary.run_cycle(frames[3], frames[3].stamp_s).new_frame      # one late frame
    order = []
    client = SwapClient(poll_period_s=0.0, request_timeout_s=2.0,
                        open_device_kv=lambda descriptor: QueuedCopy(snap.kv, order))
    client.load_offer(client.on_response(SwapAnswer(SwapOffer(1, str(path), 3, 3, kv={"buffer": 0}, round=1))))
    outcome = client.apply_ready(primary.state, cycle_id=4, next_cycle_room=primary.next_cycle_late_room())
    assert outcome.status == "applied" and outcome.report.copy_pending and outcome.report.in_next_cycle == 1
    assert order == ["copy queued"] and not client.want_request()      # the reconciler's buffer is still read
    result = primary.run_cycle(frames[4], frames[4].stamp_s)
    assert order == ["copy queued", "copy checked"] and result.swap_frames == 1
    client.after_cycle(result)
    assert client.want_request()
    summary = client.summary()
    assert summary["swap_settle_ms_max"] != "" and summary["swap_next_cycle_ms_max"] == round(result.elapsed_ms, 3)
    assert summary["swap_recompute_ms_max"] == 0.0


def test_an_unknown_swap_finish_is_refused_by_name():
    with pytest.raises(C.ConfigError, match="asr.swap_finish must be one of"):
        C.load(overrides={"asr.swap_finish": "later"})
