"""`vla-edge retention`: which clips each eviction policy keeps on real footage."""
from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

log = logging.getLogger(__name__)

TINY_MODEL_HIDDEN_SIZE = 128    # hidden size of the tiny seeded model (`vla-edge make-model tiny`)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--capacity-frames", type=_positive_int, default=6,
                        help="frames the KV arena holds (default 6)")
    parser.add_argument("--hidden-size", type=_positive_int, default=None,
                        help=f"encoder output width (default {TINY_MODEL_HIDDEN_SIZE}, the tiny model's)")
    parser.add_argument("--model", type=Path, default=None,
                        help="take the hidden size from this HF model directory's config.json instead")
    parser.add_argument("--max-frames-per-clip", type=_positive_int, default=None,
                        help="stream only the first N frames of each clip (quick runs)")
    parser.add_argument("--config", type=Path, default=None,
                        help="configuration YAML for the vision section (default config/vla_edge.yaml)")
    parser.add_argument("--json", type=Path, default=None, help="also write the study as JSON here")


def run(args: argparse.Namespace) -> int:
    from .. import config
    from ..core.retention import format_table, run_retention_study

    cfg = config.load(args.config)
    try:
        hidden = _hidden_size(args)
    except ValueError as exc:
        print(f"vla-edge retention: {exc}", file=sys.stderr)
        return 2
    report = run_retention_study(cfg.vision, hidden, capacity_frames=args.capacity_frames,
                                 max_frames_per_clip=args.max_frames_per_clip)
    print(format_table(report))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report.as_dict(), indent=2))
        log.info("wrote %s", args.json)
    return 0


def _hidden_size(args) -> int:
    if args.model is not None and args.hidden_size is not None:
        raise ValueError("give --hidden-size or --model, not both")
    if args.model is not None:
        from ..model.spec import ModelSpec
        return ModelSpec.from_dir(args.model).hidden_size
    return args.hidden_size or TINY_MODEL_HIDDEN_SIZE


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value
