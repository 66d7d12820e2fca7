"""`vla-edge soak --minutes N`: the demo for as long as asked, judged as a long run.

It is `vla-edge demo` (tools/demo.py: the three node processes under the
supervisor, real footage at cycle.camera_hz, a controller counting every
cycle) for N minutes, plus the resident memory (VmRSS) of each node process
sampled from outside every SAMPLE_PERIOD_S into the JSON and a PNG. The
verdict, printed and in the JSON, checks what a long run must show:

    cycle-id gaps and lost cycles   0
    actions                         > 0 (a run of refusals or errors only answers every cycle too)
    deadline misses among admitted  <= MAX_ADMITTED_MISS_RATE (cycles that ran the model)
    node restarts, deaths, exits    none, and every node exits 0
    RSS growth after the first      < MAX_RSS_GROWTH_BYTES per node process: the highest sample of
    minute                            the last PEAK_WINDOW_S against the highest of the first
                                      PEAK_WINDOW_S at or after WARMUP_S; a run too short for two
                                      windows that do not overlap cannot say, and fails saying so

What it does not judge, and the table above it shows: refusals, exact forgetting (rounds, the exact share,
swap timings), whose bounds depend on the hardware and the issue at hand.

Peaks, not two points: a process whose heap swings within a bound (the 7B soak's reasoning node on the
H200, 2026-12-04: 471 to 511 MiB and back every ~50 s, for 4 minutes) read +36 MiB point to point, the
last sample at the top of a swing and the first judged one near its bottom; its peaks moved +0.3 MiB. A
leak moves the peaks as much as it moves any point.

Exit code 0 when every check passes, 1 otherwise (2 for bad arguments).
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

# Every second: the model nodes hand their free heap back every memory.heap_trim_interval_s (10 s), so their RSS is
# a sawtooth of a few MiB with a period near 10 s (23-25 trims in a 240 s H200 soak). Sampled every 10 s, the part of
# each tooth a sample saw drifted through the run (10 s against ~10.4 s), and a window's highest sample depended on
# that phase rather than on the peaks: up to a tooth's height of apparent growth or shrinkage (test_soak.py).
# Every second, each 60 s window holds whole teeth and their peaks.
SAMPLE_PERIOD_S = 1.0
WARMUP_S = 60.0                        # allocations settle (arena, caches, DDS history) in the first minute
PEAK_WINDOW_S = 60.0                   # longer than the swings of a bounded heap seen so far (~50 s)
MAX_RSS_GROWTH_BYTES = 5 * 2 ** 20
MAX_ADMITTED_MISS_RATE = 0.001


def add_arguments(parser) -> None:
    from . import demo
    parser.add_argument("--minutes", type=float, default=10.0, help="how long the camera runs (default 10)")
    parser.add_argument("--json", metavar="PATH", default="out/soak.json", help="report (default out/soak.json)")
    parser.add_argument("--png", metavar="PATH", default="out/soak_memory.png",
                        help="memory over time (default out/soak_memory.png; the cycle timeline goes beside it)")
    parser.add_argument("--model", metavar="DIR", help="model directory (default model.path of the config)")
    parser.add_argument("--params", metavar="FILE", help="ROS parameter file (default config/vla_edge.yaml)")
    parser.add_argument("--width", type=int, default=demo.DEFAULT_WIDTH, help="camera image width; 0 = clip size")
    parser.add_argument("--set", metavar="KEY=VALUE", action="append", default=[],
                        help="override one configuration key for all nodes (repeatable)")
    parser.add_argument("--reconciler", choices=demo.RECONCILER_MODES, default="active",
                        help="active (default); inactive: configured, not activated (the baseline a reconciler's "
                             "cost on the cycle is measured against); off: not started")


def run(args) -> int:
    from ..config import ConfigError, load
    from .bringup import parse_sets
    from .demo import ensure_model, run_demo, run_reported
    from .demo_report import format_table, write_json, write_timeline_png

    if not args.minutes > 0:
        print(f"vla-edge soak: --minutes must be > 0, got {args.minutes}", file=sys.stderr)
        return 2
    overrides = parse_sets(args.set)
    try:
        cfg = load(args.params, overrides)
        model_dir = ensure_model(Path(args.model or cfg.model.path))
    except (ConfigError, FileNotFoundError) as exc:
        print(f"vla-edge soak: {exc}", file=sys.stderr)
        return 2
    sampler = MemorySampler()
    ran = run_reported("soak", lambda: run_demo(cfg, model_dir, args.minutes * 60.0, args.width, args.params,
                                                {**overrides, "model.path": str(model_dir)},
                                                reconciler=args.reconciler, tick=sampler.maybe_sample))
    if isinstance(ran, int):
        return ran
    report, cycles = ran
    report["memory_samples"] = sampler.samples
    report["soak"] = verdict(report, sampler.samples)
    print(format_table(report))
    print(format_verdict(report["soak"]))
    write_json(report, args.json)
    write_memory_png(sampler.samples, args.png)
    timeline = Path(args.png).with_name(Path(args.png).stem.replace("_memory", "") + "_cycles.png")
    write_timeline_png(cycles, cfg.cycle.deadline_ms, timeline)
    print(f"report: {args.json}\nmemory: {args.png}\ntimeline: {timeline}")
    return 0 if report["soak"]["passed"] else 1


class MemorySampler:
    """VmRSS of every node process every SAMPLE_PERIOD_S (called about once a second: a sample when a call finds
    the period passed)."""

    def __init__(self):
        self.samples: list = []          # {"t_s", "rss_bytes": {node: bytes}, "pid": {node: pid}}
        self._t0: float | None = None
        self._next = 0.0

    def maybe_sample(self, procs) -> None:
        now = time.monotonic()
        if self._t0 is None:
            self._t0 = now
        if now - self._t0 < self._next:
            return
        self._next += SAMPLE_PERIOD_S
        rss, pids, kinds = {}, {}, {}
        for name, proc in procs.procs.items():
            pids[name] = proc.pid
            rss[name], kinds[name] = _rss_of(proc.pid)
        self.samples.append({"t_s": round(now - self._t0, 3), "rss_bytes": rss, "pid": pids, "rss_kinds": kinds})


def verdict(report: dict, samples: list) -> dict:
    """The checks of a soak run (see the module docstring)."""
    growth = rss_growth(samples)
    restarts = sum((report.get("restarts") or {}).values())
    exits = {k: v for k, v in (report.get("exit_codes") or {}).items() if v != 0}
    checks = {
        "cycle_id_gaps": {"value": report["cycle_id_gaps"], "bound": 0, "ok": report["cycle_id_gaps"] == 0},
        "lost_cycles": {"value": report["lost_cycles"], "bound": 0, "ok": report["lost_cycles"] == 0},
        "actions": {"value": report.get("actions", 0), "bound": "> 0", "ok": report.get("actions", 0) > 0},
        "admitted_miss_rate": {"value": report["admitted_miss_rate"], "bound": MAX_ADMITTED_MISS_RATE,
                               "ok": report["admitted_miss_rate"] <= MAX_ADMITTED_MISS_RATE},
        "ended_early": {"value": report.get("ended_early", ""), "bound": "", "ok": not report.get("ended_early")},
        "node_restarts": {"value": restarts, "bound": 0, "ok": restarts == 0},
        "nodes_died_or_failed": {"value": ", ".join([*(report.get("died_during_run") or []),
                                                     *(f"{k} exit {v}" for k, v in exits.items())]),
                                 "bound": "", "ok": not report.get("died_during_run") and not exits},
    }
    why_not = _memory_not_judged(samples)
    if why_not is not None:
        checks["rss_growth"] = {"value": None, "bound": MAX_RSS_GROWTH_BYTES, "ok": False, "why": why_not}
    else:
        for name, value in growth.items():
            checks[f"rss_growth_{name}"] = {"value": value, "bound": MAX_RSS_GROWTH_BYTES,
                                            "ok": value is not None and value < MAX_RSS_GROWTH_BYTES}
    return {"checks": checks, "passed": all(c["ok"] for c in checks.values()),
            "rss_growth_from_s": _baseline(samples)["t_s"] if samples else None,
            "rss_growth_by_kind": rss_growth_by_kind(samples),
            # Reported beside the verdict, not judged: whether the state stayed exact depends on the reconciler's
            # hardware (on one GPU with the cycles it may be slow), not on the run staying healthy.
            "exact_forgetting": report.get("exactness", {}).get("verdict", "n/a")}


def _memory_not_judged(samples: list) -> str | None:
    """None when the samples span two PEAK_WINDOW_S windows after the baseline that do not overlap; else why the
    growth cannot be judged (no samples, or the first and the last window would hold the same samples: a growth of
    exactly 0)."""
    if not samples:
        return "no memory samples"
    span = samples[-1]["t_s"] - _baseline(samples)["t_s"]
    if span < 2 * PEAK_WINDOW_S:
        return (f"n/a: {span:.0f} s of samples after the first {WARMUP_S:g} s, {2 * PEAK_WINDOW_S:g} s needed "
                f"(a soak of at least {(WARMUP_S + 2 * PEAK_WINDOW_S) / 60:g} minutes)")
    return None


def rss_growth(samples: list) -> dict:
    """{node: the highest RSS of the last PEAK_WINDOW_S - the highest of the first PEAK_WINDOW_S from the first
    sample at or after WARMUP_S} (None: restarted in between, or a sample missing)."""
    if not samples:
        return {}
    base, last = _baseline(samples), samples[-1]
    after = [s for s in samples if s["t_s"] >= base["t_s"]]
    first = [s for s in after if s["t_s"] < base["t_s"] + PEAK_WINDOW_S]
    final = [s for s in after if s["t_s"] > last["t_s"] - PEAK_WINDOW_S]
    out = {}
    for name in last["rss_bytes"]:
        pids = {s["pid"].get(name) for s in after}
        early = [s["rss_bytes"].get(name) for s in first]
        late = [s["rss_bytes"].get(name) for s in final]
        known = None not in early and None not in late
        out[name] = max(late) - max(early) if len(pids) == 1 and known else None
    return out


def rss_growth_by_kind(samples: list) -> dict:
    """{node: {kind: last - first at or after WARMUP_S}} for the parts of VmRSS (/proc/<pid>/status RssAnon: heap
    and anonymous maps; RssFile: mapped files such as libraries; RssShmem: shared memory), not judged: where a
    growth lives says what to look for (nodes restarted in between, or samples without kinds, are left out)."""
    if not samples:
        return {}
    base, last = _baseline(samples), samples[-1]
    out = {}
    for name, kinds in last.get("rss_kinds", {}).items():
        start = base.get("rss_kinds", {}).get(name)
        if kinds and start and base["pid"].get(name) == last["pid"].get(name):
            out[name] = {k: kinds[k] - start[k] for k in kinds if k in start}
    return out


def format_verdict(soak: dict) -> str:
    lines = [f"soak verdict: {'PASS' if soak['passed'] else 'FAIL'} (RSS growth from t = {soak['rss_growth_from_s']} s)"]
    for name, c in soak["checks"].items():
        value, bound = c["value"], c["bound"]
        if name.startswith("rss_growth"):
            value = c.get("why") or ("n/a" if value is None else f"{value / 2**20:+.2f} MiB")
            bound = f"< {bound / 2**20:g} MiB"
        elif isinstance(value, float):
            value, bound = f"{value:.5f}", f"<= {bound}"
        elif isinstance(bound, str) and bound:
            pass                                          # said as it is, e.g. "> 0"
        else:
            bound = f"== {bound!r}" if bound == "" else f"<= {bound}"
        lines.append(f"  {'ok  ' if c['ok'] else 'FAIL'} {name:<28} {value}  ({bound})")
        kinds = soak.get("rss_growth_by_kind", {}).get(name[len("rss_growth_"):]) if name.startswith("rss_growth_") \
            else None
        if kinds:
            lines.append("       last sample against the first judged, by kind: " + ", ".join(
                f"{k} {v / 2**20:+.2f} MiB" for k, v in kinds.items()))
    lines.append(f"  info exact forgetting: {soak.get('exact_forgetting', 'n/a')} (not judged; the table above has "
                 f"the numbers)")
    return "\n".join(lines)


def write_memory_png(samples: list, path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(10, 4.5))
    names = sorted({n for s in samples for n in s["rss_bytes"]})
    for name in names:
        points = [(s["t_s"], s["rss_bytes"][name] / 2**20) for s in samples if s["rss_bytes"].get(name) is not None]
        if points:
            ax.plot(*zip(*points), marker="o", markersize=3, label=name)
    ax.axvspan(0, WARMUP_S, color="grey", alpha=0.15, label=f"first {WARMUP_S:g} s (not judged)")
    ax.set_xlabel("time since the first action (s)")
    ax.set_ylabel("VmRSS (MiB)")
    ax.set_title(f"vla-edge soak: resident memory of each node process, sampled every {SAMPLE_PERIOD_S:g} s")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _baseline(samples: list) -> dict:
    return next((s for s in samples if s["t_s"] >= WARMUP_S), samples[-1])


RSS_KINDS = {"RssAnon": "anon", "RssFile": "file", "RssShmem": "shmem"}


def _rss_of(pid: int) -> tuple:
    """(VmRSS bytes or None, {anon, file, shmem: bytes}) of a process, from /proc/<pid>/status."""
    from ..core.metrics import read_memory_bytes
    found = read_memory_bytes(Path(f"/proc/{pid}/status"), ("VmRSS",) + tuple(RSS_KINDS))
    return found["VmRSS"], {kind: found[key] for key, kind in RSS_KINDS.items() if found[key] is not None}
