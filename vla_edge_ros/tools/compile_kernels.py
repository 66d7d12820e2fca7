"""`vla-edge compile-kernels`: fill PyCUDA's kernel cache before a node needs it.

A GPU node compiles cuda/*.cu with nvcc through PyCUDA when its backend is built, and PyCUDA keeps each
cubin in its on-disk cache (keyed by the source, the options, the architecture and nvcc's version), so
every later process only loads them. On a fresh machine the first reasoning node therefore paid the
compile inside its configure: start to active took 35.2 s on the H200, with ~26 s in configure (issue 21).
This command compiles every family exactly as the backend does (`cuda_kernels.family_cubin`, the same
source, options and architecture) ahead of that, as a build step: `make demo` runs it once per machine
on a GPU. It needs nvcc, and a GPU only to read the architecture when --arch is not given.
"""
from __future__ import annotations

import importlib.util
import sys
import time


def add_arguments(parser) -> None:
    parser.add_argument("--arch", help="GPU architecture, e.g. sm_90 (default: device 0's)")
    parser.add_argument("--params", metavar="FILE", help="ROS parameter file whose kv.dtype picks the KV families' "
                        "build (default config/vla_edge.yaml)")
    parser.add_argument("--kv-dtype", nargs="+", help="KV arena types to build for (default: kv.dtype of --params)")
    parser.add_argument("--families", nargs="+", help="only these kernel families (default: all)")
    parser.add_argument("--jobs", type=int, help="nvcc processes at a time (default: one per core)")


def run(args) -> int:
    if args.jobs is not None and args.jobs < 1:
        print(f"compile-kernels: --jobs must be at least 1, got {args.jobs}", file=sys.stderr)
        return 2
    if importlib.util.find_spec("pycuda") is None:        # the compiler and its cache are PyCUDA's
        print("compile-kernels: PyCUDA is not installed (the gpu extra: scripts/bootstrap.sh installs it where a "
              "CUDA GPU and nvcc are found)", file=sys.stderr)
        return 2
    from ..config import load
    from ..model.cuda_kernels import FAMILIES, KV_ARENA_TYPES, all_builds, fill_disk_cache, family_arch
    families = list(args.families or FAMILIES)
    unknown = [f for f in families if f not in FAMILIES]
    kv_dtypes = list(args.kv_dtype or [load(args.params).kv.dtype])
    bad_dtypes = [d for d in kv_dtypes if d not in KV_ARENA_TYPES]
    if unknown or bad_dtypes:
        print(f"compile-kernels: unknown {'families ' + str(unknown) if unknown else ''}"
              f"{' kv dtypes ' + str(bad_dtypes) if bad_dtypes else ''}; families: {list(FAMILIES)}, kv dtypes: "
              f"{list(KV_ARENA_TYPES)}", file=sys.stderr)
        return 2
    arch = args.arch or _device_arch()
    for family in families:
        if family_arch(family, arch) is None:     # an architecture-specific family (wgmma) this device cannot run
            print(f"{family:20s} skipped: not built for {arch}")
    t_all = time.perf_counter()
    results = fill_disk_cache(all_builds(arch, kv_dtypes, families), workers=args.jobs)
    failed = [(build, exc) for build, _s, exc in results if exc is not None]
    for (family, _target, options), seconds, exc in results:
        print(f"{family:20s} {' '.join(options) or '-':12s} {seconds:6.2f} s{'  FAILED' if exc else ''}")
    if failed:
        for (family, _target, options), exc in failed:
            print(f"compile-kernels: {family} {' '.join(options)} failed: {exc}", file=sys.stderr)
        return 1
    print(f"{len(results)} builds for {arch} in {time.perf_counter() - t_all:.1f} s (side by side; the times above "
          f"are each build's own): PyCUDA's cache holds them now")
    return 0


def _device_arch() -> str:
    from ..model.cuda_device import primary_device
    from ..model.cuda_kernels import device_arch
    return device_arch(primary_device(0))
