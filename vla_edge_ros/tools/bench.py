"""`vla-edge bench [cycle|csr|asr]`: benchmarks, each against a baseline timed in the same run.

    vla-edge bench --backend numpy                              engine cycle vs HF transformers (CPU, tiny model)
    vla-edge bench --backend pycuda --shape qwen2.5-1.5b        CUDA cycle vs HF bf16, eager and static cache +
                                                                torch.compile (GPU machine)
    vla-edge bench --backend pycuda --shape llama-2-7b --weights float int4
                                                                the same per weight format, all on the INT4
                                                                model's function (bench/cycle_weights.py)
    vla-edge bench csr                                          time-to-first-token: CSR vs recompute-everything,
                                                                ours and HF transformers' (SDPA) in the same run
    vla-edge bench asr --png out/asr.png                        latency over eviction cycles: ASR / sync / approximate
                                                                (the paper's Fig. 6)
    vla-edge bench csr --backend pycuda --shape qwen2.5-1.5b    the same on the GPU (random 1.5B-shaped model)
    vla-edge bench asr --backend pycuda --shape qwen2.5-1.5b    reconciler in its own CUDA context, swap device to device
"""
from __future__ import annotations

import argparse
import importlib

from ..bench.cycle_weights import weight_format

SUITES = {
    ("cycle", "numpy"): "vla_edge_ros.bench.numpy_cycle",
    ("cycle", "pycuda"): "vla_edge_ros.bench.pycuda_cycle",
    ("csr", "numpy"): "vla_edge_ros.bench.csr_ttft",
    ("asr", "numpy"): "vla_edge_ros.bench.asr_timeline",
    ("csr", "pycuda"): "vla_edge_ros.bench.csr_ttft",
    ("asr", "pycuda"): "vla_edge_ros.bench.asr_timeline",
}
# --shape for the csr / asr suites on pycuda when left at the dispatcher's "tiny" default.
GPU_SUITE_SHAPE = "qwen2.5-1.5b"


def add_arguments(p) -> None:
    p.add_argument("suite", nargs="?", default="cycle", choices=sorted({s for s, _ in SUITES}),
                   help="what to measure (default: one control cycle)")
    p.add_argument("--backend", default="numpy", choices=["numpy", "pycuda"])
    p.add_argument("--model", help="model directory (default: model.path from the config)")
    p.add_argument("--shape", help=f"pycuda: model shape to generate (tiny | qwen2.5-1.5b | llama-2-7b; default "
                   f"{GPU_SUITE_SHAPE}, the robot's model in config/gpu_demo.yaml)")
    p.add_argument("--config", help="configuration YAML (default: config/vla_edge.yaml)")
    p.add_argument("--cycles", type=int, default=20, help="timed cycles per cached length")
    p.add_argument("--cached", type=int, nargs="+", help="cached lengths to sweep")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--launch-modes", nargs="+", choices=["pdl", "plain"],
                   help="cycle on pycuda: decode launch modes to time side by side (default: plain then pdl)")
    p.add_argument("--weights", nargs="+", type=weight_format, default=["float"],
                   help="cycle on pycuda: weight formats of ours, side by side: float and/or int4 (with int4 HF and "
                        "ours float run the INT4 model's dequantized weights; default: float)")
    p.add_argument("--no-hf-compiled", action="store_true",
                   help="cycle on pycuda: skip the HF static cache + torch.compile baseline (minutes of compilation)")
    csr = p.add_argument_group("csr / asr suites")
    csr.add_argument("--suffix", type=int, nargs="+", help="csr: dynamic-suffix lengths M to sweep")
    csr.add_argument("--repeats", type=int, help="csr: timed repeats per (N, M)")
    csr.add_argument("--baseline-repeats", type=int, help="csr: timed repeats of the recompute baseline")
    csr.add_argument("--baseline-suffix", type=int, nargs="+", help="csr: suffix lengths at which the baseline is timed")
    csr.add_argument("--chunk", type=int, help="csr: rows per forward of our recompute, 0: one forward (default: "
                     "512 on numpy, 0 on pycuda)")
    csr.add_argument("--kv-dtype", choices=["float32", "bfloat16"],
                     help="csr on pycuda: the KV arena's element type (default: kv.dtype of the config)")
    csr.add_argument("--bulk-gemm", help="csr on pycuda: the bulk prefill's GEMM (cuda_bulk_launchers.BULK_GEMMS: tma, "
                     "tma2, wgmma128, mma; default: the serving plan's)")
    csr.add_argument("--bulk-parts", type=int, choices=[1, 2],
                     help="csr on pycuda: bf16 parts of the bulk prefill's activations and attention factors, 2: hi + "
                          "lo (the serving precision, default), 1: bf16 alone (HF's bf16 precision)")
    csr.add_argument("--bulk-kv-overlap", action=argparse.BooleanOptionalAction,
                     help="csr on pycuda: the bulk prefill's flash attention with its K/V copies under its products "
                          "(KernelPlan.bulk_attention_kv_overlap, on in serving) or, --no-bulk-kv-overlap, without")
    csr.add_argument("--kernel-variants", nargs="+", metavar="NAME",
                     help="csr on pycuda: the kernel lab's variants over the serving plan (bench/kernel_lab.py "
                          "KERNEL_VARIANTS, e.g. lcs2)")
    csr.add_argument("--frames", help="csr / asr: pre-decoded footage .npy (bench/gpu_inputs.save_footage)")
    csr.add_argument("--hz", type=float, help="asr: cycle rate (default 30)")
    csr.add_argument("--max-cycles", type=int, help="asr: give up on the ASR run after this many cycles")
    csr.add_argument("--baseline-cycles", type=int, help="asr: cycles of the sync and approx runs")
    csr.add_argument("--device-transfer", choices=["device", "host"], help="asr on pycuda: how a swap moves the KV")
    csr.add_argument("--reconciler-context", choices=["own", "shared"],
                     help="asr on pycuda: the reconciler's own CUDA context, or the primary's")
    csr.add_argument("--capacity", type=int, help="asr: KV capacity in tokens")
    csr.add_argument("--eviction-cycles", type=int, help="asr: eviction cycles to run through")
    csr.add_argument("--asr-mode", choices=["csr", "semantic"], help="asr: reconciliation mode")
    csr.add_argument("--work", choices=["interleaved", "thread"], help="asr: where the reconciler runs")
    csr.add_argument("--png", help="asr: Fig. 6, latency per cycle through the rounds")
    csr.add_argument("--modes", nargs="+", choices=["asr", "sync", "approx"], help="asr: which modes to run")
    csr.add_argument("--no-warm-start", action="store_true", help="asr: start every mode from an empty state")
    csr.add_argument("--from-json", nargs="+", help="asr: run nothing, table and plot from these result files")
    csr.add_argument("--set", metavar="KEY=VALUE", action="append", default=[],
                     help="asr: override one configuration key (repeatable), e.g. --set asr.threshold=0.5")


def run(args) -> int:
    key = (args.suite, args.backend)
    if key not in SUITES:
        print(f"vla-edge bench: no {args.suite!r} benchmark for backend {args.backend!r}; have {sorted(SUITES)}")
        return 2
    if args.weights != ["float"] and key != ("cycle", "pycuda"):
        print(f"vla-edge bench: --weights {' '.join(args.weights)} is the pycuda cycle's (bench --backend pycuda)")
        return 2
    if args.set and args.suite != "asr":
        print("vla-edge bench: --set overrides configuration keys of bench asr; the other suites take --config")
        return 2
    cuda_choices = (args.bulk_gemm, args.bulk_parts, args.bulk_kv_overlap, args.kernel_variants)
    if any(c is not None for c in cuda_choices) and key != ("csr", "pycuda"):
        print("vla-edge bench: --bulk-gemm, --bulk-parts, --bulk-kv-overlap and --kernel-variants choose the CUDA "
              "kernels of bench csr --backend pycuda")
        return 2
    if args.shape is None:
        # The robot's shape for every suite: a GPU figure is compared with the graph's on that model.
        args.shape = GPU_SUITE_SHAPE
    return importlib.import_module(SUITES[key]).run(args)
