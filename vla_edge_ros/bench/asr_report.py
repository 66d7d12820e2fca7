"""What `bench asr` reports: the per-mode summary, its table, the paper's Fig. 6, and runs read back from JSON.

A run is {"cycles": [record per cycle], "reconciler": stats, "capacity_check": the primary's
core/capacity_check.CapacityFit as a dict, or None} (bench/asr_timeline.py
makes them; its JSON keeps each mode's timeline and stats, so `--from-json`
redraws and re-tables runs made elsewhere, e.g. the GPU's 32K modes run in
two processes). A record: i, t_s, latency_ms, reason, phase (reconciler phase
at the cycle's start, "rebuild" for a synchronous rebuild), event ("swap",
"rebuild" or ""), evicted (frames the primary's policy dropped approximately
this cycle), rounds_started / rounds_aborted (running totals after the
cycle's gap), frames, state_version, approximate_evictions, state_exact (after
the cycle and its swap), served_exact (the state the cycle was served on),
late_start_ms (how far earlier work ran past its boundary), rebase_forgotten
(frames a RoPE re-base forgot in this cycle); the last three are missing from
runs made before they were kept.

Which cycles reconciliation costs (`reconciling_flags`): those that started
during a round (or carried a synchronous rebuild), the cycle right after a
swap or rebuild (a swap's late frames are written at its start with
asr.swap_finish next_cycle; an overrun of the boundary delays it), and any
cycle after one of those that still started late (a rebuild of seconds delays
several). Counted by phase alone, those cycles were "steady": on the H200's
32K run of 2026-12-05 the two slowest steady cycles were the two after swaps,
and the ratio read 0.96 where it is 1.10.

Fig. 6 of reference/csr-asr-paper.md shows TTFT per query through eviction
cycles, with and without ASR. Here: one panel per mode (same axes: cycle
number; latency on a log scale when a spike passes LOG_SCALE_ABOVE deadlines,
so a rebuild of seconds and the steady cycle are both legible), the deadline,
when rounds were triggered, swaps (ASR) and rebuilds (sync), the primary's
approximate evictions, aborted rounds, and the cycles a reconciliation was in
progress.
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np

from ..core.capacity_check import CapacityFit
from . import asr_context
from .common import percentiles, print_table

LOG_SCALE_ABOVE = 4.0       # Fig. 6 on a log scale when the slowest cycle passes this many deadlines (a spike
                            # of seconds beside cycles of milliseconds), linear otherwise
BUSY_PHASES = ("warming", "catching_up", "ready")     # a reconciliation is in progress (ASR)
REBUILD_PHASE = "rebuild"                             # the cycle that carried a synchronous rebuild (sync)
STEADY_PHASES = ("idle", "absent")
REFUSED = "refused_budget"
LATE_START_MS = 1.0         # a cycle that started this much after its boundary was delayed by earlier work
SETTINGS_COMPARED = ("backend", "model", "hz", "asr_mode", "threshold", "evict_fraction", "work", "overrides",
                     "config", "eviction_policy")    # files re-tabled together: differences are said
MAX_CAUSES_PRINTED = 12     # fallbacks described one per line under the table (the JSON keeps them all)
DEADLINE_MISSED = "deadline_missed"


# ----------------------------------------------------------------------------
# Summary


def reconciling_flags(cycles: list) -> list:
    """Per cycle: True where reconciliation costs it (the module docstring), False for a steady cycle, None for
    neither (a stopped reconciler)."""
    flags, previous = [], False
    for i, c in enumerate(cycles):
        after_event = i > 0 and bool(cycles[i - 1]["event"])
        spill = previous and (c.get("late_start_ms") or 0.0) > LATE_START_MS
        if c["phase"] in BUSY_PHASES or c["phase"] == REBUILD_PHASE or after_event or spill:
            flag = True
        elif c["phase"] in STEADY_PHASES:
            flag = False
        else:
            flag = None
        flags.append(flag)
        previous = bool(flag)
    return flags


def served_exact(c: dict) -> bool:
    """Whether the cycle was served on an exact state (runs from before served_exact: the state after it)."""
    return bool(c.get("served_exact", c["state_exact"]))


def summarize(run_: dict, deadline_ms: float) -> dict:
    cyc = run_["cycles"]
    lat = [c["latency_ms"] for c in cyc]
    flags = reconciling_flags(cyc)
    busy = [c["latency_ms"] for c, f in zip(cyc, flags) if f is True]
    steady = [c["latency_ms"] for c, f in zip(cyc, flags) if f is False]
    actions = [c for c in cyc if c["reason"] == "action"]
    reasons: dict[str, int] = {}
    for c in cyc:
        reasons[c["reason"]] = reasons.get(c["reason"], 0) + 1
    p_busy, p_steady = percentiles(busy), percentiles(steady)
    to_swap = run_["reconciler"].get("trigger_to_applied_ms", [])
    swap_ms = [c["swap_ms"] for c in cyc if c.get("swap_ms") is not None]
    last = cyc[-1] if cyc else {}
    return {
        "cycles": len(cyc),
        "rounds": sum(1 for c in cyc if c["event"]),          # swaps applied (asr) / rebuilds (sync)
        "rounds_started": last.get("rounds_started", 0),
        "rounds_aborted": last.get("rounds_aborted", 0),
        "latency_ms": percentiles(lat),
        "over_deadline": sum(1 for x in lat if x > deadline_ms),
        "refused": reasons.get(REFUSED, 0),
        "deadline_missed": reasons.get(DEADLINE_MISSED, 0),
        "fallbacks": sum(n for reason, n in reasons.items() if reason != "action"),
        "outcomes": reasons,
        "eviction_cycles": sum(1 for c in cyc if c["event"]),
        "approximate_evictions": sum(c.get("evicted", 0) for c in cyc),
        "trigger_to_swap_ms": {"mean": float(np.mean(to_swap)) if to_swap else None,
                               "max": float(np.max(to_swap)) if to_swap else None, "samples": list(to_swap)},
        "swap_apply_ms": percentiles(swap_ms) if swap_ms else None,     # at the boundary after a cycle (asr)
        "reconciling_cycles": len(busy),
        "steady_cycles": len(steady),
        "p99_reconciling_ms": p_busy["p99"],
        "p99_steady_ms": p_steady["p99"],
        "p99_ratio_reconciling_vs_steady": (p_busy["p99"] / p_steady["p99"]) if busy and steady else None,
        # The same question at equal context: that ratio also compares state sizes (bench/asr_context.py).
        "matched_context": asr_context.matched_context(cyc, flags),
        # over the actions, each on the state it was served on (as metrics.exact_action_share)
        "exact_state_fraction": float(np.mean([served_exact(c) for c in actions])) if actions else None,
        "actions_on_approximate_state": sum(1 for c in actions if not served_exact(c)),
        "rebases": sum(1 for c in cyc if c.get("rebase_forgotten")),
        "rebase_forgotten_frames": sum(c.get("rebase_forgotten", 0) for c in cyc),
        "reconciler": {k: v for k, v in run_["reconciler"].items() if not isinstance(v, list)},
        "capacity_check": run_.get("capacity_check"),           # the primary's, after its warm-up
        "refused_beyond_capacity_fit": _refused_beyond(cyc, run_.get("capacity_check")),
        "fallback_causes": fallback_causes(cyc),
    }


def fallback_causes(cycles: list) -> list[dict]:
    """Each cycle that did not end in an action, with what came just before it: the boundary before it (a swap's
    ms, the frames held before and after), the reconciler work in that gap and how far it ran past the boundary
    (interleaved runs; gap_over_ms and gap_work are missing from runs made before they were kept)."""
    out = []
    for i, c in enumerate(cycles):
        if c["reason"] == "action":
            continue
        before = cycles[i - 1] if i else {}
        # A record's frames are counted after its cycle and the swap that followed it: the swap before cycle i
        # took the state from record i - 2's count (give or take cycle i - 1's own frame) to record i - 1's.
        out.append({"i": c["i"], "reason": c["reason"], "latency_ms": c["latency_ms"],
                    "estimate_ms": c.get("estimate_ms"), "budget_ms": c.get("budget_ms"), "frames": before.get("frames"),
                    "frames_before": cycles[i - 2]["frames"] if i >= 2 else None, "swap_before_ms": before.get("swap_ms"),
                    "gap_over_ms": before.get("gap_over_ms"), "gap_work": before.get("gap_work")})
    return out


def describe_cause(f: dict) -> str:
    """One fallback_causes entry in words."""
    words = [f"cycle {f['i']} {f['reason']} ({_f(f['latency_ms'])} ms; estimate {_f(f['estimate_ms'])} against a "
             f"budget of {_f(f['budget_ms'])})"]
    if f.get("swap_before_ms") is not None:
        words.append(f"after a swap of {_f(f['swap_before_ms'])} ms ({f['frames_before']} -> {f['frames']} frames)")
    if f.get("gap_over_ms"):
        work = ", ".join(f"{what}{f' {n} frames' if n else ''} {ms:.1f} ms" for what, n, ms in f.get("gap_work") or [])
        words.append(f"its gap ran {f['gap_over_ms']:.1f} ms past the boundary ({work or 'the swap'})")
    return "; ".join(words)


def _refused_beyond(cycles: list, capacity_check: dict | None) -> int | None:
    """Refused cycles that came with more frames held than the capacity check found a cycle can serve: what the
    configured capacity refuses whether a reconciler runs or not (None: no check)."""
    fit = CapacityFit.from_values(capacity_check or {})
    if fit is None:
        return None
    return sum(1 for c in cycles if c["reason"] == REFUSED and c["frames"] > fit.frames_that_fit)


def print_summary(summaries: dict, header: list[str]) -> None:
    for line in header:
        print(line)
    rows = []
    for mode, s in summaries.items():
        lat, swap = s["latency_ms"], s["trigger_to_swap_ms"]
        rows.append([mode, s["cycles"], s["rounds"], s["rounds_aborted"], _f(lat["p50"]), _f(lat["p99"]), _f(lat["max"]),
                     s["over_deadline"], s["refused"], s["fallbacks"], _f(s["p99_reconciling_ms"]),
                     _f(s["p99_steady_ms"]), _f(s["p99_ratio_reconciling_vs_steady"], 3),
                     _f(s["exact_state_fraction"], 3), _f(swap["mean"]), _f(swap["max"]), s["approximate_evictions"]])
    print_table("cycle latency (ms, from the scheduled boundary; a sync rebuild included; fallbacks included); "
                "rounds = swaps applied (asr) / rebuilds (sync); ratio = p99 reconciling / p99 steady (reconciling: "
                "cycles during a round, the one after each swap or rebuild, and those it delayed); exact = share of "
                "actions served on an exact state; trigger->swap (mean, max ms) = the rebuild itself for sync",
                ["mode", "cycles", "rounds", "aborted", "p50", "p99", "max", "> deadline", "refused", "no action",
                 "p99 reconciling", "p99 steady", "ratio", "exact", "trigger->swap", "max", "approx. evicted"], rows)
    for mode, s in summaries.items():
        deferred = s["reconciler"].get("offers_deferred")
        print(f"  {mode}: outcomes {s['outcomes']}" + (f"; offers deferred at a boundary {deferred}" if deferred else ""))
        print(f"  {mode}: p99 reconciling over {s['reconciling_cycles']} cycles, p99 steady over "
              f"{s['steady_cycles']}; {s.get('actions_on_approximate_state', 0)} actions on an approximate state")
        if s.get("rebases"):
            print(f"  {mode}: {s['rebases']} RoPE re-bases forgot {s['rebase_forgotten_frames']} frames (the positions "
                  f"ran out before a swap: not an eviction, and not counted as approximate)")
        rec = s["reconciler"]
        if rec.get("step_layer_pieces", 1) > 1:          # asr.step_layer_pieces (core/gap_steps.py)
            print(f"  {mode}: steps in {rec['step_layer_pieces']} pieces of layers: {rec['pieced_steps']} finished "
                  f"({rec['pieces_run']} pieces run), {rec['pieced_steps_given_up']} not finished in the gaps")
        fit = CapacityFit.from_values(s.get("capacity_check") or {})
        if fit is not None:
            print(f"  {mode}: capacity check: {fit.describe()}; of the {s['refused']} refused cycles "
                  f"{s['refused_beyond_capacity_fit']} came with more than those {fit.frames_that_fit} frames held")
        matched = s.get("matched_context")
        if matched:
            print(f"  {mode}: {asr_context.describe(matched)}")
        apply = s.get("swap_apply_ms")
        if apply:
            print(f"  {mode}: swap at the boundary after a cycle, p50/p99/max {_f(apply['p50'])} / {_f(apply['p99'])} / "
                  f"{_f(apply['max'])} ms")
        causes = s.get("fallback_causes") or []
        for f in causes[:MAX_CAUSES_PRINTED]:
            print(f"  {mode}: {describe_cause(f)}")
        if len(causes) > MAX_CAUSES_PRINTED:
            print(f"  {mode}: ... and {len(causes) - MAX_CAUSES_PRINTED} more fallbacks (all in the JSON)")


def _f(v, digits: int = 2) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


# ----------------------------------------------------------------------------
# Fig. 6


def plot_fig6(runs: dict, summaries: dict, deadline_ms: float, title: str, path, quiet: bool = False) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(runs), 1, figsize=(13, 2.8 * len(runs)), sharex=True, sharey=True, squeeze=False)
    worst = max((c["latency_ms"] for r in runs.values() for c in r["cycles"]), default=0.0)
    log_scale = worst > LOG_SCALE_ABOVE * deadline_ms
    floor = min((c["latency_ms"] for r in runs.values() for c in r["cycles"] if c["latency_ms"] > 0), default=0.1)
    floor = floor if log_scale else 0.0         # where the eviction and abort marks sit
    for ax, (mode, run_) in zip(axes[:, 0], runs.items()):
        once = _FirstLabel()
        cyc = run_["cycles"]
        x = np.array([c["i"] for c in cyc])
        lat = np.maximum(np.array([c["latency_ms"] for c in cyc]), floor)       # a log axis has no zeros
        for lo, hi in _spans(np.array([c["phase"] in BUSY_PHASES for c in cyc])):
            ax.axvspan(x[lo] - 0.5, x[hi - 1] + 0.5, color="tab:orange", alpha=0.15, lw=0,
                       label=once("reconciling"))
        for i in _steps(cyc, "rounds_started"):
            ax.axvline(x[i], color="tab:green", lw=0.7, ls=":", label=once("trigger"))
        ax.plot(x, lat, lw=0.7, color="tab:blue", label="cycle latency")
        ev = np.array([bool(c["event"]) for c in cyc], dtype=bool)
        if ev.any():
            ax.plot(x[ev], lat[ev], "v", color="tab:red", ms=5,
                    label="swap (exact state in)" if mode == "asr" else "synchronous rebuild")
        approx = np.array([c.get("evicted", 0) > 0 for c in cyc], dtype=bool)
        if approx.any():
            ax.plot(x[approx], np.full(approx.sum(), floor), "|", color="0.45", ms=7, label="approximate eviction")
        aborted = _steps(cyc, "rounds_aborted")
        if aborted:
            ax.plot(x[aborted], np.full(len(aborted), floor), "x", color="k", ms=5, label="round aborted")
        ax.axhline(deadline_ms, color="k", ls="--", lw=0.8, label=f"deadline {deadline_ms:.1f} ms")
        if log_scale:
            ax.set_yscale("log")
        ax.set_ylabel("latency (ms)" + (", log" if log_scale else ""))
        s = summaries[mode]
        exact = s["exact_state_fraction"]
        ax.set_title(f"{mode}: p50 {_f(s['latency_ms']['p50'])}, p99 {_f(s['latency_ms']['p99'])}, max "
                     f"{_f(s['latency_ms']['max'])} ms; {s['over_deadline']} over the deadline, {s['refused']} refused; "
                     f"{s['rounds']} rounds; exact state {'-' if exact is None else f'{exact:.1%}'} of actions",
                     loc="left", fontsize=9)
        ax.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=7)
    axes[-1, 0].set_xlabel("cycle (one frame of footage and one query per cycle)")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    if not quiet:
        print(f"wrote {path}")


def _spans(mask: np.ndarray) -> list[tuple[int, int]]:
    """[lo, hi) index ranges where mask is True."""
    edges = np.diff(np.concatenate([[0], mask.astype(np.int8), [0]]))
    return list(zip(np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)))


def _steps(cyc: list, key: str) -> list[int]:
    """Indices of the cycles after which the running total `key` grew."""
    totals = np.array([c.get(key, 0) for c in cyc])
    return list(np.flatnonzero(np.diff(np.concatenate([[0], totals])) > 0))


class _FirstLabel:
    """A legend label the first time a panel draws a kind of mark, none after: one legend entry per kind."""

    def __init__(self):
        self.seen: set[str] = set()

    def __call__(self, label: str) -> str | None:
        if label in self.seen:
            return None
        self.seen.add(label)
        return label


# ----------------------------------------------------------------------------
# Runs read back


def load_runs(paths) -> tuple[dict, dict]:
    """(mode -> run, the first file's settings) from bench asr JSON files; a mode in a later file replaces
    the same mode of an earlier one."""
    runs, meta = {}, None
    for p in paths:
        opener = gzip.open if str(p).endswith(".gz") else open
        with opener(p, "rt") as f:
            data = json.load(f)
        if data.get("suite") != "asr":
            raise ValueError(f"{p}: not a bench asr result (suite {data.get('suite')!r})")
        first = meta is None
        meta = meta or {k: v for k, v in data.items() if k != "modes"}
        if data["deadline_ms"] != meta["deadline_ms"] or data["capacity_tokens"] != meta["capacity_tokens"]:
            raise ValueError(f"{p}: capacity {data['capacity_tokens']} / deadline {data['deadline_ms']} ms differ "
                             f"from the first file's {meta['capacity_tokens']} / {meta['deadline_ms']}")
        if not first:
            differ = [k for k in SETTINGS_COMPARED if data.get(k) != meta.get(k)]
            if differ:                    # the header shows the first file's: say what the others ran with
                print(f"note: {p} ran with other settings than the first file: "
                      + "; ".join(f"{k} {data.get(k)!r} (first: {meta.get(k)!r})" for k in differ))
        for mode, m in data["modes"].items():
            if "timeline" not in m:
                raise ValueError(f"{p}: mode {mode} holds a summary only (a file from before the timelines were "
                                 f"kept): nothing to re-table")
            runs[mode] = {"cycles": m["timeline"], "reconciler": m["reconciler_stats"],
                          "capacity_check": m.get("capacity_check")}     # None in files from before the check
    return runs, meta
