"""The bulk prefill against the cycle's prefill kernels on the Qwen2.5-1.5B shape (GPU only).

    python -m vla_edge_ros.bench.bulk_probe [--json out/bulk_probe.json] [--quick]
    ncu --clock-control none -k regex:gemm python -m vla_edge_ros.bench.bulk_probe --launch-once 1024
    ncu --clock-control none -k regex:attention_flash_hd python -m vla_edge_ros.bench.bulk_probe \
        --launch-flash-once 1024 15360 --kv-dtype bfloat16

Three tables, each measured in one run on one backend (random bf16 weights drawn by HF on the GPU, an fp32 KV
arena or with `--kv-dtype bfloat16` the GPU demo's bf16 one), so every ratio compares like with like:
  gemm     each projection of a layer (q|k|v, o, gate/up, down) at M activation rows through each bulk GEMM
           kernel (cuda_bulk_launchers.BULK_GEMMS: gemm_bulk.cu's mma.sync, gemm_wgmma.cu's wgmma where the device has
           sm_90a): the useful rate 2 M N K / time (graph replays), with the activations as bf16 hi + lo (p2: the
           precision of the cycle's prefill) or bf16 alone (p1: HF's)
  forward  CudaBackend.forward over n rows after `--context` cached slots, host uploads and the final
           synchronize included (what a reconciler step costs): the cycle's prefill kernels (passes of 128 rows,
           the path of every forward before the bulk prefill) against the bulk prefill with each GEMM kernel,
           ms and us per token
  recompute a full recompute of N tokens from an empty arena (passes of bulk_max_rows rows), with each GEMM
           kernel: the CSR paper's unordered baseline (bench csr has it against HF's SDPA recompute)
The forward and recompute tables also time the serving GEMM with two query heads per flash-attention warp ("w2":
KernelPlan.bulk_attention_heads_per_warp) and with the attention's K/V copies under its products ("kvo":
KernelPlan.bulk_attention_kv_overlap; the serving choice), alone and together, with both part counts, with two K/V
stages ("s2"), and the overlap with hoisted copies ("kvo h") and 64-entry tiles ("kvo t64":
KernelPlan.bulk_attention_hoisted_copies, bulk_attention_tile_entries).
`--launch-once M` launches each GEMM kernel once per projection at M rows, outside any graph, and exits: the
run to put under Nsight Compute (`ncu`) to see what limits a kernel; `--launch-flash-once ROWS CONTEXT` does the
same for each flash-attention variant over one pass of ROWS rows after CONTEXT cached entries.
A diagnosis tool for choosing the defaults (model.bulk_prefill_min_rows, BULK_* in cuda_backend.py); the
benchmarks of record are `vla-edge bench csr` and `bench asr`.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import time

import numpy as np

from .common import machine_info, print_table, write_json
from ..model.cuda_kernel_plan import MEASURED_BEST

FORWARD_ROWS = (32, 64, 128, 256, 512, 1024)
GEMM_ROWS = (256, 1024, 4096)
RECOMPUTE = (4096, 16384)


def _median_ms(run, repeats: int) -> float:
    run()                                                  # warm-up: graph captures, first launches
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        times.append((time.perf_counter() - t0) * 1e3)
    return float(np.median(times))


def _layer_gemms(backend, spec, ck):
    """(name, weight, mode) of layer 0's four projections."""
    layer = backend.layers[0]
    return [("q|k|v", layer.w_qkv, ck.MODE_ADD), ("o", layer.w_o, ck.MODE_ADD),
            ("gate/up", layer.w_gate_up, ck.MODE_SWIGLU), ("down", layer.w_down, ck.MODE_ADD)]


def launch_once(m: int) -> None:
    """Each GEMM kernel once per projection at m rows, plain launches (for a profiler's kernel filter)."""
    from pycuda import gpuarray

    from ..model import cuda_bulk_launchers as cbl
    from ..model import cuda_kernels as ck
    from ..model.cuda_backend import CudaBackend
    from ..model.cuda_device import primary_device
    from .gpu_inputs import random_model

    spec, weights = random_model("qwen2.5-1.5b")
    backend = CudaBackend(spec, weights, 256, "bfloat16", vram_ceiling_bytes=None, bulk_prefill_min_rows=1)
    arch = ck.device_arch(primary_device(0))
    with backend.device.bound():
        x = gpuarray.to_gpu(np.full(2 * m * spec.intermediate_size, 0x3c00, np.uint16))
        y = gpuarray.zeros((m, spec.q_dim + 2 * spec.kv_dim), np.float32)
        y_hl = gpuarray.zeros(2 * m * spec.intermediate_size, np.uint16)
        for kernel, plan in cbl.BULK_GEMMS.items():
            if ck.family_arch(plan.family, arch) is None:
                continue
            for name, W, mode in _layer_gemms(backend, spec, ck):
                kw = {"out_hl": y_hl, "out_part_stride": y_hl.size // 2, "out_cols": spec.intermediate_size} \
                    if mode == ck.MODE_SWIGLU else {"out": y}
                backend.kernels.gemm_bulk(W, x, x.size // 2, m, mode, backend.stream, kernel=kernel, **kw)
                backend.stream.synchronize()
                print(f"launched {kernel} {name} at {m} rows")
    backend.close()


# (label, parts, query heads per warp, K/V overlap, K/V stages, hoisted copies, tile entries) of the flash attention's
# variants --launch-flash-once launches, each an entry of its own (prefill_bulk.cu, attention_flash_kvo.cu,
# attention_flash_tiles.cu), so a profiler tells them apart by name.
FLASH_VARIANTS = (("p2", 2, 1, False, 1, False, 32), ("p2 s2", 2, 1, False, 2, False, 32),
                  ("p1", 1, 1, False, 1, False, 32), ("w2", 2, 2, False, 1, False, 32),
                  ("w2 p1", 1, 2, False, 1, False, 32), ("kvo", 2, 1, True, 1, False, 32),
                  ("kvo p1", 1, 1, True, 1, False, 32), ("w2 kvo", 2, 2, True, 1, False, 32),
                  ("w2 kvo p1", 1, 2, True, 1, False, 32), ("kvo h", 2, 1, True, 1, True, 32),
                  ("kvo h p1", 1, 1, True, 1, True, 32), ("kvo t64", 2, 1, True, 1, True, 64),
                  ("kvo t64 p1", 1, 1, True, 1, True, 64))


def launch_flash_once(rows: int, context: int, kv_dtype: str) -> None:
    """Each flash-attention variant once over one bulk pass of the 1.5B shape's layer: `rows` rows after `context`
    cached entries (a late pass of a long recompute), the list split as the backend splits it, plain launches (for
    a profiler's kernel filter, e.g. ncu -k regex:attention_flash_hd)."""
    import pycuda.driver as drv
    from pycuda import gpuarray

    from ..model import cuda_kernels as ck
    from ..model.cuda_device import primary_device

    hq, kvh, hd = 12, 2, 128
    device = primary_device(0)
    rng = np.random.default_rng(0)
    with device.bound():
        kernels = ck.CudaKernels(device, kv_dtype=kv_dtype)
        kernels.load_family("prefill_bulk")
        kernels.load_family("attention_flash_kvo")
        kernels.load_family("attention_flash_tiles")
        stream = drv.Stream()
        cap = context + rows
        kv_type = ck.KV_ARENA_TYPES[kv_dtype][0]
        shape = (kvh, cap, hd)
        k = gpuarray.to_gpu(rng.integers(0x3c00, 0x3f80, size=shape).astype(np.uint16) if kv_type == np.uint16
                            else rng.standard_normal(shape).astype(np.float32))
        v = gpuarray.to_gpu(rng.integers(0x3c00, 0x3f80, size=shape).astype(np.uint16) if kv_type == np.uint16
                            else rng.standard_normal(shape).astype(np.float32))
        qkv = gpuarray.to_gpu(rng.standard_normal((rows, (hq + 2 * kvh) * hd)).astype(np.float32))
        attend = gpuarray.to_gpu(np.arange(cap, dtype=np.int32))
        ctl = gpuarray.to_gpu(np.array([0, context, 0, -1], np.int32))
        stage = gpuarray.zeros((4, kvh, cap, hd), np.uint16)
        splits = max(1, ck.ceil_div(2 * kernels.num_sms, ck.ceil_div(rows, 16) * kvh))
        part_o = gpuarray.zeros(splits * rows * hq * hd, np.float32)
        part_ml = gpuarray.zeros(splits * rows * hq * 2, np.float32)
        out_stride = rows * hq * hd
        out = gpuarray.zeros(2 * out_stride, np.uint16)
        kernels.kv_stage(int(k.gpudata), int(v.gpudata), attend, ctl, stage, rows, kvh, cap, hd, stream)
        for label, parts, heads, overlap, stages, hoisted, tile in FLASH_VARIANTS:
            kernels.attention_flash(qkv, stage, ctl, part_o, part_ml, out, out_stride, rows, hq, kvh, hd, splits,
                                    hd ** -0.5, stream, stages=stages, parts=parts, heads_per_warp=heads,
                                    kv_overlap=overlap, hoisted_copies=hoisted, tile_entries=tile)
            stream.synchronize()
            print(f"launched flash attention {label}: {rows} rows after {context}, {splits} splits, {kv_dtype} arena")


def probe(context: int, quick: bool, kv_dtype: str = "float32") -> dict:
    import pycuda.driver as drv
    from pycuda import gpuarray

    from ..model import cuda_bulk_launchers as cbl
    from ..model import cuda_kernels as ck
    from ..model.cuda_backend import CudaBackend
    from .gemv_probe import _time_graph
    from ..model.cuda_device import primary_device
    from .gpu_inputs import random_model

    spec, weights = random_model("qwen2.5-1.5b")
    gemms = [k for k, plan in cbl.BULK_GEMMS.items()
             if ck.family_arch(plan.family, ck.device_arch(primary_device(0))) is not None]
    capacity = max(context + max(FORWARD_ROWS), max(RECOMPUTE)) + 64
    backend = CudaBackend(spec, weights, capacity, "bfloat16", vram_ceiling_bytes=None, bulk_prefill_min_rows=1,
                          bulk_prefill_max_rows=1024, kv_dtype=kv_dtype)
    rng = np.random.default_rng(0)
    out = {"machine": machine_info(), "context": context, "kv_dtype": kv_dtype, "gemm": [], "forward": [],
           "recompute": []}
    shapes = _layer_gemms(backend, spec, ck)
    with backend.device.bound():
        stream = backend.stream
        x = gpuarray.to_gpu(rng.integers(0x3c00, 0x3f80, size=2 * 4096 * spec.intermediate_size).astype(np.uint16))
        y = gpuarray.zeros((4096, max(spec.hidden_size, spec.q_dim + 2 * spec.kv_dim)), np.float32)
        y_hl = gpuarray.zeros(2 * 4096 * spec.intermediate_size, np.uint16)
        for family in {cbl.BULK_GEMMS[k].family for k in gemms}:
            backend.kernels.load_family(family)
        variants = [(kernel, parts) for parts in (2, 1) for kernel in gemms]
        for m in GEMM_ROWS[:1] if quick else GEMM_ROWS:
            for name, W, mode in shapes:
                n_out, k = W.shape
                row = {"proj": name, "M": m, "us": {}, "tflops": {}}
                for kernel, parts in variants:
                    kw = {"out_hl": y_hl, "out_part_stride": y_hl.size // 2, "out_cols": spec.intermediate_size} \
                        if mode == ck.MODE_SWIGLU else {"out": y}

                    def record(W=W, mode=mode, parts=parts, kw=kw, m=m, kernel=kernel):
                        backend.kernels.gemm_bulk(W, x, x.size // 2, m, mode, stream, parts=parts, kernel=kernel, **kw)
                    us = _time_graph(stream, record, replays=20, per_replay=1)      # microseconds per launch
                    key = f"{kernel} p{parts}"
                    row["us"][key] = us
                    row["tflops"][key] = 2.0 * m * n_out * k / (us * 1e-6) / 1e12
                out["gemm"].append(row)
    keys = [f"{v} p{p}" for v, p in variants]
    print_table("bulk GEMM per projection: useful TFLOP/s (2 M N K / time, graph replays; us of the first)",
                ["proj", "M", *keys, f"us {keys[0]}"],
                [[r["proj"], r["M"], *(r["tflops"][k] for k in keys), r["us"][keys[0]]] for r in out["gemm"]])

    # A context of real K/V, then forwards of n new rows after it (slots past the context, written each time).
    ctx_slots = np.arange(context)
    ids = rng.integers(0, spec.vocab_size, size=capacity)
    rows_all = backend.embed(ids)
    backend.forward(rows_all[:context], np.arange(context), ctx_slots, np.zeros(0, np.int64), logits="none")

    def forward(n):
        backend.forward(rows_all[context:context + n], np.arange(context, context + n),
                        np.arange(context, context + n), ctx_slots, logits="none")
        backend.synchronize()

    serving_gemm = MEASURED_BEST.bulk_gemm if MEASURED_BEST.bulk_gemm in gemms else gemms[-1]
    # (label, bulk on, activation parts, GEMM kernel, query heads per flash-attention warp, its K/V overlap, its K/V
    # stages, hoisted copies, tile entries)
    variants = [("cycle kernels", 0, 2, "mma", 1, False, 1, False, 32),
                *((f"bulk {k}", 1, 2, k, 1, False, 1, False, 32) for k in gemms),
                *((f"bulk {k} p1", 1, 1, k, 1, False, 1, False, 32) for k in gemms if k != "mma" or len(gemms) == 1),
                (f"bulk {serving_gemm} s2", 1, 2, serving_gemm, 1, False, 2, False, 32),
                *((" ".join(["bulk", serving_gemm, *w, *kvo, *p]), 1, parts, serving_gemm, heads, bool(kvo), 1, False,
                   32)
                  for heads, w in ((1, []), (2, ["w2"])) for kvo in ([], ["kvo"]) for parts, p in ((2, []), (1, ["p1"]))
                  if heads == 2 or kvo),
                *((" ".join(["bulk", serving_gemm, "kvo", tiles, *p]), 1, parts, serving_gemm, 1, True, 1, True,
                   entries)
                  for tiles, entries in (("h", 32), ("t64", 64)) for parts, p in ((2, []), (1, ["p1"])))]

    def use(bulk, parts, kernel, heads_per_warp, kv_overlap, stages, hoisted, tile_entries):
        backend.bulk_min_rows = bulk
        # A plan switch also drops the captured graphs: the bulk ones baked the previous variant in.
        backend.use_kernel_plan(dataclasses.replace(MEASURED_BEST, bulk_activation_parts=parts, bulk_gemm=kernel,
                                                    bulk_attention_heads_per_warp=heads_per_warp,
                                                    bulk_attention_kv_overlap=kv_overlap,
                                                    bulk_attention_stages=stages,
                                                    bulk_attention_hoisted_copies=hoisted,
                                                    bulk_attention_tile_entries=tile_entries))
    for n in FORWARD_ROWS[2:4] if quick else FORWARD_ROWS:
        row = {"rows": n}
        for label, bulk, *choice in variants:
            use(bulk, *choice)
            row[label] = _median_ms(lambda: forward(n), repeats=5)
        out["forward"].append(row)
    labels = [v[0] for v in variants]
    best = min(labels[1:], key=lambda k: sum(r[k] for r in out["forward"]))
    # The row of the serving plan (MEASURED_BEST's bulk choices), named in both titles.
    serving = " ".join(["bulk", serving_gemm,
                        *(["kvo"] if MEASURED_BEST.bulk_attention_kv_overlap else []),
                        *([] if not MEASURED_BEST.bulk_attention_hoisted_copies
                          else ["h" if MEASURED_BEST.bulk_attention_tile_entries == 32 else "t64"]),
                        *(["p1"] if MEASURED_BEST.bulk_activation_parts == 1 else [])])
    print_table(f"forward of n rows after {context} cached slots (ms; us per token in brackets; serving: {serving})",
                ["rows", *labels, f"x cycle ({best})"],
                [[r["rows"], *(f"{r[k]:.2f} ({r[k] * 1e3 / r['rows']:.1f})" for k in labels),
                  r["cycle kernels"] / r[best]] for r in out["forward"]])

    for total in RECOMPUTE[:1] if quick else RECOMPUTE:
        row = {"tokens": total}
        for label, bulk, *choice in variants[1:]:
            use(bulk, *choice)

            def recompute(total=total):
                backend.forward(rows_all[:total], np.arange(total), np.arange(total), np.zeros(0, np.int64),
                                logits="none")
                backend.synchronize()
            row[label] = _median_ms(recompute, repeats=3)
        out["recompute"].append(row)
    print_table(f"full recompute from an empty arena (ms; us per token in brackets; serving: {serving})",
                ["tokens", *labels[1:]],
                [[r["tokens"], *(f"{r[k]:.1f} ({r[k] * 1e3 / r['tokens']:.1f})" for k in labels[1:])]
                 for r in out["recompute"]])
    drv.Context.synchronize()
    backend.close()
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--context", type=int, default=2048, help="cached slots before the timed forwards")
    p.add_argument("--quick", action="store_true", help="one GEMM size, two forward sizes")
    p.add_argument("--kv-dtype", choices=("float32", "bfloat16"), default="float32",
                   help="the KV arena's element type (bfloat16: the GPU demo's, config/gpu_demo.yaml)")
    p.add_argument("--json", default=None)
    p.add_argument("--launch-once", type=int, default=0, metavar="M",
                   help="launch each GEMM kernel once per projection at M rows and exit (for ncu)")
    p.add_argument("--launch-flash-once", type=int, nargs=2, metavar=("ROWS", "CONTEXT"),
                   help="launch each flash-attention variant once over ROWS rows after CONTEXT cached entries (with "
                        "--kv-dtype's arena) and exit (for ncu)")
    args = p.parse_args(argv)
    if args.launch_flash_once:
        launch_flash_once(*args.launch_flash_once, args.kv_dtype)
        return 0
    if args.launch_once:
        launch_once(args.launch_once)
        return 0
    write_json(args.json, probe(args.context, args.quick, args.kv_dtype))
    return 0


if __name__ == "__main__":
    sys.exit(main())
