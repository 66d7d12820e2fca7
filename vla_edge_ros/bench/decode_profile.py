"""Where a cycle's device time goes, per decode variant, on a model snapshot (GPU only).

    python -m vla_edge_ros.bench.decode_profile --model DIR --launch-modes pdl plain
    ncu --clock-control none --profile-from-start off --csv --metrics gpu__time_duration.sum \\
        python -m vla_edge_ros.bench.decode_profile --model DIR --launch-modes plain --ncu-window decode

For each decode launch mode (plain, pdl, persistent[:blocks[:MiB]]): the decode step and the 32-row prefill as CUDA-graph replays (median of CUDA
events over `--replays`), the graphs' node counts, and the per-group breakdown of
bench/pycuda_cycle.py. `--ncu-window decode|prefill` brackets one replay of that graph with cuProfilerStart/Stop, so
`ncu --profile-from-start off` times exactly its kernels, one by one
(scripts/ncu_summary.py sums them per kernel name). This is a diagnosis tool; the benchmark of
record is `vla-edge bench --backend pycuda` (bench/pycuda_cycle.py).
"""
from __future__ import annotations

import argparse
import dataclasses
import logging
import sys

import numpy as np

from . import kernel_lab
from ..model.cuda_kernel_plan import MEASURED_BEST
from .pycuda_cycle import (BINS, DECODE_STEPS, PREFILL_ROWS, _breakdown, _fill_context, apply_launch_mode, launch_mode,
                           mode_kv_dtype, robot_config, shape_of)

log = logging.getLogger(__name__)


def profile_mode(backend, spec, mode: str, n_cached: int, replays: int, ncu_window: str | None,
                 base=MEASURED_BEST) -> dict:
    import pycuda.driver as drv

    in_effect = apply_launch_mode(backend, mode, base)
    lo = spec.vocab_size - BINS
    ctx = np.arange(n_cached)
    w_slots = np.arange(n_cached, n_cached + PREFILL_ROWS)
    d_slots = np.arange(n_cached + PREFILL_ROWS, n_cached + PREFILL_ROWS + DECODE_STEPS)
    rng = np.random.default_rng(0)
    x = backend.embed(rng.integers(0, spec.vocab_size, size=PREFILL_ROWS))
    for _ in range(3):                                     # capture + warm
        backend.run_cycle_tokens(x, w_slots, w_slots, ctx, d_slots, d_slots, lo, DECODE_STEPS + 1, BINS)
    start, end = drv.Event(), drv.Event()
    out = {"launch": in_effect}
    for phase in ("decode", "prefill"):
        times = []
        for _ in range(replays):
            backend.begin_cycle(x, w_slots, w_slots, ctx, d_slots, d_slots, DECODE_STEPS + 1)
            if phase == "decode":
                backend.launch_prefill(PREFILL_ROWS, lo, BINS)
            start.record(backend.stream)
            if phase == "decode":
                backend.launch_decode_step(lo, BINS)
            else:
                backend.launch_prefill(PREFILL_ROWS, lo, BINS)
            end.record(backend.stream)
            end.synchronize()
            times.append(end.time_since(start))
        out[f"{phase}_ms"] = float(np.median(times))
    out["graph_nodes"] = {"-".join(map(str, k)): g.n_nodes for k, g in backend._graphs.items()}
    # The decode row's table index is PREFILL_ROWS (the attend list: the n_cached context, then the cycle's rows),
    # as pycuda_cycle's breakdown has had since 2026-12-02; n_cached + PREFILL_ROWS timed up to twice the context.
    out["breakdown_ms"] = {"decode": _breakdown(backend, 1, PREFILL_ROWS, n_cached),
                           "prefill": _breakdown(backend, PREFILL_ROWS, 0, n_cached)}
    if ncu_window:
        from cuda.bindings import driver as cu
        backend.begin_cycle(x, w_slots, w_slots, ctx, d_slots, d_slots, DECODE_STEPS + 1)
        backend.synchronize()
        if ncu_window == "decode":
            backend.launch_prefill(PREFILL_ROWS, lo, BINS)
            backend.synchronize()
        cu.cuProfilerStart()
        if ncu_window == "decode":
            backend.launch_decode_step(lo, BINS)
        else:
            backend.launch_prefill(PREFILL_ROWS, lo, BINS)
        backend.synchronize()
        cu.cuProfilerStop()
    return out


def compare_modes(backend, spec, modes: list, n_cached: int, base=MEASURED_BEST) -> list:
    """The decode steps of one cycle in every mode, each from the same device state after one prefill (two
    prefills differ in the last bits: split-K atomic adds). Per mode: (mode in effect, tokens, final residual row);
    the modes compute the same functions in the same order, so all should agree bit for bit."""
    lo = spec.vocab_size - BINS
    ctx = np.arange(n_cached)
    w_slots = np.arange(n_cached, n_cached + PREFILL_ROWS)
    d_slots = np.arange(n_cached + PREFILL_ROWS, n_cached + PREFILL_ROWS + DECODE_STEPS)
    x = backend.embed(np.random.default_rng(2).integers(0, spec.vocab_size, size=PREFILL_ROWS))
    backend.begin_cycle(x, w_slots, w_slots, ctx, d_slots, d_slots, DECODE_STEPS + 1)
    backend.launch_prefill(PREFILL_ROWS, lo, BINS)
    start = kernel_lab.decode_state(backend)
    out = []
    for mode in modes:
        kernel_lab.restore_decode_state(backend, start)
        in_effect = apply_launch_mode(backend, mode, base)
        for _ in range(DECODE_STEPS):
            backend.launch_decode_step(lo, BINS)
        tokens = backend.finish_cycle(DECODE_STEPS + 1)
        with backend.device.bound():
            resid = backend._get(backend.resid, 1)
        out.append((in_effect, [int(t) for t in tokens], resid))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="model snapshot directory (bf16, or INT4: make-model ... --weights int4)")
    p.add_argument("--launch-modes", nargs="+", default=["plain", "pdl", "persistent"], type=launch_mode,
                   help="plain | pdl | persistent[:<blocks per SM>[:<L2 prefetch MiB>]], each optionally with a "
                        "prefill attention variant +tiled|+mma|+mma2, decode attention variant +h1|+h2, decode projection "
                        "grid +noloop|+loop2|+loop4 and, on an INT4 snapshot, +int4staged, +i4ipb2|+i4ipb4|+i4ipb8 and +i4x2 "
                        "(bench/pycuda_cycle.py)")
    p.add_argument("--cached", type=int, default=4064)
    p.add_argument("--replays", type=int, default=50)
    p.add_argument("--ncu-window", choices=("decode", "prefill"), help="bracket one replay of this graph for ncu")
    p.add_argument("--unstaged-prefill", action="store_true",
                   help="prefill projections through projection_bf16.cu instead of projection_staged.cu "
                        "(KernelPlan.staged_prefill_projections off)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    from ..model.cuda_backend import CudaBackend
    from ..model.cuda_device import primary_device
    from ..model.spec import ModelSpec

    spec = ModelSpec.from_dir(args.model)
    with primary_device(0).bound():
        robot = robot_config(shape_of(spec))                    # the 7B INT4 snapshot: its bf16 arena and ceiling
        # One backend: the KV arena type of the first mode (its +kv32 / +kv16, else the robot preset's).
        kv_dtype = mode_kv_dtype(args.launch_modes[0], robot.kv.dtype)
        base = dataclasses.replace(MEASURED_BEST, staged_prefill_projections=not args.unstaged_prefill)
        backend = CudaBackend(spec, args.model, args.cached + PREFILL_ROWS + DECODE_STEPS, "bfloat16",
                              kv_dtype=kv_dtype, plan=base, vram_ceiling_bytes=robot.memory.vram_ceiling_bytes,
                              **robot.model.kernel_options())
        _fill_context(backend, spec, args.cached, np.random.default_rng(1))
        for mode in args.launch_modes:
            r = profile_mode(backend, spec, mode, args.cached, args.replays, args.ncu_window, base)
            parts = "; ".join(f"{ph}: " + ", ".join(f"{k} {v:.3f}" for k, v in groups.items())
                              for ph, groups in r["breakdown_ms"].items())
            print(f"{r['launch']:>16}  decode step {r['decode_ms']:.3f} ms  prefill {r['prefill_ms']:.3f} ms  "
                  f"nodes {r['graph_nodes']}  [{parts}]", flush=True)
        if len(args.launch_modes) > 1 and not args.ncu_window:
            runs = compare_modes(backend, spec, args.launch_modes, args.cached, base)
            first, tokens, resid = runs[0]
            print(f"decode from one prefill state: {first} tokens {tokens}")
            for mode, t, r in runs[1:]:
                diff = float(np.max(np.abs(r - resid)))
                print(f"  {mode:>16}: tokens {'identical' if t == tokens else t}, final residual row "
                      f"{'bit-identical' if diff == 0.0 else f'max |diff| {diff:.3e}'}")
        backend.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
