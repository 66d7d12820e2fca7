#!/usr/bin/env python3
"""Sum an `ncu --csv --metrics gpu__time_duration.sum` report per kernel name (bench/decode_profile.py).

    python3 scripts/ncu_summary.py ncu.csv
Prints, per kernel name: launches, total and mean time (us), then the total. ncu runs each kernel
alone (serialized, caches as it leaves them), so the total is the kernels' own time without the
launch gaps and overlap of a graph replay; the difference to the replay time is what the gaps cost.
"""
import csv
import sys
from collections import defaultdict


def main(path: str) -> int:
    lines = open(path, encoding="utf-8", errors="replace").read().splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        print(f"{path}: no ncu CSV header found", file=sys.stderr)
        return 1
    rows = list(csv.DictReader(lines[start:]))
    total = defaultdict(float)
    count = defaultdict(int)
    order = []
    for row in rows:
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        name = row["Kernel Name"].split("(")[0]
        value = float(row["Metric Value"].replace(",", ""))
        unit = row.get("Metric Unit", "ns")
        scale = {"ns": 1e-3, "nsecond": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}.get(unit, 1e-3)
        if name not in total:
            order.append(name)
        total[name] += value * scale
        count[name] += 1
    print(f"{'kernel':<34} {'launches':>8} {'total us':>10} {'mean us':>9}")
    for name in order:
        print(f"{name:<34} {count[name]:>8} {total[name]:>10.1f} {total[name] / count[name]:>9.2f}")
    print(f"{'all':<34} {sum(count.values()):>8} {sum(total.values()):>10.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
