"""`vla-edge quantize --model DIR --out DIR`: a float snapshot written as an INT4 one (model/int4_snapshot.py).

Tensor by tensor: one float tensor is read, quantized in blocks of rows and
written before the next is read, so a model larger than memory quantizes too.
"""
from __future__ import annotations

import sys


def add_arguments(parser) -> None:
    parser.add_argument("--model", required=True, help="float snapshot directory (F32 or BF16 safetensors)")
    parser.add_argument("--out", required=True, help="output directory for the INT4 snapshot (created)")
    parser.add_argument("--group-size", type=int, default=None,
                        help="weights per fp16 scale along the input dimension (default: model.int4_group_size)")


def run(args) -> int:
    from ..config import ConfigError, load
    from ..model.int4_snapshot import quantize_snapshot
    from ..model.make_model import MAX_SHARD_BYTES
    from ..model.spec import ModelFormatError

    try:
        group = args.group_size if args.group_size is not None else load().model.int4_group_size
        out = quantize_snapshot(args.model, args.out, group, MAX_SHARD_BYTES)
        files = sorted(p.name for p in out.iterdir())
        size = sum(p.stat().st_size for p in out.glob("*.safetensors"))
    except (ConfigError, ModelFormatError, ValueError, OSError) as exc:
        print(f"vla-edge quantize: {exc}", file=sys.stderr)
        return 1
    print(f"INT4 (groups of {group}, fp16 scales) in {out}: {size / 2**20:.1f} MiB of safetensors")
    print("files: " + ", ".join(files))
    return 0
