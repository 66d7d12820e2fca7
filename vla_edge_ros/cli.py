"""`vla-edge`: one command for the demo, the ROS graph, benchmarks and model tools."""
from __future__ import annotations

import argparse
import importlib
import logging
import sys

# subcommand -> (module under vla_edge_ros.tools, one-line help)
SUBCOMMANDS = {
    "demo": ("demo", "run the live pipeline on bundled real footage and print a report"),
    "soak": ("soak", "the demo for --minutes N, judged as a long run (gaps, misses, memory growth)"),
    "bringup": ("bringup", "start the three nodes as separate processes (no launch_ros needed)"),
    "bench": ("bench", "benchmarks against a baseline measured in the same run"),
    "verify": ("verify", "check a backend against HuggingFace transformers"),
    "make-model": ("make_model", "write a model snapshot (tiny, llama-tiny, smollm2, qwen2.5-1.5b-random, "
                                 "llama-2-7b-random)"),
    "quantize": ("quantize", "write a float snapshot as an INT4 one (groups of fp16-scaled 4-bit weights)"),
    "compile-kernels": ("compile_kernels", "compile the CUDA kernels into PyCUDA's cache ahead of the first node"),
    "retention": ("retention", "which clips the eviction policies keep on real footage"),
    "record": ("record", "write the footage as a rosbag2 (mcap)"),
    "replay": ("replay", "publish a bag's images with their recorded timing"),
    "dds-profile": ("dds_profile", "print the shell line that gives a process the graph's Fast DDS profile"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vla-edge", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (module, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        mod = _load(module)
        if mod is not None:
            mod.add_arguments(p)
        p.set_defaults(_module=module)
    return parser


def _load(module: str):
    try:
        return importlib.import_module(f"vla_edge_ros.tools.{module}")
    except ModuleNotFoundError as exc:
        if exc.name == f"vla_edge_ros.tools.{module}":
            return None  # subcommand not built yet
        raise


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    mod = _load(args._module)
    if mod is None:
        print(f"vla-edge {args.command}: not available in this build", file=sys.stderr)
        return 2
    return int(mod.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
