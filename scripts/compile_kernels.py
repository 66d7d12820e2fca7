"""Compile every kernel family with nvcc, as PyCUDA would, without a GPU: a quick check after
editing cuda/*.cu or its headers.

    .venv/bin/python scripts/compile_kernels.py [--arch sm_90] [--out DIR] [--kv-dtype bfloat16]

Each family's pasted source (cuda_kernels.family_source: headers included) goes to
`nvcc -arch=<arch> -cubin` with the package's COMPILE_OPTIONS plus the family's options for the KV arena type
(cuda_kernels.family_options); the cubins land in --out (a temporary directory if not given).
Exit status 1 when any family fails to compile.
"""
import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# This checkout's package and kernels, even where the venv's editable install points at another checkout.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from vla_edge_ros.model.cuda_kernels import (COMPILE_OPTIONS, FAMILIES, KV_ARENA_TYPES, family_arch,  # noqa: E402
                                             family_options, family_source)


def compile_family(family: str, arch: str, out: Path, kv_dtype: str) -> subprocess.CompletedProcess:
    """nvcc on one family's pasted source for `arch`, or its "a" target where the family needs one (wgmma)."""
    source = out / f"{family}.cu"
    source.write_text(family_source(family))
    target = family_arch(family, arch) or arch        # a family this arch cannot run: let nvcc say why
    return subprocess.run(["nvcc", f"-arch={target}", "-cubin", *COMPILE_OPTIONS, *family_options(family, kv_dtype),
                           "-o", str(out / f"{family}.cubin"), str(source)], capture_output=True, text=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="sm_90")
    parser.add_argument("--out", type=Path, default=None, help="keep the pasted sources and cubins here")
    parser.add_argument("--kv-dtype", choices=tuple(KV_ARENA_TYPES), default="float32", help="the KV arena's type")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="vla_kernels_"))
    out.mkdir(parents=True, exist_ok=True)
    failed = []
    for family in FAMILIES:
        t0 = time.perf_counter()
        done = compile_family(family, args.arch, out, args.kv_dtype)
        status = "ok" if done.returncode == 0 else "FAILED"
        print(f"{family:18s} {status:6s} {time.perf_counter() - t0:5.1f} s", flush=True)
        if done.returncode != 0:
            failed.append(family)
            print(done.stdout + done.stderr, file=sys.stderr)
    print(f"{len(FAMILIES) - len(failed)}/{len(FAMILIES)} families compiled for {args.arch}, KV {args.kv_dtype} "
          f"(cubins in {out})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
