"""core/swap_protocol.py without ROS: two real engines (tiny model, real footage) play the
reasoning and reconciler processes; offers travel as files and JSON, the applied version
travels back as the tag of the next state chunk."""
import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from vla_edge_ros.core.engine_factory import primary_engine
from vla_edge_ros import config as C
from vla_edge_ros.core.engine_factory import reconciler_state
from vla_edge_ros.core.footage import read_clip, resize_rgb
from vla_edge_ros.core.frames import Frame
from vla_edge_ros.core.reconciliation import Phase, StateReconciler
from vla_edge_ros.core import swap_protocol
from vla_edge_ros.core.state_snapshot import SnapshotError, StateSnapshot
from vla_edge_ros.core.swap_protocol import (ReconcilerWorker, SnapshotStore, SwapAnswer, SwapClient, SwapOffer,
                                             SwapProtocolError, start_loader)

CAPACITY = 480           # prefix 25 + suffix 56 + 12 frames of 32 tokens: csr triggers at 11 frames


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    return tiny_model_dir


@pytest.fixture(scope="module")
def frames():
    cfg = C.VlaConfig()
    clip = read_clip("bikes.mp4", max_frames=40)
    return [Frame(resize_rgb(px, cfg.vision.image_width, cfg.vision.image_height), 10.0 + i / 60, i + 1)
            for i, px in enumerate(clip)]


@pytest.fixture
def cfg(model):
    return C.load(overrides={"model.path": str(model), "kv.capacity_tokens": CAPACITY, "cycle.deterministic": True})


def _wait(predicate, what, timeout_s=20.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def test_offers_are_versioned_files_and_the_applied_tag_starts_the_next_round(cfg, frames, tmp_path):
    primary = primary_engine(cfg)
    worker = ReconcilerWorker(StateReconciler(cfg, reconciler_state(cfg)), SnapshotStore(tmp_path / "snaps"))
    client = SwapClient(poll_period_s=0.0, request_timeout_s=5.0)
    assert worker.answer().offer is None and "no reconciled state yet" in worker.answer().reason
    worker.start()
    try:
        # The primary admits 11 frames (11 >= ceil(0.9 * 12)): the reconciler starts round 1.
        for f in frames[:11]:
            assert primary.run_cycle(f, f.stamp_s).new_frame
            worker.on_chunk(f, primary.state.state_version)
        _wait(lambda: worker.offer is not None, "offer v1")
        # Reasoning side: ask, load off-thread, apply at a boundary after one more (late) frame.
        request = client.request_sent()
        answer = worker.answer()
        offer = answer.offer
        assert offer is not None and offer.version == 1 and offer.round == 1 and offer.newest_frame_id == 11
        snap_on_disk = StateSnapshot.load(offer.path)
        assert snap_on_disk.frame_ids == [6, 7, 8, 9, 10, 11]          # csr: the newest half, kept exactly
        loading = client.on_response(answer, request)
        start_loader(client, loading).join(timeout=10)
        assert primary.run_cycle(frames[11], frames[11].stamp_s).new_frame
        worker.on_chunk(frames[11], primary.state.state_version)              # still tagged v0: arrived before the swap
        # Meanwhile the reconciler catches frame 12 up too and offers a fresher version of round 1 ...
        _wait(lambda: worker.offer.version == 2 and worker.offer.newest_frame_id == 12, "the fresher offer v2")
        # ... while the file of v1, handed out, stays until the primary is done with it.
        assert Path(offer.path).exists()
        outcome = client.apply_ready(primary.state, cycle_id=11)
        dropped = primary.state.last_swap.dropped
        assert outcome.status == "applied" and outcome.version == 1
        assert dropped == [1, 2, 3, 4, 5] and primary.state.last_swap.late == [12] and primary.state.state_version == 1
        assert client.summary()["swap_apply_ms_p50"] != "" and client.summary()["swap_late_frames"] == 1
        # Exact: the KV of an engine that only ever saw frames 6..12 (up to float32 rounding: the
        # reconciler prefills several frames per forward, the oracle one at a time).
        oracle = primary_engine(cfg)
        for f in frames[5:12]:
            oracle.state.append_frame(f)
        np.testing.assert_allclose(primary.state.export_state(1).kv, oracle.state.export_state(1).kv, rtol=1e-4, atol=1e-5)

        # The next chunk carries v1: the reconciler learns the swap happened and tracks the primary again; the
        # rest of round 1 (v2) is withdrawn and its files go.
        assert primary.run_cycle(frames[12], frames[12].stamp_s).new_frame
        worker.on_chunk(frames[12], primary.state.state_version)
        _wait(lambda: worker.reconciler.k_applied == 1, "the reconciler to see v1 applied")
        _wait(lambda: worker.offer is None, "round 1's fresher offer to be withdrawn")
        assert worker.reconciler.primary_frame_ids == [f.frame_id for f in primary.state.kv.retained()]
        assert worker.answer().offer is None and worker.summary()["offers_withdrawn"] == 1
        for f in frames[13:20]:
            assert primary.run_cycle(f, f.stamp_s).new_frame
            worker.on_chunk(f, primary.state.state_version)
        _wait(lambda: worker.offer is not None and worker.offer.newest_frame_id == 20, "round 2 caught up")
        assert worker.offer.round == 3 and worker.reconciler.stats.rounds_started == 2   # v2 was round 1's
        assert worker.reconciler.phase is Phase.READY
        assert sorted(p.name for p in (tmp_path / "snaps").iterdir()) == [SnapshotStore.file_name(worker.offer.version)]
    finally:
        worker.stop()
        worker.store.close()
    assert not (tmp_path / "snaps").exists()


@pytest.mark.parametrize("max_late", [3, 2])
def test_frames_the_reconciler_never_saw_are_kept_not_dropped_at_the_swap(cfg, frames, tmp_path, max_late):
    """A reconciler that was not listening for a while (deactivated) or lost chunk messages must not make
    the primary forget the frames it missed: its snapshot reports the gaps, the primary keeps those frames
    (recomputed after the snapshot's frames), and the result is still exactly an engine that computed
    the frames in that order. Dropped are only frames the reconciler saw and chose to drop, and, when more
    never-seen frames than asr.max_late_chunks would make the boundary long, the oldest of them."""
    # A round at 8 mirrored frames (ceil(0.6 x 12)); the primary will hold 3 frames the reconciler never saw.
    cfg = cfg.replace({"asr.threshold": 0.6, "asr.max_late_chunks": max_late})
    primary = primary_engine(cfg)
    worker = ReconcilerWorker(StateReconciler(cfg, reconciler_state(cfg)), SnapshotStore(tmp_path / "snaps"))
    worker.start()
    try:
        seq = 0

        def admit(f, deliver=True):
            nonlocal seq
            assert primary.run_cycle(f, f.stamp_s).new_frame
            seq += 1
            if deliver:
                worker.on_chunk(f, primary.state.state_version, seq)

        for f in frames[:3]:
            admit(f)
        worker.stop()                                   # deactivated: frames 4 and 5 go by unseen
        for f in frames[3:5]:
            admit(f, deliver=False)
        worker.start()
        for f in frames[5:8]:
            admit(f)
        admit(frames[8], deliver=False)                 # a lost chunk message: the sequence jumps
        for f in frames[9:11]:
            admit(f)                                    # the primary holds 11 frames, the reconciler saw 8
        _wait(lambda: worker.offer is not None, "offer v1")
        snap = StateSnapshot.load(worker.offer.path)
        assert snap.unseen == [(-1, 1), (3, 6), (8, 10)], snap.unseen
        assert snap.frame_ids == [7, 8, 10, 11], snap.frame_ids   # csr: the newest half of the 8 it saw

        dropped = primary.state.import_state(snap)
        kept_unseen = [4, 5, 9][3 - max_late:]                 # the newest max_late of them
        forgotten = [4, 5, 9][:3 - max_late]
        assert dropped == [1, 2, 3] + forgotten + [6], "only frames the reconciler saw and left out are forgotten"
        assert primary.state.last_swap.unseen == kept_unseen and primary.state.last_swap.late == []
        assert primary.state.last_swap.unseen_forgotten == forgotten
        assert [r.frame_id for r in primary.state.kv.retained()] == [7, 8, 10, 11] + kept_unseen
        assert primary.state.state_exact
        oracle = primary_engine(cfg)
        for i in [6, 7, 9, 10] + [f - 1 for f in kept_unseen]:
            oracle.state.append_frame(frames[i])
        np.testing.assert_allclose(primary.state.export_state(1).kv, oracle.state.export_state(1).kv, rtol=1e-4, atol=1e-5)
        assert primary.run_cycle(frames[11], frames[11].stamp_s).is_action
    finally:
        worker.stop()
        worker.store.close()


def test_a_restarted_reasoning_node_never_gets_frames_of_the_process_before_it(cfg, frames, tmp_path):
    """A new reasoning process starts with an empty state and numbers its chunks from 1 again; the
    reconciler must not offer it a state built from its predecessor's frames."""
    worker = ReconcilerWorker(StateReconciler(cfg, reconciler_state(cfg)), SnapshotStore(tmp_path / "snaps"))
    worker.start()
    try:
        before = primary_engine(cfg)
        for seq, f in enumerate(frames[:11], start=1):
            assert before.run_cycle(f, f.stamp_s).new_frame
            worker.on_chunk(f, before.state.state_version, seq)
        _wait(lambda: worker.answer().offer, "an offer for the first reasoning process")

        after = primary_engine(cfg)                        # restarted: empty state, frame ids go on
        assert after.run_cycle(frames[11], frames[11].stamp_s).new_frame
        worker.on_chunk(frames[11], after.state.state_version, 1)
        answer = worker.answer()
        assert answer.offer is None and "restarted" in answer.reason, answer      # the old offer is void at once
        for seq, f in enumerate(frames[12:22], start=2):
            assert after.run_cycle(f, f.stamp_s).new_frame
            worker.on_chunk(f, after.state.state_version, seq)
        _wait(lambda: worker.offer is not None and worker.offer.newest_frame_id == frames[21].frame_id,
              "an offer for the restarted reasoning process, caught up")
        snap = StateSnapshot.load(worker.answer().offer.path)
        assert snap.frame_ids and set(snap.frame_ids) <= {f.frame_id for f in frames[11:22]}, snap.frame_ids
        assert worker.reconciler.epoch == 1
        after.state.import_state(snap)
        assert after.state.state_exact and after.state.last_swap.unseen == []
    finally:
        worker.stop()
        worker.store.close()


class DeviceFault(Exception):
    """As pycuda._driver.Error: a plain Exception subclass, not one of Python's built-in error types."""


def _close_the_store(worker):
    worker.store.close()                                   # the directory is gone: publishing the offer fails


def _fault_the_device(worker):
    def failing_publish(snap):
        raise DeviceFault("an illegal memory access was encountered")
    worker.store.publish = failing_publish


@pytest.mark.parametrize("breaks, error", [(_close_the_store, "FileNotFoundError"), (_fault_the_device, "DeviceFault")])
def test_worker_failure_stops_offers_but_not_the_caller(cfg, frames, tmp_path, breaks, error):
    """A failing worker stops offering with its reason kept, whatever the error's type: pycuda's (a device fault
    under a step or an export) are not Python's RuntimeError, and such an error used to end the worker's thread
    with its last offer still handed out and no reason."""
    worker = ReconcilerWorker(StateReconciler(cfg, reconciler_state(cfg)), SnapshotStore(tmp_path / "snaps"))
    breaks(worker)
    worker.start()
    try:
        for f in frames[:11]:
            worker.on_chunk(f, 0)
        _wait(lambda: worker.error is not None, "the worker to fail")
        assert worker.reconciler.phase is Phase.STOPPED and worker.answer().offer is None
        assert error in worker.summary()["worker_error"]
    finally:
        worker.stop()


# ----------------------------------------------------------------------------
# Reasoning side state machine


def test_client_one_request_in_flight_poll_period_and_timeout():
    client = SwapClient(poll_period_s=0.1, request_timeout_s=2.0)
    assert client.want_request(now=0.0)
    client.request_sent(now=0.0)
    assert not client.want_request(now=1.0)                    # one in flight
    assert client.want_request(now=2.5) and client.timeouts == 1   # unanswered 2 s: the reconciler is gone
    client.request_sent(now=2.5)
    assert client.on_response(SwapAnswer(reason="x")) is None and client.not_ready == 1
    assert not client.want_request(now=2.55)                   # poll period
    assert client.want_request(now=2.7)


def test_client_skips_old_loading_and_rejected_versions(tmp_path):
    client = SwapClient(poll_period_s=0.1, request_timeout_s=2.0)
    snap = StateSnapshot(version=3)
    path = snap.save(tmp_path / "v3.npz")
    offer = client.on_response(SwapAnswer(SwapOffer(3, str(path), 0, -1)))
    assert offer is not None
    assert client.on_response(SwapAnswer(SwapOffer(4, str(path), 0, -1))) is None   # one load at a time
    client.load_offer(offer)
    assert client.take_ready().version == 3 and client.take_ready() is None
    client.mark_rejected(3)
    assert client.on_response(SwapAnswer(SwapOffer(3, str(path), 0, -1))) is None   # never again
    client.mark_applied(5, cycle_id=7, dropped=0, late=0)
    assert client.on_response(SwapAnswer(SwapOffer(4, str(path), 0, -1))) is None   # older than applied
    summary = client.summary()
    assert (summary["state_version"], summary["swap_applied_at_cycle"], summary["swap_rejections"]) == (5, 7, 1)


def test_client_never_asks_while_it_may_still_read_an_offer_and_ignores_abandoned_answers(tmp_path):
    """A new request tells the reconciler the primary is done with the offer answered before (its file and
    GPU buffer may then be reused): so none is sent while an offer loads, waits for a boundary or is being
    applied, and the answer to a request given up on is never loaded."""
    client = SwapClient(poll_period_s=0.0, request_timeout_s=2.0)
    path = StateSnapshot(version=3, round=3).save(tmp_path / "v3.npz")
    old = client.request_sent(now=0.0)
    assert client.want_request(now=2.5) and client.timeouts == 1       # abandoned
    new = client.request_sent(now=2.5)
    assert client.on_response(SwapAnswer(SwapOffer(3, str(path), 0, -1, round=3)), old) is None
    assert client.late_answers == 1 and not client.want_request(now=2.6)   # still waiting for the new one
    offer = client.on_response(SwapAnswer(SwapOffer(3, str(path), 0, -1, round=3)), new)
    assert offer is not None and not client.want_request(now=3.0)         # loading
    client.load_offer(offer)
    assert not client.want_request(now=3.0)                                 # ready for the next boundary
    snap = client.take_ready()
    assert snap.version == 3 and not client.want_request(now=3.0)           # being applied
    client.mark_applied(3, cycle_id=9, dropped=0, late=1, apply_ms=4.0, kv_copy_ms=1.0, recompute_ms=2.2,
                        round_id=snap.round, check_ms=0.1, place_ms=0.2, place_off_cpu_ms=0.05,
                        queue_off_cpu_ms=0.3, queue_scatter_ms=0.25, slot_upload_ms=0.1, admit_ms=0.15)
    assert client.want_request(now=3.0)
    # Round 3 is applied: its fresher versions are moot; a new round is not.
    assert client.on_response(SwapAnswer(SwapOffer(4, str(path), 0, -1, round=3))) is None
    assert client.on_response(SwapAnswer(SwapOffer(5, str(path), 0, -1, round=5))) is not None
    summary = client.summary()
    assert (summary["swap_apply_ms_p50"], summary["swap_check_ms_p50"], summary["swap_place_ms_p50"],
            summary["swap_kv_copy_ms_max"], summary["swap_recompute_ms_p99"]) == (4.0, 0.1, 0.2, 1.0, 2.2)
    assert summary["swap_rest_ms_max"] == pytest.approx(0.5)             # what the four parts leave of the whole
    assert summary["swap_place_off_cpu_ms_p50"] == 0.05                   # a share of place_ms, not a fifth part
    assert summary["swap_queue_off_cpu_ms_p50"] == 0.3                    # a share of kv_copy_ms, likewise
    assert (summary["swap_queue_scatter_ms_p50"], summary["swap_slot_upload_ms_max"]) == (0.25, 0.1)   # and these
    assert summary["swap_admit_ms_p50"] == 0.15 and summary["swap_rest_ms_max"] > 0.15  # a share of the rest
    # The apply without its KV copy and recompute (the device work on a GPU): the host part, never above the whole.
    assert summary["swap_bookkeeping_ms_max"] == pytest.approx(4.0 - 1.0 - 2.2)
    assert summary["swap_bookkeeping_ms_p50"] <= summary["swap_apply_ms_p50"]


def _primary_and_first_snapshot(model_dir, frames, max_late_chunks: int):
    """A deterministic primary that answered frames[:3], and its state then as snapshot v1 of round 1."""
    cfg = C.load(overrides={"model.path": str(model_dir), "kv.capacity_tokens": CAPACITY,
                            "cycle.deterministic": True, "asr.max_late_chunks": max_late_chunks})
    primary = primary_engine(cfg)
    for f in frames[:3]:
        assert primary.run_cycle(f, f.stamp_s).new_frame
    snap = primary.state.export_state(version=1)
    snap.round = 1
    return primary, snap


def test_a_deferred_offer_is_not_loaded_again_but_a_fresher_one_is(tiny_model_dir, frames, tmp_path):
    primary, stale = _primary_and_first_snapshot(tiny_model_dir, frames, max_late_chunks=1)
    for f in frames[3:5]:                                   # two frames after it: more than asr.max_late_chunks
        assert primary.run_cycle(f, f.stamp_s).new_frame
    client = SwapClient(poll_period_s=0.0, request_timeout_s=2.0)
    client.load_offer(client.on_response(SwapAnswer(SwapOffer(1, str(stale.save(tmp_path / "v1.npz")), 3, 3,
                                                               round=1))))
    held = [r.frame_id for r in primary.state.kv.retained()]
    outcome = client.apply_ready(primary.state, cycle_id=5)
    assert outcome.status == "deferred" and outcome.detail == "stale"
    assert [r.frame_id for r in primary.state.kv.retained()] == held and primary.state.state_version == 0
    assert client.summary()["swap_deferred_stale"] == 1 and client.summary()["swap_rejections"] == 0
    assert client.on_response(SwapAnswer(SwapOffer(1, str(tmp_path / "v1.npz"), 3, 3, round=1))) is None
    fresher = primary.state.export_state(version=2)         # the same round, caught up
    fresher.round = 1
    offer = client.on_response(SwapAnswer(SwapOffer(2, str(fresher.save(tmp_path / "v2.npz")), 5, 5, round=1)))
    client.load_offer(offer)
    outcome = client.apply_ready(primary.state, cycle_id=6)
    assert outcome.status == "applied" and primary.state.state_version == 2 and primary.state.state_exact


def test_client_survives_a_vanished_or_mismatched_file_and_bad_answers(tmp_path):
    client = SwapClient(poll_period_s=0.1, request_timeout_s=2.0)
    client.load_offer(client.on_response(SwapAnswer(SwapOffer(3, str(tmp_path / "gone.npz"), 4, 9))))
    assert client.load_failures == 1 and client.take_ready() is None
    path = StateSnapshot(version=2).save(tmp_path / "v2.npz")
    client.load_offer(client.on_response(SwapAnswer(SwapOffer(6, str(path), 0, -1))))
    assert client.load_failures == 2 and client.take_ready() is None
    for bad in ({"version": 0}, {"path": ""}, {"frames": -1}, {"round": 7}):    # round after its own version
        with pytest.raises(SwapProtocolError, match="not a usable offer"):
            SwapOffer(**{"version": 6, "path": str(path), "frames": 0, "newest_frame_id": -1, **bad})


def _dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_new_store_removes_the_snapshot_directories_of_dead_reconcilers(tmp_path, monkeypatch):
    """A SIGKILLed reconciler leaves vla_edge_swap_<pid>_* behind; the next store removes it, and
    never the directory of a live process or anything not named like a store."""
    monkeypatch.setattr(swap_protocol, "SHM_DIR", tmp_path)
    dead = tmp_path / f"vla_edge_swap_{_dead_pid()}_k1ll3d"
    (dead / "sub").mkdir(parents=True)
    (dead / "state_v000003.npz").write_bytes(b"x" * 4096)
    live = tmp_path / f"vla_edge_swap_{os.getppid()}_alive"
    live.mkdir()
    (live / "state_v000001.npz").write_bytes(b"y")
    other = tmp_path / "vla_edge_swap_notapid_x"
    other.mkdir()
    store = SnapshotStore()
    try:
        assert store.directory.parent == tmp_path and store.directory.name.startswith(f"vla_edge_swap_{os.getpid()}_")
        assert not dead.exists(), "the dead reconciler's snapshots were kept"
        assert (live / "state_v000001.npz").exists() and other.exists()
        SnapshotStore().close()                              # a second store keeps the first (alive: us)
        assert store.directory.exists()
    finally:
        store.close()


def test_a_swap_whose_recompute_does_not_fit_the_slack_waits_for_a_fresher_offer(tiny_model_dir, frames, tmp_path):
    """One late frame to recompute but no time for it before the next boundary: deferred (no_slack), nothing
    changed; the same offer with room for one frame is applied, recomputing it."""
    primary, snap = _primary_and_first_snapshot(tiny_model_dir, frames, max_late_chunks=2)
    path = snap.save(tmp_path / "v1.npz")
    assert primary.run_cycle(frames[3], frames[3].stamp_s).new_frame      # one frame after the snapshot
    client = SwapClient(poll_period_s=0.0, request_timeout_s=2.0)
    client.load_offer(client.on_response(SwapAnswer(SwapOffer(1, str(path), 3, 3, round=1))))
    held = [r.frame_id for r in primary.state.kv.retained()]
    outcome = client.apply_ready(primary.state, cycle_id=4, max_recompute=0)
    assert outcome.status == "deferred" and outcome.detail == "no_slack"
    assert [r.frame_id for r in primary.state.kv.retained()] == held and primary.state.state_version == 0
    assert client.summary()["swap_deferred_no_slack"] == 1 and client.summary()["swap_deferred_stale"] == 0
    again = snap                                           # the same state, offered again as a fresher version
    again.version = 2
    again.round = 2
    offer = client.on_response(SwapAnswer(SwapOffer(2, str(again.save(tmp_path / "v2.npz")), 3, 3, round=2)))
    client.load_offer(offer)
    client.wait_for_room()                                 # a boundary with no room for any swap: it stays loaded
    assert client.summary()["swap_waits_no_room"] == 1 and not client.want_request(now=1e9)
    outcome = client.apply_ready(primary.state, cycle_id=5, max_recompute=1)
    assert outcome.status == "applied" and outcome.report.late == [frames[3].frame_id], outcome
    client.wait_for_room()                                 # nothing loaded: nothing waited
    assert client.summary()["swap_waits_no_room"] == 1


def test_a_skipped_boundary_is_answered_and_counted_as_a_miss(tiny_model_dir, frames):
    cfg = C.load(overrides={"model.path": str(tiny_model_dir), "kv.capacity_tokens": CAPACITY})
    engine = primary_engine(cfg)
    first = engine.run_cycle(frames[0], frames[0].stamp_s)
    skipped = engine.skipped_boundary(12.5, "between")
    after = engine.run_cycle(frames[1], frames[1].stamp_s)
    assert (first.cycle_id, skipped.cycle_id, after.cycle_id) == (0, 1, 2)
    assert skipped.reason == "deadline_missed" and skipped.boundary_skipped and "12.5 ms" in skipped.detail
    assert skipped.overran_in == "between" and "between was still running" in skipped.detail
    total = engine.metrics.summary()
    assert total["cycles"] == 3 and total["fallback_reasons"]["deadline_missed"] >= 1
    assert total["model_cycles"] == 2                       # no latency sample for a cycle that never ran


def test_the_loader_checks_a_snapshot_and_the_boundary_rejects_a_bad_one_as_without_it(cfg, frames, tmp_path):
    """SwapClient's precheck runs the snapshot's own checks on the loader: a sound snapshot reaches the boundary
    with them passed (and is applied), a bad one is rejected there with the error it gets with no precheck."""
    primary = primary_engine(cfg)
    for f in frames[:3]:
        assert primary.run_cycle(f, f.stamp_s).new_frame
    good = primary.state.export_state(version=1)
    bad = primary.state.export_state(version=2)
    bad.next_position = bad.frames[-1].position_start          # inside its newest frame
    details = []
    for precheck in (None, primary.state.precheck_snapshot):
        client = SwapClient(poll_period_s=0.0, request_timeout_s=2.0, precheck=precheck)
        path = bad.save(tmp_path / f"bad_{precheck is None}.npz")
        client.request_sent()
        client.load_offer(client.on_response(SwapAnswer(SwapOffer(2, str(path), len(bad.frames), 3, round=2))))
        outcome = client.apply_ready(primary.state, cycle_id=3)
        assert outcome.status == swap_protocol.REJECTED and primary.state.state_version == 0
        details.append(outcome.detail)
    assert details[0] == details[1] and "next_position" in details[0]
    client = SwapClient(poll_period_s=0.0, request_timeout_s=2.0, precheck=primary.state.precheck_snapshot)
    path = good.save(tmp_path / "good.npz")
    client.request_sent()
    client.load_offer(client.on_response(SwapAnswer(SwapOffer(1, str(path), len(good.frames), 3, round=1))))
    snap = client._ready
    assert snap._checked is not None                            # passed on the loader thread
    outcome = client.apply_ready(primary.state, cycle_id=4)
    assert outcome.status == swap_protocol.APPLIED and primary.state.state_version == 1
    assert 0.0 <= client.summary()["swap_bookkeeping_ms_max"] <= client.summary()["swap_apply_ms_max"]


def test_a_snapshot_with_a_nan_pooled_embedding_is_rejected_before_the_state_changes(cfg, frames, tmp_path):
    """The pooled embeddings (the semantic policy's keys) are checked with the rest of the snapshot: a NaN among
    them rejects the swap at the boundary and the state in force stays whole (it was placed first, and failed
    there after the frames in force had been evicted)."""
    primary = primary_engine(cfg)
    for f in frames[:3]:
        assert primary.run_cycle(f, f.stamp_s).new_frame
    held = [r.frame_id for r in primary.state.kv.retained()]
    bad = primary.state.export_state(version=1)
    bad.frames[1].pooled[5] = np.nan
    client = SwapClient(poll_period_s=0.0, request_timeout_s=2.0, precheck=primary.state.precheck_snapshot)
    path = bad.save(tmp_path / "nan_pooled.npz")
    client.request_sent()
    client.load_offer(client.on_response(SwapAnswer(SwapOffer(1, str(path), len(bad.frames), 3, round=1))))
    outcome = client.apply_ready(primary.state, cycle_id=3)
    assert outcome.status == swap_protocol.REJECTED and "pooled embeddings contain NaN" in outcome.detail
    assert primary.state.state_version == 0 and [r.frame_id for r in primary.state.kv.retained()] == held
    # A snapshot handed over in process (bench asr's reconciler; a file cannot hold one): a vector a size short is
    # a SnapshotError too, not numpy's error from stacking them.
    short = primary.state.export_state(version=2)
    short.frames[0] = dataclasses.replace(short.frames[0], pooled=short.frames[0].pooled[:-1])
    with pytest.raises(SnapshotError, match="must be vectors of"):
        primary.state.import_state(short)
    assert primary.state.state_version == 0 and [r.frame_id for r in primary.state.kv.retained()] == held


def test_summary_sorts_the_timings_outside_the_lock_the_boundary_takes(monkeypatch):
    """The diagnostics call summary() on the executor thread; the swap at the boundary takes the same lock to
    account for itself (mark_applied). The ~30 percentiles are taken on copies, after the lock is let go."""
    client = SwapClient(poll_period_s=0.0, request_timeout_s=2.0)
    for i in range(5):
        client.mark_applied(i + 1, cycle_id=10 * i, dropped=1, late=2, apply_ms=1.0 + i, kv_copy_ms=0.5,
                            recompute_ms=0.1 * i, check_ms=0.2, place_ms=0.1)
    held = []
    real = swap_protocol.percentile

    def spy(values, q):
        held.append(client._lock.locked())
        return real(values, q)

    monkeypatch.setattr(swap_protocol, "percentile", spy)
    summary = client.summary()
    assert held and not any(held)
    assert summary["swap_apply_ms_p50"] == 3.0 and summary["swap_apply_ms_max"] == 5.0
    assert summary["swap_apply_ms_last"] == 5.0 and summary["swaps"] == 5
    counts = client.counts()                        # the counters alone, as the boundary's log line takes them
    assert counts == {k: v for k, v in summary.items() if k in counts}
    assert not any(k.endswith(("_p50", "_p99", "_max", "_last")) for k in counts)


def test_swap_timings_keep_the_whole_runs_maximum_and_count():
    """The percentiles are over the newest TIMING_SAMPLES swaps; the maximum and the count are the whole run's
    (a 4-minute CPU soak applies ~730 swaps: a maximum over the newest 256 was the last ~85 s's)."""
    from vla_edge_ros.core.swap_protocol import TIMING_SAMPLES
    from vla_edge_ros.tools.demo_report import _swap_timings_label, _swaps
    client = SwapClient(poll_period_s=0.0, request_timeout_s=5.0)
    n = TIMING_SAMPLES + 150
    for version in range(1, n + 1):
        client.mark_applied(version, version, 0, 0, apply_ms=9.0 if version == 1 else 0.5, kv_copy_ms=0.1)
    s = client.summary()
    assert s["swap_apply_ms_max"] == 9.0 and s["swap_apply_ms_n"] == n and s["swap_apply_ms_p99"] == 0.5
    swaps = _swaps({f"swap.{k}": str(v) for k, v in s.items()})
    assert swaps["apply_ms_max"] == 9.0
    assert _swap_timings_label(swaps) == f"swap at the boundary p50/p99 (newest {TIMING_SAMPLES} of {n})/max"
