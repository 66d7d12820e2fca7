"""One control cycle of the PyCUDA backend vs HuggingFace bf16 (eager, and static cache + torch.compile), same weights.

    python -m vla_edge_ros.bench.pycuda_cycle --json out/pycuda_cycle.json
    vla-edge bench --backend pycuda --shape qwen2.5-1.5b
    vla-edge bench --backend pycuda --shape llama-2-7b --weights float int4

A cycle = a 32-row prefill (frame tokens) over `cached` tokens already in the
KV cache, then 8 single-token decode steps, every argmax restricted to the 256
action bins (9 tokens chosen). Measured in one run, on one GPU:

  * ours: `CudaBackend.run_cycle_tokens` end to end on the host clock (upload,
    captured prefill graph, 8 decode-graph replays, token download); prefill
    and decode separately with CUDA events; once per decode launch mode (plain:
    ordinary launches, the backend's default; pdl: programmatic dependent
    launch; persistent: every layer of a step in one persistent kernel,
    KernelPlan.persistent_decode, optionally persistent:<blocks per SM>:<L2 MiB>;
    the plans are built by bench/kernel_lab.py);
  * HF transformers eager bf16 (same weights, same prefill embeddings, its own
    DynamicCache cropped back to `cached` after every cycle), timed the same way;
  * HF transformers bf16 the fast way: SDPA attention, a StaticCache of
    `cached` + 32 + 8 slots, the forward under torch.compile (mode
    "reduce-overhead": inductor kernels replayed as CUDA graphs, one graph for
    the 32-row prefill and one for the 1-row decode step, the argmax over the
    bins inside the graph). The context is written once per cached length,
    uncompiled; every cycle then rewrites the same slots [cached, cached + 40)
    by rewinding the cache's write counter, so no cycle recompiles or grows
    the cache. Compilation is timed apart (untimed warm-up cycles, logged); a
    compile failure is recorded as that column's error, not raised;
  * the weight-streaming floor: bytes a decode step must read (layer weights +
    the 256 head rows; and all weights incl. the full head, HF's case) over the
    device-to-device copy bandwidth measured here (bytes read + written / time);
  * `--weights float int4`: ours once per weight format, every column on the
    same function (the random model quantized to INT4; bench/cycle_weights.py),
    each format with its own decode floor.

Shapes: make_model's synthetic ones (tiny, qwen2.5-1.5b, llama-2-7b), drawn at
random by HF on the GPU.
"""
from __future__ import annotations

import argparse
import gc
import logging
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from . import cycle_report, cycle_weights, kernel_lab
from .common import machine_info, percentiles, write_json
from .kernel_lab import KERNEL_VARIANTS, LAUNCH_MODES
from ..model.cuda_kernel_plan import MEASURED_BEST

log = logging.getLogger(__name__)

# Bench shape -> make_model's synthetic shape of the same numbers (model/make_model.SYNTHETIC_SHAPES: written once).
SHAPES = {"tiny": "tiny", "llama-tiny": "llama-tiny", "qwen2.5-1.5b": "qwen2.5-1.5b-random",
          "llama-2-7b": "llama-2-7b-random"}
HF_CONFIG_CLASSES = {"qwen2": "Qwen2Config", "llama": "LlamaConfig"}
DEFAULT_CACHED = (256, 2048, 4064)
PREFILL_ROWS = 32
DECODE_STEPS = 8
BINS = 256
COPY_BYTES = 1 << 31            # 2 GiB per buffer: far beyond the 60 MB L2


def add_arguments(p) -> None:
    p.add_argument("--shape", default="qwen2.5-1.5b", choices=sorted(SHAPES))
    p.add_argument("--cycles", type=int, default=50, help="timed cycles per cached length (ours)")
    p.add_argument("--hf-cycles", type=int, default=10, help="timed cycles per cached length (HF eager)")
    p.add_argument("--hf-compiled-cycles", type=int, default=10,
                   help="timed cycles per cached length (HF static cache + torch.compile)")
    p.add_argument("--no-hf-compiled", action="store_true",
                   help="skip the HF static cache + torch.compile baseline (its compilation takes minutes)")
    p.add_argument("--cached", type=int, nargs="+", help=f"cached lengths (default {DEFAULT_CACHED})")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--weights", nargs="+", default=["float"], type=cycle_weights.weight_format,
                   help="weight formats of ours, timed side by side: float (bf16) and/or int4 (the random model "
                        "quantized; with int4 every column, HF's too, runs the dequantized weights). Default: float")
    p.add_argument("--launch-modes", nargs="+", default=None, type=launch_mode,
                   help="decode launch modes to time side by side: plain (the backend's default), pdl "
                        "(programmatic dependent launch), persistent[:<blocks per SM>[:<L2 prefetch MiB>]] (one "
                        "persistent kernel per step), each optionally with a prefill attention variant "
                        "+tiled|+mma|+mma2 and +ma|+noma (its softmax's unseen slots masked in the arguments, off by "
                        "default) or +hs|+nohs (two warps per tile, each keeping half of the head's sums, off by "
                        "default), a decode attention variant +h1|+h2 (warps per slot group) or +mmadec "
                        "(on the tensor cores), a decode projection grid +noloop|+loop2|+loop4 (blocks per SM "
                        "looping over items), +int4staged|+int4unstaged|+i4p1 (INT4 weights: prefill projections "
                        "through projection_int4_staged.cu, the default, projection_int4.cu, or the staged kernel "
                        "on one activation part), +i4pf (its activation prefetch), +i4plean|+noi4plean (the lean "
                        "entries of the INT4 projections of many rows, off by default), +i4ipb2|+i4ipb4|+i4ipb8 "
                        "(INT4 weights: every decode projection looped, ~2/4/8 items per block) with optionally +i4x2 (two items in flight "
                        "per warp), +i4lean|+noi4lean (INT4 weights: the decode projections' lean entries, off by "
                        "default), +g1|+nog1 (a model without grouped queries: the decode attention's one-head "
                        "entry, on by default, or off), +dpf|+nodpf (the decode attention's next pass loaded "
                        "while one is computed, on by default: with g1, or +h1 for a model with grouped queries; or "
                        "off), +xg|+noxg (the decode attention's entries for exactly the model's group, off by "
                        "default), "
                        "the long-context attention's blocks per SM +lcs1|+lcs2|+lcs4 (the splits "
                        "per KV head: that many x SMs / KV heads, at least 16) and +lcm1|+lcm32|+lcm64 (no floor, or 32 or 64), the bulk "
                        "prefill's flash attention +nofah|+fah|+fat64 (the copies before, hoisted copies, with 64-entry tiles) and its "
                        "operands +bp1|+bp2 (one bf16 part, as model.bulk_prefill_precision bf16, or two; the cycle never "
                        "runs the bulk prefill: for bench csr and verify --kernel-variants), and a KV "
                        "arena type +kv32|+kv16 (a backend of its own: float32 or bf16 K/V), e.g. "
                        "plain+tiled for the kernel before attention_mma.cu; the first is "
                        "the one the summary reports (default: the three launch modes with the configured kernels)")


# Kernel variants a launch mode may add with '+' (launch_mode): kernel_lab.KERNEL_VARIANTS. Unnamed, each is the
# measured-best plan's choice (model/cuda_kernel_plan.py).
# The KV arena's element type ('+kv32' / '+kv16'): fixed when a backend is built, so each type named gets a
# backend of its own (same weights, its own context fill); unnamed, the robot preset's (robot_config).
KV_VARIANTS = {"kv32": "float32", "kv16": "bfloat16"}


def launch_mode(text: str) -> str:
    """argparse type of a decode launch mode with optional kernel variants:
    plain | pdl | persistent[:blocks[:MiB]], then at most one of +tiled +mma +mma2, one of +h1 +h2, one of
    +noloop +loop2 +loop4, +mmadec, one of +int4staged +int4unstaged +i4p1, one of +i4ipb2 +i4ipb4 +i4ipb8, +i4x2
    (with an +i4ipbN)
    (KERNEL_VARIANTS: variants that set the same switch exclude each other) and one of +kv32 +kv16 (KV_VARIANTS)."""
    mode, *variants = text.split("+")
    kind, *opts = mode.split(":")
    try:
        ok = kind in LAUNCH_MODES and len(opts) <= (2 if kind == "persistent" else 0) and \
            all(float(o) >= 0 for o in opts) and (not opts or int(opts[0]) in (1, 2))
    except ValueError:
        ok = False
    ok = ok and all(v in KERNEL_VARIANTS or v in KV_VARIANTS for v in variants)
    ok = ok and sum(v in KV_VARIANTS for v in variants) <= 1
    switches = [k for v in variants if v in KERNEL_VARIANTS for k in KERNEL_VARIANTS[v]]
    ok = ok and len(switches) == len(set(switches))
    try:                                        # a plan KernelPlan refuses (+i4x2 without an +i4ipbN)
        ok = ok and kernel_lab.mode_plan(text) is not None
    except ValueError:
        ok = False
    if not ok:
        raise argparse.ArgumentTypeError(f"launch mode {text!r}: plain, pdl or persistent[:1|2[:MiB]], then at most one "
                                         f"of +tiled +mma +mma2, one of +h1 +h2, one of +noloop +loop2 +loop4, "
                                         f"+mmadec, one of +int4staged +int4unstaged +i4p1, one of +i4ipb2 +i4ipb4 "
                                         f"+i4ipb8, +i4x2 (with an "
                                         f"+i4ipbN) and one of +kv32 +kv16")
    return text


def apply_launch_mode(backend, mode: str, base=MEASURED_BEST) -> str:
    """Switch `backend` to decode launch mode `mode` (launch_mode's syntax) and its kernel variants over `base` (the
    plan the backend was built with); returns the mode in effect (plain where the device cannot do the one asked
    for, the kernel variants in effect, and the KV arena type when it is the backend's)."""
    in_effect = kernel_lab.apply_launch_mode(backend, mode, base)
    return in_effect + "".join(f"+{v}" for v in mode.split("+")[1:] if KV_VARIANTS.get(v) == backend.kv_dtype)


# The preset a robot runs each shape with (config/*.yaml over the defaults), whose KV arena type, kernel options and
# INT4 group size the bench takes; shapes not named: config/gpu_demo.yaml.
ROBOT_PRESETS = {"llama-2-7b": "gpu_7b_int4.yaml"}
DEFAULT_ROBOT_PRESET = "gpu_demo.yaml"


def robot_config(shape: str = "qwen2.5-1.5b"):
    """The preset of `shape` over the defaults (ROBOT_PRESETS): the setup a robot with a GPU runs, which the bench
    times."""
    from ..config import load
    from ..resources import config_dir
    return load(config_dir() / robot_preset(shape))


def robot_preset(shape: str) -> str:
    return ROBOT_PRESETS.get(shape, DEFAULT_ROBOT_PRESET)


def shape_of(spec) -> str:
    """The bench shape a model snapshot has (SHAPES, matched on its dimensions), so a tool given a model directory
    runs the preset that shape runs with; "qwen2.5-1.5b" (config/gpu_demo.yaml's) when none matches."""
    from ..model.make_model import SYNTHETIC_SHAPES
    dims = ("model_type", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size")
    for shape, kind in SHAPES.items():
        synthetic = SYNTHETIC_SHAPES[kind]
        if all(getattr(spec, d) == getattr(synthetic, d) for d in dims):
            return shape
    return "qwen2.5-1.5b"


def mode_kv_dtype(mode: str, default: str) -> str:
    """The KV arena type a launch mode asks for (its +kv32 / +kv16), else `default`."""
    return next((KV_VARIANTS[v] for v in mode.split("+")[1:] if v in KV_VARIANTS), default)


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
    hf_compiled_cycles = 0 if getattr(args, "no_hf_compiled", False) else int(
        getattr(args, "hf_compiled_cycles", None) or 10)
    seed = int(getattr(args, "seed", 0) or 0)
    modes = list(getattr(args, "launch_modes", None) or LAUNCH_MODES)
    formats = cycle_weights.check_formats(getattr(args, "weights", None) or ["float"])
    result = bench(shape, cached, cycles, hf_cycles, seed, modes, hf_compiled_cycles, formats)
    cycle_report.print_report(result)
    write_json(getattr(args, "json", None), result)
    return 0


def bench(shape: str, cached: list, cycles: int, hf_cycles: int, seed: int, modes: list,
          hf_compiled_cycles: int = 10, formats=("float",)) -> dict:
    """modes: decode launch modes (launch_mode's syntax); hf_compiled_cycles = 0 skips the compiled HF baseline
    (its columns are then None); formats: ours' weight formats (cycle_weights), the first is the summary's."""
    import torch

    from ..model.spec import ModelSpec

    formats = cycle_weights.check_formats(formats)
    torch.manual_seed(seed)
    hf, cfg = _hf_model(shape)
    spec = ModelSpec.from_hf_config(cfg)
    capacity = max(cached) + PREFILL_ROWS + DECODE_STEPS
    # One backend per weight format and KV arena type the modes name, each as a robot runs it.
    robot = robot_config(shape)
    kv_types = list(dict.fromkeys(mode_kv_dtype(m, robot.kv.dtype) for m in modes))
    with tempfile.TemporaryDirectory(prefix="vla_edge_int4_bench_") as tmp:
        backends = cycle_weights.our_backends(hf, cfg, spec, formats, kv_types, capacity, robot, Path(tmp))
    gc.collect()                                    # the host weights, before HF's twin and caches need room
    torch.cuda.empty_cache()
    # The compiled baseline needs SDPA attention; the eager column keeps its eager attention, so it gets a second
    # model holding a copy of the same weights (made once: 3 GB more at 1.5B, 13.5 GB at 7B).
    hf_sdpa = _hf_twin(hf, shape, "sdpa") if hf_compiled_cycles > 0 else None
    bandwidth = copy_bandwidth()
    floors = {fmt: cycle_weights.decode_floor_bytes(fmt, backends[fmt, kv_types[0]], spec,
                                                    robot.model.int4_group_size, BINS) for fmt in formats}
    rng = np.random.default_rng(seed)
    rows = []
    for n_cached in cached:
        for b in backends.values():
            _fill_context(b, spec, n_cached, rng)
        theirs = _time_hf(hf, spec, n_cached, hf_cycles, rng)
        compiled = (_time_hf_compiled_or_error(hf_sdpa, spec, n_cached, hf_compiled_cycles, rng)
                    if hf_sdpa is not None else None)
        torch.cuda.empty_cache()                    # HF's caches of this length: the next length allocates its own
        for fmt in formats:
            for mode in modes:
                mode_backend = backends[fmt, mode_kv_dtype(mode, robot.kv.dtype)]
                in_effect = apply_launch_mode(mode_backend, mode)
                ours = _time_ours(mode_backend, spec, n_cached, cycles, rng)
                # a decode step also reads every cached K/V row (and the cycle's own): weights + K/V is its floor
                kv_bytes = (2 * spec.num_layers * spec.kv_dim * np.dtype(mode_backend.kv_rows_dtype()).itemsize
                            * (n_cached + PREFILL_ROWS + DECODE_STEPS // 2))
                rows.append(cycle_report.row(n_cached, fmt, in_effect, ours, theirs, compiled,
                                             floors[fmt] / bandwidth * 1e3,
                                             (floors[fmt] + kv_bytes) / bandwidth * 1e3))
    head = {"benchmark": "pycuda_cycle", "shape": shape, "machine": _machine(),
            "cycle": f"{PREFILL_ROWS}-row prefill + {DECODE_STEPS} decode steps, argmax over {BINS} action bins",
            "kv_capacity": capacity, "robot_preset": f"config/{robot_preset(shape)}"}
    return cycle_report.result(head, formats, modes, kv_types, backends, rows, floors, bandwidth,
                               cycle_weights.hf_weight_bytes(hf), BINS)


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
    # The breakdown replays the launched pipeline's kernel groups: a persistent step has no groups to time.
    breakdown = {"prefill": _breakdown_or_error(backend, PREFILL_ROWS, 0, n_cached)}
    if not backend.kernel_plan.persistent_decode:
        # The decode row's table index is PREFILL_ROWS: the attend list holds the n_cached context entries, then
        # the cycle's rows (until 2026-12-02 this passed n_cached + PREFILL_ROWS, which timed the decode
        # attention over up to twice the context, cut at the arena's size).
        breakdown["decode"] = _breakdown_or_error(backend, 1, PREFILL_ROWS, n_cached)
    return {"cycle_ms": percentiles(cycle_ms), "prefill_ms": float(np.median(prefill_ms)),
            "decode_ms_per_token": float(np.median(decode_ms)), "cycles": len(cycle_ms), "breakdown_ms": breakdown}


def _breakdown_or_error(backend, n: int, row_offset: int, n_cached: int) -> dict:
    """_breakdown, or {"error": ...} where it cannot replay the backend's kernel groups (it enqueues them through
    the backend's internals, which an INT4 backend built elsewhere may lay out otherwise): the cycle timings stand."""
    try:
        return _breakdown(backend, n, row_offset, n_cached)
    except Exception as e:  # noqa: BLE001 - any failure of a diagnostic replay; the error is recorded and printed
        log.exception("kernel-group breakdown of %d rows failed; recording the error", n)
        return {"error": f"{type(e).__name__}: {e}"[:500]}


def _breakdown(backend, n: int, row_offset: int, n_cached: int, replays: int = 20) -> dict:
    """Graph-replay time of each kernel group of one forward over n rows (all layers), to locate the cost.
    Run after a cycle (tables in place); the replays overwrite scratch and the cycle's own slots only."""
    import pycuda.driver as drv

    from ..model.cuda_graphs import capture

    s = backend.stream
    out = {}
    start, end = drv.Event(), drv.Event()
    for name in kernel_lab.layer_groups(backend, n):
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
# HuggingFace: eager bf16, and static cache + torch.compile

# How the compiled baseline compiles: transformers' own defaults for compiled decoding (generation CompileConfig:
# inductor, "reduce-overhead" = CUDA-graph replay, no fullgraph requirement), except dynamic=False: we also compile
# the 32-row prefill, and a second input length must give a second static graph, not one dynamic-length graph.
COMPILE_OPTIONS = {"mode": "reduce-overhead", "fullgraph": False, "dynamic": False}
COMPILE_WARMUP_CYCLES = 3       # 1st: trace + compile both graphs; 2nd: CUDA-graph recording; 3rd: first replay


def hf_config(shape: str) -> dict:
    """The HF config of a bench shape as keyword arguments of its config class, with model_type (qwen2 | llama)."""
    from ..model.make_model import SYNTHETIC_SHAPES, synthetic_config

    cfg = synthetic_config(SYNTHETIC_SHAPES[SHAPES[shape]], "bfloat16", generator="bench", seed=0,
                           num_action_bins=BINS)
    for key in ("vla_edge", "dtype", "architectures"):      # a snapshot's notes, not the architecture
        cfg.pop(key)
    return cfg


def _hf_model(shape: str, device: str = "cuda", dtype: str = "bfloat16"):
    """A random HF model of `shape` (Qwen2 or Llama, eager attention) and its config as a dict."""
    import torch

    model = _hf_skeleton(shape, device, dtype, "eager")
    with torch.no_grad():                                       # HF inits biases and norms to constants: draw them
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.copy_(1.0 * (name.endswith("norm.weight") or "layernorm" in name) + 0.02 * torch.randn_like(p))
    d = model.config.to_dict()
    d["model_type"] = model.config.model_type
    d.setdefault("rope_theta", hf_config(shape)["rope_theta"])
    return model, d


def _hf_twin(model, shape: str, attn_implementation: str):
    """A second HF model with a copy of `model`'s weights and another attention implementation. A copy, not a
    switch of `model.config`: the attention choice is read from the config at every forward, so switching it
    back and forth would change the eager column (and invalidate compiled graphs) too."""
    twin = _hf_skeleton(shape, str(model.device), str(model.dtype).removeprefix("torch."), attn_implementation)
    twin.load_state_dict(model.state_dict())
    return twin


def _hf_skeleton(shape: str, device: str, dtype: str, attn_implementation: str):
    import torch
    import transformers

    kwargs = hf_config(shape)
    cfg = getattr(transformers, HF_CONFIG_CLASSES[kwargs.pop("model_type")])(**kwargs)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=getattr(torch, dtype),
                                                              attn_implementation=attn_implementation)
    return model.eval()


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
            _, t0, t1, t2 = _hf_eager_cycle(model, cache, embed(ids), lo)
            if i >= 2:
                cycle_ms.append((t2 - t0) * 1e3)
                prefill_ms.append((t1 - t0) * 1e3)
                decode_ms.append((t2 - t1) * 1e3 / DECODE_STEPS)
    return {"cycle_ms": percentiles(cycle_ms), "prefill_ms": float(np.median(prefill_ms)),
            "decode_ms_per_token": float(np.median(decode_ms)), "cycles": len(cycle_ms)}


def _hf_eager_cycle(model, cache, x, lo: int) -> tuple[list, float, float, float]:
    """One cycle on a DynamicCache holding the context: prefill the rows x [1, 32, hidden], decode 8 tokens, crop the
    cache back. Returns the 9 chosen tokens and the host clock at start, after prefill, at the end."""
    import torch

    dev = model.device
    _sync(dev)
    t0 = time.perf_counter()
    out = model(inputs_embeds=x, past_key_values=cache, use_cache=True)   # positions follow the cache
    tokens = [lo + int(out.logits[0, -1, lo:].argmax())]
    _sync(dev)
    t1 = time.perf_counter()
    for _ in range(DECODE_STEPS):
        out = model(input_ids=torch.tensor([[tokens[-1]]], device=dev), past_key_values=cache, use_cache=True)
        tokens.append(lo + int(out.logits[0, -1, lo:].argmax()))
    _sync(dev)
    t2 = time.perf_counter()
    cache.crop(-(PREFILL_ROWS + DECODE_STEPS))             # back to the cached context
    return tokens, t0, t1, t2


class HFStaticCycle:
    """The control cycle on an HF model over a StaticCache that holds `n_cached` context tokens for good.

    Every cycle writes its 40 tokens' K/V to the same slots [n_cached, n_cached + 40): transformers 5's StaticLayer
    writes where its own counter (`cumulative_length`, a device tensor at a fixed address) points and its forward
    takes no cache_position, so the positions go in explicitly as position_ids and the counter is set back to
    n_cached in place after each cycle (a StaticCache cannot be cropped). With `compile_options`, one
    torch.compile'd step serves prefill and decode; the shapes differ, so it holds two graphs.
    """

    def __init__(self, model, n_cached: int, lo: int, compile_options: dict | None = None):
        import torch
        from transformers import StaticCache

        self.model, self.n_cached, self.lo = model, n_cached, lo
        dev = model.device
        self.cache = StaticCache(config=model.config, max_cache_len=n_cached + PREFILL_ROWS + DECODE_STEPS)
        self.prefill_positions = torch.arange(n_cached, n_cached + PREFILL_ROWS, device=dev)[None]     # [1, 32]
        self.decode_positions = [torch.tensor([[n_cached + PREFILL_ROWS + j]], device=dev)
                                 for j in range(DECODE_STEPS)]                                        # [1, 1] each
        self.step = (torch.compile(self._greedy_bin_step, **compile_options) if compile_options is not None
                     else self._greedy_bin_step)

    def fill(self, ctx_ids) -> None:
        """The context [1, n_cached] into slots [0, n_cached), uncompiled. The first write also allocates the static
        K/V tensors, outside any compiled region, which is what lets them be marked as fixed addresses."""
        assert ctx_ids.shape == (1, self.n_cached), f"{tuple(ctx_ids.shape)=}"
        self.model(input_ids=ctx_ids, past_key_values=self.cache, use_cache=True, logits_to_keep=1)

    def cycle(self, x) -> tuple:
        """Prefill the rows x [1, 32, hidden], decode 8 tokens. Returns the 9 tokens (int64 [9], host) and the
        host clock at start, after prefill, at the end."""
        import torch

        dev = self.model.device
        _sync(dev)
        t0 = time.perf_counter()
        # Outputs of a CUDA-graph replay are overwritten by the next replay: keep clones of the tokens.
        token = self.step(self.prefill_positions, inputs_embeds=x).clone()
        tokens = [token]
        _sync(dev)
        t1 = time.perf_counter()
        for pos in self.decode_positions:
            token = self.step(pos, input_ids=token).clone()
            tokens.append(token)
        chosen = torch.cat(tokens, dim=1)[0].cpu()      # the one download of the cycle; waits for the last step
        t2 = time.perf_counter()
        self._rewind()
        return chosen, t0, t1, t2

    def _greedy_bin_step(self, position_ids, input_ids=None, inputs_embeds=None):
        """Forward of the new rows at position_ids [1, n], then the action-bin argmax of the last row: token [1, 1]."""
        out = self.model(input_ids=input_ids, inputs_embeds=inputs_embeds, position_ids=position_ids,
                         past_key_values=self.cache, use_cache=True, logits_to_keep=1)
        return self.lo + out.logits[:, -1, self.lo:].argmax(dim=-1, keepdim=True)

    def _rewind(self) -> None:
        from transformers.cache_utils import StaticLayer

        for layer in self.cache.layers:
            assert type(layer) is StaticLayer, f"{type(layer).__name__}: only full-attention static layers rewind"
            layer.cumulative_length.fill_(self.n_cached)    # in place: compiled graphs hold its address


def _time_hf_compiled(model, spec, n_cached: int, cycles: int, rng, compile_options: dict | None = None) -> dict:
    """Like _time_hf, on HFStaticCycle with the step compiled (COMPILE_OPTIONS unless given). The first
    COMPILE_WARMUP_CYCLES cycles are untimed; the first one's duration is reported as compile_s."""
    import torch

    options = dict(COMPILE_OPTIONS if compile_options is None else compile_options)
    dev = model.device
    lo = spec.vocab_size - BINS
    # Graphs of an earlier cached length are of no further use (other cache shape) and would count against
    # dynamo's recompile limit, after which it silently runs uncompiled: start clean.
    torch._dynamo.reset()
    run = HFStaticCycle(model, n_cached, lo, options)
    embed = model.get_input_embeddings()
    cycle_ms, prefill_ms, decode_ms = [], [], []
    with torch.no_grad():
        run.fill(torch.as_tensor(rng.integers(0, spec.vocab_size, size=(1, n_cached)), device=dev))
        for i in range(cycles + COMPILE_WARMUP_CYCLES):
            ids = torch.as_tensor(rng.integers(0, spec.vocab_size, size=(1, PREFILL_ROWS)), device=dev)
            tokens, t0, t1, t2 = run.cycle(embed(ids))
            if i == 0:
                compile_s = t2 - t0
                log.info("HF static cache + torch.compile %s, cached %d: first cycle (compilation) %.1f s",
                         options, n_cached, compile_s)
            if i >= COMPILE_WARMUP_CYCLES:
                cycle_ms.append((t2 - t0) * 1e3)
                prefill_ms.append((t1 - t0) * 1e3)
                decode_ms.append((t2 - t1) * 1e3 / DECODE_STEPS)
    assert int(tokens.min()) >= lo, tokens
    return {"cycle_ms": percentiles(cycle_ms), "prefill_ms": float(np.median(prefill_ms)),
            "decode_ms_per_token": float(np.median(decode_ms)), "cycles": len(cycle_ms),
            "compile_s": compile_s, "compile_options": {k: str(v) for k, v in options.items()}}


def _time_hf_compiled_or_error(model, spec, n_cached: int, cycles: int, rng) -> dict:
    """_time_hf_compiled, or {"error": ...} when compiling or running it fails: the baseline is optional, the rest
    of the bench still stands."""
    import torch

    try:
        return _time_hf_compiled(model, spec, n_cached, cycles, rng)
    except Exception as e:  # noqa: BLE001 - dynamo / inductor / the C compiler fail in too many ways to name
        log.exception("HF static cache + torch.compile failed at cached %d; recording the error", n_cached)
        torch._dynamo.reset()
        return {"error": f"{type(e).__name__}: {e}"[:2000]}


def _sync(device) -> None:
    """Wait for the device's queued work (the host clock then covers it); CPU work is already done."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


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


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(p)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
