"""Patch-embedding vision encoder: one RGB frame -> grid_rows * grid_cols tokens.

Layout (defaults: 16x16 patches, 8 across, 4 down -> 128 x 64 image, 32 tokens):

    pixels  [H, W, 3] uint8 RGB, any size
      -> cv2.resize(INTER_AREA) to [image_height, image_width, 3]
      -> x / 127.5 - 1                        values in [-1, 1]
      -> patches, row-major over the grid: token t = r * grid_cols + c covers
         rows r*p .. r*p+p-1 and columns c*p .. c*p+p-1
      -> each patch flattened in (y, x, channel) order:
         flat[(y * p + x) * 3 + ch] = image[r*p + y, c*p + x, ch]      [3*p*p]
      -> tokens = patches @ patch_proj.weight.T + patch_proj.bias       [tokens, hidden]
      -> pooled = mean of the tokens over the patch axis                [hidden]

Weights are `patch_proj.weight [hidden, 3*p*p]` and `patch_proj.bias [hidden]`,
read from `vision.weights_path` (safetensors) or drawn from
`vision.seed`. Seeded weights are N(0, std = 1/sqrt(3*p*p)) for both tensors:
with inputs in [-1, 1] each output is a sum of 3*p*p terms whose variance is at
most 1/(3*p*p), so token values stay O(1), the scale of a small model's token
embeddings. Seeded weights are untrained: the encoder has real shapes and cost,
not real perception.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

from ..config import VisionConfig

log = logging.getLogger(__name__)

WEIGHT_NAME = "patch_proj.weight"
BIAS_NAME = "patch_proj.bias"


@dataclass(frozen=True)
class EncodedFrame:
    tokens: np.ndarray      # [grid_rows * grid_cols, hidden] float32
    pooled: np.ndarray      # [hidden] float32, mean over the tokens


class VisionEncoder:
    def __init__(self, vision_cfg: VisionConfig, hidden_size: int, backend=None):
        """backend: with vision.on_gpu, the model backend whose GPU runs the patch projection (its
        `patch_projection`, PyCUDA only; a backend without one is a ValueError); the resize stays on the host
        either way. None: the numpy projection whatever vision.on_gpu says (offline tools with no model)."""
        if hidden_size <= 0:
            raise ValueError(f"VisionEncoder: hidden_size must be > 0, got {hidden_size}")
        self.cfg = vision_cfg
        self.hidden_size = int(hidden_size)
        if vision_cfg.weights_path:
            weight, bias = load_patch_weights(vision_cfg.weights_path, self.hidden_size, vision_cfg.patch_dim)
        else:
            weight, bias = seeded_patch_weights(vision_cfg.seed, self.hidden_size, vision_cfg.patch_dim)
        self.weight = weight                  # [hidden, 3*p*p] float32
        self.bias = bias                      # [hidden] float32
        # vision.on_gpu: image at the encoder size (uint8) -> (tokens, pooled) on the device (model/cuda_vision.py).
        self.device_projection = None
        if vision_cfg.on_gpu and backend is not None:
            if not hasattr(backend, "patch_projection"):
                raise ValueError(f"vision.on_gpu needs the model on a GPU (model.backend pycuda); this backend is "
                                 f"{type(backend).__name__}")
            self.device_projection = backend.patch_projection(weight, bias, vision_cfg.grid_rows, vision_cfg.grid_cols,
                                                              vision_cfg.patch_size)

    @property
    def tokens_per_frame(self) -> int:
        return self.cfg.tokens_per_frame

    def encode(self, pixels: np.ndarray) -> EncodedFrame:
        """[H, W, 3] uint8 RGB -> EncodedFrame (see the module docstring for the layout)."""
        if self.device_projection is not None:
            tokens, pooled = self.device_projection(self.resize(pixels))
            return EncodedFrame(tokens=tokens, pooled=pooled)
        image = self.prepare(pixels)                                    # [Hi, Wi, 3] float32 in [-1, 1]
        patches = extract_patches(image, self.cfg.patch_size)           # [tokens, 3*p*p]
        tokens = patches @ self.weight.T + self.bias                    # [tokens, hidden]
        tokens = tokens.astype(np.float32, copy=False)
        pooled = tokens.mean(axis=0, dtype=np.float32)                  # [hidden]
        return EncodedFrame(tokens=tokens, pooled=pooled)

    def prepare(self, pixels: np.ndarray) -> np.ndarray:
        """Validate, resize to the encoder size and map to [-1, 1]: [Hi, Wi, 3] float32."""
        return self.resize(pixels).astype(np.float32) / 127.5 - 1.0

    def resize(self, pixels: np.ndarray) -> np.ndarray:
        """Validate and resize to the encoder size: [Hi, Wi, 3] uint8."""
        _check_pixels(pixels)
        width, height = self.cfg.image_width, self.cfg.image_height
        if pixels.shape[:2] != (height, width):
            pixels = cv2.resize(pixels, (width, height), interpolation=cv2.INTER_AREA)
        return pixels


# ----------------------------------------------------------------------------
# Helpers


def extract_patches(image: np.ndarray, patch: int) -> np.ndarray:
    """[rows*p, cols*p, 3] -> [rows*cols, p*p*3]: grid row-major, each patch in (y, x, channel) order."""
    height, width, channels = image.shape
    if height % patch or width % patch:
        raise ValueError(f"extract_patches: image {height}x{width} is not a whole number of {patch}x{patch} patches")
    rows, cols = height // patch, width // patch
    grid = image.reshape(rows, patch, cols, patch, channels)           # [r, y, c, x, ch]
    grid = grid.transpose(0, 2, 1, 3, 4)                               # [r, c, y, x, ch]
    return np.ascontiguousarray(grid.reshape(rows * cols, patch * patch * channels))


def seeded_patch_weights(seed: int, hidden_size: int, patch_dim: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    std = 1.0 / np.sqrt(patch_dim)
    weight = rng.normal(0.0, std, size=(hidden_size, patch_dim)).astype(np.float32)     # [hidden, 3*p*p]
    bias = rng.normal(0.0, std, size=(hidden_size,)).astype(np.float32)                  # [hidden]
    return weight, bias


def load_patch_weights(path: str | Path, hidden_size: int, patch_dim: int) -> tuple[np.ndarray, np.ndarray]:
    """Read and check patch_proj.weight / patch_proj.bias from a safetensors file."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"vision.weights_path: no such file {path}")
    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise ValueError(f"vision weights file {path} is not a readable safetensors file: {exc}") from exc
    expected = {WEIGHT_NAME: (hidden_size, patch_dim), BIAS_NAME: (hidden_size,)}
    out = []
    for name, shape in expected.items():
        if name not in tensors:
            raise ValueError(f"vision weights file {path}: missing tensor {name!r} (has {sorted(tensors)})")
        t = tensors[name]
        if t.shape != shape:
            raise ValueError(f"vision weights file {path}: tensor {name!r} has shape {t.shape}, expected {shape}")
        if not np.issubdtype(t.dtype, np.floating):
            raise ValueError(f"vision weights file {path}: tensor {name!r} has dtype {t.dtype}, expected a float type")
        t = t.astype(np.float32)
        if not np.isfinite(t).all():
            raise ValueError(f"vision weights file {path}: tensor {name!r} contains NaN or Inf")
        out.append(t)
    log.info("vision encoder weights loaded from %s", path)
    return out[0], out[1]


def _check_pixels(pixels) -> None:
    if not isinstance(pixels, np.ndarray):
        raise ValueError(f"VisionEncoder.encode: pixels must be a numpy array, got {type(pixels).__name__}")
    if pixels.dtype != np.uint8:
        raise ValueError(f"VisionEncoder.encode: pixels must be uint8, got {pixels.dtype}")
    if pixels.ndim != 3 or pixels.shape[2] != 3:
        raise ValueError(f"VisionEncoder.encode: pixels must be [H, W, 3] RGB, got shape {pixels.shape}")
    if pixels.shape[0] == 0 or pixels.shape[1] == 0:
        raise ValueError(f"VisionEncoder.encode: pixels are empty, shape {pixels.shape}")
