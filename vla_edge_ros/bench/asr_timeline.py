"""`vla-edge bench asr`: per-cycle latency through repeated evictions, three ways (the paper's Fig. 6).

Continuous operation at `--hz` (one new frame of real footage per cycle,
paced by the wall clock; 30 Hz on the GPU, 15 Hz for the tiny model on the
numpy backend: CPU_DEFAULT_HZ says why) with a small arena on the CPU
(`--capacity`, 1024; 4096 and 32K are the GPU runs), until
the ASR run has applied `--eviction-cycles` swaps (10, as the paper's 10
reconciliation cycles); the other two modes then run the same number of
cycles (without an ASR run: as many as the rule needs for that many rounds):

    asr      the primary Engine + a StateReconciler on a second Engine
             (core/reconciliation.py); reconciler work runs on its own thread
             (`--work thread`: a second core, the paper's second compute
             resource; the default on a CPU with more than one core) or in
             the primary's idle time after each cycle (`--work interleaved`:
             steps sized by the slack schedule the reconciler node uses; the
             default on one GPU, where that schedule is what the ROS graph
             runs); as in the reasoning node, a ready offer is applied at the
             boundary after a cycle, bounded by the slack before the next one,
             and timed apart (swap ms); cycles are timed from their scheduled
             boundaries, so a swap that overruns one counts in the next cycle
    sync     at the same trigger, with the same choice of frames to keep, the
             primary recomputes the kept frames itself between two cycles, in
             one forward (FrameState.rebuild_in_place), counted in the next cycle
    approx   the primary's semantic eviction only: no reconciliation at all

Every mode starts from the same warm state (`--no-warm-start` to start
empty): the primary already holds the frames of the clip up to one below the
trigger, appended exactly in bulk and untimed (and mirrored to the
reconciler), as after a long run at the camera's rate. The first round is
then one cycle away instead of a fill phase of 30 s at 32K.

On the GPU (`--backend pycuda --shape qwen2.5-1.5b`, bf16 random weights,
bench/gpu_inputs.py) the primary runs on a CudaBackend in the process's
primary context, reused by each mode's fresh Engine; the reconciler's Engine
runs on a second CudaBackend in a context of its own (asr.device's GPU,
the primary's by default: model/cuda_state_transfer.py), in the primary's
gaps (or on its own thread with `--work thread`); a swap moves the KV device
to device across the two contexts (`--device-transfer host`: through host
memory instead). Without `--config` the GPU runs take config/gpu_demo.yaml,
the robot's setup (threshold 0.75 there: fewer cycles per round than the
package default's 0.9 the counts below assume). The GPU runs
(`scripts/gpu_session.sh` stages asr-4k, asr-32k, asr-32k-approx), with their
expected time at 30 Hz (10 rounds take 10 x (trigger - kept) cycles: 10 x 57
at 4K, 10 x 459 at 32K with threshold 0.9):

    python -m vla_edge_ros.cli bench asr --backend pycuda --capacity 4096 \
        --json out/asr-4k.json --png out/asr-4k.png                       # ~20 s per mode, ~2 min in all
    python -m vla_edge_ros.cli bench asr --backend pycuda --capacity 32768 --modes asr sync --max-cycles 5500 \
        --json out/asr-32k.json --png out/asr-32k.png                     # ~155 s per mode, ~6.5 min
    python -m vla_edge_ros.cli bench asr --backend pycuda --capacity 32768 --modes approx \
        --json out/asr-32k-approx.json --png out/asr-32k-approx.png       # ~3.5 min
    python -m vla_edge_ros.cli bench asr --from-json out/asr-32k.json out/asr-32k-approx.json \
        --png out/asr-32k-fig6.png                                        # on any machine: table + Fig. 6

(the three 32K modes in one process would take ~9 minutes, too close to the
device tool's 10-minute limit on one command; `--max-cycles 5500` ends an
ASR run whose rounds do not converge before it eats the sync run's time; the
JSON and the plot are rewritten after each mode, so a run cut short keeps the
modes it finished).

Reported per mode (bench/asr_report.py): p50/p99/max cycle latency (from the
scheduled boundary; a sync rebuild included), the swaps' apply time, cycles
over the deadline, refusals, fallbacks by reason, rounds (swaps applied /
rebuilds) and aborted rounds, offers deferred at a boundary, time from
trigger to swap, p99 while a reconciliation is in progress vs the steady
state, the share of cycles served from an exact state, the primary's
approximate evictions; and Fig. 6: latency per cycle with the deadline, triggers, swaps,
rebuilds, approximate evictions and aborted rounds marked.
"""
from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import numpy as np

from ..config import ASR_MODES
from ..config import load as load_config
from ..tools.bringup import parse_sets
from ..resources import config_dir
from ..core.cpu_threads import limit_cpu_threads
from .asr_report import load_runs, plot_fig6, print_summary, summarize
from .common import add_input_arguments, machine_info, module_main, percentiles, write_json

log = logging.getLogger(__name__)

MODES = ("asr", "sync", "approx")
DEFAULT_CAPACITY = 1024
DEFAULT_EVICTION_CYCLES = 10          # the paper's Fig. 6: 10 reconciliation cycles
GPU_CONFIG = "gpu_demo.yaml"          # the configuration of --backend pycuda without --config
DEFAULT_HZ = 30.0                     # the robot's rate (config deadline 33 ms): the GPU runs
# The CPU default: the tiny model's numpy cycle takes 20-30 ms on a 2-core machine (one BLAS thread), so at 30 Hz
# admission refuses in stretches whatever the mode and the figure shows the machine, not the modes.
CPU_DEFAULT_HZ = 15.0
MAX_CYCLES_FACTOR = 2.5               # the ASR run gives up after this many times the cycles the rule needs for the
                                      # rounds (refused cycles add no frame, aborted rounds start over)
WARM_FRAMES_PER_FORWARD = 32          # warm start: frames appended per forward (1024 rows)
SYNC_REBUILD_TOKENS_PER_FORWARD = None  # sync: the whole rebuild in one forward, its fastest (it blocks anyway)
PROGRESS_EVERY = 150                  # cycles between progress lines in the log


def add_arguments(p) -> None:
    p.add_argument("--capacity", type=int, default=DEFAULT_CAPACITY, help="KV slots of each engine")
    p.add_argument("--eviction-cycles", type=int, default=DEFAULT_EVICTION_CYCLES,
                   help="reconciliation rounds: swaps the ASR run must apply")
    p.add_argument("--hz", type=float, help=f"cycle (and frame) rate (default {CPU_DEFAULT_HZ:.0f} on numpy, "
                   f"{DEFAULT_HZ:.0f} on pycuda)")
    p.add_argument("--asr-mode", choices=ASR_MODES, help="asr.mode (default: from the config)")
    p.add_argument("--work", choices=("interleaved", "thread"),
                   help="where reconciler work runs (default: thread with more than one CPU core, else interleaved)")
    p.add_argument("--max-cycles", type=int, help=f"give up on the ASR run after this many (default "
                   f"{MAX_CYCLES_FACTOR} x the cycles the rule needs for the rounds)")
    p.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES), help="which modes to run")
    p.add_argument("--baseline-cycles", type=int, help="cycles of the sync and approx runs (default: as many as the "
                   "ASR run took; without one, as many as the rule needs for --eviction-cycles rounds)")
    p.add_argument("--no-warm-start", action="store_true", help="start every mode from an empty state")
    p.add_argument("--from-json", nargs="+", help="run nothing: table and plot from these bench asr JSON files")
    p.add_argument("--backend", default="numpy", choices=["numpy", "pycuda"])
    p.add_argument("--shape", help="pycuda: random model shape (default qwen2.5-1.5b)")
    p.add_argument("--device-transfer", choices=("device", "host"), default="device",
                   help="pycuda: swap KV device to device across the two contexts, or through host memory")
    p.add_argument("--reconciler-context", choices=("own", "shared"), default="own",
                   help="pycuda: the reconciler's CUDA context: its own (on asr.device's GPU), or the primary's "
                        "(second stream in the same context: kernels may overlap instead of time-slicing)")
    p.add_argument("--reconciler-device", type=int, help="pycuda: asr.device, the reconciler's GPU (default: from "
                   "the config; -1 the primary's)")
    add_input_arguments(p)
    p.add_argument("--png", help="write Fig. 6 (latency per cycle through the rounds) here")
    p.add_argument("--set", metavar="KEY=VALUE", action="append", default=[],
                   help="override one configuration key (repeatable), e.g. --set asr.threshold=0.5; keys the "
                        "benchmark sets from its own options (--capacity, --hz, the model, ...) are refused")


def main(argv=None) -> int:
    return module_main("asr_timeline", __doc__, add_arguments, run, argv)


def run(args) -> int:
    if getattr(args, "from_json", None):
        return _from_json(args)
    if getattr(args, "backend", None) == "pycuda":
        from ..model.cuda_device import primary_device
        with primary_device(0).bound():    # this thread drives the primary context for the whole bench
            return _run(args)
    return _run(args)


def _run(args) -> int:
    from ..core.footage import resize_rgb
    from . import gpu_inputs

    kind = getattr(args, "backend", None) or "numpy"
    # On the GPU the robot's setup (config/gpu_demo.yaml: the reconciler's threshold, step cap and swap polling);
    # on the CPU the package defaults.
    config_path = getattr(args, "config", None) or (str(config_dir() / GPU_CONFIG) if kind == "pycuda" else None)
    base = load_config(config_path) if config_path else load_config()
    limit_cpu_threads(base.model.cpu_threads)            # as the nodes run: one BLAS thread (core/cpu_threads.py)
    model_dir = Path(getattr(args, "model", None) or base.model.path)
    capacity = int(getattr(args, "capacity", None) or DEFAULT_CAPACITY)
    rounds = int(getattr(args, "eviction_cycles", None) or DEFAULT_EVICTION_CYCLES)
    hz = float(getattr(args, "hz", None) or (DEFAULT_HZ if kind == "pycuda" else CPU_DEFAULT_HZ))
    max_cycles = getattr(args, "max_cycles", None)
    baseline_cycles = getattr(args, "baseline_cycles", None)
    modes = list(getattr(args, "modes", None) or MODES)
    warm = not getattr(args, "no_warm_start", False)
    # A second core is the paper's second compute resource; on one core the reconciler can only use the gaps.
    # On one GPU the reconciler node uses the primary's gaps (the slack schedule): interleaved is that schedule.
    # On a CPU a second core is the paper's second compute resource; on one core only the gaps are left.
    work = getattr(args, "work", None) or ("thread" if kind == "numpy" and (os.cpu_count() or 1) > 1
                                           else "interleaved")
    overrides = {"model.path": str(model_dir), "model.backend": kind, "kv.capacity_tokens": capacity,
                 "cycle.deadline_ms": 1000.0 / hz}
    if kind == "pycuda":
        overrides.update({"model.dtype": "bfloat16", "asr.backend": "pycuda"})
        if getattr(args, "reconciler_device", None) is not None:
            overrides["asr.device"] = args.reconciler_device
    if getattr(args, "asr_mode", None):
        overrides["asr.mode"] = args.asr_mode
    sets = parse_sets(getattr(args, "set", None) or [])
    clash = sorted(k for k in sets if k in overrides)
    if clash:
        raise ValueError(f"bench asr: --set {', '.join(clash)}: the benchmark sets these from its own options "
                         f"(--capacity, --hz, --asr-mode, --model, --backend, --reconciler-device)")
    cfg = base.replace({**overrides, **sets})
    if cfg.cycle.safety_margin_ms >= cfg.cycle.deadline_ms:
        raise ValueError(f"bench asr: --hz {hz} leaves no room for the {cfg.cycle.safety_margin_ms} ms safety margin")

    tokenizer = gpu_inputs.tokenizer_of(model_dir)
    engines = _Engines(kind, cfg, model_dir, tokenizer, getattr(args, "shape", None) or "qwen2.5-1.5b",
                       getattr(args, "device_transfer", None) or "device", "asr" in modes,
                       getattr(args, "reconciler_context", None) or "own")
    size = (cfg.vision.image_width, cfg.vision.image_height)
    clip, source = gpu_inputs.footage(getattr(args, "frames", None))
    frames = [resize_rgb(px, *size) for px in clip]      # the encoder's own resize, done once

    machine = machine_info()
    machine["blas_threads_env"] = {k: os.environ.get(k, "") for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")}
    settings = {"suite": "asr", "backend": kind, "model": engines.describe(), "machine": machine, "footage": source,
                "capacity_tokens": capacity, "hz": hz, "deadline_ms": cfg.cycle.deadline_ms, "asr_mode": cfg.asr.mode,
                "threshold": cfg.asr.threshold, "evict_fraction": cfg.asr.evict_fraction, "work": work,
                "overrides": sets,
                "eviction_policy": cfg.kv.eviction_policy, "rounds_wanted": rounds, "warm_start": warm,
                "config": config_path or "package defaults"}
    runs, cycles = {}, baseline_cycles
    for mode in modes:
        runner = _Runner(mode, cfg, engines, work)
        plan = _plan_cycles(runner, rounds, warm)
        settings.update(frame_capacity=plan["frame_capacity"], warm_start_frames=plan["warm_frames"])
        wanted, least = (rounds if mode in ("asr", "sync") else None), 0
        if mode == "asr":
            limit = int(max_cycles or MAX_CYCLES_FACTOR * plan["cycles_for_rounds"])
        elif mode == "sync" and not baseline_cycles:
            # its own rounds (Fig. 6 wants them in every panel), and at least the cycles ASR ran (the same span)
            limit = int(max(cycles or 0, max_cycles or MAX_CYCLES_FACTOR * plan["cycles_for_rounds"]))
            least = int(cycles or 0)
        else:
            limit, wanted = int(cycles or plan["cycles_for_rounds"]), None
        t = time.perf_counter()
        runs[mode] = runner.run(frames, hz, limit, wanted, plan["warm_frames"], least)
        if mode == "asr" and not baseline_cycles:
            cycles = len(runs[mode]["cycles"])
        done = summarize(runs[mode], cfg.cycle.deadline_ms)
        log.info("%s: %d cycles in %.1f s, latency %s, over deadline %d, outcomes %s, rounds %d, trigger->swap %s",
                 mode, done["cycles"], time.perf_counter() - t,
                 {k: round(v, 2) for k, v in done["latency_ms"].items() if v is not None}, done["over_deadline"],
                 done["outcomes"], done["rounds"], done["trigger_to_swap_ms"]["mean"])
        # Written after every mode: a run cut short (the device tool's time limit) keeps what it finished.
        _write(runs, settings, getattr(args, "json", None), getattr(args, "png", None), quiet=mode != modes[-1])
    _report(runs, settings)
    if "asr" in runs and summarize(runs["asr"], cfg.cycle.deadline_ms)["rounds"] < rounds:
        log.warning("asr: %d of the %d rounds wanted were applied within %d cycles",
                    summarize(runs["asr"], cfg.cycle.deadline_ms)["rounds"], rounds, len(runs["asr"]["cycles"]))
    return 0


def _from_json(args) -> int:
    runs, settings = load_runs(args.from_json)
    _report(runs, settings)
    _write(runs, settings, getattr(args, "json", None), getattr(args, "png", None), quiet=False)
    return 0


def _report(runs: dict, settings: dict) -> None:
    m = settings["machine"]
    summaries = {mode: summarize(r, settings["deadline_ms"]) for mode, r in runs.items()}
    print_summary(summaries, [
        f"machine: {m['cpu']} x{m['cpu_count']}, python {m['python']}, numpy {m['numpy']}, "
        f"BLAS threads env {m.get('blas_threads_env')}" + (f", GPU {m['gpu']}" if "gpu" in m else ""),
        f"model: {settings['model']}; capacity {settings['capacity_tokens']} tokens ({settings.get('frame_capacity')} "
        f"frames); {settings['hz']:.0f} Hz, deadline {settings['deadline_ms']:.1f} ms; asr.mode {settings['asr_mode']} "
        f"(threshold {settings.get('threshold')}, evict_fraction {settings.get('evict_fraction')}); reconciler work: "
        f"{settings['work']}; footage {settings['footage']}; config {settings.get('config', '-')}",
        f"rounds wanted {settings.get('rounds_wanted')}; warm start: "
        + (f"{settings.get('warm_start_frames')} frames (one below the trigger)" if settings.get("warm_start")
           else "none (empty state)"),
    ])


def _write(runs: dict, settings: dict, json_path, png_path, quiet: bool) -> None:
    summaries = {mode: summarize(r, settings["deadline_ms"]) for mode, r in runs.items()}
    if png_path:
        plot_fig6(runs, summaries, settings["deadline_ms"],
                  f"per-cycle latency through reconciliation rounds (cf. the paper's Fig. 6): {settings['model']}, "
                  f"{settings['capacity_tokens']} KV slots, {settings['hz']:.0f} Hz", png_path, quiet=quiet)
    write_json(json_path, {**settings, "modes": {
        mode: {**summaries[mode], "timeline": runs[mode]["cycles"], "reconciler_stats": runs[mode]["reconciler"]}
        for mode in runs}}, quiet=quiet)


def _plan_cycles(runner, rounds: int, warm: bool) -> dict:
    """Frame capacity, the warm start's frames (one below the trigger), and the cycles `rounds` rounds of the
    rule take from there: each round refills from the kept frames back to the trigger."""
    from ..core.reconciliation import make_asr_mode

    st = runner.primary.state
    cap, rule = st.frame_capacity, make_asr_mode(runner.cfg)
    below = 0
    while below + 1 < cap and rule.trigger(below + 1, cap, 0) is None:
        below += 1
    kept = len(rule.keep(_stand_in_frames(below + 1), cap, st.kv.policy))
    per_round = max(1, below + 1 - kept)
    first = 1 if warm else below + 1
    return {"frame_capacity": cap, "warm_frames": below if warm else 0,
            "cycles_for_rounds": first + rounds * per_round}


def _stand_in_frames(n: int) -> list:
    """n retained frames (ids 0..n-1, all alike) to ask a rule how many it keeps at the trigger."""
    from types import SimpleNamespace

    import numpy as np
    return [SimpleNamespace(frame_id=i, pooled=np.ones(1, np.float32)) for i in range(n)]


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
        from ..model.cuda_device import CudaDevice, primary_device, reconciler_device_index
        from ..model.cuda_state_transfer import DeviceKvExporter

        spec, weights = gpu_inputs.random_model(shape)
        self.spec = spec
        self.primary_backend = CudaBackend(spec, weights, cfg.kv.capacity_tokens, "bfloat16")
        self.reconciler_backend = self.exporter = self.own = None
        if with_reconciler:
            # "own": a context of its own on asr.device's GPU (the primary's by default; another one is read peer to
            # peer, model/cuda_device.reconciler_device_index); "shared": the primary's context.
            index, _why = reconciler_device_index(cfg.asr.device)       # logged there, a fallback as a warning
            self.own = CudaDevice.own(index) if context == "own" else primary_device(0)
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
        from ..core.engine_factory import reconciler_encoder, reconciler_step_rows
        backend = self._backend(cfg, self.kind == "pycuda" and self.reconciler_backend)
        state = FrameState(cfg, backend, self.tokenizer, reconciler_encoder(cfg, backend.spec), takes_swaps=False)
        state.kv_export = self.exporter if self.kind == "pycuda" else None
        state.backend.prepare_forward(reconciler_step_rows(cfg), pieces=cfg.asr.step_layer_pieces)   # as the node: no capture in a gap
        return state

    def _backend(self, cfg, shared):
        if shared:
            return shared
        from ..model.factory import create_backend_from_weights
        return create_backend_from_weights("numpy", self.spec, self.weights, cfg.kv.capacity_tokens)


class _Runner:
    def __init__(self, mode, cfg, engines: _Engines, work):
        from ..core.capacity_check import check_capacity, take_context_cost
        from ..core.in_process_asr import InProcessAsr
        from ..core.reconciliation import StateReconciler

        if mode == "approx":
            cfg = cfg.replace({"kv.eviction_policy": "semantic"})
        self.mode, self.cfg = mode, cfg
        self.primary = engines.primary(cfg)
        # As the reasoning node's configure: the first cycles' one-time costs (on the GPU graph captures, the
        # lone frame's forward a swap recomputes with) are paid here, and admission starts from steady costs.
        pixels = np.random.default_rng(0).integers(0, 256, (cfg.vision.image_height, cfg.vision.image_width, 3),
                                                   dtype=np.uint8)
        self.primary.warm_up(cfg.lifecycle.warmup_cycles, pixels)
        # ... and its capacity check: whether a cycle over a full state meets the deadline (printed with the run).
        self.capacity = check_capacity(self.primary, cfg.lifecycle.capacity_check_cycles, pixels)
        take_context_cost(self.primary, self.capacity)             # admission.context_cost, as the node
        reconciler = StateReconciler(cfg, engines.reconciler(cfg)) if mode == "asr" else None
        # Offers prepared on a loader thread, the boundary taking only prepared ones: as the reasoning node does.
        self.driver = InProcessAsr(self.primary, reconciler, work=work, offer_loader=True)
        self.reconciler = reconciler
        self.rebuild_ms: list[float] = []

    def run(self, frames, hz, limit, swaps_wanted, warm_frames: int, least_cycles: int = 0):
        """Up to `limit` cycles, ending once `swaps_wanted` rounds (swaps applied; sync: rebuilds) are in and at
        least `least_cycles` ran."""
        from ..core.frames import Frame

        period = 1.0 / hz
        self._warm_start(frames, warm_frames, period)
        records = []
        t0 = time.perf_counter()
        try:
            for i in range(limit):
                boundary = t0 + i * period
                _sleep_until(boundary)
                fid = warm_frames + i                    # frame ids (and stamps) go on from the warm frames
                now_s = warm_frames * period + (time.perf_counter() - t0)
                frame = Frame(pixels=frames[fid % len(frames)], stamp_s=now_s, frame_id=fid)
                records.append(self._cycle(frame, now_s, i, boundary, boundary + period))
                gap_start = time.perf_counter()
                self.driver.work_until(t0 + (i + 1) * period)
                records[-1].update(self._round_totals(), **self._gap_record(gap_start, t0 + (i + 1) * period))
                if (i + 1) % PROGRESS_EVERY == 0:
                    self._log_progress(records)
                if swaps_wanted is not None and self._rounds_done() >= swaps_wanted and i + 1 >= least_cycles:
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
        if self.reconciler is not None:       # offers the boundary left for a fresher one, by reason (stale, no_slack)
            stats = {**stats, "offers_deferred": dict(self.driver.deferred), **self.driver.gap_steps.summary()}
        return {"cycles": records, "reconciler": dict(stats),
                "capacity_check": None if self.capacity is None else self.capacity.as_dict()}

    def _rounds_done(self) -> int:
        return self.reconciler.stats.rounds_applied if self.reconciler is not None else len(self.rebuild_ms)

    def _warm_start(self, frames, n: int, period: float) -> None:
        """The primary holds frames 0..n-1 of the clip, appended exactly in bulk (untimed), and the reconciler
        has mirrored them: the state of a run that has been going at the camera's rate for n frames."""
        from ..core.frames import Frame

        if n == 0:
            return
        st = self.primary.state
        chunks = [st.encode_chunk(Frame(pixels=frames[j % len(frames)], stamp_s=j * period, frame_id=j))
                  for j in range(n)]
        for s in range(0, n, WARM_FRAMES_PER_FORWARD):
            st.append_chunks(chunks[s:s + WARM_FRAMES_PER_FORWARD], allow_evict=False)
        st.last_frame_id = n - 1
        st.backend.synchronize()
        if self.reconciler is not None:
            for c in chunks:
                self.reconciler.mirror_encoded(c)
            # ... and taken in, as a reconciler that has been running takes one a cycle: left in its inbox, the
            # first gap drained them all at once (766 frames at 32K: 57 ms on the development machine; on the
            # H200 the second cycle started 36 ms late and was refused).
            self.reconciler.receive()
        log.info("%s: warm start with %d frames (%d tokens)", self.mode, n, n * self.cfg.vision.tokens_per_frame)

    def _gap_record(self, gap_start: float, next_boundary: float) -> dict:
        """The reconciler work in this cycle's gap (interleaved; bench/asr_report.describe_cause says it in words)
        and how far that work ran past the next boundary, beyond where the cycle and its swap had already run
        (0: it did not): a late start of the next cycle (a refusal on a negative budget) names its cause."""
        now = time.perf_counter()
        over_ms = max(0.0, (now - max(gap_start, next_boundary)) * 1e3)
        gap = self.driver.last_gap if self.driver.work == "interleaved" else []
        self.driver.last_gap = []
        return {"gap_over_ms": round(over_ms, 3), "gap_work": [[what, frames, round(ms, 3)] for what, frames, ms in gap]}

    def _round_totals(self) -> dict:
        """Running totals after this cycle's gap: rounds started / aborted (sync: every rebuild is one)."""
        if self.reconciler is None:
            return {"rounds_started": len(self.rebuild_ms), "rounds_aborted": 0}
        st = self.reconciler.stats
        return {"rounds_started": st.rounds_started, "rounds_aborted": st.rounds_aborted}

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

    def _cycle(self, frame, now_s, i, boundary: float, next_boundary: float) -> dict:
        """One cycle timed from its scheduled boundary, as the reasoning node times it (work at the previous
        boundary that overran this one counts here); asr: a ready swap applied after it, timed apart."""
        from ..core.reconciliation import make_asr_mode

        event, swap_ms = "", None
        late_start_ms = max(0.0, (time.perf_counter() - boundary) * 1e3)    # earlier work that ran past the boundary
        rebase_before = self.primary.state.last_rebase
        if self.mode == "sync":
            t = time.perf_counter()
            p = self.primary.state
            rule = make_asr_mode(self.cfg)
            why = rule.trigger(len(p.frames), p.frame_capacity, p.approximate_evictions)
            if why is not None:
                p.rebuild_in_place(rule.keep(p.kv.retained(), p.frame_capacity, p.kv.policy),
                                   tokens_per_step=SYNC_REBUILD_TOKENS_PER_FORWARD)
                event = "rebuild"
                self.rebuild_ms.append((time.perf_counter() - t) * 1e3)
            c = self.driver.cycle(frame, now_s, start_perf=boundary)      # the rebuild counts in this cycle
            latency = c.latency_ms
            phase = "rebuild" if event else "idle"
        else:
            c = self.driver.cycle(frame, now_s, start_perf=boundary, next_boundary_perf=next_boundary)
            latency, phase, swap_ms = c.latency_ms, c.phase, c.swap_ms
            event = "swap" if c.swap is not None else ""
        s, r = self.primary.state, c.result
        rebased = s.last_rebase is not rebase_before        # RoPE positions re-based in this cycle
        # What admission decided on (estimate against budget, its tail factor after this cycle, a probe): at 32K
        # slots on the H200 refusals came in runs of 15 between single actions; these say which part refused.
        admission = {"estimate_ms": r.estimate_ms, "budget_ms": r.budget_ms, "probe": r.probe,
                     "tail_factor": self.primary.admission.tail_factor}
        return {"i": i, "t_s": now_s, "latency_ms": latency, "reason": c.result.reason or "action", "phase": phase,
                **admission,
                "event": event, "swap_ms": swap_ms, "evicted": len(c.result.evicted_frame_ids), "frames": len(s.frames),
                "state_version": s.state_version, "approximate_evictions": s.approximate_evictions,
                "state_exact": s.state_exact,                   # after the cycle and the swap that followed it
                "served_exact": r.state_exact,                  # the state this cycle was served on
                "late_start_ms": round(late_start_ms, 3),
                "rebase_forgotten": s.last_rebase["forgotten"] if rebased else 0}


def _sleep_until(t_perf: float) -> None:
    left = t_perf - time.perf_counter()
    if left > 0:
        time.sleep(left)


if __name__ == "__main__":
    raise SystemExit(main())
