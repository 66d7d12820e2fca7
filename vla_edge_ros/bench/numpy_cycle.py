"""`vla-edge bench --backend numpy`: one control cycle of our CPU backend beside HF transformers.

A cycle here is what the reasoning node does each 33 ms once the state is
warm: prefill 32 vision rows + the dynamic suffix over `cached` tokens already
in the KV cache, then 7 single-token decode steps (8 action tokens; the first
comes from the prefill's last logits), every argmax restricted to the action
bins. The baseline is HuggingFace transformers (fp32, eager attention) doing
the same work with its DynamicCache on the same weights and inputs: its cache
is cropped back to `cached` after every cycle so both sides always start
from the same length. Both sides must pick the same action tokens, otherwise
the comparison is void and the benchmark says so.
"""
from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np

from ..config import load as load_config
from .common import machine_info, percentiles, print_table, write_json

log = logging.getLogger(__name__)

DEFAULT_CACHED = (256, 1024, 2048, 4000)
SUFFIX_TOKENS = 12   # a short instruction + "Action:" tokenizes to about this many tokens


def run(args) -> int:
    import torch
    from ..model.factory import create_backend, load_model
    from ..model.hf_oracle import load_hf_model

    from ..core.cpu_threads import limit_cpu_threads
    cfg = load_config(args.config) if getattr(args, "config", None) else load_config()
    limit_cpu_threads(cfg.model.cpu_threads)          # both sides get the same thread count
    model_dir = Path(args.model or cfg.model.path)
    _ensure_model(model_dir)
    spec, _weights, _tok = load_model(model_dir)
    tpf, n_act = cfg.vision.tokens_per_frame, cfg.action.num_tokens
    lengths = tuple(args.cached) if args.cached else DEFAULT_CACHED
    cycles = args.cycles
    rng = np.random.default_rng(0)
    lo = spec.vocab_size - cfg.action.num_bins

    hf = load_hf_model(model_dir)
    torch.set_num_threads(cfg.model.cpu_threads)
    hf_embed = hf.get_input_embeddings()
    rows = []
    payload_rows = []
    all_ours, all_hf = [], []
    for cached in lengths:
        capacity = cached + tpf + SUFFIX_TOKENS + n_act
        backend = create_backend("numpy", model_dir, capacity=capacity)
        ctx_ids = rng.integers(0, lo, size=cached)
        suffix_ids = rng.integers(0, lo, size=SUFFIX_TOKENS)
        vision = rng.standard_normal((tpf, spec.hidden_size)).astype(np.float32) * 0.02  # [32, hidden]
        prefill_x = np.concatenate([vision, backend.embed(suffix_ids)])                 # [P, hidden]
        p = prefill_x.shape[0]

        ours = _time_ours(backend, ctx_ids, prefill_x, cached, p, n_act, lo, cycles)
        base = _time_hf(torch, hf, hf_embed, ctx_ids, prefill_x, cached, p, n_act, lo, cycles)
        agree = ours["tokens"] == base["tokens"]
        o, b = percentiles(ours["cycle_ms"]), percentiles(base["cycle_ms"])
        all_ours += ours["cycle_ms"]
        all_hf += base["cycle_ms"]
        rows.append([cached, o["p50"], o["p95"], o["p99"], b["p50"], b["p99"], b["p50"] / o["p50"],
                     np.median(ours["prefill_ms"]) / p, np.median(base["prefill_ms"]) / p,
                     np.median(ours["decode_ms"]) / (n_act - 1), np.median(base["decode_ms"]) / (n_act - 1),
                     "yes" if agree else "NO"])
        payload_rows.append({"cached_tokens": cached, "prefill_tokens": p, "decode_steps": n_act - 1,
                             "latency_ms": o, "baseline_latency_ms": b, "speedup_p50": b["p50"] / o["p50"],
                             "prefill_ms_per_token": float(np.median(ours["prefill_ms"]) / p),
                             "baseline_prefill_ms_per_token": float(np.median(base["prefill_ms"]) / p),
                             "decode_ms_per_token": float(np.median(ours["decode_ms"]) / (n_act - 1)),
                             "baseline_decode_ms_per_token": float(np.median(base["decode_ms"]) / (n_act - 1)),
                             "action_tokens_agree": bool(agree)})

    machine = machine_info()
    print(f"machine: {machine['cpu']} x{machine['cpu_count']}, python {machine['python']}, "
          f"numpy {machine['numpy']}, torch {machine.get('torch')} ({machine.get('torch_threads')} threads)")
    print(f"model: {model_dir} ({spec.model_type}, {spec.num_layers} layers, hidden {spec.hidden_size}); "
          f"cycle = prefill {tpf} vision + {SUFFIX_TOKENS} suffix tokens, then {n_act - 1} decode steps; "
          f"{cycles} timed cycles per length; baseline = HF transformers {_hf_version()} fp32 eager, DynamicCache")
    print_table("cycle latency (ms): ours = numpy backend, hf = baseline; ratio = hf p50 / ours p50",
                ["cached", "p50", "p95", "p99", "hf p50", "hf p99", "ratio",
                 "prefill ms/tok", "hf prefill ms/tok", "decode ms/tok", "hf decode ms/tok", "same tokens"], rows)
    write_json(args.json, {
        "suite": "cycle", "backend": "numpy", "model": str(model_dir), "machine": machine,
        "cycles": cycles * len(lengths), "latency_ms": percentiles(all_ours),
        "baseline": "hf-transformers-fp32-eager", "baseline_latency_ms": percentiles(all_hf),
        "by_cached_length": payload_rows,
    })
    if not all(r["action_tokens_agree"] for r in payload_rows):
        log.error("our action tokens differ from HF's: the timing comparison is not like for like")
        return 1
    return 0


def _time_ours(backend, ctx_ids, prefill_x, cached, p, n_act, lo, cycles) -> dict:
    ctx_slots = np.arange(cached, dtype=np.int32)
    for start in range(0, cached, 512):                       # warm the cache in chunks (untimed)
        sl = ctx_slots[start:start + 512]
        backend.forward(backend.embed(ctx_ids[sl]), sl.astype(np.int64), sl, ctx_slots[:start], logits="none")
    pre_slots = np.arange(cached, cached + p, dtype=np.int32)
    dec_slots = np.arange(cached + p, cached + p + n_act - 1, dtype=np.int32)
    pre_pos = np.arange(cached, cached + p, dtype=np.int64)
    out = {"cycle_ms": [], "prefill_ms": [], "decode_ms": [], "tokens": None}
    dec_pos = np.arange(cached + p, cached + p + n_act - 1, dtype=np.int64)
    n_bins = backend.spec.vocab_size - lo
    for i in range(cycles + 2):                               # two warm-up cycles
        # The backend's own cycle, as the engine runs it (numpy: the context's K/V gathered once per cycle).
        t0 = time.perf_counter()
        tokens = backend.run_cycle_tokens(prefill_x, pre_pos, pre_slots, ctx_slots, dec_slots, dec_pos, lo, n_act,
                                          n_bins)
        t2 = time.perf_counter()
        prefill_ms, decode_ms = backend.last_cycle_ms
        if i >= 2:
            out["cycle_ms"].append((t2 - t0) * 1e3)
            out["prefill_ms"].append(prefill_ms)
            out["decode_ms"].append(decode_ms)
        out["tokens"] = [int(t) for t in tokens]
    return out


def _time_hf(torch, hf, hf_embed, ctx_ids, prefill_x, cached, p, n_act, lo, cycles) -> dict:
    from transformers import DynamicCache
    out = {"cycle_ms": [], "prefill_ms": [], "decode_ms": [], "tokens": None}
    with torch.inference_mode():
        cache = DynamicCache()
        if cached:                                   # nothing cached: the cycle starts from an empty cache
            hf(input_ids=torch.from_numpy(ctx_ids)[None], past_key_values=cache, use_cache=True,
               position_ids=torch.arange(cached)[None])
        x = torch.from_numpy(prefill_x)[None]
        pos = torch.arange(cached, cached + p)[None]
        for i in range(cycles + 2):
            t0 = time.perf_counter()
            res = hf(inputs_embeds=x, past_key_values=cache, use_cache=True, position_ids=pos)
            tokens = [lo + int(torch.argmax(res.logits[0, -1, lo:]))]
            t1 = time.perf_counter()
            for step in range(n_act - 1):
                res = hf(input_ids=torch.tensor([[tokens[-1]]]), past_key_values=cache, use_cache=True,
                         position_ids=torch.tensor([[cached + p + step]]))
                tokens.append(lo + int(torch.argmax(res.logits[0, -1, lo:])))
            t2 = time.perf_counter()
            cache.crop(-(p + n_act - 1))                 # drop this cycle's tokens again
            if i >= 2:
                out["cycle_ms"].append((t2 - t0) * 1e3)
                out["prefill_ms"].append((t1 - t0) * 1e3)
                out["decode_ms"].append((t2 - t1) * 1e3)
            out["tokens"] = tokens
    return out


def _ensure_model(model_dir: Path) -> None:
    if (model_dir / "config.json").is_file():
        return
    from ..model.make_model import make_model
    log.info("model %s missing: writing the tiny model there", model_dir)
    make_model("tiny", model_dir)


def _hf_version() -> str:
    import transformers
    return transformers.__version__
