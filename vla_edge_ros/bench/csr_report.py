"""What `bench csr` prints: the machine, both sides' setup, the TTFT and per-token tables, Table II's layout.

The JSON (written by bench/csr_ttft.py) holds the same numbers with every sample.
"""
from __future__ import annotations

from .common import print_table

# Issue 20's target: CSR with an M=32 suffix over a 32K-token state at least 80x faster than HF's recompute.
TARGET_STATE, TARGET_SUFFIX, TARGET_HF_RATIO = 32768, 32, 80.0


def print_report(results: list[dict], plan, machine: dict, run: dict) -> None:
    spec, hf = run["spec"], run["hf"]
    print(f"machine: {machine['cpu']} x{machine['cpu_count']}, python {machine['python']}, numpy {machine['numpy']}, "
          f"torch {machine.get('torch')} ({machine.get('torch_threads')} threads)"
          + (f", GPU {machine['gpu']}" if "gpu" in machine else ""))
    print(f"model: {run['model']} ({spec.model_type}, {spec.num_layers} layers, hidden {spec.hidden_size}), "
          f"{run['backend']} backend {run['dtype']}; KV capacity {run['capacity']}; state = {run['prefix_tokens']}-token "
          f"prefix + vision rows of {run['footage']}")
    chunk = "one forward for all rows" if plan.chunk == 0 else f"{plan.chunk} rows per forward"
    print(f"ours: CSR {plan.repeats} repeats (+1 warm-up) per point; Unord. = our prefill of all N + M rows, {chunk}, "
          f"{plan.base_repeats} repeat(s) (+{plan.base_warmup} warm-up) at M in {list(plan.base_suffixes)}")
    print(f"HF: {hf['library']}, {hf['dtype']} {hf['attention']} on {hf['device']} ({hf['model']}); one forward over "
          f"the same N + M rows, last row's logits only, no cache kept; {plan.repeats} repeats (+{hf['warmup']} warm-up)")
    print(f"sweep: HF {run['hf_sweep_s']:.1f} s, then ours {run['our_sweep_s']:.1f} s")

    rows, per_token = [], []
    for r in results:
        n, m = r["state_tokens"], r["suffix_tokens"]
        base = "baseline_ttft_ms" in r
        rows.append([n, m, _pm(r["csr_ttft_ms"]), _pm(r["baseline_ttft_ms"]) if base else "-", _pm(r["hf_recompute_ms"]),
                     _x(r.get("speedup")), _x(r["hf_vs_csr"]), _x(r.get("ours_vs_hf"))])
        per_token.append([n, m, _f(r.get("recompute_us_per_token"), 1), _f(r["hf_us_per_token"], 1),
                          f"{r['logits_cosine_min']:.6f}" if base else "-",
                          ("yes" if r["same_first_token"] else "NO") if base else "-",
                          f"{r['hf_logits_cosine']:.6f}", "yes" if r["hf_same_first_token"] else "no"])
    print_table("TTFT (ms, mean ± std): CSR = suffix prefill over the cached state; Unord. = our recompute of "
                "everything; HF = HF transformers' recompute of everything",
                ["N", "M", "CSR", "Unord.", "HF", "Unord./CSR", "HF/CSR", "Unord./HF"], rows)
    print_table("recompute cost per token (us) and agreement with CSR's last-row logits",
                ["N", "M", "Unord. us/tok", "HF us/tok", "cos(Unord.)", "same token", "cos(HF)", "HF token"],
                per_token)
    _print_table_ii(results, plan.sizes, plan.suffixes, min(plan.base_suffixes))
    _print_target(results)


def _print_table_ii(results, sizes, suffixes, m0: int) -> None:
    """The paper's layout: one column per N, the unordered rows (ours, HF's), then one CSR row per M."""
    by = {(r["state_tokens"], r["suffix_tokens"]): r for r in results}
    rows = [[f"Unord. ours (M={m0})"] + [_pm(by[(n, m0)]["baseline_ttft_ms"]) for n in sizes],
            [f"Unord. HF (M={m0})"] + [_pm(by[(n, m0)]["hf_recompute_ms"]) for n in sizes]]
    rows += [[f"M={m}"] + [_pm(by[(n, m)]["csr_ttft_ms"]) for n in sizes] for m in suffixes]
    print_table("Table II layout (ms, mean ± std)", [""] + [f"N={n}" for n in sizes], rows)


def _print_target(results) -> None:
    point = next((r for r in results if (r["state_tokens"], r["suffix_tokens"]) == (TARGET_STATE, TARGET_SUFFIX)), None)
    if point is None:
        return
    ratio = point["hf_vs_csr"]
    print(f"target (issue 20): HF recompute / CSR at N={TARGET_STATE}, M={TARGET_SUFFIX} >= {TARGET_HF_RATIO:.0f}: "
          f"{ratio:.1f} ({'met' if ratio >= TARGET_HF_RATIO else 'NOT met'})")


def _pm(s: dict) -> str:
    return f"{s['mean']:.2f} ± {s['std']:.2f}"


def _x(v) -> str:
    return "-" if v is None else f"{v:.1f}x" if v >= 10 else f"{v:.2f}x"


def _f(v, digits: int) -> str:
    return "-" if v is None else f"{v:.{digits}f}"
