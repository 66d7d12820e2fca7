"""`vla-edge verify --model DIR`: check a backend against HuggingFace transformers on the same inputs.

For each of three fixed prompts:
  - one prefill (all logits + hidden states) vs an HF forward: logits cosine,
    max |diff| of the hidden states per layer;
  - the prompt as two prefill chunks vs one prefill (chunked prefill must equal it);
  - 32 greedy tokens, ours decoded through the backend's own KV cache (prefill
    once, then 1-token forward calls), HF's through its own cache;
  - teacher forcing: HF's greedy continuation fed to both, argmax compared at
    every position (and the logits cosine of those decode steps).
The backend is built by factory.create_backend_from_weights, so any backend
with the Backend interface (numpy, PyCUDA) is checked the same way.
--kv-dtype bfloat16 checks a backend whose KV arena holds bf16 values; HF's
attention then reads its K/V rounded to bf16 as well (hf_oracle), so, as with
bf16 weights, only arithmetic precision differs.
An INT4 snapshot (its config.json says so: ours or compressed-tensors W4A16)
is loaded as model.weights: int4 and HF runs its dequantized values (written
to a temporary float32 snapshot), judged at the bf16 thresholds.
--against-unquantized DIR adds the quantized model's quality against the
original (quantized_quality.py): top-1 agreement and perplexities, no threshold.
"""
from __future__ import annotations

import json
import logging
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..config import KV_DTYPES

logger = logging.getLogger(__name__)

PROMPTS = (
    "You control a robot arm. Answer each camera frame with one action. Arm: 7 joints and a parallel gripper.",
    "Task: pick up the red block and place it in the blue bowl. Action:",
    "The camera is mounted above the workspace and looks down at the table",
)
NEW_TOKENS = 32


@dataclass(frozen=True)
class Thresholds:
    min_cosine: float              # logits cosine, min over prompts and positions
    greedy_must_match: bool        # all greedy tokens identical to HF's
    min_top1: float | None         # teacher-forced argmax agreement; None = printed, not required


# Pass criteria per backend dtype. bf16: the backend holds bf16-rounded weights and
# HF runs in fp32 on the same rounded weights, so only arithmetic precision differs.
# fp32: issue 2 asks >= 0.9999 and the GPU issue >= 0.99999; the stricter bound serves both backends.
# A bf16 KV arena is held to the bf16 criteria even with fp32 weights: an fp32-level difference that moves
# a K or V value across a bf16 rounding boundary changes it by a bf16 step (measured on tiny: logits 5e-4).
THRESHOLDS = {
    "float32": Thresholds(min_cosine=0.99999, greedy_must_match=True, min_top1=None),
    "bfloat16": Thresholds(min_cosine=0.999, greedy_must_match=False, min_top1=0.99),
}


@dataclass
class PromptResult:
    text: str
    num_tokens: int
    prefill_cosine_min: float       # ours one prefill vs HF, over prompt positions
    decode_cosine_min: float        # ours 1-token steps (teacher-forced) vs HF, over new positions
    chunked_cosine_min: float       # ours two chunks vs ours one prefill
    chunked_max_abs: float
    greedy_ours: list
    greedy_hf: list
    greedy_matching_prefix: int     # tokens identical before the first divergence
    top1_agree: int                 # teacher-forced positions where argmax agrees
    top1_total: int
    hidden_max_abs: list = field(default_factory=list)   # per hidden-state entry, max |ours - HF|
    hidden_max_ref: list = field(default_factory=list)   # per entry, max |HF| (scale)
    greedy_text: str = ""                                 # our greedy continuation, decoded


def add_arguments(parser) -> None:
    parser.add_argument("--model", required=True, help="model snapshot directory (what our backend loads)")
    parser.add_argument("--backend", choices=("auto", "numpy", "pycuda"), default="auto", help="backend to check")
    parser.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32",
                        help="backend precision; bf16: HF runs fp32 on the same bf16-rounded weights")
    parser.add_argument("--kv-dtype", choices=KV_DTYPES, default="float32",
                        help="element type of the backend's KV arena (kv.dtype); bfloat16: HF's attention reads "
                             "its K/V rounded to bf16 too")
    parser.add_argument("--json", default=None, help="also write the full report as JSON to this path")
    parser.add_argument("--reference", default=None,
                        help="snapshot HF loads (default: --model); e.g. an original to check a converted copy against")
    parser.add_argument("--bulk-prefill-min-rows", type=int, default=0,
                        help="pycuda: forwards of at least this many rows through the bulk prefill "
                             "(model.bulk_prefill_min_rows; 1: every forward, decode steps too)")
    parser.add_argument("--kernel-variants", nargs="+", metavar="NAME", default=None,
                        help="pycuda: check the kernel lab's variants over the serving plan (bench/kernel_lab.py "
                             "KERNEL_VARIANTS, e.g. i4p1, fah, fat64), a choice's numerics before it serves")
    parser.add_argument("--hf-device", default="cpu", help="torch device for the HF oracle (cpu, cuda)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads for the HF oracle (default: torch's choice; 1 on a shared machine)")
    parser.add_argument("--against-unquantized", default=None, metavar="DIR",
                        help="--model is INT4: also print its teacher-forced top-1 agreement and perplexity on a text "
                             "against this unquantized snapshot (figures, no threshold)")


def run(args) -> int:
    from ..model.spec import ModelFormatError
    from ..model.weights import canonical_dtype

    dtype = canonical_dtype(args.dtype)
    try:
        report = verify(args.model, args.backend, dtype, reference_dir=args.reference, hf_device=args.hf_device,
                        torch_threads=args.threads, kv_dtype=args.kv_dtype,
                        bulk_prefill_min_rows=args.bulk_prefill_min_rows, kernel_variants=args.kernel_variants)
    except (ModelFormatError, ValueError, OSError) as exc:
        print(f"vla-edge verify: {exc}", file=sys.stderr)
        return 2
    if args.against_unquantized:
        from .quantized_quality import compare, format_quality
        try:
            report["quality"] = compare(args.model, args.against_unquantized)
        except (ModelFormatError, ValueError, OSError) as exc:
            print(f"vla-edge verify: {exc}", file=sys.stderr)
            return 2
    print(format_report(report))
    if "quality" in report:
        print("\nINT4 quality against the unquantized model:\n" + format_quality(report["quality"]))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0 if report["passed"] else 1


def verify(model_dir, backend_kind: str, dtype: str, reference_dir=None, hf_device: str = "cpu",
           new_tokens: int = NEW_TOKENS, torch_threads: int | None = None, kv_dtype: str = "float32",
           bulk_prefill_min_rows: int = 0, kernel_variants=None) -> dict:
    """Run the comparison and return the report (a JSON-able dict; `passed` is the verdict). kernel_variants: names
    of bench/kernel_lab.KERNEL_VARIANTS the pycuda backend runs over its serving plan (ValueError elsewhere)."""
    variant_fields = _kernel_variant_fields(backend_kind, kernel_variants)
    import torch

    previous_threads = torch.get_num_threads()
    if torch_threads:
        # torch's idle worker threads spin; on a shared CPU they starve the numpy backend.
        torch.set_num_threads(torch_threads)
    try:
        report = _verify(model_dir, backend_kind, dtype, reference_dir, hf_device, new_tokens, kv_dtype,
                         bulk_prefill_min_rows, variant_fields)
    finally:
        torch.set_num_threads(previous_threads)
    report["kernel_variants"] = list(kernel_variants or ())
    return report


def _kernel_variant_fields(backend_kind: str, names) -> dict:
    """The KernelPlan fields of the lab variants `names`, checked before anything loads: pycuda only."""
    if not names:
        return {}
    from ..bench.kernel_lab import variant_fields
    from ..model.factory import resolve_kind

    fields = variant_fields(names, "--kernel-variants")   # the CLI prefixes "vla-edge verify: "
    if resolve_kind(backend_kind) != "pycuda":
        raise ValueError(f"--kernel-variants {' '.join(names)} choose CUDA kernels; they need --backend pycuda")
    return fields


def format_report(report: dict) -> str:
    spec = report["spec"]
    lines = [f"model {report['model']}: {spec['model_type']}, {spec['num_layers']} layers, "
             f"hidden {spec['hidden_size']}, heads {spec['num_heads']}/{spec['num_kv_heads']}, vocab {spec['vocab_size']}",
             f"backend {report['backend']} ({report['dtype']}"
             + (", INT4 weights dequantized" if report.get("weights") == "int4" else "")
             + f", KV {report['kv_dtype']}"
             + (f", bulk prefill from {report['bulk_prefill_min_rows']} rows" if report.get("bulk_prefill_min_rows") else "")
             + "".join(f", +{v}" for v in report.get("kernel_variants") or ())
             + (f", not in effect for this model: {', '.join(report['kernel_fields_not_in_effect'])}"
                if report.get("kernel_fields_not_in_effect") else "")
             + f")  vs  {report['oracle']}"
             + (f" on {report['reference']}" if report["reference"] != report["model"] else ""), ""]
    # 1 - cosine rather than the cosine itself: an fp32 match reads 1.00000000 at any useful precision.
    lines.append(f"{'prompt':>6} {'tokens':>6} {'1-cos prefill':>13} {'1-cos decode':>13} {'1-cos chunked':>13} "
                 f"{'chunked |d|':>11} {'greedy':>7} {'top-1 (TF)':>10}")
    for i, p in enumerate(report["prompts"]):
        lines.append(f"{i:>6} {p['num_tokens']:>6} {1 - p['prefill_cosine_min']:>13.2e} "
                     f"{1 - p['decode_cosine_min']:>13.2e} {1 - p['chunked_cosine_min']:>13.2e} "
                     f"{p['chunked_max_abs']:>11.2e} {p['greedy_matching_prefix']:>3}/{len(p['greedy_hf']):<3} "
                     f"{p['top1_agree']:>4}/{p['top1_total']:<5}")
    lines += ["", "hidden states, max |ours - HF| over prompts and positions:",
              f"{'layer':>8} {'max |diff|':>11} {'max |HF|':>10}"]
    diffs = [max(vals) for vals in zip(*(p["hidden_max_abs"] for p in report["prompts"]))]
    refs = [max(vals) for vals in zip(*(p["hidden_max_ref"] for p in report["prompts"]))]
    for layer, (d, r) in enumerate(zip(diffs, refs)):
        name = "embed" if layer == 0 else ("final" if layer == len(diffs) - 1 else str(layer))
        lines.append(f"{name:>8} {d:>11.3e} {r:>10.3e}")
    lines += ["", "our greedy continuations:"]
    lines += [f"{i:>6}: {p['greedy_text']!r}" for i, p in enumerate(report["prompts"])]
    lines += ["", f"{'check':<34} {'value':>14} {'required':>14}  result"]
    for c in report["checks"]:
        verdict = {True: "PASS", False: "FAIL", None: "info"}[c["passed"]]
        lines.append(f"{c['name']:<34} {c['value']:>14} {c['required']:>14}  {verdict}")
    lines += ["", "verify: " + ("PASSED" if report["passed"] else "FAILED")]
    return "\n".join(lines)


# ----------------------------------------------------------------------------
# Internal helpers


def _verify(model_dir, backend_kind, dtype, reference_dir, hf_device, new_tokens, kv_dtype,
            bulk_prefill_min_rows=0, variant_fields=None) -> dict:
    import tempfile

    from ..model.int4_snapshot import projection_names, weight_format, write_dequantized_snapshot
    from ..model.spec import ModelSpec

    if weight_format(model_dir) == "int4" and reference_dir is None:
        # HF cannot run our INT4 layout: it runs the very values our backend computes with, in float32. With
        # --dtype bf16 the backends round every other tensor to bf16 but compute with w_hat = q * scale exactly
        # (weights.rounded_to_bf16, the CUDA INT4 kernels), so HF keeps the dequantized projections unrounded.
        exact = frozenset(projection_names(ModelSpec.from_dir(model_dir)))
        with tempfile.TemporaryDirectory(prefix="vla-edge-dequantized-") as tmp:
            oracle_dir = write_dequantized_snapshot(model_dir, Path(tmp) / "dequantized")
            report = _verify_against(model_dir, backend_kind, dtype, oracle_dir, hf_device, new_tokens, kv_dtype,
                                     bulk_prefill_min_rows, variant_fields, keep_exact=exact)
        report["reference"] = f"{model_dir} (dequantized)"
        return report
    return _verify_against(model_dir, backend_kind, dtype, reference_dir, hf_device, new_tokens, kv_dtype,
                           bulk_prefill_min_rows, variant_fields)


def _verify_against(model_dir, backend_kind, dtype, reference_dir, hf_device, new_tokens, kv_dtype,
                    bulk_prefill_min_rows, variant_fields=None, keep_exact=frozenset()) -> dict:
    import transformers

    from ..model import hf_oracle
    from ..model.factory import create_backend_from_weights, load_model_weights, resolve_kind
    from ..model.int4_snapshot import weight_format
    from ..model.spec import ModelSpec
    from ..model.weights import load_tokenizer

    spec = ModelSpec.from_dir(model_dir)
    weights_format = weight_format(model_dir)
    tokenizer = load_tokenizer(model_dir)
    prompts = [tokenizer.encode(text).ids for text in PROMPTS]
    for text, ids in zip(PROMPTS, prompts):
        if len(ids) < 2 or max(ids) >= spec.vocab_size:
            raise ValueError(f"prompt {text!r} tokenizes to {len(ids)} ids (max {max(ids, default=-1)}), "
                             f"need >= 2 ids below vocab_size {spec.vocab_size}")
    capacity = max(len(ids) for ids in prompts) + new_tokens + 1
    kind = resolve_kind(backend_kind)
    options = {"bulk_prefill_min_rows": bulk_prefill_min_rows} if bulk_prefill_min_rows else None
    # pycuda uploads an INT4 snapshot from its directory, as stored (its kernels compute w_hat = q * scale); the
    # dequantized float32 copy would be uploaded as float weights, bf16-rounded, and check other kernels.
    weights = (model_dir if kind == "pycuda" and weights_format == "int4"
               else load_model_weights(model_dir, spec, weights_format))
    backend = create_backend_from_weights(kind, spec, weights, capacity, dtype, kv_dtype=kv_dtype, kernel_options=options)
    not_in_effect = []
    if variant_fields:              # the lab's choices over the serving plan (a choice this model cannot run falls back)
        import dataclasses
        plan = backend.use_kernel_plan(dataclasses.replace(backend.kernel_plan, **variant_fields))
        not_in_effect = sorted(k for k, v in variant_fields.items() if getattr(plan, k) != v)
    oracle = hf_oracle.load_hf_model(reference_dir or model_dir, round_to_bf16=(dtype == "bfloat16"), device=hf_device,
                                     round_kv_to_bf16=(kv_dtype == "bfloat16"), keep_exact=keep_exact)

    results = [_check_prompt(backend, oracle, text, ids, new_tokens) for text, ids in zip(PROMPTS, prompts)]
    for r in results:
        r.greedy_text = tokenizer.decode(r.greedy_ours)
    # INT4 is held to today's bf16 criteria (issue 23), although HF runs exactly the dequantized values.
    thresholds = THRESHOLDS["bfloat16" if "bfloat16" in (dtype, kv_dtype) or weights_format == "int4" else "float32"]
    checks = _checks(results, thresholds)
    return {
        "model": str(model_dir), "reference": str(reference_dir or model_dir), "backend": kind, "dtype": dtype,
        "kv_dtype": kv_dtype, "bulk_prefill_min_rows": bulk_prefill_min_rows, "weights": weights_format,
        "kernel_fields_not_in_effect": not_in_effect,
        "spec": spec.as_dict(), "oracle": f"transformers {transformers.__version__} {type(oracle).__name__} fp32 eager"
        + (" on bf16-rounded weights" if dtype == "bfloat16" else "")
        + (" (the INT4 projections unrounded)" if dtype == "bfloat16" and keep_exact else "")
        + (", K/V rounded to bf16" if kv_dtype == "bfloat16" else ""),
        "new_tokens": new_tokens, "thresholds": asdict(thresholds),
        "prompts": [asdict(r) for r in results], "checks": checks,
        "passed": all(c["passed"] is not False for c in checks),
    }


def _check_prompt(backend, oracle, text: str, ids: list, new_tokens: int) -> PromptResult:
    import numpy as np

    from ..model import hf_oracle

    n = len(ids)
    prompt = np.asarray(ids, dtype=np.int64)                             # [N]
    empty = np.zeros(0, dtype=np.int64)

    # Two chunks, then one prefill over the same slots (slots are simply overwritten).
    k = n // 2
    first = backend.forward(backend.embed(prompt[:k]), np.arange(k), np.arange(k), empty, logits="all")
    second = backend.forward(backend.embed(prompt[k:]), np.arange(k, n), np.arange(k, n), np.arange(k), logits="all")
    chunked = np.concatenate([first.logits, second.logits])              # [N, vocab]
    single = backend.forward(backend.embed(prompt), np.arange(n), np.arange(n), empty, logits="all",
                             return_hidden=True)

    # Greedy through our KV cache: prefill once, then one token per forward call.
    ours = [int(np.argmax(single.logits[-1]))]
    while len(ours) < new_tokens:
        pos = n + len(ours) - 1
        step = backend.forward(backend.embed(np.asarray(ours[-1:])), np.array([pos]), np.array([pos]),
                               np.arange(pos), logits="last")
        ours.append(int(np.argmax(step.logits[-1])))
    hf_new = hf_oracle.hf_greedy(oracle, prompt, new_tokens)

    # Teacher forcing on HF's continuation: both see exactly the same sequence.
    sequence = np.concatenate([prompt, np.asarray(hf_new, dtype=np.int64)])   # [N + new]
    reference = hf_oracle.hf_forward(oracle, sequence)
    decode_rows = []
    for j, token in enumerate(hf_new[:-1]):
        pos = n + j
        step = backend.forward(backend.embed(np.asarray([token])), np.array([pos]), np.array([pos]),
                               np.arange(pos), logits="last")
        decode_rows.append(step.logits[-1])
    vocab = single.logits.shape[1]
    decode = np.stack(decode_rows) if decode_rows else np.zeros((0, vocab), np.float32)  # [new - 1, vocab]
    ours_all = np.concatenate([single.logits, decode])                   # [N + new - 1, vocab]
    ref_all = reference.logits[:n + new_tokens - 1]                      # same positions

    matching = next((i for i, (a, b) in enumerate(zip(ours, hf_new)) if a != b), len(hf_new))
    if len(single.hidden_states) != len(reference.hidden_states):
        raise ValueError(f"backend returned {len(single.hidden_states)} hidden states, HF "
                         f"{len(reference.hidden_states)}")
    hidden_diff = [float(np.abs(o - r[:n]).max()) for o, r in zip(single.hidden_states, reference.hidden_states)]
    return PromptResult(
        text=text, num_tokens=n,
        prefill_cosine_min=_min_row_cosine(single.logits, ref_all[:n]),
        decode_cosine_min=_min_row_cosine(decode, ref_all[n:]) if len(decode) else 1.0,
        chunked_cosine_min=_min_row_cosine(chunked, single.logits),
        chunked_max_abs=float(np.abs(chunked - single.logits).max()),
        greedy_ours=ours, greedy_hf=list(hf_new), greedy_matching_prefix=matching,
        top1_agree=int(np.count_nonzero(ours_all.argmax(axis=1) == ref_all.argmax(axis=1))),
        top1_total=int(ours_all.shape[0]),
        hidden_max_abs=hidden_diff,
        hidden_max_ref=[float(np.abs(r[:n]).max()) for r in reference.hidden_states],
    )


def _min_row_cosine(a, b) -> float:
    import numpy as np

    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    denom = np.linalg.norm(a64, axis=1) * np.linalg.norm(b64, axis=1)
    return float(np.min(np.sum(a64 * b64, axis=1) / np.maximum(denom, 1e-300)))


def _checks(results: list, t: Thresholds) -> list[dict]:
    cos = min(min(r.prefill_cosine_min, r.decode_cosine_min) for r in results)
    chunked = min(r.chunked_cosine_min for r in results)
    greedy_ok = sum(r.greedy_matching_prefix for r in results)
    greedy_total = sum(len(r.greedy_hf) for r in results)
    top1 = sum(r.top1_agree for r in results) / sum(r.top1_total for r in results)
    return [
        {"name": "logits cosine (min)", "value": f"{cos:.10f}", "required": f">= {t.min_cosine}",
         "passed": cos >= t.min_cosine},
        {"name": "chunked prefill cosine vs one", "value": f"{chunked:.10f}", "required": f">= {t.min_cosine}",
         "passed": chunked >= t.min_cosine},
        {"name": "greedy tokens identical", "value": f"{greedy_ok}/{greedy_total}",
         "required": "all" if t.greedy_must_match else "-",
         "passed": (greedy_ok == greedy_total) if t.greedy_must_match else None},
        {"name": "teacher-forced top-1 agreement", "value": f"{100 * top1:.2f}%",
         "required": f">= {100 * t.min_top1:.0f}%" if t.min_top1 is not None else "-",
         "passed": (top1 >= t.min_top1) if t.min_top1 is not None else None},
    ]
