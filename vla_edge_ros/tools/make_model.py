"""`vla-edge make-model KIND --out DIR`: write a model snapshot (HF layout) the engine and HF both load."""
from __future__ import annotations

import logging
import sys

logger = logging.getLogger(__name__)


def add_arguments(parser) -> None:
    from ..model.make_model import MODEL_KINDS

    parser.add_argument("kind", choices=MODEL_KINDS, help="which model to write")
    parser.add_argument("--out", required=True, help="output directory (created; existing weight files replaced)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the synthetic weights (default 0)")
    parser.add_argument("--dtype", choices=("fp32", "bf16"), default=None,
                        help="stored weight dtype (default: fp32, bf16 for qwen2.5-1.5b-random)")
    parser.add_argument("--layers", type=int, default=None, help="override the number of layers (synthetic models)")


def run(args) -> int:
    import numpy as np

    from ..config import ConfigError, load
    from ..model.make_model import make_model
    from ..model.spec import ModelFormatError
    from ..model.weights import check_snapshot

    try:
        bins = load().action.num_bins
        out = make_model(args.kind, args.out, seed=args.seed, dtype=args.dtype, layers=args.layers,
                         num_action_bins=bins)
        entries = check_snapshot(out)   # read the headers back: every tensor present, with its shape
    except (ConfigError, ModelFormatError, ImportError, ValueError, OSError) as exc:
        print(f"vla-edge make-model: {exc}", file=sys.stderr)
        return 1
    files = sorted(p.name for p in out.iterdir())
    params = sum(int(np.prod(shape)) for _, _, shape in entries.values())
    tags = "+".join(sorted({tag for _, tag, _ in entries.values()}))
    print(f"{args.kind}: {params:,} parameters ({tags} on disk) in {out}")
    print("files: " + ", ".join(files))
    return 0
