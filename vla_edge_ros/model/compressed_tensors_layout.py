"""The W4A16 checkpoints of compressed-tensors ("pack-quantized", as vLLM serves them), read as int4.py's format.

Such a snapshot's config.json carries

    "quantization_config": {"quant_method": "compressed-tensors", "format": "pack-quantized",
        "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": null,
            "weights": {"num_bits": 4, "type": "int", "symmetric": true, "strategy": "group",
                        "group_size": 128, "dynamic": false, ...}}},
        "ignore": ["lm_head"], ...}

and every quantized Linear `P` (e.g. `model.layers.0.mlp.up_proj`) is stored as

    P.weight_packed  I32          [out, in / 8]   eight weights per word, q + 8 in each nibble, the lowest
                                                  nibble the lowest column
    P.weight_scale   F32|BF16|F16 [out, in / G]   w_hat = q * scale
    P.weight_shape   I64          [2]             [out, in]

in place of `P.weight`. The words' little-endian bytes are exactly int4.py's
packed bytes (column 2j in the low nibble of byte j, stored as q + 8), so the
reader reinterprets the buffer; the scales are used as stored (widened to
float32 exactly), the only scale the checkpoint's own decoder knows. Only this
one scheme is read; anything else (asymmetric, other bit widths, activation
quantization, other packings) is refused by name rather than misread.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .spec import ModelFormatError

QUANT_METHOD = "compressed-tensors"
PACK_FORMAT = "pack-quantized"
WEIGHTS_PER_WORD = 8
PACKED_SUFFIX = ".weight_packed"
SCALE_SUFFIX = ".weight_scale"
SHAPE_SUFFIX = ".weight_shape"
# the one weight scheme read: W4A16, symmetric INT4 in groups
W4A16_WEIGHTS = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group"}
ACTORDERS_READ = (None, "weight")     # static groups: column c's scale is group c // G (stored in column order)
ZERO_POINT_SUFFIX = ".weight_zero_point"
G_IDX_SUFFIX = ".weight_g_idx"
SCALE_DTYPES = (np.float16, np.float32)   # bf16 scales reach numpy as float32 (weights.py reads them so)


@dataclass(frozen=True)
class CompressedTensorsW4A16:
    group_size: int
    ignore: tuple          # module names (or "re:" patterns) kept in float, as the checkpoint lists them


def is_compressed_tensors(config: dict) -> bool:
    """Whether a config.json says its weights are compressed-tensors' (of any scheme)."""
    qc = config.get("quantization_config") if isinstance(config, dict) else None
    return isinstance(qc, dict) and qc.get("quant_method") == QUANT_METHOD


def read_scheme(config: dict) -> CompressedTensorsW4A16:
    """The W4A16 scheme of a compressed-tensors config.json, or ModelFormatError naming what differs."""
    qc = config.get("quantization_config") or {}
    groups = qc.get("config_groups") or {}
    if not isinstance(groups, dict) or not all(isinstance(g, dict) for g in groups.values()):
        raise ModelFormatError(f"compressed-tensors config_groups must map group names to objects, got {groups!r}")
    if len(groups) != 1:
        raise ModelFormatError(f"compressed-tensors checkpoint with {len(groups)} config groups: only one W4A16 "
                               f"group is read")
    (group_name, group), = groups.items()
    fmt = group.get("format") or qc.get("format")
    if fmt != PACK_FORMAT:
        raise ModelFormatError(f"compressed-tensors format {fmt!r}: only {PACK_FORMAT!r} is read")
    if group.get("input_activations") or group.get("output_activations"):
        raise ModelFormatError(f"compressed-tensors group {group_name!r} quantizes activations: only W4A16 "
                               f"(weights only) is read")
    weights = group.get("weights") or {}
    for key, want in W4A16_WEIGHTS.items():
        if weights.get(key) != want:
            raise ModelFormatError(f"compressed-tensors group {group_name!r}: weights.{key} is {weights.get(key)!r}, "
                                   f"only {want!r} (W4A16 symmetric group INT4) is read")
    if weights.get("dynamic"):
        raise ModelFormatError(f"compressed-tensors group {group_name!r}: dynamic weight scales are not stored")
    if weights.get("actorder") not in ACTORDERS_READ:
        # "group" (or true): columns were quantized in activation order and each column's group is in weight_g_idx,
        # not column // G; read as if it were, every weight would take another group's scale
        raise ModelFormatError(f"compressed-tensors group {group_name!r}: weights.actorder "
                               f"{weights.get('actorder')!r} (groups by weight_g_idx) is not read; only static "
                               f"groups (actorder {ACTORDERS_READ[0]!r} or {ACTORDERS_READ[1]!r})")
    for key in ("transform_config", "sparsity_config"):
        extra = qc.get(key)
        if extra and not (key == "sparsity_config" and isinstance(extra, dict) and extra.get("format") == "dense"):
            raise ModelFormatError(f"compressed-tensors {key} {extra!r}: the weights are not plain W4A16 "
                                   f"(transformed or sparse); not read")
    group_size = weights.get("group_size")
    if not isinstance(group_size, int) or group_size <= 0 or group_size % 2:
        raise ModelFormatError(f"compressed-tensors group {group_name!r}: group_size {group_size!r} is not a "
                               f"positive even number")
    return CompressedTensorsW4A16(group_size=group_size, ignore=tuple(qc.get("ignore") or ()))


def stored_names(weight_name: str) -> tuple[str, str, str]:
    """(packed, scale, shape) tensor names replacing HF weight `P.weight`."""
    prefix = weight_name.removesuffix(".weight")
    return prefix + PACKED_SUFFIX, prefix + SCALE_SUFFIX, prefix + SHAPE_SUFFIX


def packed_bytes(words: np.ndarray, stored_shape: np.ndarray, name: str) -> np.ndarray:
    """int32 words [out, in / 8] -> int4.py's uint8 [out, in / 2], checked against weight_shape [out, in]."""
    if words.dtype != np.int32 or words.ndim != 2:
        raise ModelFormatError(f"{name}: weight_packed must be int32 [out, in / 8], got {words.dtype} "
                               f"{list(words.shape)}")
    shape = tuple(int(d) for d in np.asarray(stored_shape).reshape(-1))
    want = (words.shape[0], words.shape[1] * WEIGHTS_PER_WORD)
    if shape != want:
        # in not a multiple of 8 would leave padding nibbles in the last word: not a layout we read
        raise ModelFormatError(f"{name}: weight_shape {list(shape)} does not match weight_packed "
                               f"{list(words.shape)} (holds {list(want)})")
    little = words.astype("<i4", copy=False)                       # the bytes as a little-endian host lays them
    return little.view(np.uint8).reshape(words.shape[0], -1)       # [out, in / 2]
