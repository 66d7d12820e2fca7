"""The prefill's attention kernels side by side on the Qwen2.5-1.5B shape (GPU only).

    python -m vla_edge_ros.bench.attention_probe [--cached 4064] [--json out/attention_probe.json]

32 query rows (a frame) over `cached` context slots plus themselves, 12 query heads on 2 KV heads of 128
dimensions, one launch pair (partial sums + merge) per layer on that layer's own fp32 K/V arena (28 of them,
so they stream from HBM as in a cycle), captured as a CUDA graph and replayed: microseconds per layer for
attention_tiled.cu (the baseline, fp32 products) and attention_mma.cu (tensor cores) at each entry and row
block size, with the ratio to the baseline and each variant's largest difference from it (relative to the
output's peak). A diagnosis tool for choosing attention_mma's launch shape (the H200's answer is in
notes/cuda_notes.md); the benchmark of record is bench/pycuda_cycle.py.
"""
from __future__ import annotations

import argparse
import sys

import numpy as np

from .common import machine_info, print_table, write_json
from .gemv_probe import _time_graph

HQ, KVH, HD, ROWS, LAYERS = 12, 2, 128, 32, 28
# (label, attention() keywords): the baseline first.
VARIANTS = [("tiled", {})] + [(f"mma b{b} rows {r}", {"tensor_cores": True, "blocks_per_sm": b, "rows_per_block": r})
                              for b in (1, 2) for r in (4, 8, 16, 32)]


def probe(cached: int, replays: int) -> dict:
    import pycuda.driver as drv
    from pycuda import gpuarray

    from ..model.cuda_device import primary_device
    from ..model.cuda_attention_launchers import ATTN_CHUNK
    from ..model.cuda_kernels import CudaKernels

    device = primary_device(0)
    with device.bound():
        kn = CudaKernels(device)
        stream = drv.Stream()
        rng = np.random.default_rng(0)
        capacity = cached + ROWS
        n_splits = -(-capacity // ATTN_CHUNK)
        k = [gpuarray.to_gpu(rng.standard_normal((KVH, capacity, HD)).astype(np.float32)) for _ in range(LAYERS)]
        v = [gpuarray.to_gpu(rng.standard_normal((KVH, capacity, HD)).astype(np.float32)) for _ in range(LAYERS)]
        qkv = gpuarray.to_gpu((rng.standard_normal((ROWS, (HQ + 2 * KVH) * HD)) * 2).astype(np.float32))
        attend = gpuarray.to_gpu(rng.permutation(capacity).astype(np.int32))     # scattered slots, as after eviction
        ctl = gpuarray.to_gpu(np.array([0, cached, 0, -1], np.int32))
        part_o = gpuarray.zeros((ROWS, HQ, n_splits, HD), np.float32)
        part_ml = gpuarray.zeros((ROWS, HQ, n_splits, 2), np.float32)
        out = gpuarray.zeros((ROWS, HQ * HD), np.float32)

        def layer_calls(variant):
            def record():                                # cuda_graphs.capture records whatever this enqueues on stream
                for li in range(LAYERS):
                    kn.attention(qkv, int(k[li].gpudata), int(v[li].gpudata), attend, ctl, part_o, part_ml, out, ROWS,
                                 HQ, KVH, HD, capacity, n_splits, HD ** -0.5, stream, **variant)
            return record

        rows, baseline, base_out = [], None, None
        for label, variant in VARIANTS:
            layer_calls(variant)()                       # outside the capture: loads an on-demand family first
            stream.synchronize()
            result = out.get()
            us = _time_graph(stream, layer_calls(variant), replays, LAYERS)
            if baseline is None:
                baseline, base_out = us, result
            diff = float(np.max(np.abs(result - base_out)) / np.max(np.abs(base_out)))
            rows.append({"variant": label, "us_per_layer": us, "x_tiled": baseline / us, "max_rel_diff": diff})
    return {"machine": machine_info(), "cached": cached, "rows": rows}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cached", type=int, default=4064)
    p.add_argument("--replays", type=int, default=20)
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    result = probe(args.cached, args.replays)
    print_table(f"prefill attention, {ROWS} rows over {args.cached} cached, {HQ}/{KVH} heads x {HD}, per layer "
                f"({result['machine'].get('gpu', 'GPU')})", ["variant", "us/layer", "x tiled", "max rel diff"],
                [[r["variant"], r["us_per_layer"], r["x_tiled"], f"{r['max_rel_diff']:.1e}"] for r in result["rows"]])
    write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
