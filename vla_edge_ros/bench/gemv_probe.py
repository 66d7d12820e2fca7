"""A candidate one-row GEMV (bench/gemv_candidate.cu) against the decode projection kernel (GPU only).

    python -m vla_edge_ros.bench.gemv_probe [--json out/gemv_probe.json]
    ncu --clock-control none --section SpeedOfLight --section Occupancy --section WarpStateStats \\
        python -m vla_edge_ros.bench.gemv_probe --once gate_up

For the four weight shapes of a Qwen2.5-1.5B decoder layer, one launch per layer on its own weights
(28 copies, so they stream from HBM), captured as a CUDA graph and replayed: microseconds per launch
and the fraction of the copy bandwidth measured in the same run, for projection_fused.cu with its
default block shape (STORE / ADD epilogue, no RMSNorm) and for every entry of the candidate (rows
per warp R, 16-byte chunks per batch U, software pipeline P). Every candidate result is checked
against numpy first. `--once SHAPE` launches each kernel once on that shape (for ncu). A diagnosis
tool: the candidate has no epilogues and is not used by the engine.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import numpy as np

from .common import print_table, write_json
from .pycuda_cycle import copy_bandwidth

SHAPES = {"qkv": (2048, 1536), "o": (1536, 1536), "gate_up": (17920, 1536), "down": (1536, 8960)}
SOURCE = Path(__file__).with_name("gemv_candidate.cu")


def _candidates(mod) -> list:
    names = re.findall(r"^GEMV_ENTRY\((\d+), (\d+), (\d+)\)", SOURCE.read_text(), re.M)
    return [(f"gemv_r{r}_u{u}_p{p}", int(r), mod.get_function(f"gemv_r{r}_u{u}_p{p}")) for r, u, p in names]


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
    from pycuda.compiler import SourceModule

    from ..model.cuda_device import primary_device
    from ..model.cuda_kernels import MODE_ADD, MODE_STORE, CudaKernels
    from ..model.kernel_reference import from_bf16_bits

    kn = CudaKernels(primary_device(0))
    mod = SourceModule(SOURCE.read_text(), arch=kn.arch, no_extern_c=True, options=["-O3"])
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

        def mma():
            for w in weights:
                kn.projection_fused(w, x, out, 1, mode, stream)

        def gemv():
            for w in weights:
                kn.gemv(w, x, out, mode, stream)
        if once:
            mma()
            gemv()
        else:
            results.append({"shape": name, "kernel": "projection_fused (default)",
                            "us": _time_graph(stream, mma, replays, n)})
            results.append({"shape": name, "kernel": "gemv.cu (the engine's)", "us": _time_graph(stream, gemv, replays, n)})
        for label, r, fn in _candidates(mod):
            grid = (-(-rows // (8 * r)), 1, 1)

            def cand(fn=fn, grid=grid):
                for w in weights:
                    fn(w.gpudata, x.gpudata, out.gpudata, np.int32(rows), np.int32(K), block=(256, 1, 1), grid=grid,
                       stream=stream, shared=4 * K)
            out.fill(np.float32(np.nan))
            cand()
            stream.synchronize()
            err = float(np.linalg.norm(out.get()[0] - expected) / np.linalg.norm(expected))
            if once or not np.isfinite(err) or err > 1e-5:
                results.append({"shape": name, "kernel": label, "us": float("nan"), "rel_err": err})
                continue
            results.append({"shape": name, "kernel": label, "us": _time_graph(stream, cand, replays, n), "rel_err": err})
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
