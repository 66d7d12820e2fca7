"""What the demo's controller saw, as numbers (JSON), a table (stdout) and a timeline (PNG).

Input is what a controller receives, plus the nodes' own diagnostics:
    cycles      one record per cycle id, from /vla/action_tokens (actions) and
                /vla/fallback (fallbacks): outcome, elapsed ms, evictions
    diagnostics the last /diagnostics values of reasoning and camera_ingest
                (double-buffer drops, peak memory, swaps)
Latency percentiles use the definition of core/metrics.py: cycles that ran the
model to the end (actions and deadline_missed fallbacks).

Cycles that never came are lost, not absent: cycle ids missing inside the
window, and, when the outputs stop before the window ends (the reasoning node
died), every cycle period from the last output to the window's planned end.
The deadline-miss rate counts them as missed (a controller waited in vain);
`admitted_miss_rate` is the engine's own: late among the cycles that ran.

`exactness` says whether exact forgetting (ASR) worked, in one word and the
numbers behind it: the share of actions served on an exact state (no
approximate eviction since the last reconciled swap; the reasoning node's
count since it was activated), the reconciler's rounds started / applied /
aborted by reason, the offers the reasoning node deferred (too stale, or no
slack at the boundary for their late frames) or held for a later boundary
(no room even for a swap without late frames), and the time
from a round's trigger to its swap (the reconciler learns of a swap from the
next state chunk, one cycle later).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..core.boundary_overrun import OVERRUN_PARTS
from ..core.capacity_check import CapacityFit
from ..core.cycle_phases import PHASES
from ..core.cycle_result import DEADLINE_MISSED, FALLBACK_REASONS, REFUSED_BUDGET
from ..core.gap_ledger import SUMMARY_PREFIXES as GAP_SUMMARY_PREFIXES
from ..core.metrics import percentile
from ..core.swap_protocol import SWAP_TIMINGS, TIMING_SAMPLES

CONFIGURE_STEPS = "warmup.configure_steps_s."     # the reasoning node's /diagnostics keys of its configure steps
CAPACITY = "capacity."                              # ... and of its capacity check

ACTION = "action"
EXACT_SHARE_WORKED = 0.95      # "exact forgetting: YES" needs at least this share of actions on an exact state
EXACT_SHARE_PARTLY = 0.5       # below it: "NO", the state was mostly approximate (swaps or not)
ABORT_REASONS = ("no_longer_fits", "own_policy_evicted", "rejected_by_primary", "primary_restarted")


@dataclass(frozen=True)
class CycleRecord:
    cycle_id: int
    outcome: str              # "action" or a fallback reason code
    elapsed_ms: float
    evictions: int
    received_s: float         # controller clock, seconds since the demo started


def build_report(cycles: list, reasoning: dict, camera: dict, meta: dict, reconciler: dict | None = None) -> dict:
    """The demo report; `reasoning` / `camera` / `reconciler` are the last /diagnostics values of those nodes."""
    reconciler = reconciler or {}
    cycles = sorted(cycles, key=lambda c: c.cycle_id)
    n = len(cycles)
    reasons = {r: sum(c.outcome == r for c in cycles) for r in FALLBACK_REASONS}
    actions = sum(c.outcome == ACTION for c in cycles)
    ran = [c.elapsed_ms for c in cycles if c.outcome in (ACTION, DEADLINE_MISSED)]
    ids = [c.cycle_id for c in cycles]
    gaps = (ids[-1] - ids[0] + 1 - n) if ids else 0
    period_s = meta["deadline_ms"] / 1000.0
    last_s = max((c.received_s for c in cycles), default=0.0)
    # One period of slack: the last cycle of a healthy window may land just before its end.
    lost_after_last = max(0, int((meta["seconds"] - last_s) / period_s) - 1)
    lost = gaps + lost_after_last
    expected = n + lost
    return {
        **meta,
        "cycles": n,
        "actions": actions,
        "fallbacks": n - actions,
        "fallback_reasons": reasons,
        "lost_cycles": lost,
        "lost_after_last_output": lost_after_last,
        "expected_cycles": expected,
        "deadline_miss_rate": (reasons[DEADLINE_MISSED] + lost) / expected if expected else 0.0,
        "admitted_miss_rate": reasons[DEADLINE_MISSED] / len(ran) if ran else 0.0,
        "refusal_rate": reasons[REFUSED_BUDGET] / n if n else 0.0,
        "latency_ms": {f"p{q}": (percentile(ran, q) if ran else None) for q in (50, 95, 99)}
        | {"max": max(ran) if ran else None},
        "cycle_id_gaps": gaps,
        "evictions": sum(c.evictions for c in cycles),
        "frames": _frames(reasoning, camera, meta),
        "peak_memory": {
            "reasoning_process_vm_hwm_bytes": _int(reasoning.get("total.peak_rss_bytes")),
            "engine_model_and_kv_bytes": _int(reasoning.get("state.memory_bytes")),
        },
        "kv": {"frames_retained": _int(reasoning.get("state.frames")), "fill": _float(reasoning.get("state.kv_fill"))},
        "swaps": _swaps(reasoning),
        "exactness": exactness(reasoning, reconciler),
        "phases_ms": phases(reasoning),
        "warmup": {"steady_ms": _float(reasoning.get("warmup.steady_ms")), "first_ms": _float(reasoning.get("warmup.first_ms"))},
        "capacity_check": capacity_check(reasoning),
        "reasoning_configure_steps_s": {k[len(CONFIGURE_STEPS):]: _float(v) for k, v in reasoning.items()
                                        if k.startswith(CONFIGURE_STEPS)},
        "admission_spikes_not_learned": _int(reasoning.get("admission.spikes_not_learned")),
        "boundaries_skipped": _int(reasoning.get("skipped_boundaries")),
        "boundaries_skipped_in": {part: _int(reasoning.get(f"skipped_in.{part}")) for part in OVERRUN_PARTS},
        "admission_estimate": {k: _float(reasoning.get(f"admission.{k}")) for k in
                               ("prefill_ms_per_token", "decode_ms_per_token", "other_ms", "tail_factor")},
        "gc": {"full_collections": _int(reasoning.get("gc.full_collections")),
               "max_pause_ms": _float(reasoning.get("gc.max_pause_ms")),
               "max_full_pause_ms": _float(reasoning.get("gc.max_full_pause_ms"))},
        "reconciler_work": _reconciler_work(reconciler),
    }


def capacity_check(reasoning: dict) -> dict | None:
    """The reasoning node's configure-time capacity check (core/capacity_check.py), None when it did not run."""
    fit = CapacityFit.from_values({k[len(CAPACITY):]: v for k, v in reasoning.items() if k.startswith(CAPACITY)})
    return None if fit is None else fit.as_dict()


def _reconciler_work(reconciler: dict) -> dict:
    """The reconciler's schedule and step costs, and its gap ledger (core/gap_ledger.py), from its /diagnostics."""
    keys = ("schedule", "reoffers", "offers_handed_out", "offers_withdrawn", "steps", "largest_step_frames",
            "windows_too_small", "offers_postponed", "relaxations", "starved", "warmup_step_ms_per_token",
            "step_ms_per_token", "step_ms_per_token_p10", "step_ms_per_token_p50", "step_ms_per_token_p90",
            "step_host_ms_per_token_p50", "offer_ms", "heap_trims", "step_layer_pieces", "pieced_steps", "pieces_run",
            "pieced_steps_given_up")
    return {k: reconciler.get(k, "") for k in keys} | {k: reconciler[k] for k in sorted(reconciler)
                                                        if k.startswith(GAP_SUMMARY_PREFIXES)}


def _frames(reasoning: dict, camera: dict, meta: dict) -> dict:
    dropped_ingest = _int(camera.get("overwritten"))
    dropped_reasoning = _int(reasoning.get("frames_overwritten"))
    return {"camera_published": meta.get("camera_frames_published"),
            "received_by_ingest": _int(camera.get("received")),
            "rejected_by_ingest": _int(camera.get("rejected")),
            "dropped_by_double_buffer": {"camera_ingest": dropped_ingest, "reasoning": dropped_reasoning,
                                         "total": dropped_ingest + dropped_reasoning}}


def _swaps(reasoning: dict) -> dict:
    return {"applied": _int(reasoning.get("swap.swaps")), "state_version": _int(reasoning.get("swap.state_version")),
            **{f"{part}_{q}": _float(reasoning.get(f"swap.swap_{part}_{q}"))
               for part in SWAP_TIMINGS for q in ("p50", "p99", "max")},
            "kv_copy_ms_last": _float(reasoning.get("swap.swap_kv_copy_ms_last")),
            "apply_ms_n": _int(reasoning.get("swap.swap_apply_ms_n")),
            "deferred_stale": _int(reasoning.get("swap.swap_deferred_stale")),
            "late_frames": _int(reasoning.get("swap.swap_late_frames")),
            "rejected": _int(reasoning.get("swap.swap_rejections")),
            "load_failures": _int(reasoning.get("swap.swap_load_failures"))}


def phases(reasoning: dict) -> dict:
    """{phase: {n, p50, p99, max, late_p50}} of the reasoning node's cycles (core/cycle_phases.py), and
    'late_cycles'; phases that never ran are left out."""
    out = {name: {k: (_int if k == "n" else _float)(reasoning.get(f"phase.{name}.{k}"))
                  for k in ("n", "p50", "p99", "max", "late_p50")}
           for name in PHASES if reasoning.get(f"phase.{name}.n")}
    out["late_cycles"] = _int(reasoning.get("phase.late_cycles"))
    return out


def format_phase_table(phases_ms: dict) -> str:
    """The phase table: one row per phase, p50/p99/max over the cycles it ran in, and its median in the
    late cycles (where a late cycle lost its time)."""
    late = phases_ms.get("late_cycles", 0)
    lines = [f"{'phase (ms)':<14}{'n':>7}{'p50':>9}{'p99':>9}{'max':>9}{'late p50':>10}   ({late} late cycles)"]
    for name in PHASES:
        row = phases_ms.get(name)
        if row is None:
            continue
        lines.append(f"{name:<14}{row['n']:>7}" + "".join(f"{_ms(row[k]):>9}" for k in ("p50", "p99", "max"))
                     + f"{_ms(row['late_p50']):>10}")
    return "\n".join(lines)


def exactness(reasoning: dict, reconciler: dict) -> dict:
    """Did exact forgetting work? The verdict and the numbers behind it (see the module docstring)."""
    actions = _int(reasoning.get("total.actions"))
    exact_actions = _int(reasoning.get("total.exact_actions"))
    share = exact_actions / actions if actions else None
    started, applied = _int(reconciler.get("rounds_started")), _int(reconciler.get("rounds_applied"))
    swaps = _int(reasoning.get("swap.swaps"))
    if share is None:
        verdict = "n/a (no action served)"
    elif share == 1.0 and swaps == 0 and started == 0:
        verdict = "not needed yet (nothing forgotten)"
    elif swaps == 0:
        verdict = "NO (no reconciled state applied)"
    elif share >= EXACT_SHARE_WORKED:
        verdict = "YES"
    elif share >= EXACT_SHARE_PARTLY:
        verdict = f"PARTLY (under {EXACT_SHARE_WORKED:.0%} of actions on an exact state)"
    else:
        verdict = f"NO (the state was approximate for most actions despite {swaps} swaps)"
    return {"verdict": verdict, "exact_action_share": share, "exact_actions": exact_actions, "actions": actions,
            # no reconciler diagnostics at all (not started, or none received): its counts below read 0, not measured
            "reconciler_reported": "rounds_started" in reconciler,
            "approximate_evictions_now": _int(reasoning.get("state.approximate_evictions")),
            "swaps_applied": swaps, "rounds_started": started, "rounds_applied": applied,
            "rounds_aborted": _int(reconciler.get("rounds_aborted")),
            "rounds_aborted_by": {r: _int(reconciler.get(f"rounds_aborted_by.{r}")) for r in ABORT_REASONS},
            "offers_deferred_stale": _int(reasoning.get("swap.swap_deferred_stale")),
            "offers_deferred_no_slack": _int(reasoning.get("swap.swap_deferred_no_slack")),
            "offer_waits_no_room": _int(reasoning.get("swap.swap_waits_no_room")),
            "reoffers": _int(reconciler.get("reoffers")),
            "rounds_sized_to_fit": _int(reconciler.get("rounds_sized_to_fit")),
            "round_frame_limit": _int(reconciler.get("round_frame_limit")),
            "arrival_frames_per_s": _float(reconciler.get("arrival_frames_per_s")),
            "rebuild_frames_per_s": _float(reconciler.get("rebuild_frames_per_s")),
            "offer_to_swap_ms_max": _float(reconciler.get("offer_to_swap_ms_max")),
            "trigger_to_swap_ms_p50": _float(reconciler.get("trigger_to_applied_ms_p50")),
            "trigger_to_swap_ms_max": _float(reconciler.get("trigger_to_applied_ms_max"))}


def format_table(report: dict) -> str:
    rows = _run_rows(report) + _outcome_rows(report) + _state_rows(report)
    width = max(len(k) for k, _ in rows)
    table = "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
    if len(report.get("phases_ms", {})) > 1:
        table += ("\nwhere the cycle's time went (reasoning node; wake..finish add up to the cycle latency; off_cpu: "
                  "of the admitted part, the cycle thread not running; run_queue: of that, waiting for a core; stolen: of "
                  "that, about what the hypervisor took, from its 10 ms ticks)\n")
        table += format_phase_table(report["phases_ms"])
    return table


def _run_rows(report: dict) -> list:
    """What ran: duration, early end, restarts, model, start-up times."""
    rows = [
        ("duration", f"{report['seconds']:.1f} s, camera {report['camera_hz']:g} Hz, deadline {report['deadline_ms']:g} ms"),
    ]
    if report.get("ended_early"):
        rows.append(("ENDED EARLY", report["ended_early"]))
    restarted = {k: v for k, v in report.get("restarts", {}).items() if v}
    if restarted:
        rows.append(("node restarts", ", ".join(f"{k} {v}" for k, v in restarted.items())))
    if report.get("host_steal_share") is not None:
        rows.append(("hypervisor steal", f"{100 * report['host_steal_share']:.1f}% of the machine's CPU time in the "
                                         f"window (/proc/stat: the CPUs were taken for other guests)"))
    return rows + [
        ("model", f"{report['model']} ({report['backend']}; reconciler {report.get('reconciler', 'active')})"),
        ("process start -> active", f"{report.get('start_to_active_s', 0.0):.1f} s (" + ", ".join(
            f"{k} {v:.1f} s" for k, v in report.get("lifecycle_transition_s", {}).items()) + " configure+activate)"),
        ("reasoning configure steps", ", ".join(f"{k} {v:.2f} s" for k, v in
                                                report.get("reasoning_configure_steps_s", {}).items()) or "-"),
        ("camera start -> first action", f"{report['camera_to_first_action_s']:.2f} s (DDS discovery; before the "
                                         f"measured window)"),
    ]


def _outcome_rows(report: dict) -> list:
    """What the cycles answered, and how fast."""
    lat = report["latency_ms"]
    rows = [
        ("cycles", f"{report['cycles']} received of {report['expected_cycles']} (cycle-id gaps: "
                   f"{report['cycle_id_gaps']})"),
        ("actions", f"{report['actions']}"),
        ("fallbacks", f"{report['fallbacks']}"),
    ]
    skipped = report.get("boundaries_skipped", 0)
    by_part = ", ".join(f"{part} {n}" for part, n in report.get("boundaries_skipped_in", {}).items() if n)
    # The node counts skipped boundaries since it started, so the count can include some from before this window
    # (start-up, warm-up): said as such, not as a part of this window's misses.
    rows += [(f"  {reason}", str(count) + (f" (the node skipped {skipped} boundaries since it started, in this "
                                            f"window or before it; still running when they passed: "
                                            f"{by_part or 'not reported'})"
                                            if reason == DEADLINE_MISSED and skipped else ""))
             for reason, count in report["fallback_reasons"].items()]
    return rows + [
        ("lost (never published)", f"{report['lost_cycles']} ({report['lost_after_last_output']} after the last output)"),
        ("deadline-miss rate", f"{report['deadline_miss_rate']:.4f} (lost cycles count as missed; among admitted "
                               f"cycles {report['admitted_miss_rate']:.4f})"),
        ("refusal rate", f"{report['refusal_rate']:.4f}"),
        ("cycle latency p50/p95/p99", "/".join(_ms(lat[k]) for k in ("p50", "p95", "p99")) + f" ms (max {_ms(lat['max'])})"),
    ]


def _state_rows(report: dict) -> list:
    """Frames, the KV state and its swaps, admission, the collector and memory."""
    frames, mem, swaps = report["frames"], report["peak_memory"], report["swaps"]
    dropped = frames["dropped_by_double_buffer"]
    return [
        ("camera frames published", f"{frames['camera_published']} (slowest publish call after the first {report['max_publish_ms']:.2f} ms)"),
        ("dds transport", report.get("dds_profile") or "n/a"),
        ("frames dropped (double buffer)", f"{dropped['total']} (camera_ingest {dropped['camera_ingest']}, "
                                           f"reasoning {dropped['reasoning']})"),
        ("images rejected", str(frames["rejected_by_ingest"])),
        ("capacity check", capacity_line(report.get("capacity_check"))),
        ("evictions", f"{report['evictions']} (frames retained {report['kv']['frames_retained']})"),
        ("exact forgetting", _exactness_line(report["exactness"])),
        ("state swaps applied", f"{swaps['applied']} (state version {swaps['state_version']}; "
                                f"{swaps['late_frames']} late frames recomputed; rejected "
                                f"{swaps['rejected']}, load failures {swaps['load_failures']})"),
        (_swap_timings_label(swaps), "; ".join(
            f"{label} " + "/".join(_ms(swaps[f"{part}_{q}"]) for q in ("p50", "p99", "max")) + " ms"
            for label, part in (("whole", "apply_ms"), ("checks", "check_ms"), ("slots", "place_ms"),
                                ("of which off CPU", "place_off_cpu_ms"), ("KV copy", "kv_copy_ms"),
                                ("its queuing off CPU", "queue_off_cpu_ms"),
                                ("its scatter's launch", "queue_scatter_ms"), ("its slot upload", "slot_upload_ms"),
                                ("late recompute", "recompute_ms"), ("rest", "rest_ms"),
                                ("of which admitting late frames", "admit_ms"),
                                ("without KV copy and recompute", "bookkeeping_ms")))),
        ("left to the next cycle p50/p99/max", "; ".join(       # asr.swap_finish next_cycle (n/a otherwise)
            f"{label} " + "/".join(_ms(swaps[f"{part}_{q}"]) for q in ("p50", "p99", "max")) + " ms"
            for label, part in (("copy check", "settle_ms"), ("cycle with late frames", "next_cycle_ms")))),
        ("reconciler work", ", ".join(f"{k} {v}" for k, v in report["reconciler_work"].items() if v != "") or "-"),
        ("admission spikes not learned", str(report["admission_spikes_not_learned"])),
        ("admission estimate (last)", _estimate_line(report.get("admission_estimate", {}))),
        ("garbage collection (reasoning)", f"{report['gc']['full_collections']} full collections, longest pause "
                                           f"{_ms(report['gc']['max_pause_ms'])} ms (while serving)"),
        ("peak memory", f"reasoning process VmHWM {_mib(mem['reasoning_process_vm_hwm_bytes'])}, "
                        f"model + KV arena {_mib(mem['engine_model_and_kv_bytes'])}"),
    ]


def capacity_line(values: dict | None) -> str:
    """The capacity check (capacity_check's dict) in words."""
    fit = None if not values else CapacityFit.from_values(values)
    return ("not run (lifecycle.capacity_check_cycles 0, or a frame capacity too small to hold its cycles)"
            if fit is None else fit.describe())


def _estimate_line(e: dict) -> str:
    """The admission model as the reasoning node last published it: what a cycle is predicted to cost."""
    if not e or e.get("prefill_ms_per_token") is None:
        return "n/a"
    return (f"prefill {e['prefill_ms_per_token']:.3f} ms/token, decode {e['decode_ms_per_token']:.3f} ms/token, "
            f"fixed {_ms(e['other_ms'])} ms per cycle, times the tail factor {e['tail_factor']:.2f}")


def _swap_timings_label(swaps: dict) -> str:
    """The swap timings' row name: how many swaps, and which of them the percentiles cover (SwapClient keeps the
    newest TIMING_SAMPLES; the max is of the whole run)."""
    n = swaps.get("apply_ms_n") or 0
    if n > TIMING_SAMPLES:
        return f"swap at the boundary p50/p99 (newest {TIMING_SAMPLES} of {n})/max"
    return f"swap at the boundary p50/p99/max ({n} swaps)"


def _exactness_line(e: dict) -> str:
    share = "n/a" if e["exact_action_share"] is None else f"{e['exact_action_share']:.1%}"
    aborted = ", ".join(f"{r} {n}" for r, n in e["rounds_aborted_by"].items() if n) or "none"
    rounds = ("rounds n/a (no reconciler figures received)" if e.get("reconciler_reported") is False else
              f"rounds {e['rounds_started']} started / {e['rounds_applied']} applied / {e['rounds_aborted']} aborted")
    return (f"{e['verdict']}: {share} of actions on an exact state ({e['exact_actions']} of {e['actions']} the "
            f"reasoning node served since it was activated); {rounds} "
            f"({aborted}); {e['swaps_applied']} swaps, {e['reoffers']} fresher re-offers, "
            f"{e['offers_deferred_stale']} stale offers deferred, {e['offers_deferred_no_slack']} deferred without "
            f"slack for their late frames, {e['offer_waits_no_room']} boundaries an offer waited for room; "
            f"trigger -> swap p50 "
            f"{_ms(e['trigger_to_swap_ms_p50'])} ms, max {_ms(e['trigger_to_swap_ms_max'])} ms; {_sizing(e)}")


def _sizing(e: dict) -> str:
    """How the newest round was sized (core/round_budget.py): the bound from the measured rates, and how often it cut."""
    if not e.get("round_frame_limit"):
        return "rounds not bounded by measured rates yet"
    return (f"rounds sized to fit {e['rounds_sized_to_fit']} (newest bound {e['round_frame_limit']} frames: "
            f"arrivals {_rate(e.get('arrival_frames_per_s'))}/s, rebuilds {_rate(e.get('rebuild_frames_per_s'))}/s, "
            f"offer to swap up to {_ms(e.get('offer_to_swap_ms_max'))} ms)")


def _rate(v) -> str:
    return "n/a" if v is None else f"{v:.1f}"


def write_json(report: dict, path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")


def write_timeline_png(cycles: list, deadline_ms: float, path) -> None:
    """Cycle latency against the deadline, admitted/refused markers, cumulative evictions."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cycles = sorted(cycles, key=lambda c: c.cycle_id)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(12, 7), sharex=True, height_ratios=(3, 1.3))
    groups = {
        "action (admitted, in time)": ([c for c in cycles if c.outcome == ACTION], "tab:green", "o"),
        "deadline_missed (admitted, late)": ([c for c in cycles if c.outcome == DEADLINE_MISSED], "tab:red", "x"),
        "refused_budget (refused)": ([c for c in cycles if c.outcome == REFUSED_BUDGET], "tab:orange", "v"),
        "other fallbacks": ([c for c in cycles if c.outcome not in (ACTION, DEADLINE_MISSED, REFUSED_BUDGET)],
                            "tab:gray", "s"),
    }
    for label, (group, color, marker) in groups.items():
        if group:
            top.scatter([c.received_s for c in group], [c.elapsed_ms for c in group], s=9, c=color, marker=marker,
                        label=f"{label}: {len(group)}")
    top.axhline(deadline_ms, color="black", linestyle="--", linewidth=1, label=f"deadline {deadline_ms:g} ms")
    top.set_ylabel("cycle latency (ms)")
    top.set_title("vla-edge demo: every control cycle as the controller received it")
    top.legend(loc="upper right", fontsize=8)
    top.grid(alpha=0.3)
    times = [c.received_s for c in cycles]
    evictions, total = [], 0
    for c in cycles:
        total += c.evictions
        evictions.append(total)
    bottom.step(times, evictions, where="post", color="tab:purple", label="KV evictions (cumulative)")
    admitted = [c.received_s for c in cycles if c.outcome in (ACTION, DEADLINE_MISSED)]
    refused = [c.received_s for c in cycles if c.outcome == REFUSED_BUDGET]
    ymax = max(total, 1)
    bottom.vlines(admitted, 0, 0.04 * ymax, color="tab:green", linewidth=0.5, label="admitted")
    bottom.vlines(refused, 0.96 * ymax, ymax, color="tab:orange", linewidth=0.5, label="refused")
    bottom.set_xlabel("time since the camera started (s)")
    bottom.set_ylabel("evictions")
    bottom.legend(loc="upper left", fontsize=8)
    bottom.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _int(text) -> int:
    return int(float(text)) if text not in (None, "") else 0


def _float(text) -> float | None:
    return float(text) if text not in (None, "") else None


def _ms(value) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def _mib(value: int) -> str:
    return f"{value / 2**20:.1f} MiB" if value else "n/a"
