"""The instruction count of a kernel's hottest loop, from its SASS, without a GPU: how the notes' figures for the
lean INT4 entries (862 -> 578 instructions per 128 weights a lane, ...) were taken, and how to take them again.

    .venv/bin/python scripts/sass_loops.py gemv_int4 gemv_int4 gemv_int4_lean [--kv-dtype bfloat16]
        [--cuobjdump PATH] [--arch sm_90]

The family is compiled as the package compiles it on a device (scripts/compile_kernels.py: the pasted source,
COMPILE_OPTIONS and the family's KV options), disassembled with cuobjdump, and for each named entry the longest loop (a backward branch,
not one returning into a loop from a cold path) is printed with its instruction count and its commonest opcodes. CUDA toolkits
without cuobjdump (this development machine's) can take it from PyPI: `pip download --no-deps
nvidia-cuda-cuobjdump`, unzip, and pass the binary with --cuobjdump.
"""
import argparse
import collections
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# This checkout's package and kernels, even where the venv's editable install points at another checkout.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from compile_kernels import compile_family  # noqa: E402
from vla_edge_ros.model.cuda_kernels import KV_ARENA_TYPES  # noqa: E402

# One SASS line: /*addr*/ [@P0 | @!P0] OPCODE ...; a branch's target follows BRA.
SASS_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P[0-9T]\s+)?([A-Z][A-Z0-9_]*)(?:\.[A-Z0-9_.]+)?\s*(.*?);")
BRANCH_TARGET = re.compile(r"^(0x[0-9a-f]+)")


def functions(sass: str) -> dict:
    """{entry name: [(address, opcode, operands), ...]} of a cuobjdump -sass listing."""
    out, name = {}, None
    for line in sass.splitlines():
        if "Function :" in line:
            name = line.split("Function :")[1].strip()
            out[name] = []
            continue
        m = SASS_LINE.search(line)
        if m and name is not None:
            out[name].append((int(m.group(1), 16), m.group(2), m.group(3).strip()))
    return out


def loops(instructions: list) -> list:
    """(first address, branch address) of every loop: a backward branch, less the branches that jump back into the
    middle of another loop from past its end (nvcc's cold paths, e.g. a divergent-branch fallback placed after the
    function, return that way: their span holds code that is not the loop's)."""
    spans = []
    for at, op, operands in instructions:
        target = BRANCH_TARGET.match(operands) if op == "BRA" else None
        if target and int(target.group(1), 16) < at:
            spans.append((int(target.group(1), 16), at))
    return [(s, e) for s, e in spans if not any(s2 < s <= e2 < e for s2, e2 in spans)]


def longest_loop(instructions: list) -> tuple:
    """(first address, branch address, instructions in the loop, Counter of opcodes) of the loop (loops()) spanning
    the most instructions; (None, None, 0, Counter()) when the code has none."""
    best = (None, None, 0)
    for start, end in loops(instructions):
        count = sum(1 for a, _, _ in instructions if start <= a <= end)
        if count > best[2]:
            best = (start, end, count)
    start, end, count = best
    ops = collections.Counter(op for a, op, _ in instructions if start is not None and start <= a <= end)
    return start, end, count, ops


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("family")
    parser.add_argument("entries", nargs="+")
    parser.add_argument("--arch", default="sm_90")
    parser.add_argument("--kv-dtype", choices=tuple(KV_ARENA_TYPES), default="float32")
    parser.add_argument("--cuobjdump", default=shutil.which("cuobjdump"), help="the cuobjdump binary")
    parser.add_argument("--top", type=int, default=8, help="opcodes listed per loop")
    args = parser.parse_args()
    if not shutil.which("nvcc") or not args.cuobjdump:
        print("sass_loops: needs nvcc on PATH and cuobjdump (--cuobjdump; see the docstring)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="vla_sass_") as tmp:
        done = compile_family(args.family, args.arch, Path(tmp), args.kv_dtype)
        if done.returncode:
            print(done.stdout + done.stderr, file=sys.stderr)
            return 1
        sass = subprocess.run([args.cuobjdump, "-sass", str(Path(tmp) / f"{args.family}.cubin")],
                              capture_output=True, text=True, check=True).stdout
    found = functions(sass)
    for entry in args.entries:
        if entry not in found:
            print(f"{entry}: not in {args.family} (has {sorted(found)})", file=sys.stderr)
            return 1
        start, end, count, ops = longest_loop(found[entry])
        top = ", ".join(f"{op} {n}" for op, n in ops.most_common(args.top))
        where = f"0x{start:x}..0x{end:x}" if start is not None else "no loop"
        print(f"{entry}: longest loop {count} instructions ({where}): {top}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
