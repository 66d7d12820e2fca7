"""One control cycle of the PyCUDA backend vs HuggingFace eager bf16, on the same weights and inputs.

    python -m vla_edge_ros.bench.pycuda_cycle --json out/pycuda_cycle.json
    vla-edge bench --backend pycuda --shape qwen2.5-1.5b

A cycle = a 32-row prefill (frame tokens) over `cached` tokens already in the
KV cache, then 8 single-token decode steps, every argmax restricted to the 256
action bins (9 tokens chosen). Measured in one run, on one GPU:

  * ours: `CudaBackend.run_cycle_tokens` end to end on the host clock (upload,
    captured prefill graph, 8 decode-graph replays, token download); prefill
    and decode separately with CUDA events;
  * HF transformers eager bf16 (same weights, same prefill embeddings, its own
    DynamicCache cropped back to `cached` after every cycle), timed the same way;
  * the weight-streaming floor: bytes a decode step must read (layer weights +
    the 256 head rows; and all weights incl. the full head, HF's case) over the
    device-to-device copy bandwidth measured here (bytes read + written / time).
"""
from __future__ import annotations

import argparse
import logging
import sys
import time

import numpy as np

from .common import machine_info, percentiles, print_table, write_json

log = logging.getLogger(__name__)

SHAPES = {"qwen2.5-1.5b": dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                               num_attention_heads=12, num_key_value_heads=2, rope_theta=1000000.0,
                               rms_norm_eps=1e-6, tie_word_embeddings=True, max_position_embeddings=32768),
          "tiny": dict(vocab_size=1024, hidden_size=128, intermediate_size=352, num_hidden_layers=4,
                       num_attention_heads=4, num_key_value_heads=2, rope_theta=10000.0, rms_norm_eps=1e-6,
                       tie_word_embeddings=True, max_position_embeddings=32768)}
DEFAULT_CACHED = (256, 2048, 4064)
PREFILL_ROWS = 32
DECODE_STEPS = 8
BINS = 256
COPY_BYTES = 1 << 31            # 2 GiB per buffer: far beyond the 60 MB L2


def add_arguments(p) -> None:
    p.add_argument("--shape", default="qwen2.5-1.5b", choices=sorted(SHAPES))
    p.add_argument("--cycles", type=int, default=50, help="timed cycles per cached length (ours)")
    p.add_argument("--hf-cycles", type=int, default=10, help="timed cycles per cached length (HF eager)")
    p.add_argument("--cached", type=int, nargs="+", help=f"cached lengths (default {DEFAULT_CACHED})")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--decode-variants", nargs="+", default=None, metavar="PROJ:ATTN",
                   help="decode-pipeline kernels to time side by side (model.cuda_backend.DecodeKernels), "
                        "e.g. mma:chunk gemv:split; the first is the one the summary reports (default: the backend's)")


def run(args) -> int:
    import torch

    if not torch.cuda.is_available():
        print("pycuda bench: no CUDA device", file=sys.stderr)
        return 2
    from ..model.cuda_device import primary_device
    with primary_device(0).bound():        # this thread drives the device for the whole bench (events, copies)
        return _run(args)


def _run(args) -> int:
    shape = _shape_name(getattr(args, "shape", "qwen2.5-1.5b"))
    cached = list(getattr(args, "cached", None) or DEFAULT_CACHED)
    cycles = int(getattr(args, "cycles", None) or 50)
    hf_cycles = int(getattr(args, "hf_cycles", None) or 10)
    seed = int(getattr(args, "seed", 0) or 0)
    from ..model.cuda_backend import DecodeKernels
    variants = [DecodeKernels.parse(v) for v in (getattr(args, "decode_variants", None) or [str(DecodeKernels())])]
    result = bench(shape, cached, cycles, hf_cycles, seed, variants)
    _print(result)
    write_json(getattr(args, "json", None), result)
    return 0


def bench(shape: str, cached: list, cycles: int, hf_cycles: int, seed: int, variants: list) -> dict:
    import torch

    from ..model.cuda_backend import CudaBackend
    from ..model.spec import ModelSpec

    torch.manual_seed(seed)
    hf, cfg = _hf_model(shape)
    spec = ModelSpec.from_hf_config(cfg)
    weights = _weights_from_hf(hf, spec)
    capacity = max(cached) + PREFILL_ROWS + DECODE_STEPS
    t0 = time.perf_counter()
    backend = CudaBackend(spec, weights, capacity, "bfloat16")
    del weights
    log.info("backend ready in %.1f s", time.perf_counter() - t0)
    bandwidth = copy_bandwidth()
    floor_bytes = backend.decode_stream_bytes(BINS)
    full_bytes = backend.weight_bytes
    floor_ms = floor_bytes / bandwidth * 1e3
    rng = np.random.default_rng(seed)
    rows = []
    for n_cached in cached:
        _fill_context(backend, spec, n_cached, rng)
        theirs = _time_hf(hf, spec, n_cached, hf_cycles, rng)
        for variant in variants:
            backend.set_decode_kernels(variant)
            ours = _time_ours(backend, spec, n_cached, cycles, rng)
            rows.append({"cached": n_cached, "variant": str(variant), "ours": ours, "hf_eager_bf16": theirs,
                         "ratio_p50": theirs["cycle_ms"]["p50"] / ours["cycle_ms"]["p50"],
                         "ratio_p99": theirs["cycle_ms"]["p99"] / ours["cycle_ms"]["p99"],
                         "decode_vs_floor": ours["decode_ms_per_token"] / floor_ms})
    last = [r for r in rows if r["variant"] == str(variants[0])][-1]
    return {
        "benchmark": "pycuda_cycle", "shape": shape, "machine": _machine(),
        "cycle": f"{PREFILL_ROWS}-row prefill + {DECODE_STEPS} decode steps, argmax over {BINS} action bins",
        "decode_variants": [str(v) for v in variants], "summary_variant": str(variants[0]),
        "kv_capacity": capacity, "device_memory_bytes": backend.memory_bytes(),
        "weight_bytes": full_bytes, "decode_stream_bytes": floor_bytes,
        "copy_bandwidth_gbs": bandwidth / 1e9,
        "floor_decode_ms": floor_ms, "floor_full_weights_ms": full_bytes / bandwidth * 1e3,
        "cycles": rows,
        "latency_ms": {"p50": last["ours"]["cycle_ms"]["p50"], "p99": last["ours"]["cycle_ms"]["p99"]},
        "baseline_latency_ms": {"p50": last["hf_eager_bf16"]["cycle_ms"]["p50"],
                                "p99": last["hf_eager_bf16"]["cycle_ms"]["p99"]},
        "ratio": last["ratio_p50"],
        "decode_ms_per_token": last["ours"]["decode_ms_per_token"],
    }


# ----------------------------------------------------------------------------
# Ours


def _fill_context(backend, spec, n_cached: int, rng) -> None:
    """Real K/V in slots [0, n_cached): a forward pass over random tokens."""
    ctx_slots = np.arange(n_cached)
    for start in range(0, n_cached, backend.max_rows):
        n = min(backend.max_rows, n_cached - start)
        ids = rng.integers(0, spec.vocab_size, size=n)
        backend.forward(backend.embed(ids), np.arange(start, start + n), ctx_slots[start:start + n],
                        ctx_slots[:start], logits="none")


def _time_ours(backend, spec, n_cached: int, cycles: int, rng) -> dict:
    import pycuda.driver as drv

    ctx_slots = np.arange(n_cached)
    w_slots = np.arange(n_cached, n_cached + PREFILL_ROWS)
    d_slots = np.arange(n_cached + PREFILL_ROWS, n_cached + PREFILL_ROWS + DECODE_STEPS)
    pos = w_slots.copy()
    d_pos = d_slots.copy()
    lo = spec.vocab_size - BINS
    ev = [drv.Event() for _ in range(3)]
    cycle_ms, prefill_ms, decode_ms = [], [], []
    for i in range(cycles + 5):                                 # first 5: graph capture and warm-up
        x = backend.embed(rng.integers(0, spec.vocab_size, size=PREFILL_ROWS))
        t0 = time.perf_counter()
        backend.begin_cycle(x, pos, w_slots, ctx_slots, d_slots, d_pos, DECODE_STEPS + 1)
        ev[0].record(backend.stream)
        backend.launch_prefill(PREFILL_ROWS, lo, BINS)
        ev[1].record(backend.stream)
        for _ in range(DECODE_STEPS):
            backend.launch_decode_step(lo, BINS)
        ev[2].record(backend.stream)
        tokens = backend.finish_cycle(DECODE_STEPS + 1)
        elapsed = (time.perf_counter() - t0) * 1e3
        if i >= 5:
            cycle_ms.append(elapsed)
            prefill_ms.append(ev[1].time_since(ev[0]))
            decode_ms.append(ev[2].time_since(ev[1]) / DECODE_STEPS)
    assert tokens.min() >= lo, tokens
    breakdown = {"decode": _breakdown(backend, 1, n_cached + PREFILL_ROWS, n_cached),
                 "prefill": _breakdown(backend, PREFILL_ROWS, 0, n_cached)}
    return {"cycle_ms": percentiles(cycle_ms), "prefill_ms": float(np.median(prefill_ms)),
            "decode_ms_per_token": float(np.median(decode_ms)), "cycles": len(cycle_ms), "breakdown_ms": breakdown}


def _breakdown(backend, n: int, row_offset: int, n_cached: int, replays: int = 20) -> dict:
    """Graph-replay time of each kernel group of one forward over n rows (all layers), to locate the cost.
    Run after a cycle (tables in place); the replays overwrite scratch and the cycle's own slots only."""
    import pycuda.driver as drv

    from ..model.cuda_graphs import capture

    s = backend.stream
    out = {}
    start, end = drv.Event(), drv.Event()
    for name in backend.layer_groups(n):
        backend._put(backend.ctl, np.array([row_offset, n_cached, 0, 0], np.int32))
        graph = capture(f"profile-{name}-{n}", s, lambda: backend._enqueue_layers(n, groups=(name,)))
        graph.launch(s)
        start.record(s)
        for _ in range(replays):
            graph.launch(s)
        end.record(s)
        end.synchronize()
        out[name] = start.time_till(end) / replays
        graph.close()
    return out


# ----------------------------------------------------------------------------
# HuggingFace eager bf16


def _hf_model(shape: str):
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    cfg = Qwen2Config(**SHAPES[shape])
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, attn_implementation="eager")
    with torch.no_grad():                                       # HF inits biases and norms to constants: draw them
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.copy_(1.0 * (name.endswith("norm.weight") or "layernorm" in name) + 0.02 * torch.randn_like(p))
    model.eval()
    d = cfg.to_dict()
    d["model_type"] = "qwen2"
    d.setdefault("rope_theta", SHAPES[shape]["rope_theta"])
    return model, d


def _weights_from_hf(model, spec):
    from ..model.weights import GLOBAL_TENSOR_NAMES, LAYER_TENSOR_NAMES, LayerWeights, ModelWeights

    state = {k: v.float().cpu().numpy() for k, v in model.state_dict().items()}
    layers = [LayerWeights(**{f: state[t.format(i=i)] for f, t in LAYER_TENSOR_NAMES.items()})
              for i in range(spec.num_layers)]
    embed = state[GLOBAL_TENSOR_NAMES["embed"]]
    return ModelWeights(embed=embed, layers=layers, final_norm=state[GLOBAL_TENSOR_NAMES["final_norm"]],
                        lm_head=embed, tied=True, source_dtype="BF16")


def _time_hf(model, spec, n_cached: int, cycles: int, rng) -> dict:
    import torch
    from transformers import DynamicCache

    dev = model.device
    lo = spec.vocab_size - BINS
    with torch.no_grad():
        cache = DynamicCache()
        ctx = torch.as_tensor(rng.integers(0, spec.vocab_size, size=(1, n_cached)), device=dev)
        model(input_ids=ctx, past_key_values=cache, use_cache=True)
        embed = model.get_input_embeddings()
        cycle_ms, prefill_ms, decode_ms = [], [], []
        for i in range(cycles + 2):
            ids = torch.as_tensor(rng.integers(0, spec.vocab_size, size=(1, PREFILL_ROWS)), device=dev)
            x = embed(ids)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = model(inputs_embeds=x, past_key_values=cache, use_cache=True)   # positions follow the cache
            token = lo + int(out.logits[0, -1, lo:].argmax())
            torch.cuda.synchronize()
            t1 = time.perf_counter()
            for j in range(DECODE_STEPS):
                out = model(input_ids=torch.tensor([[token]], device=dev), past_key_values=cache, use_cache=True)
                token = lo + int(out.logits[0, -1, lo:].argmax())
            torch.cuda.synchronize()
            t2 = time.perf_counter()
            cache.crop(-(PREFILL_ROWS + DECODE_STEPS))             # back to the cached context
            if i >= 2:
                cycle_ms.append((t2 - t0) * 1e3)
                prefill_ms.append((t1 - t0) * 1e3)
                decode_ms.append((t2 - t1) * 1e3 / DECODE_STEPS)
    return {"cycle_ms": percentiles(cycle_ms), "prefill_ms": float(np.median(prefill_ms)),
            "decode_ms_per_token": float(np.median(decode_ms)), "cycles": len(cycle_ms)}


# ----------------------------------------------------------------------------
# Floor and output


def copy_bandwidth(nbytes: int = COPY_BYTES, repeats: int = 10) -> float:
    """Device-to-device copy bandwidth in bytes/s, counting bytes read + written (median of repeats)."""
    import pycuda.driver as drv

    src, dst = drv.mem_alloc(nbytes), drv.mem_alloc(nbytes)     # in the context current on this thread
    drv.memset_d32(src, 0x3F800000, nbytes // 4)                # 1.0f everywhere: not zeros
    start, end = drv.Event(), drv.Event()
    times = []
    for i in range(repeats + 2):
        start.record()
        drv.memcpy_dtod(dst, src, nbytes)
        end.record()
        end.synchronize()
        if i >= 2:
            times.append(end.time_since(start) / 1e3)
    src.free()
    dst.free()
    return 2 * nbytes / float(np.median(times))


def _machine() -> dict:
    import pycuda.driver as drv

    info = machine_info()
    dev = drv.Context.get_device()
    info["gpu_pycuda"] = dev.name()
    info["cuda_driver"] = drv.get_driver_version()
    return info


def _shape_name(shape: str) -> str:
    if shape not in SHAPES:
        raise SystemExit(f"pycuda bench: unknown shape {shape!r}; choose one of {sorted(SHAPES)}")
    return shape


def _print(r: dict) -> None:
    headers = ["cached", "decode", "ours p50", "ours p99", "prefill", "dec/tok", "HF p50", "HF p99", "HF prefill", "HF dec/tok",
               "x p50", "x p99", "dec/floor"]
    rows = [[c["cached"], c["variant"], c["ours"]["cycle_ms"]["p50"], c["ours"]["cycle_ms"]["p99"], c["ours"]["prefill_ms"],
             c["ours"]["decode_ms_per_token"], c["hf_eager_bf16"]["cycle_ms"]["p50"],
             c["hf_eager_bf16"]["cycle_ms"]["p99"], c["hf_eager_bf16"]["prefill_ms"],
             c["hf_eager_bf16"]["decode_ms_per_token"], c["ratio_p50"], c["ratio_p99"], c["decode_vs_floor"]]
            for c in r["cycles"]]
    print_table(f"pycuda cycle ({r['cycle']}), {r['shape']}, ms; on {r['machine'].get('gpu_pycuda')}", headers, rows)
    print(f"copy bandwidth {r['copy_bandwidth_gbs']:.0f} GB/s (read+write); decode floor "
          f"{r['decode_stream_bytes'] / 1e9:.3f} GB -> {r['floor_decode_ms']:.3f} ms/token; all weights "
          f"{r['weight_bytes'] / 1e9:.3f} GB -> {r['floor_full_weights_ms']:.3f} ms; device memory "
          f"{r['device_memory_bytes'] / 2**30:.2f} GiB for {r['kv_capacity']} KV slots")
    for c in r["cycles"]:
        for phase, parts in c["ours"]["breakdown_ms"].items():
            print(f"  cached {c['cached']:>5} {c['variant']:>11} {phase:>8}: " + ", ".join(f"{k} {v:.3f} ms" for k, v in parts.items()))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(p)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
