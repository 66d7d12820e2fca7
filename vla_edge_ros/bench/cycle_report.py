"""What the cycle bench (bench/pycuda_cycle.py) reports: the rows, the JSON of a run, the printed tables.

A row is one (cached length, weight format, launch mode): ours against the HF columns measured at that length in the
same run (x = HF time / ours, > 1: ours is faster) and against the decode floor of its weight format. The JSON's
top-level figures are the first weight format's (a float-only run keeps the keys it had before the formats came);
`by_weights` has each format's.
"""
from __future__ import annotations

from .common import print_table


def timed(column) -> bool:
    """Whether a baseline column holds timings (not skipped, not an error)."""
    return column is not None and "error" not in column


def ratio(theirs, ours: dict, pct: str):
    """Their cycle time over ours at a percentile (> 1: we are faster); None without timings."""
    return theirs["cycle_ms"][pct] / ours["cycle_ms"][pct] if timed(theirs) else None


def row(n_cached: int, fmt: str, variant: str, ours: dict, theirs: dict, compiled, floor_ms: float,
        floor_with_kv_ms: float | None = None) -> dict:
    """One timed (cached length, weight format, launch mode): ours, the HF columns of that length, the ratios;
    floor_ms: a decode step's weight bytes at the copy bandwidth; floor_with_kv_ms: with the K/V rows it reads."""
    return {"cached": n_cached, "weights": fmt, "variant": variant, "ours": ours, "hf_eager_bf16": theirs,
            "hf_compiled_static": compiled,
            "ratio_p50": theirs["cycle_ms"]["p50"] / ours["cycle_ms"]["p50"],
            "ratio_p99": theirs["cycle_ms"]["p99"] / ours["cycle_ms"]["p99"],
            "ratio_p50_compiled": ratio(compiled, ours, "p50"),
            "ratio_p99_compiled": ratio(compiled, ours, "p99"),
            "decode_vs_floor": ours["decode_ms_per_token"] / floor_ms,
            "floor_with_kv_ms": floor_with_kv_ms,
            "decode_vs_floor_with_kv": (ours["decode_ms_per_token"] / floor_with_kv_ms) if floor_with_kv_ms else None,
            "cycles_timed": ours.get("cycles"),
            "hf_cycles_timed": theirs.get("cycles") if timed(theirs) else None}


def summary(r: dict) -> dict:
    """The figures of record of one row (the first launch mode at the longest context)."""
    compiled = r["hf_compiled_static"]
    return {"latency_ms": {"p50": r["ours"]["cycle_ms"]["p50"], "p99": r["ours"]["cycle_ms"]["p99"]},
            "baseline_latency_ms": {"p50": r["hf_eager_bf16"]["cycle_ms"]["p50"],
                                    "p99": r["hf_eager_bf16"]["cycle_ms"]["p99"]},
            "ratio": r["ratio_p50"],
            "baseline_compiled_latency_ms": ({"p50": compiled["cycle_ms"]["p50"], "p99": compiled["cycle_ms"]["p99"]}
                                             if timed(compiled) else None),
            "ratio_compiled": r["ratio_p50_compiled"],
            "decode_ms_per_token": r["ours"]["decode_ms_per_token"]}


def result(head: dict, formats: list, modes: list, kv_types: list, backends: dict, rows: list, floors: dict,
           bandwidth: float, hf_bytes: int, n_bins: int) -> dict:
    """The JSON of a run: `head` (benchmark, shape, machine, cycle, kv_capacity), then the figures. backends:
    (weight format, KV arena type) -> ours; floors: weight format -> decode floor bytes; bandwidth in bytes/s."""
    last_cached = rows[-1]["cached"]
    firsts = {fmt: next(r for r in rows if r["cached"] == last_cached and r["weights"] == fmt) for fmt in formats}
    backend = backends[formats[0], kv_types[0]]
    by_weights = {fmt: {"decode_stream_bytes": floors[fmt], "floor_decode_ms": floors[fmt] / bandwidth * 1e3,
                        "backend_decode_stream_bytes": backends[fmt, kv_types[0]].decode_stream_bytes(n_bins),
                        "device_memory_bytes_by_kv_dtype": {kv: backends[fmt, kv].memory_bytes() for kv in kv_types},
                        "summary_launch_mode": firsts[fmt]["variant"], **summary(firsts[fmt])}
                  for fmt in formats}
    return {
        **head, "weights": formats, "launch_modes": [r["variant"] for r in rows[:len(modes)]],
        "summary_launch_mode": firsts[formats[0]]["variant"],
        "device_memory_bytes": backend.memory_bytes(), "kv_dtype": backend.kv_dtype,
        "device_memory_bytes_by_kv_dtype": by_weights[formats[0]]["device_memory_bytes_by_kv_dtype"],
        "weight_bytes": backend.weight_bytes, "decode_stream_bytes": floors[formats[0]],
        "copy_bandwidth_gbs": bandwidth / 1e9,
        "floor_decode_ms": by_weights[formats[0]]["floor_decode_ms"],
        "floor_full_weights_ms": backend.weight_bytes / bandwidth * 1e3,
        "hf_weight_bytes": hf_bytes, "floor_hf_weights_ms": hf_bytes / bandwidth * 1e3,
        "by_weights": by_weights,
        "cycles": rows,
        **summary(firsts[formats[0]]),
    }


# ----------------------------------------------------------------------------
# Printed


def print_report(r: dict) -> None:
    """The run's tables. A float-only run prints as before the formats came (plus its KV arena type); with int4 in
    it each row names its weights and each format gets its own decode floor."""
    formats = r.get("weights", ["float"])
    by_format = formats != ["float"]
    title = f"pycuda cycle ({r['cycle']}), {r['shape']}, ms; on {r['machine'].get('gpu_pycuda')}"
    headers = (["cached"] + ["weights"] * by_format +
               ["launch", "cycles", "ours p50", "ours p99", "prefill", "dec/tok", "dec/floor", "dec/floor+KV",
                "x eager p50", "x eager p99", "x compiled p50", "x compiled p99"])
    rows = [[c["cached"]] + [c.get("weights", "float")] * by_format +
            [c["variant"], _or_na(c.get("cycles_timed")), c["ours"]["cycle_ms"]["p50"], c["ours"]["cycle_ms"]["p99"],
             c["ours"]["prefill_ms"], c["ours"]["decode_ms_per_token"], c["decode_vs_floor"],
             _or_na(c.get("decode_vs_floor_with_kv")), c["ratio_p50"], c["ratio_p99"],
             _or_na(c.get("ratio_p50_compiled")), _or_na(c.get("ratio_p99_compiled"))]
            for c in r["cycles"]]
    note = "; HF and ours float hold the INT4 model's dequantized weights in bf16" if "int4" in formats else ""
    print_table(title + "; x = HF time / ours (> 1: ours is faster); dec/floor: decode against its weight bytes at "
                "the copy bandwidth, +KV: and the K/V rows a step reads; p99 of under 100 cycles is about their max"
                + note, headers, rows)
    _print_baselines(r)
    if by_format:
        _print_floors(r)
    else:
        print(f"copy bandwidth {r['copy_bandwidth_gbs']:.0f} GB/s (read+write); decode floor "
              f"{r['decode_stream_bytes'] / 1e9:.3f} GB -> {r['floor_decode_ms']:.3f} ms/token; all weights "
              f"{r['weight_bytes'] / 1e9:.3f} GB -> {r['floor_full_weights_ms']:.3f} ms; device memory "
              f"{r['device_memory_bytes'] / 2**30:.2f} GiB for {r['kv_capacity']} KV slots ({_arena(r)})")
    for c in r["cycles"]:
        for phase, parts in c["ours"]["breakdown_ms"].items():
            times = (", ".join(f"{k} {v:.3f} ms" for k, v in parts.items()) if "error" not in parts
                     else f"not timed: {parts['error']}")
            print(f"  cached {c['cached']:>5} {c.get('weights', 'float'):>5} {c['variant']:>16} {phase:>8}: {times}")


def _print_floors(r: dict) -> None:
    """Per weight format: the bytes a decode step streams at the run's copy bandwidth, and the device memory."""
    print(f"copy bandwidth {r['copy_bandwidth_gbs']:.0f} GB/s (read+write); {r['kv_capacity']} KV slots, "
          f"{_arena(r)}")
    for fmt, w in r["by_weights"].items():
        memory = ", ".join(f"{b / 2**30:.2f} GiB with a {kv} KV arena"
                           for kv, b in w["device_memory_bytes_by_kv_dtype"].items())
        print(f"  ours {fmt:>5}: decode floor {w['decode_stream_bytes'] / 1e9:.3f} GB -> {w['floor_decode_ms']:.3f} "
              f"ms/token (the backend counts {w['backend_decode_stream_bytes'] / 1e9:.3f} GB); device memory {memory}")
    print(f"  HF bf16: all weights {r['hf_weight_bytes'] / 1e9:.3f} GB -> {r['floor_hf_weights_ms']:.3f} ms/token")


def _print_baselines(r: dict) -> None:
    """The HF columns, once per cached length (they do not depend on our weight format or launch mode)."""
    by_cached = {c["cached"]: c for c in r["cycles"]}
    headers = ["cached", "eager p50", "eager p99", "eager prefill", "eager dec/tok",
               "compiled p50", "compiled p99", "compiled prefill", "compiled dec/tok", "compile s"]
    rows, errors = [], []
    for n_cached, c in by_cached.items():
        eager, compiled = c["hf_eager_bf16"], c.get("hf_compiled_static")
        ok = timed(compiled)
        rows.append([n_cached, eager["cycle_ms"]["p50"], eager["cycle_ms"]["p99"], eager["prefill_ms"],
                     eager["decode_ms_per_token"]]
                    + ([compiled["cycle_ms"]["p50"], compiled["cycle_ms"]["p99"], compiled["prefill_ms"],
                        compiled["decode_ms_per_token"], compiled["compile_s"]] if ok else ["n/a"] * 5))
        if compiled is not None and not ok:
            errors.append(f"  cached {n_cached}: compiled baseline failed: {compiled['error'].splitlines()[0]}")
    print_table("HF transformers bf16, ms: eager (DynamicCache) and compiled (SDPA, StaticCache, torch.compile "
                "reduce-overhead)", headers, rows)
    for line in errors:
        print(line)


def _arena(r: dict) -> str:
    """The summary's KV arena type and where it came from (the robot preset, unless a launch mode named one)."""
    return f"{r['kv_dtype']} KV arena" + (f"; robot preset {r['robot_preset']}" if r.get("robot_preset") else "")


def _or_na(value):
    return "n/a" if value is None else value
