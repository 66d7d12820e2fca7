"""Time the decode projections (projection_fused.cu, one row) over block shapes (GPU only).

    python -m vla_edge_ros.bench.projection_probe [--shape qwen2.5-1.5b] [--json out/probe.json]

For each projection of a decoder layer (q|k|v with the RMSNorm prologue, o, gate/up with the
prologue and SwiGLU, down) and each (warps per block, K parts) that the launcher accepts, a CUDA
graph of one launch per layer, each on its own weights (so the weights stream from HBM, as in a
real step, not from L2), is replayed; the table gives the time per launch and the bandwidth
against the copy bandwidth measured in the same run, with the launcher's default choice marked.
Ordinary and programmatic (PDL) launches are both timed. A diagnosis tool for choosing
cuda_kernels.projection_fused's defaults; the benchmark of record is bench/pycuda_cycle.py.
"""
from __future__ import annotations

import argparse
import sys

import numpy as np

from .common import print_table, write_json
from .pycuda_cycle import SHAPES, copy_bandwidth


def _shapes(cfg: dict) -> list:
    h, inter, hd = cfg["hidden_size"], cfg["intermediate_size"], cfg["hidden_size"] // cfg["num_attention_heads"]
    qkv = (cfg["num_attention_heads"] + 2 * cfg["num_key_value_heads"]) * hd
    i8 = -(-inter // 8) * 8
    from ..model.cuda_kernels import MODE_ADD, MODE_STORE, MODE_SWIGLU
    # (name, rows, K, mode, RMSNorm prologue); q|k|v timed in STORE mode (same loads, no RoPE tables)
    return [("qkv", qkv, h, MODE_STORE, True), ("o", h, h, MODE_ADD, False),
            ("gate_up", 2 * i8, h, MODE_SWIGLU, True), ("down", h, inter, MODE_ADD, False)]


def _configs(rows: int, K: int, mode: int) -> list:
    from ..model.cuda_kernels import FUSED_MAX_WARPS, MODE_ADD
    n_steps = K // 32
    out = []
    for warps in (1, 2, 4, 8, 12, 16):
        for kb in (1, 2, 3, 4, 6, 8, 12):
            if warps > FUSED_MAX_WARPS or kb * warps > n_steps or (kb > 1 and mode != MODE_ADD):
                continue
            out.append((warps, kb))
    return out


def probe(shape: str, layers: int, replays: int) -> dict:
    import pycuda.driver as drv
    from pycuda import gpuarray

    from ..model.cuda_graphs import capture
    from ..model.cuda_kernels import CudaKernels, ceil_div
    from ..model.cuda_device import primary_device

    device = primary_device(0)
    kn = CudaKernels(device)
    stream = drv.Stream()
    rng = np.random.default_rng(0)
    bandwidth = copy_bandwidth()
    results = []
    for name, rows, K, mode, norm in _shapes(SHAPES[shape]):
        weights = [gpuarray.to_gpu(rng.integers(0x3c00, 0x3e00, size=(rows, K), dtype=np.uint16)) for _ in range(layers)]
        x = gpuarray.to_gpu(rng.standard_normal((1, K)).astype(np.float32))
        out = gpuarray.zeros((1, rows), np.float32)
        norm_w = gpuarray.to_gpu(np.ones(K, np.float32)) if norm else None
        out_cols = rows // 2 if name == "gate_up" else None
        default = _default_config(kn, rows, K, mode)
        for pdl in (False, True):
            if pdl and not kn.enable_programmatic_launch():
                continue
            if not pdl:
                kn.disable_programmatic_launch()
            for warps, kb in _configs(rows, K, mode):
                def record():
                    for w in weights:
                        kn.projection_fused(w, x, out, 1, mode, stream, norm_w=norm_w, eps=1e-6,
                                            out_cols=out_cols, warps=warps, kb=kb)
                graph = capture(f"probe-{name}", stream, record)
                graph.launch(stream)
                start, end = drv.Event(), drv.Event()
                start.record(stream)
                for _ in range(replays):
                    graph.launch(stream)
                end.record(stream)
                end.synchronize()
                graph.close()
                us = start.time_till(end) * 1e3 / (replays * layers)
                nbytes = rows * K * 2
                results.append({"proj": name, "pdl": pdl, "warps": warps, "kb": kb, "us": us,
                                "blocks": ceil_div(rows, 16) * kb, "default": (warps, kb) == default,
                                "bw_fraction": nbytes / (us * 1e-6) / bandwidth})
        for w in weights:
            w.gpudata.free()
    kn.disable_programmatic_launch()
    return {"benchmark": "projection_probe", "shape": shape, "copy_bandwidth_gbs": bandwidth / 1e9,
            "gpu": drv.Context.get_device().name(), "results": results}


def _default_config(kn, rows, K, mode):
    """(warps, kb) the launcher picks when not told (the same arithmetic as CudaKernels.projection_fused)."""
    from ..model import cuda_kernels as ck
    n_tiles, n_steps = ck.ceil_div(rows, 16), K // 32
    return ck.fused_config(n_tiles, n_steps, mode, kn.num_sms)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="qwen2.5-1.5b", choices=sorted(SHAPES))
    p.add_argument("--layers", type=int, default=28)
    p.add_argument("--replays", type=int, default=10)
    p.add_argument("--json")
    args = p.parse_args(argv)
    from ..model.cuda_device import primary_device
    with primary_device(0).bound():
        r = probe(args.shape, args.layers, args.replays)
    rows = []
    for name in dict.fromkeys(x["proj"] for x in r["results"]):
        mine = sorted((x for x in r["results"] if x["proj"] == name), key=lambda x: x["us"])
        shown = mine[:8] + [x for x in mine[8:] if x["default"]]
        rows += [[name, "pdl" if x["pdl"] else "plain", x["warps"], x["kb"], x["blocks"], x["us"], x["bw_fraction"],
                  "<- default" if x["default"] else ""] for x in shown]
    print_table(f"decode projections, one row, {r['shape']}, on {r['gpu']} (copy {r['copy_bandwidth_gbs']:.0f} GB/s)",
                ["proj", "launch", "warps", "kb", "blocks", "us", "of copy bw", ""], rows)
    write_json(args.json, r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
