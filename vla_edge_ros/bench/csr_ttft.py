"""`vla-edge bench csr`: time to first token with the CSR state against recomputing everything, ours and HF's.

The paper's Table II (reference/csr-asr-paper.md), on one backend instance, so
both sides use the same weights and the same arena: `--backend numpy` with the
configured (tiny) model, or `--backend pycuda --shape qwen2.5-1.5b` with a
random model of that shape (bf16 weights; bench/gpu_inputs.py):

    state   N tokens: the real static prefix (config prompt) + vision rows of
            real footage frames (bikes.mp4, 32 rows per frame, cut to N)
    suffix  M tokens: the real dynamic suffix (instruction + action prompt),
            tiled to M tokens so it still ends with the action prompt
    CSR     the state's KV is already cached (computed once, untimed); TTFT =
            one prefill of the M suffix rows over it -> logits of the last row
    Unord.  the paper's unordered baseline on our backend: nothing is reusable,
            so TTFT = a prefill of all N + M rows -> logits of the last row,
            `--chunk` rows per forward (0: one forward for all rows, which the
            backend splits into its own passes as the engine's synchronous
            rebuild does: the GPU default; 512 on the CPU, where the numpy
            backend's attention scores of one forward grow as rows x context)
    HF      HuggingFace transformers recomputing the same N + M rows in one
            forward (bench/hf_recompute.py: SDPA, last row's logits only, no
            cache kept): bf16 on a twin of the GPU model holding the same
            weights; float32 on the CPU. Timed at every (N, M), first, then
            freed before our sweep runs (on the GPU its activations at 32K
            take a few GB)

Both of our sides must give the same first token (and logits with cosine >=
0.9999), otherwise the comparison is void and the command says so (exit 1).
HF's logits are compared with CSR's too: on the CPU (float32 on both sides)
by the same rule, since HF is the oracle there; on the GPU (HF computes in
bf16, we keep fp32 activations) the cosine and token are reported only. The
baseline rewrites the very same values into the state's slots, so the CSR
state stays valid between repeats. Mean and std over `--repeats` repeats per
point (HF: the same count after HF_WARMUP warm-up calls).

Columns: CSR, Unord. (ours) and HF ms; Unord./CSR (the paper's ratio),
HF/CSR (issue 20's target: >= 80 at M=32, N=32K), Unord./HF (how far our bulk
recompute is from HF's), microseconds per recomputed token of both.

Our recompute is timed at the smallest M only unless `--baseline-suffix`
names more (the paper's table has a single unordered row). On the GPU it is
timed `--baseline-repeats` times (default GPU_BASELINE_REPEATS) without
warm-up (kernels are loaded by a first prefill and the layer graphs of its
passes captured by `prepare_forward` before the clock starts), and it runs
first at each N: it leaves the state's KV in slots [0, N), the cached state
the CSR timings then use (no separate fill). On the CPU the state is filled
untimed, growing from one N to the next.

GPU time of the default sweep (N up to 32K, M up to 1024) at main 3841fe0's
speeds: HF ~9 s (4 N x 4 M x 4 forwards, 354 ms each at 32K), ours ~20 s
(3 recomputes per N, 4.4 s each at 32K; less with a faster bulk prefill),
plus the model draw and the backend build (kernel compilation on a fresh
machine): 1-2 minutes in all (`scripts/gpu_session.sh` stage csr-hf):

    python -m vla_edge_ros.cli bench csr --backend pycuda --shape qwen2.5-1.5b --json out/csr.json
"""
from __future__ import annotations

import argparse
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..config import load as load_config
from ..core.cpu_threads import limit_cpu_threads
from .common import add_input_arguments, machine_info, module_main, write_json
from .csr_report import print_report, targets
from .hf_recompute import HF_ATTENTION, HfRecompute

log = logging.getLogger(__name__)

# CPU defaults sized for ~1.5 minutes on a 2-core machine (the tiny model's recompute there: ~6 s at 8K, ~22 s
# at 16K, attention-bound); the GPU sweep goes to 32K.
DEFAULT_SIZES = (1024, 4096, 8192)
DEFAULT_SUFFIXES = (1, 32, 256)
DEFAULT_REPEATS = 3
DEFAULT_CHUNK = 512                       # CPU: numpy attention scores of one forward are rows x context floats
GPU_SIZES = (1024, 4096, 16384, 32768)
GPU_SUFFIXES = (1, 32, 256, 1024)
GPU_REPEATS = 3
GPU_BASELINE_REPEATS = 3
GPU_CHUNK = 0                             # one forward: the backend picks its passes, as the engine's rebuild
SAME_LOGITS_COSINE = 0.9999


def add_arguments(p) -> None:
    p.add_argument("--sizes", type=int, nargs="+", help=f"state lengths N (default {DEFAULT_SIZES}; pycuda {GPU_SIZES})")
    p.add_argument("--suffix", type=int, nargs="+",
                   help=f"suffix lengths M (default {DEFAULT_SUFFIXES}; pycuda {GPU_SUFFIXES})")
    p.add_argument("--repeats", type=int,
                   help=f"timed repeats per (N, M) (default {DEFAULT_REPEATS}; pycuda {GPU_REPEATS})")
    p.add_argument("--baseline-repeats", type=int, help="timed repeats of our recompute baseline (default: --repeats; "
                   f"pycuda {GPU_BASELINE_REPEATS})")
    p.add_argument("--baseline-suffix", type=int, nargs="+",
                   help="suffix lengths M at which our recompute is timed (default: the smallest, the paper's "
                        "single 'Unord.' row)")
    p.add_argument("--chunk", type=int, help=f"rows per forward of our recompute, 0: one forward for all rows "
                   f"(default {DEFAULT_CHUNK}; pycuda {GPU_CHUNK})")
    p.add_argument("--backend", default="numpy", choices=["numpy", "pycuda"])
    p.add_argument("--shape", help="pycuda: random model shape (default qwen2.5-1.5b)")
    p.add_argument("--kv-dtype", choices=("float32", "bfloat16"), help="pycuda: the KV arena's element type (default: "
                   "kv.dtype of the config; HF's cache is bf16)")
    p.add_argument("--bulk-gemm", help="pycuda: the bulk prefill's GEMM (cuda_bulk_launchers.BULK_GEMMS; default: the "
                   "serving plan's)")
    p.add_argument("--bulk-parts", type=int, choices=(1, 2), help="pycuda: bf16 parts of the bulk prefill's "
                   "activations and attention factors, 2: hi + lo (the serving precision, default), 1: bf16 alone "
                   "(HF's bf16 precision)")
    p.add_argument("--bulk-kv-overlap", action=argparse.BooleanOptionalAction, help="pycuda: the bulk prefill's "
                   "flash attention with its K/V copies under its products (KernelPlan.bulk_attention_kv_overlap, "
                   "on in serving) or, --no-bulk-kv-overlap, without (prefill_bulk.cu's one-stage entries)")
    p.add_argument("--kernel-variants", nargs="+", metavar="NAME", help="pycuda: the kernel lab's variants over the "
                   "serving plan (bench/kernel_lab.KERNEL_VARIANTS, e.g. lcs2: two blocks per SM of the cycle's "
                   "long-context attention, which the CSR suffix runs)")
    add_input_arguments(p)


def main(argv=None) -> int:
    return module_main("csr_ttft", __doc__, add_arguments, run, argv)


def run(args) -> int:
    if getattr(args, "backend", None) == "pycuda":
        from ..model.cuda_device import primary_device
        with primary_device(0).bound():    # this thread drives the primary context for the whole bench
            return _run(args)
    return _run(args)


@dataclass(frozen=True)
class Plan:
    """What one run sweeps and how often (the CLI's choices with the backend's defaults filled in)."""
    gpu: bool
    sizes: tuple                  # N, ascending
    suffixes: tuple               # M
    repeats: int                  # CSR and HF timings per point
    base_repeats: int             # our recompute's timings per point
    base_suffixes: tuple          # the M at which our recompute is timed
    chunk: int                    # rows per forward of our recompute; 0: one forward

    @property
    def base_warmup(self) -> int:
        # On the GPU our recompute costs seconds at 32K: no warm-up (a first prefill loads the kernels and
        # prepare_forward captures the graphs before the clock starts).
        return 0 if self.gpu else 1

    @property
    def fill_by_baseline(self) -> bool:
        # On the GPU the first timed recompute is also what fills the cached state (no separate fill).
        return self.gpu


def make_plan(args) -> Plan:
    gpu = (getattr(args, "backend", None) or "numpy") == "pycuda"
    # `vla-edge bench csr --cached ...` (the dispatcher's flag) also names the state lengths.
    sizes = tuple(sorted(getattr(args, "sizes", None) or getattr(args, "cached", None)
                         or (GPU_SIZES if gpu else DEFAULT_SIZES)))
    suffixes = tuple(getattr(args, "suffix", None) or (GPU_SUFFIXES if gpu else DEFAULT_SUFFIXES))
    repeats = _given(args, "repeats", GPU_REPEATS if gpu else DEFAULT_REPEATS)
    base_repeats = _given(args, "baseline_repeats", GPU_BASELINE_REPEATS if gpu else repeats)
    base_suffixes = tuple(getattr(args, "baseline_suffix", None) or (min(suffixes),))
    chunk = _given(args, "chunk", GPU_CHUNK if gpu else DEFAULT_CHUNK)
    for name, values in (("sizes", sizes), ("suffix", suffixes), ("repeats", (repeats,)),
                         ("baseline-repeats", (base_repeats,))):
        if min(values) <= 0:
            raise ValueError(f"bench csr: --{name} must be > 0, got {values}")
    if chunk < 0:
        raise ValueError(f"bench csr: --chunk must be >= 0 (0: one forward), got {chunk}")
    if not set(base_suffixes) <= set(suffixes):
        raise ValueError(f"bench csr: --baseline-suffix {base_suffixes} must be among --suffix {suffixes}")
    return Plan(gpu, sizes, suffixes, repeats, base_repeats, base_suffixes, chunk)


def _given(args, name: str, default: int) -> int:
    """An integer option, None meaning the default (0 is a value: `--chunk 0`)."""
    value = getattr(args, name, None)
    return int(default if value is None else value)


def _run(args) -> int:
    from ..core.prompt import encode_text, prefix_text, suffix_ids
    from ..core.vision_encoder import VisionEncoder
    from . import gpu_inputs

    cfg = load_config(args.config) if getattr(args, "config", None) else load_config()
    limit_cpu_threads(cfg.model.cpu_threads)            # as the nodes run: one BLAS thread (core/cpu_threads.py)
    model_dir = Path(getattr(args, "model", None) or cfg.model.path)
    plan = make_plan(args)
    tokenizer = gpu_inputs.tokenizer_of(model_dir)
    prefix = encode_text(tokenizer, prefix_text(cfg.prompt))                              # [P]
    if min(plan.sizes) <= prefix.size:
        raise ValueError(f"bench csr: every state length must exceed the {prefix.size}-token prefix, got {plan.sizes}")
    capacity = max(plan.sizes) + max(plan.suffixes)
    variant_changes = _kernel_variant_changes(args)
    if not plan.gpu and (any(getattr(args, k, None) is not None for k in BULK_CHOICES) or variant_changes):
        raise ValueError("bench csr: --bulk-gemm, --bulk-parts, --bulk-kv-overlap and --kernel-variants choose CUDA "
                         "kernels; they need --backend pycuda")
    if plan.gpu:
        from ..model.cuda_backend import CudaBackend
        shape = getattr(args, "shape", None) or "qwen2.5-1.5b"
        spec, weights, twin = gpu_inputs.random_model_with_twin(shape, HF_ATTENTION)
        hf = HfRecompute(twin, f"random {shape} (the same weights as ours)")
        del twin
        kv_dtype = getattr(args, "kv_dtype", None) or cfg.kv.dtype
        backend = CudaBackend(spec, weights, capacity, "bfloat16", kv_dtype=kv_dtype)
        del weights
        kernel_plan = _bulk_plan(backend, args, variant_changes)
        precision = ("fp32 activations (bf16 hi + lo in the bulk prefill's products)"
                     if kernel_plan.bulk_activation_parts == 2 else "bf16 activations in the bulk prefill (as HF's)")
        model_name = f"random {shape} (HF init, seed 0)"
        dtype = (f"bf16 weights, {precision}, {kv_dtype} KV arena, bulk GEMM {kernel_plan.bulk_gemm}"
                 + (", flash attention with the K/V overlap" if kernel_plan.bulk_attention_kv_overlap else "")
                 + "".join(f", +{v}" for v in getattr(args, "kernel_variants", None) or ()))
    else:
        from ..model.factory import load_model
        spec, weights, _ = load_model(model_dir)
        backend = create_numpy_backend(spec, weights, capacity)
        hf = HfRecompute.from_model_dir(model_dir, cfg.model.cpu_threads)
        model_name, dtype = str(model_dir), "fp32"
    encoder = VisionEncoder(cfg.vision, spec.hidden_size)
    frames, source = gpu_inputs.footage(getattr(args, "frames", None))
    suffix_base = suffix_ids(tokenizer, cfg.prompt, cfg.prompt.instruction)              # [S]
    rows_all = _state_rows(backend, encoder, frames, prefix, max(plan.sizes))            # [max N, hidden]
    suffix_rows = {m: backend.embed(_tile_suffix(suffix_base, m)) for m in plan.suffixes}   # M -> [M, hidden]

    t0 = time.perf_counter()
    hf_points = _hf_sweep(hf, rows_all, suffix_rows, plan)
    hf_info = hf.describe()
    hf.close()
    t1 = time.perf_counter()
    if plan.gpu:     # first launches load kernel modules lazily: keep that out of the first timed point
        _prefill(backend, rows_all[:min(plan.sizes)], 0, plan.chunk, logits=True)
    results = _our_sweep(backend, rows_all, suffix_rows, plan, hf_points)
    t2 = time.perf_counter()

    machine = machine_info()
    run_info = {"model": model_name, "backend": "pycuda" if plan.gpu else "numpy", "dtype": dtype, "spec": spec,
                "capacity": capacity, "prefix_tokens": int(prefix.size), "footage": source, "hf": hf_info,
                "hf_sweep_s": t1 - t0, "our_sweep_s": t2 - t1}
    print_report(results, plan, machine, run_info)
    write_json(getattr(args, "json", None), {
        "suite": "csr", "backend": run_info["backend"], "model": model_name, "dtype": dtype, "machine": machine,
        "repeats": plan.repeats, "baseline_repeats": plan.base_repeats, "baseline_warmup": plan.base_warmup,
        "baseline_suffixes": list(plan.base_suffixes), "kv_capacity": capacity, "prefill_chunk": plan.chunk,
        "prefix_tokens": int(prefix.size), "footage": source, "hf": hf_info, "hf_sweep_s": t1 - t0,
        "our_sweep_s": t2 - t1, "sweep_s": t2 - t0, "results": results,
        "targets": targets(results, min(plan.base_suffixes)),
    })
    ok = True
    if not all(r.get("same_first_token", True) for r in results):
        log.error("CSR and our full recompute disagree: the timing comparison is not like for like")
        ok = False
    if hf_info["dtype"] == "float32" and not all(r["hf_agrees"] for r in results):
        log.error("HF's float32 recompute and CSR disagree (cosine below %s or another first token)",
                  SAME_LOGITS_COSINE)
        ok = False
    return 0 if ok else 1


# The CUDA bulk prefill's choices this bench takes (argument -> KernelPlan field); unset ones keep the serving plan's.
BULK_CHOICES = {"bulk_gemm": "bulk_gemm", "bulk_parts": "bulk_activation_parts",
                "bulk_kv_overlap": "bulk_attention_kv_overlap"}


def _kernel_variant_changes(args) -> dict:
    """The KernelPlan fields --kernel-variants sets (ValueError for a name the kernel lab does not have)."""
    from .kernel_lab import variant_fields

    return variant_fields(getattr(args, "kernel_variants", None) or (), "bench csr")


def _bulk_plan(backend, args, variant_changes: dict):
    """The CUDA backend's kernel plan with --bulk-gemm / --bulk-parts / --bulk-kv-overlap / --kernel-variants
    applied (the plan in effect is returned: a choice the device cannot run falls back, as use_kernel_plan says in
    the log)."""
    import dataclasses

    changes = dict(variant_changes)
    changes.update({field: getattr(args, arg) for arg, field in BULK_CHOICES.items()
                    if getattr(args, arg, None) is not None})
    if not changes:
        return backend.kernel_plan
    return backend.use_kernel_plan(dataclasses.replace(backend.kernel_plan, **changes))


def create_numpy_backend(spec, weights, capacity: int):
    from ..model.factory import create_backend_from_weights
    return create_backend_from_weights("numpy", spec, weights, capacity=capacity)


# ----------------------------------------------------------------------------
# The two sweeps


def _hf_sweep(hf: HfRecompute, rows_all, suffix_rows: dict, plan: Plan) -> dict:
    """(N, M) -> (HF ms per repeat, HF's last-row logits [vocab]) at every point."""
    points = {}
    for n in plan.sizes:
        for m in plan.suffixes:
            points[(n, m)] = hf.run(np.concatenate([rows_all[:n], suffix_rows[m]]), plan.repeats)
            log.info("N=%d M=%d: HF recompute %.1f ms", n, m, np.mean(points[(n, m)][0]))
    return points


def _our_sweep(backend, rows_all, suffix_rows: dict, plan: Plan, hf_points: dict) -> list[dict]:
    results = []
    filled = 0
    for n in plan.sizes:
        if not plan.fill_by_baseline:
            # The cached state (untimed), extended from the previous N: rows past `filled` were overwritten
            # by the previous baseline's suffix or never written.
            _prefill(backend, rows_all[filled:n], filled, plan.chunk, logits=False)
            backend.synchronize()
            filled = n
        state = rows_all[:n]                                                             # [N, hidden]
        for m in sorted(plan.suffixes, key=lambda m: (plan.fill_by_baseline and m not in plan.base_suffixes, m)):
            suffix = suffix_rows[m]                                                      # [M, hidden]
            with_base = m in plan.base_suffixes
            csr_ms, base_ms, base_logits = [], [], []
            if with_base:       # capture the graphs of the recompute's passes now, not inside its timing
                backend.prepare_forward(_chunk_sizes(n + m, plan.chunk))
            # The baseline writes the state's KV into slots [0, N) (the fill's values, or on the GPU the
            # fill itself), so the CSR state is valid after it, for this M and the next ones.
            for _ in range((plan.base_warmup + plan.base_repeats) if with_base else 0):
                backend.synchronize()
                t = time.perf_counter()
                base_logits.append(_prefill(backend, np.concatenate([state, suffix]), 0, plan.chunk, logits=True))
                base_ms.append((time.perf_counter() - t) * 1e3)
            for _ in range(plan.repeats + 1):                                            # +1 warm-up
                backend.synchronize()
                t = time.perf_counter()
                csr_logits = backend.forward(suffix, np.arange(n, n + m), np.arange(n, n + m, dtype=np.int32),
                                             np.arange(n, dtype=np.int32), logits="last").logits[-1]
                csr_ms.append((time.perf_counter() - t) * 1e3)
            csr_ms, base_ms = csr_ms[1:], base_ms[plan.base_warmup:]
            results.append(_point(n, m, csr_ms, csr_logits, base_ms, base_logits, *hf_points[(n, m)]))
            log.info("N=%d M=%d: csr %.2f ms%s", n, m, np.mean(csr_ms),
                     f", unordered {np.mean(base_ms):.1f} ms" if with_base else " (our recompute not timed at this M)")
    return results


def _point(n, m, csr_ms, csr_logits, base_ms, base_logits, hf_ms, hf_logits) -> dict:
    """One (N, M) of the JSON: timings, ratios and whether the sides computed the same thing."""
    csr, hf = float(np.mean(csr_ms)), float(np.mean(hf_ms))
    hf_cos = _cosine(csr_logits, hf_logits)
    hf_same = int(np.argmax(csr_logits)) == int(np.argmax(hf_logits))
    row = {"state_tokens": n, "suffix_tokens": m, "csr_ttft_ms": _stats(csr_ms),
           "hf_recompute_ms": _stats(hf_ms), "hf_us_per_token": hf * 1e3 / (n + m), "hf_vs_csr": hf / csr,
           "hf_logits_cosine": hf_cos, "hf_same_first_token": hf_same,
           "hf_agrees": bool(hf_same and hf_cos >= SAME_LOGITS_COSINE)}
    if base_ms:
        base = float(np.mean(base_ms))
        cos = [_cosine(csr_logits, b) for b in base_logits]
        same = [int(np.argmax(csr_logits)) == int(np.argmax(b)) for b in base_logits]
        row.update({"baseline_ttft_ms": _stats(base_ms), "speedup": base / csr, "ours_vs_hf": base / hf,
                    "recompute_us_per_token": base * 1e3 / (n + m), "logits_cosine_min": float(min(cos)),
                    "same_first_token": bool(all(same) and min(cos) >= SAME_LOGITS_COSINE)})
    return row


# ----------------------------------------------------------------------------
# Helpers


def _state_rows(backend, encoder, frames, prefix, n: int) -> np.ndarray:
    """[n, hidden]: prefix token embeddings, then 32 vision rows per footage frame (the clip loops)."""
    parts, have, i = [backend.embed(prefix)], prefix.size, 0
    while have < n:
        tokens = encoder.encode(frames[i % len(frames)]).tokens                        # [32, hidden]
        parts.append(tokens)
        have += tokens.shape[0]
        i += 1
    return np.concatenate(parts)[:n].astype(np.float32)


def _tile_suffix(ids: np.ndarray, m: int) -> np.ndarray:
    """[m] suffix ids ending with the real suffix (repeated in front when m is longer, its tail when shorter)."""
    reps = -(-m // ids.size)
    return np.tile(ids, reps)[-m:]


def _chunk_sizes(total: int, chunk: int) -> list[int]:
    """Rows of each forward of a recompute of `total` rows (chunk 0: one forward)."""
    step = chunk or total
    return [min(step, total - s) for s in range(0, total, step)]


def _prefill(backend, rows: np.ndarray, start: int, chunk: int, logits: bool):
    """Prefill of rows at positions/slots start.., `chunk` rows per forward (0: one forward), over slots
    [0, start); returns the last row's logits when asked."""
    out, s = None, 0
    for size in _chunk_sizes(rows.shape[0], chunk):
        e = s + size
        last = e == rows.shape[0]
        out = backend.forward(rows[s:e], np.arange(start + s, start + e), np.arange(start + s, start + e, dtype=np.int32),
                              np.arange(0, start + s, dtype=np.int32),          # everything before this chunk
                              logits="last" if (logits and last) else "none")
        s = e
    return out.logits[-1] if logits else None


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def _stats(samples) -> dict:
    a = np.asarray(samples, dtype=np.float64)
    return {"mean": float(a.mean()), "std": float(a.std()), "median": float(np.median(a)), "min": float(a.min()),
            "samples": [float(x) for x in a]}


if __name__ == "__main__":
    raise SystemExit(main())
