"""VisionEncoder: layout against a plain loop, resize, weights (seeded and from safetensors), errors."""
import dataclasses

import cv2
import numpy as np
import pytest
from safetensors.numpy import save_file

from vla_edge_ros import config
from vla_edge_ros.core.footage import read_clip
from vla_edge_ros.core.vision_encoder import VisionEncoder

VISION = config.load().vision
HIDDEN = 48


def loop_reference(image_u8: np.ndarray, weight: np.ndarray, bias: np.ndarray, patch: int, rows: int, cols: int):
    """Written out the slow way: for each patch (row-major), flatten (y, x, channel), project."""
    tokens = []
    for r in range(rows):
        for c in range(cols):
            flat = []
            for y in range(patch):
                for x in range(patch):
                    for ch in range(3):
                        flat.append(float(image_u8[r * patch + y, c * patch + x, ch]) / 127.5 - 1.0)
            tokens.append(weight.astype(np.float64) @ np.array(flat) + bias.astype(np.float64))
    return np.stack(tokens)


@pytest.fixture(scope="module")
def real_frame():
    return read_clip("bikes.mp4", max_frames=1)[0]          # [272, 640, 3] RGB


def test_defaults_give_32_tokens_of_a_128x64_image():
    assert (VISION.image_width, VISION.image_height, VISION.tokens_per_frame) == (128, 64, 32)


def test_tokens_match_the_loop_reference_on_an_encoder_sized_image():
    enc = VisionEncoder(VISION, HIDDEN)
    rng = np.random.default_rng(3)
    image = rng.integers(0, 256, size=(VISION.image_height, VISION.image_width, 3), dtype=np.uint8)
    out = enc.encode(image)
    ref = loop_reference(image, enc.weight, enc.bias, VISION.patch_size, VISION.grid_rows, VISION.grid_cols)
    assert out.tokens.shape == (VISION.tokens_per_frame, HIDDEN) and out.tokens.dtype == np.float32
    np.testing.assert_allclose(out.tokens, ref, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(out.pooled, ref.mean(axis=0), rtol=1e-4, atol=1e-4)
    assert out.pooled.shape == (HIDDEN,) and out.pooled.dtype == np.float32


def test_real_frame_is_area_resized_then_encoded(real_frame):
    enc = VisionEncoder(VISION, HIDDEN)
    small = cv2.resize(real_frame, (VISION.image_width, VISION.image_height), interpolation=cv2.INTER_AREA)
    ref = loop_reference(small, enc.weight, enc.bias, VISION.patch_size, VISION.grid_rows, VISION.grid_cols)
    out = enc.encode(real_frame)
    np.testing.assert_allclose(out.tokens, ref, rtol=1e-4, atol=1e-4)
    # Seeded weights keep tokens O(1): the scale of a small model's embeddings, not 10s or 1e-3s.
    assert 0.05 < float(out.tokens.std()) < 3.0


def test_non_square_grid_and_patch_order(real_frame):
    # 3 rows x 5 cols of 8-pixel patches: a transposed or column-major layout would not match.
    cfg = dataclasses.replace(VISION, patch_size=8, grid_cols=5, grid_rows=3)
    enc = VisionEncoder(cfg, 16)
    out = enc.encode(real_frame)
    small = cv2.resize(real_frame, (40, 24), interpolation=cv2.INTER_AREA)
    ref = loop_reference(small, enc.weight, enc.bias, 8, 3, 5)
    assert out.tokens.shape == (15, 16)
    np.testing.assert_allclose(out.tokens, ref, rtol=1e-4, atol=1e-4)


def test_seeded_weights_are_reproducible_and_scaled():
    a, b = VisionEncoder(VISION, HIDDEN), VisionEncoder(VISION, HIDDEN)
    np.testing.assert_array_equal(a.weight, b.weight)
    other = VisionEncoder(dataclasses.replace(VISION, seed=VISION.seed + 1), HIDDEN)
    assert not np.array_equal(a.weight, other.weight)
    assert a.weight.shape == (HIDDEN, VISION.patch_dim) and a.bias.shape == (HIDDEN,)
    assert a.weight.std() == pytest.approx(1.0 / np.sqrt(VISION.patch_dim), rel=0.05)


def test_weights_load_from_safetensors(tmp_path, real_frame):
    rng = np.random.default_rng(11)
    w = rng.normal(size=(HIDDEN, VISION.patch_dim)).astype(np.float32)
    bias = rng.normal(size=(HIDDEN,)).astype(np.float32)
    path = tmp_path / "vision.safetensors"
    save_file({"patch_proj.weight": w, "patch_proj.bias": bias}, str(path))
    enc = VisionEncoder(dataclasses.replace(VISION, weights_path=str(path)), HIDDEN)
    np.testing.assert_array_equal(enc.weight, w)
    np.testing.assert_array_equal(enc.bias, bias)
    small = cv2.resize(real_frame, (VISION.image_width, VISION.image_height), interpolation=cv2.INTER_AREA)
    ref = loop_reference(small, w, bias, VISION.patch_size, VISION.grid_rows, VISION.grid_cols)
    np.testing.assert_allclose(enc.encode(real_frame).tokens, ref, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("tensors, needle", [
    ({"patch_proj.weight": np.zeros((HIDDEN, 10), np.float32), "patch_proj.bias": np.zeros(HIDDEN, np.float32)},
     "'patch_proj.weight' has shape"),
    ({"patch_proj.weight": np.zeros((HIDDEN, VISION.patch_dim), np.float32)}, "missing tensor 'patch_proj.bias'"),
    ({"patch_proj.weight": np.zeros((HIDDEN, VISION.patch_dim), np.float32),
      "patch_proj.bias": np.full(HIDDEN, np.nan, np.float32)}, "'patch_proj.bias' contains NaN"),
])
def test_bad_weight_files_name_the_tensor_and_file(tmp_path, tensors, needle):
    path = tmp_path / "bad.safetensors"
    save_file(tensors, str(path))
    with pytest.raises(ValueError, match=needle) as info:
        VisionEncoder(dataclasses.replace(VISION, weights_path=str(path)), HIDDEN)
    assert str(path) in str(info.value)


def test_unreadable_or_missing_weight_file(tmp_path):
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError, match="junk.safetensors"):
        VisionEncoder(dataclasses.replace(VISION, weights_path=str(junk)), HIDDEN)
    with pytest.raises(FileNotFoundError, match="absent.safetensors"):
        VisionEncoder(dataclasses.replace(VISION, weights_path=str(tmp_path / "absent.safetensors")), HIDDEN)


@pytest.mark.parametrize("pixels, needle", [
    (np.zeros((64, 128, 3), np.float32), "uint8"),
    (np.zeros((64, 128, 4), np.uint8), r"\[H, W, 3\]"),
    (np.zeros((64, 128), np.uint8), r"\[H, W, 3\]"),
    (np.zeros((0, 128, 3), np.uint8), "empty"),
])
def test_bad_pixels_are_rejected(pixels, needle):
    with pytest.raises(ValueError, match=needle):
        VisionEncoder(VISION, HIDDEN).encode(pixels)


def test_on_gpu_needs_a_gpu_backend_and_tools_without_a_model_keep_the_numpy_projection(real_frame, tiny_model_dir):
    """vision.on_gpu with the numpy model backend is a clear error naming the key (the reasoning node's and the
    reconciler's configure report it); an offline tool that passes no backend encodes as before."""
    from vla_edge_ros.model.factory import create_backend
    cfg = dataclasses.replace(VISION, on_gpu=True)
    with pytest.raises(ValueError, match="vision.on_gpu needs the model on a GPU.*NumpyBackend"):
        VisionEncoder(cfg, HIDDEN, create_backend("numpy", tiny_model_dir, 256, "float32"))
    tool = VisionEncoder(cfg, HIDDEN)
    assert tool.device_projection is None
    np.testing.assert_array_equal(tool.encode(real_frame).tokens, VisionEncoder(VISION, HIDDEN).encode(real_frame).tokens)
