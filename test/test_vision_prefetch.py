"""vision.encode_ahead: the newest frame encoded on a worker before the cycle takes it (core/vision_prefetch.py).

Real parts: the real vision encoder on real footage, the tiny model's engine on the numpy backend. What must hold:
the cycle gets the very bits an inline encode gives (so actions do not change), only the newest frame is worth
encoding, a cycle waits for its own frame's encode in progress but never longer than its bound, and a failing
encoder leaves the cycle to encode (and fail) inline.
"""
import threading
import time

import numpy as np
import pytest

from vla_edge_ros import config as C
from vla_edge_ros.core.engine_factory import primary_engine
from vla_edge_ros.core.footage import read_clip
from vla_edge_ros.core.frames import Frame
from vla_edge_ros.core.vision_encoder import VisionEncoder
from vla_edge_ros.core.vision_prefetch import KEEP, VisionPrefetch


@pytest.fixture(scope="module")
def clip():
    return read_clip("bikes.mp4", max_frames=12)


@pytest.fixture(scope="module")
def encoder():
    return VisionEncoder(C.load().vision, hidden_size=64)


def _frame(pixels, i):
    return Frame(pixels=pixels, stamp_s=100.0 + i / 60.0, frame_id=i)


def _until(predicate, timeout_s=5.0):
    end = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError("timed out")
        time.sleep(0.002)


def test_the_taken_encoding_is_the_inline_encoding_bit_for_bit(encoder, clip):
    prefetch = VisionPrefetch(encoder.encode)
    try:
        for i, px in enumerate(clip[:6]):
            f = _frame(px, i)
            prefetch.offer(f)
            _until(lambda: prefetch.counts["encoded"] + prefetch.counts["skipped"] >= i + 1)
            got = prefetch.take(f)
            assert got is not None
            want = encoder.encode(px)
            assert np.array_equal(got.tokens, want.tokens) and np.array_equal(got.pooled, want.pooled)
        assert prefetch.counts["hits"] == 6 and prefetch.counts["misses"] == 0
        # A frame with the same id but another capture time is another frame: not served from the cache.
        assert prefetch.take(Frame(pixels=clip[5], stamp_s=0.5, frame_id=5)) is None
    finally:
        prefetch.stop()
    assert not prefetch.running


def _gated(encoder):
    """A prefetch whose encodes wait for the returned gate to open: (gate, prefetch)."""
    gate = threading.Event()

    def slow(pixels):
        gate.wait(5.0)
        return encoder.encode(pixels)
    return gate, VisionPrefetch(slow)


def test_only_the_newest_offered_frame_is_encoded(encoder, clip):
    gate, prefetch = _gated(encoder)
    try:
        frames = [_frame(px, i) for i, px in enumerate(clip[:8])]
        prefetch.offer(frames[0])
        _until(lambda: prefetch._busy is not None)           # frame 0 is being encoded; 1..7 arrive meanwhile
        for f in frames[1:]:
            prefetch.offer(f)
        gate.set()
        _until(lambda: prefetch.counts["encoded"] == 2)
        assert prefetch.counts["skipped"] == 6                # 1..6 superseded before their encode began
        assert prefetch.take(frames[7]) is not None and prefetch.take(frames[3]) is None
        assert len(prefetch._done) <= KEEP
    finally:
        gate.set()
        prefetch.stop()


def test_a_frame_the_cycle_encodes_itself_is_not_encoded_again_by_the_worker(encoder, clip):
    gate, prefetch = _gated(encoder)
    try:
        first, second = _frame(clip[0], 0), _frame(clip[1], 1)
        prefetch.offer(first)
        _until(lambda: prefetch._busy is not None)
        prefetch.offer(second)                                # waiting behind the first
        assert prefetch.take(second) is None                  # the cycle encodes it inline now...
        gate.set()
        _until(lambda: prefetch.counts["encoded"] == 1)
        time.sleep(0.05)
        assert prefetch.counts["encoded"] == 1 and prefetch._pending is None   # ... and the worker does not
    finally:
        gate.set()
        prefetch.stop()


def test_a_cycle_waits_for_its_own_frame_in_progress_but_only_up_to_its_bound(encoder, clip):
    def slow(pixels, delay_s):
        time.sleep(delay_s)
        return encoder.encode(pixels)
    prefetch = VisionPrefetch(lambda px: slow(px, 0.05), wait_s=2.0)
    try:
        f = _frame(clip[0], 0)
        prefetch.offer(f)
        _until(lambda: prefetch._busy is not None)
        assert prefetch.take(f) is not None and prefetch.counts["waited"] == 1
    finally:
        prefetch.stop()
    prefetch = VisionPrefetch(lambda px: slow(px, 0.5), wait_s=0.02)
    try:
        f = _frame(clip[1], 1)
        prefetch.offer(f)
        _until(lambda: prefetch._busy is not None)
        t0 = time.monotonic()
        assert prefetch.take(f) is None                       # the cycle encodes inline instead
        assert time.monotonic() - t0 < 0.3
        assert prefetch.counts["misses"] == 1
    finally:
        prefetch.stop()


def test_an_encoder_failure_is_reported_and_the_cycle_encodes_inline(clip):
    errors = []

    def broken(pixels):
        raise ValueError("VisionEncoder.encode: pixels must be uint8")
    prefetch = VisionPrefetch(broken, on_error=errors.append)
    try:
        f = _frame(clip[0], 0)
        prefetch.offer(f)
        _until(lambda: prefetch.counts["errors"] == 1)
        assert prefetch.take(f) is None and isinstance(errors[0], ValueError)
    finally:
        prefetch.stop()
    prefetch.offer(_frame(clip[1], 1))                        # after stop: ignored, nothing runs
    assert prefetch.counts["offered"] == 1 and not prefetch.running


def test_the_engine_answers_the_same_with_frames_encoded_ahead(tiny_model_dir, clip):
    """Two engines on the same frames, one taking its vision rows from a prefetch (the phase table then has the
    worker's encodes): the same action tokens, cycle by cycle."""
    cfg = C.load(overrides={"model.path": str(tiny_model_dir), "model.backend": "numpy", "cycle.deterministic": True})
    inline, ahead = primary_engine(cfg), primary_engine(cfg)
    prefetch = VisionPrefetch(ahead.state.encoder.encode,
                              on_encoded=lambda ms: ahead.phases.record("vision_ahead", ms))
    ahead.state.prefetch = prefetch
    try:
        for i, px in enumerate(clip[:8]):
            f = _frame(px, i)
            prefetch.offer(f)
            _until(lambda: prefetch.counts["encoded"] >= i + 1)
            a, b = inline.run_cycle(f, now_s=f.stamp_s), ahead.run_cycle(f, now_s=f.stamp_s)
            assert a.is_action and b.is_action, (a.detail, b.detail)
            assert list(a.tokens) == list(b.tokens), i
        assert prefetch.counts["hits"] == 8
        assert ahead.phases.summary()["vision_ahead"]["n"] == 8
    finally:
        prefetch.stop()
        inline.close()
        ahead.close()
