"""`bench asr`'s reconciling cycles against steady ones that attended to as much context.

The summary's ratio (p99 reconciling / p99 steady) compares two sets of cycles
that do not hold the same state. A round starts at asr.threshold and the
primary keeps admitting frames until its swap, so reconciling cycles attend to
the larger states: at 32768 slots on the H200 (2026-12-05), steady cycles held
544-766 frames and reconciling ones up to 1021, and a cycle there costs ~15 ms
empty and ~28 ms full. So that ratio (1.13) measures the size of the state as
much as what reconciliation costs the primary. This module answers the second
question alone: each reconciling cycle's latency over the median latency of
the steady cycles that held about as many frames (the same bucket), where the
bucket has enough of them. Reconciling cycles whose state no steady cycle
held are left out, and the share compared is reported beside the ratios.

A record's `frames` is counted after its cycle (and the swap that followed), so
the context a cycle attended to is its predecessor's count.
"""
from __future__ import annotations

import numpy as np

BUCKET_FRAMES = 25          # frames per bucket of held state (32 tokens a frame: 800 tokens)
MIN_STEADY = 5              # steady cycles a bucket needs before its median is a baseline


def matched_context(cycles: list, flags: list) -> dict | None:
    """{"p50", "p99": reconciling cycles' latency over their bucket's steady median; "steady_p99": the same for
    the steady cycles themselves (the baseline's own spread); "compared", "reconciling": cycles compared and
    reconciling action cycles in all; "buckets": buckets used} over action cycles only (a fallback's latency is
    not a cycle's cost); flags: asr_report.reconciling_flags (True reconciling, False steady, None neither). None
    when no bucket has both. A cycle that re-based its positions ran on what the re-base kept, not on its
    predecessor's count: left out."""
    held = [c["frames"] for c in cycles]
    steady: dict[int, list] = {}
    busy: list[tuple[int, float]] = []
    for i, (c, flag) in enumerate(zip(cycles, flags)):
        if c["reason"] != "action" or c.get("rebase_forgotten"):
            continue
        bucket = int(held[i - 1] if i else held[0]) // BUCKET_FRAMES
        if flag is False:
            steady.setdefault(bucket, []).append(c["latency_ms"])
        elif flag is True:
            busy.append((bucket, c["latency_ms"]))
    medians = {b: float(np.median(v)) for b, v in steady.items() if len(v) >= MIN_STEADY}
    ratios = [ms / medians[b] for b, ms in busy if b in medians]
    if not ratios:
        return None
    own = [ms / medians[b] for b, v in steady.items() if b in medians for ms in v]
    return {"p50": float(np.percentile(ratios, 50)), "p99": float(np.percentile(ratios, 99)),
            "steady_p99": float(np.percentile(own, 99)), "compared": len(ratios), "reconciling": len(busy),
            "buckets": sorted(medians.keys() & {b for b, _ in busy})}


def describe(m: dict) -> str:
    """One line for the report under the table."""
    return (f"at equal context ({BUCKET_FRAMES}-frame buckets of held state with >= {MIN_STEADY} steady cycles), "
            f"reconciling cycles over the steady median: p50 {m['p50']:.2f}, p99 {m['p99']:.2f} "
            f"({m['compared']} of {m['reconciling']} reconciling actions compared; steady cycles over their own "
            f"median: p99 {m['steady_p99']:.2f})")
