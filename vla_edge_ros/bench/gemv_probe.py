"""The engine's one-row GEMV (cuda/gemv.cu) against the copy bandwidth (GPU only).

    python -m vla_edge_ros.bench.gemv_probe [--json out/gemv_probe.json]
    ncu --clock-control none --section SpeedOfLight --section Occupancy --section WarpStateStats \\
        python -m vla_edge_ros.bench.gemv_probe --once gate_up

For the four weight shapes of a Qwen2.5-1.5B decoder layer, one launch per layer on its own weights
(28 copies, so they stream from HBM), captured as a CUDA graph and replayed: microseconds per launch
and the fraction of the copy bandwidth measured in the same run, for gemv.cu (STORE / ADD epilogue, no
RMSNorm), and on the gate/up shape for gemv.cu's gemv_bf16_items (2 or 4 blocks per SM looping over the 8-row items). Each gemv result is
checked against numpy first. `--once SHAPE` launches each kernel once on that shape (for ncu). A diagnosis
tool; the benchmark of record is bench/pycuda_cycle.py. (The plain-loop candidates that led to
gemv.cu, and the tensor-core projection_fused.cu it was measured against before that kernel was removed,
are in notes/cuda_notes.md, issue 10 run 5.)
"""
from __future__ import annotations

import argparse
import sys

import numpy as np

from .common import print_table, write_json
from .pycuda_cycle import copy_bandwidth

SHAPES = {"qkv": (2048, 1536), "o": (1536, 1536), "gate_up": (17920, 1536), "down": (1536, 8960)}


def _time_graph(stream, record, replays: int, per_replay: int) -> float:
    import pycuda.driver as drv

    from ..model.cuda_graphs import capture
    graph = capture("gemv-probe", stream, record)
    graph.launch(stream)
    start, end = drv.Event(), drv.Event()
    start.record(stream)
    for _ in range(replays):
        graph.launch(stream)
    end.record(stream)
    end.synchronize()
    graph.close()
    return start.time_till(end) * 1e3 / (replays * per_replay)


def probe(layers: int, replays: int, once: str | None) -> dict:
    import pycuda.driver as drv
    from pycuda import gpuarray

    from ..model.cuda_device import primary_device
    from ..model.cuda_kernels import MODE_ADD, MODE_STORE, CudaKernels
    from ..model.kernel_reference import from_bf16_bits

    kn = CudaKernels(primary_device(0))
    stream = drv.Stream()
    rng = np.random.default_rng(0)
    bandwidth = copy_bandwidth() if once is None else 1.0
    results = []
    for name, (rows, K) in SHAPES.items():
        if once is not None and name != once:
            continue
        n = 1 if once else layers
        host_w = rng.integers(0x3b00, 0x3d00, size=(rows, K), dtype=np.uint16) ^ rng.integers(0, 2, (rows, K), np.uint16) << 15
        weights = [gpuarray.to_gpu(host_w) for _ in range(n)]
        x_host = rng.standard_normal(K).astype(np.float32)
        x = gpuarray.to_gpu(x_host.reshape(1, K))
        out = gpuarray.zeros((1, rows), np.float32)
        expected = from_bf16_bits(host_w).astype(np.float64) @ x_host
        mode = MODE_ADD if name in ("o", "down") else MODE_STORE

        def gemv(blocks_per_sm=0):
            def launch():
                for w in weights:
                    kn.gemv(w, x, out, mode, stream, blocks_per_sm=blocks_per_sm)
            return launch

        def checked(blocks_per_sm):                             # against numpy once, before timing
            out.fill(np.float32(np.nan))
            kn.gemv(weights[0], x, out, MODE_STORE, stream, blocks_per_sm=blocks_per_sm)
            stream.synchronize()
            return float(np.linalg.norm(out.get()[0] - expected) / np.linalg.norm(expected))
        grids = [0] + ([2, 4] if name == "gate_up" else [])
        if once:
            for bps in grids:
                gemv(bps)()
        for bps in [] if once else grids:
            err = checked(bps)
            kernel = "gemv.cu (the engine's)" if bps == 0 else f"gemv.cu, items over {bps} blocks/SM"
            ok = np.isfinite(err) and err <= 1e-5
            us = _time_graph(stream, gemv(bps), replays, n) if ok else float("nan")
            results.append({"shape": name, "kernel": kernel, "us": us, "rel_err": err})
        for w in weights:
            w.gpudata.free()
        for row in results:
            if row["shape"] == name:
                row["bw_fraction"] = rows * K * 2 / (row["us"] * 1e-6) / bandwidth
    return {"benchmark": "gemv_probe", "gpu": drv.Context.get_device().name(), "copy_bandwidth_gbs": bandwidth / 1e9,
            "results": results}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=28)
    p.add_argument("--replays", type=int, default=10)
    p.add_argument("--once", choices=sorted(SHAPES))
    p.add_argument("--json")
    args = p.parse_args(argv)
    from ..model.cuda_device import primary_device
    with primary_device(0).bound():
        r = probe(args.layers, args.replays, args.once)
    if args.once:
        return 0
    rows = [[x["shape"], x["kernel"], x["us"], x.get("bw_fraction", float("nan")), x.get("rel_err", float("nan"))]
            for x in r["results"]]
    print_table(f"one-row GEMV on {r['gpu']} (copy {r['copy_bandwidth_gbs']:.0f} GB/s), us per launch",
                ["shape", "kernel", "us", "of copy bw", "rel err"], rows)
    write_json(args.json, r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
