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
    parser.add_argument("--weights", choices=("float", "int4"), default="float",
                        help="int4: the projections written straight to INT4 (synthetic models; no float copy on disk)")
    parser.add_argument("--group-size", type=int, default=None,
                        help="--weights int4: weights per fp16 scale (default: model.int4_group_size)")


def run(args) -> int:
    import numpy as np

    from ..config import ConfigError, load
    from ..model.make_model import make_model
    from ..model.spec import ModelFormatError
    from ..model.int4_snapshot import int4_entries
    from ..model.weights import check_snapshot

    try:
        cfg = load()
        group = ((args.group_size if args.group_size is not None else cfg.model.int4_group_size)
                 if args.weights == "int4" else None)
        out = make_model(args.kind, args.out, seed=args.seed, dtype=args.dtype, layers=args.layers,
                         num_action_bins=cfg.action.num_bins, int4_group_size=group)
        entries = check_snapshot(out) if group is None else int4_entries(out)   # headers read back
    except (ConfigError, ModelFormatError, ImportError, ValueError, OSError) as exc:
        print(f"vla-edge make-model: {exc}", file=sys.stderr)
        return 1
    files = sorted(p.name for p in out.iterdir())
    params = sum(int(np.prod(shape)) for _, _, shape in entries.values())
    tags = "+".join(sorted({tag for _, tag, _ in entries.values()}))
    print(f"{args.kind}: {params:,} parameters ({tags} on disk) in {out}")
    print("files: " + ", ".join(files))
    return 0
