"""Attention over a long KV cache on the Qwen2.5-1.5B shape, per layer (GPU only): what grows with the context.

    python -m vla_edge_ros.bench.long_context_probe [--cached 4064 16384 32000] [--kv-dtype bfloat16]
                                                      [--json out/long_context.json]

The cycle's attention at each cached length, 28 layers each on its own K/V arena (fp32, or bf16 with
--kv-dtype bfloat16; each layer its own so they stream from HBM as in a cycle), captured as a CUDA graph and
replayed: microseconds per layer for

  * the decode row (attention_decode.cu + the merge) with the splits covering the arena (one 64-entry chunk
    each, the baseline) and with at most S splits per KV head, each walking several chunks, with two warps per
    8-slot group (the cycle's) or one, without and with the next pass's loads in flight (its _pf entries), and the
    entries compiled for exactly the group (its _x6 entries: the heads' chains interleaved); and the
    same row through attention_mma.cu (KernelPlan.decode_attention_tensor_cores: one 16-row tile of the group's heads);
  * the prefill's 32 rows (attention_mma.cu + the merge) in several launch shapes, and with its masked-softmax
    entry (KernelPlan.attention_masked_softmax) and its head-halves entry (KernelPlan.attention_head_halves: two
    warps per tile, 8 rows a block by default), the same way;
  * the merge alone for each, and the K/V read floor (the layer's K/V bytes at the copy bandwidth measured
    in the same run).

Each variant's largest difference from the baseline (relative to the output's peak) is printed beside it. A
diagnosis tool for the split count (the H200's answer is in notes/cuda_notes.md); the benchmark of record is
bench/pycuda_cycle.py.
"""
from __future__ import annotations

import argparse
import sys

import numpy as np

from .attention_probe import HD, HQ, KVH, LAYERS, ROWS
from ..model.weights import float32_to_bf16_bits
from .common import machine_info, print_table, write_json
from .gemv_probe import _time_graph

DEFAULT_CACHED = (4064, 8192, 16384, 32000)
DECODE_SPLITS = (None, 128, 66, 64)
# (label, attention_decode entry) of the decode row at <= 66 splits besides the cycle's two warps per slot group: one
# warp per group, and its prefetching entry (KernelPlan.decode_attention_prefetch); the entries for exactly this
# shape's group of 6 (KernelPlan.decode_attention_exact_group) with two warps per group and with one and the prefetch
DECODE_ENTRIES = (("h1 <= 66", dict(head_split=1)), ("h1 prefetch <= 66", dict(head_split=1, prefetch=True)),
                  ("h2 exact <= 66", dict(head_split=2, exact_group=True)),
                  ("h1 prefetch exact <= 66", dict(head_split=1, prefetch=True, exact_group=True)))
# (label, attention() launch shape): blocks per SM of attention_mma.cu's entry, query rows per block, max_splits
PREFILL_VARIANTS = [("b2 r16", dict(blocks_per_sm=2, rows_per_block=16)),
                    ("b2 r16 <= 128", dict(blocks_per_sm=2, rows_per_block=16, max_splits=128)),
                    ("b2 r16 <= 66", dict(blocks_per_sm=2, rows_per_block=16, max_splits=66)),
                    ("b2 r16 <= 66 masked", dict(blocks_per_sm=2, rows_per_block=16, max_splits=66,
                                                 masked_softmax=True)),
                    ("b2 hs <= 66", dict(blocks_per_sm=2, max_splits=66, head_halves=True)),
                    ("b2 hs <= 33", dict(blocks_per_sm=2, max_splits=33, head_halves=True)),
                    ("b2 hs r10 <= 66", dict(blocks_per_sm=2, rows_per_block=10, max_splits=66, head_halves=True)),
                    # _b2's grid and gathers (16-row blocks: two rounds of 4 tiles), only the warps' split differs
                    ("b2 hs r16 <= 66", dict(blocks_per_sm=2, rows_per_block=16, max_splits=66, head_halves=True)),
                    ("b1 r16 <= 66", dict(blocks_per_sm=1, rows_per_block=16, max_splits=66)),
                    ("b1 r32 <= 66", dict(blocks_per_sm=1, rows_per_block=32, max_splits=66)),
                    ("b1 r32", dict(blocks_per_sm=1, rows_per_block=32))]


def probe(cached_list: list, replays: int, kv_dtype: str = "float32", prefill_only: str | None = None) -> dict:
    """prefill_only: measure that PREFILL_VARIANTS label alone (no decode rows): the run to put under ncu."""
    import pycuda.driver as drv
    from pycuda import gpuarray

    from ..model.cuda_device import primary_device
    from ..model.cuda_attention_launchers import ATTN_CHUNK
    from ..model.cuda_kernels import CudaKernels
    from .pycuda_cycle import copy_bandwidth

    device = primary_device(0)
    with device.bound():
        kn = CudaKernels(device, kv_dtype=kv_dtype)
        stream = drv.Stream()
        bandwidth = copy_bandwidth()
        rng = np.random.default_rng(0)
        capacity = max(cached_list) + ROWS + 8
        n_splits = -(-capacity // ATTN_CHUNK)
        def arena():
            x = rng.standard_normal((KVH, capacity, HD)).astype(np.float32)
            return gpuarray.to_gpu(x if kv_dtype == "float32" else float32_to_bf16_bits(x))
        element = 4 if kv_dtype == "float32" else 2
        k = [arena() for _ in range(LAYERS)]
        v = [arena() for _ in range(LAYERS)]
        qkv = gpuarray.to_gpu((rng.standard_normal((ROWS, (HQ + 2 * KVH) * HD)) * 2).astype(np.float32))
        attend = gpuarray.to_gpu(rng.permutation(capacity).astype(np.int32))     # scattered slots, as after eviction
        part_o = gpuarray.zeros((ROWS, HQ, n_splits, HD), np.float32)
        part_ml = gpuarray.zeros((ROWS, HQ, n_splits, 2), np.float32)
        out = gpuarray.zeros((ROWS, HQ * HD), np.float32)

        def timed(calls):
            """us per layer of calls(li) over the 28 layers, and the output after one untimed run."""
            def record():
                for li in range(LAYERS):
                    calls(li)
            record()                                         # outside the capture: loads on-demand families
            stream.synchronize()
            result = out.get()
            return _time_graph(stream, record, replays, LAYERS), result

        rows = []
        for cached in cached_list:
            floor_us = cached * KVH * HD * element * 2 / bandwidth * 1e6
            ctl = gpuarray.to_gpu(np.array([0, cached, 0, -1], np.int32))
            base = None
            for max_splits in (DECODE_SPLITS if prefill_only is None else ()):
                launched = n_splits if max_splits is None else min(n_splits, max_splits)

                def decode(li, ms=max_splits):
                    kn.attention_decode(qkv, int(k[li].gpudata), int(v[li].gpudata), attend, ctl, part_o, part_ml,
                                        out, 1, HQ, KVH, HD, capacity, n_splits, HD ** -0.5, stream, head_split=2,
                                        max_splits=ms)
                us, result = timed(decode)
                merge_us, _ = timed(lambda li, s=launched: kn._merge(part_o, part_ml, ctl, out, 1, HQ, HD, s, stream))
                base = result[:1] if base is None else base
                rows.append(_row(cached, "decode 1 row", "arena" if max_splits is None else f"<= {max_splits}",
                                 us, merge_us, floor_us, result[:1], base))
            for label, entry in (DECODE_ENTRIES if prefill_only is None else ()):   # one warp per group, +- prefetch
                def decode_entry(li, entry=entry):
                    kn.attention_decode(qkv, int(k[li].gpudata), int(v[li].gpudata), attend, ctl, part_o, part_ml,
                                        out, 1, HQ, KVH, HD, capacity, n_splits, HD ** -0.5, stream, max_splits=66,
                                        **entry)
                us, result = timed(decode_entry)
                merge_us, _ = timed(lambda li: kn._merge(part_o, part_ml, ctl, out, 1, HQ, HD, min(n_splits, 66),
                                                         stream))
                rows.append(_row(cached, "decode 1 row", label, us, merge_us, floor_us, result[:1], base))
            for blocks in ((2, 1) if prefill_only is None else ()):    # the decode row on the tensor cores
                def decode_mma(li, b=blocks):
                    kn.attention(qkv, int(k[li].gpudata), int(v[li].gpudata), attend, ctl, part_o, part_ml, out, 1,
                                 HQ, KVH, HD, capacity, n_splits, HD ** -0.5, stream, tensor_cores=True,
                                 blocks_per_sm=b, max_splits=66)
                us, result = timed(decode_mma)
                merge_us, _ = timed(lambda li: kn._merge(part_o, part_ml, ctl, out, 1, HQ, HD, min(n_splits, 66),
                                                         stream))
                rows.append(_row(cached, "decode 1 row, mma", f"b{blocks} <= 66", us, merge_us, floor_us,
                                 result[:1], base))

            base = None
            for label, shape in (v for v in PREFILL_VARIANTS if prefill_only in (None, v[0])):
                launched = min(n_splits, shape.get("max_splits", n_splits))

                def prefill(li, shape=shape):
                    kn.attention(qkv, int(k[li].gpudata), int(v[li].gpudata), attend, ctl, part_o, part_ml, out,
                                 ROWS, HQ, KVH, HD, capacity, n_splits, HD ** -0.5, stream, tensor_cores=True, **shape)
                us, result = timed(prefill)
                merge_us, _ = timed(lambda li, s=launched: kn._merge(part_o, part_ml, ctl, out, ROWS, HQ, HD, s,
                                                                     stream))
                base = result if base is None else base
                rows.append(_row(cached, f"prefill {ROWS} rows", label, us, merge_us, floor_us, result, base))
            ctl.gpudata.free()
    return {"machine": machine_info(), "capacity": capacity, "kv_dtype": kv_dtype, "copy_bandwidth_gbs": bandwidth / 1e9,
            "rows": rows}


def _row(cached, what, splits, us, merge_us, floor_us, result, base) -> dict:
    diff = float(np.max(np.abs(result - base)) / np.max(np.abs(base)))
    return {"cached": cached, "attention": what, "splits": splits, "us_per_layer": us, "merge_us": merge_us,
            "floor_us": floor_us, "x_floor": us / floor_us, "max_rel_diff": diff}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cached", type=int, nargs="+", default=list(DEFAULT_CACHED))
    p.add_argument("--replays", type=int, default=10)
    p.add_argument("--kv-dtype", default="float32", choices=("float32", "bfloat16"), help="the arenas' element type")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--prefill-only", choices=[label for label, _ in PREFILL_VARIANTS],
                   help="measure this prefill launch shape alone (no decode rows), e.g. under ncu")
    args = p.parse_args(argv)
    result = probe(args.cached, args.replays, args.kv_dtype, args.prefill_only)
    print_table(f"attention per layer over a long cache, {HQ}/{KVH} heads x {HD}, {args.kv_dtype} arena of "
                f"{result['capacity']} slots, copy bandwidth {result['copy_bandwidth_gbs']:.0f} GB/s "
                f"({result['machine'].get('gpu', 'GPU')})",
                ["cached", "attention", "splits", "us/layer", "merge us", "K/V floor us", "x floor", "max rel diff"],
                [[r["cached"], r["attention"], r["splits"], r["us_per_layer"], r["merge_us"], r["floor_us"],
                  r["x_floor"], f"{r['max_rel_diff']:.1e}"] for r in result["rows"]])
    write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
