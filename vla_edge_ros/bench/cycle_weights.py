"""The weight formats of the cycle bench (bench/pycuda_cycle.py, `--weights float int4`).

With int4 in the run, every column computes one function, that of the bench's random model quantized:

  * the float weights (HF's random bf16 draw) are written as a vla-edge INT4 snapshot to a temporary directory
    (int4_snapshot.write_int4_tensors, the writer `vla-edge quantize` and `make-model --weights int4` use);
  * ours INT4: that snapshot through the public factory (model/factory.create_backend, weights="int4"), which
    computes with w_hat = q * s;
  * ours bf16 and both HF baselines hold the dequantized weights read back from the snapshot
    (int4_snapshot.load_int4_weights, i.e. int4.dequantize of what was written), rounded to bf16 (our upload
    and HF's bf16 parameters round to nearest even alike). w_hat = q * fp16 s needs up to 15 significant bits,
    so the bf16 columns differ from ours INT4 by that rounding, nothing else.

The decode floor of each format: the bytes one restricted decode step must stream. float: the backend's own count
(CudaBackend.decode_stream_bytes); int4: the same layer tensors with the seven projections at int4.device_bytes
(4 bits a weight + one fp16 scale per group), counted from the model's shape.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import time
from pathlib import Path

import numpy as np

from ..config import WEIGHT_FORMATS
from ..model import int4
from ..model.int4_snapshot import (CONFIG_FILE, QUANTIZED_FIELDS, check_group_size, load_int4_weights,
                                   marked_config, projection_names, write_int4_tensors)
from ..model.weights import LAYER_TENSOR_NAMES, ModelWeights, assemble_weights, expected_shapes

log = logging.getLogger(__name__)

BF16_BYTES = 2
F32_BYTES = 4
SNAPSHOT_SHARD_BYTES = 1 << 62      # one file: the snapshot lives for one run


def weight_format(text: str) -> str:
    """argparse type of one --weights entry."""
    if text not in WEIGHT_FORMATS:
        raise argparse.ArgumentTypeError(f"weight format {text!r}: one of {', '.join(WEIGHT_FORMATS)}")
    return text


def check_formats(formats) -> list[str]:
    """The formats in the order given, each once; ValueError for none or an unknown one."""
    out = list(dict.fromkeys(formats))
    if not out or any(f not in WEIGHT_FORMATS for f in out):
        raise ValueError(f"--weights takes one or more of {WEIGHT_FORMATS}, got {list(formats)}")
    return out


# ----------------------------------------------------------------------------
# Ours, per weight format


def our_backends(hf, cfg: dict, spec, formats: list, kv_types: list, capacity: int, robot, tmp: Path) -> dict:
    """(weight format, KV arena type) -> ours, each as a robot runs it (robot: the VlaConfig of the robot preset).
    With int4 the INT4 snapshot of hf's weights goes to `tmp` and hf takes the dequantized weights that ours bf16
    is built from too (the module docstring)."""
    from ..model.cuda_backend import CudaBackend

    # The robot's modelled ceiling (memory.vram_ceiling_gib, 8 GiB) bounds one graph process; the bench holds the
    # 7B shape in bf16 (13.5 GB of weights, 16.7 GB with the q|k|v copy in RoPE order) beside HF's two copies, so it
    # sets none: the backend still refuses what the device does not have free.
    options = {**robot.model.kernel_options(), "vram_ceiling_bytes": None}
    group = robot.model.int4_group_size
    backends = {}
    if "int4" in formats:
        t0 = time.perf_counter()
        write_int4_copy(tmp, cfg, spec, hf_read_float(hf), group)
        log.info("INT4 snapshot of the bench's weights (groups of %d) written in %.1f s", group,
                 time.perf_counter() - t0)
        for kv_dtype in kv_types:       # before the float work: a refused snapshot fails the run in seconds
            backends["int4", kv_dtype] = _built(lambda: int4_backend(tmp, capacity, kv_dtype, options), "int4",
                                                kv_dtype)
        weights = dequantized_float_weights(tmp, spec)
        load_into_hf(hf, weights)
    else:
        weights = hf_float_weights(hf, spec)
    if "float" in formats:
        for kv_dtype in kv_types:
            backends["float", kv_dtype] = _built(
                lambda: CudaBackend(spec, weights, capacity, "bfloat16", kv_dtype=kv_dtype, **options), "float",
                kv_dtype)
    return backends


def _built(make, fmt: str, kv_dtype: str):
    t0 = time.perf_counter()
    backend = make()
    log.info("ours with %s weights and a %s KV arena ready in %.1f s (%.2f GiB on the device)", fmt, kv_dtype,
             time.perf_counter() - t0, backend.memory_bytes() / 2**30)
    return backend


def int4_backend(int4_dir: str | Path, capacity: int, kv_dtype: str, kernel_options: dict):
    """Ours with INT4 weights: the snapshot through the public factory, on the current device."""
    from ..model.factory import create_backend
    return create_backend("pycuda", int4_dir, capacity, dtype="bfloat16", kernel_options=kernel_options,
                          kv_dtype=kv_dtype, weights="int4")


# ----------------------------------------------------------------------------
# The bench's weights: float, and the INT4 copy


def hf_float_weights(model, spec) -> ModelWeights:
    """The HF model's weights as float32 ModelWeights (the head tied or not, as the shape says)."""
    read = hf_read_float(model)
    return assemble_weights(spec, {name: read(name) for name in expected_shapes(spec)}, "BF16")


def write_int4_copy(out_dir: str | Path, hf_config: dict, spec, read_float, group_size: int) -> Path:
    """A vla-edge INT4 snapshot in `out_dir` of the float weights read_float(HF name) -> float32 array gives (each
    called once, in file order): the projections in INT4, everything else in bf16 (the bench's weights are bf16
    values, so that is exact). config.json is `hf_config` with the INT4 marker."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    check_group_size(spec, group_size)
    listing = [(name, shape, "BF16") for name, shape in expected_shapes(spec).items()]
    write_int4_tensors(out, listing, set(projection_names(spec)), read_float, group_size, SNAPSHOT_SHARD_BYTES)
    (out / CONFIG_FILE).write_text(json.dumps(marked_config(hf_config, group_size), indent=2) + "\n")
    return out


def dequantized_float_weights(int4_dir: str | Path, spec) -> ModelWeights:
    """The snapshot's weights with the projections dequantized (float32 w_hat), as plain float weights: what ours
    bf16 and HF hold (a backend given these rounds them to bf16 as it uploads them)."""
    weights = load_int4_weights(int4_dir, spec)
    return dataclasses.replace(weights, int4_names=frozenset(), int4_group_size=0)


def hf_read_float(model):
    """read_float for write_int4_copy over an HF model's parameters (one tensor on the host at a time)."""
    params = dict(model.named_parameters())

    def read(name: str) -> np.ndarray:
        return params[name].detach().float().cpu().numpy()
    return read


def load_into_hf(model, weights: ModelWeights) -> None:
    """Copy `weights` into the HF model's parameters in place, one tensor at a time (a bf16 model rounds each to
    nearest even on the copy). Every parameter must be covered: a left-over would be another function."""
    import torch

    params = dict(model.named_parameters())
    seen = set()
    with torch.no_grad():
        for name, arr in weights.named_tensors():
            params[name].copy_(torch.from_numpy(arr))
            seen.add(name)
    left = set(params) - seen - ({"lm_head.weight"} if weights.tied else set())
    if left:
        raise ValueError(f"load_into_hf: no weights for {sorted(left)[:4]}")


# ----------------------------------------------------------------------------
# Decode floors


def decode_floor_bytes(fmt: str, backend, spec, group_size: int, n_bins: int) -> int:
    """Bytes one restricted decode step must stream with weights `fmt` (the module docstring)."""
    if fmt == "int4":
        return int4_decode_stream_bytes(spec, group_size, n_bins)
    return backend.decode_stream_bytes(n_bins)


def projection_weights(spec) -> int:
    """Weights of the seven projections of one layer."""
    shapes = expected_shapes(spec)
    return sum(int(np.prod(shapes[LAYER_TENSOR_NAMES[f].format(i=0)])) for f in QUANTIZED_FIELDS)


def int4_decode_stream_bytes(spec, group_size: int, n_bins: int) -> int:
    """Bytes one restricted decode step must read with INT4 projections: per layer the projections at
    int4.device_bytes (every input dimension holds whole groups: check_group_size), the two RMSNorm weights and the
    q/k/v biases in fp32 as the backend keeps them; then the n_bins bf16 head rows."""
    norms = 2 * spec.hidden_size * F32_BYTES
    biases = (spec.q_dim + 2 * spec.kv_dim) * F32_BYTES if spec.qkv_bias else 0
    layer = int4.device_bytes(projection_weights(spec), group_size) + norms + biases
    return spec.num_layers * layer + n_bins * spec.hidden_size * BF16_BYTES


def hf_weight_bytes(model) -> int:
    """Bytes of every distinct parameter of an HF model: what its decode step streams (the full head included)."""
    seen, total = set(), 0
    for p in model.parameters():                 # parameters() yields a tied tensor once
        if p.data_ptr() not in seen:
            seen.add(p.data_ptr())
            total += p.numel() * p.element_size()
    return total


def floor_ms(nbytes: int, bandwidth: float) -> float:
    return nbytes / bandwidth * 1e3
