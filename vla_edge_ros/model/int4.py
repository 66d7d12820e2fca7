"""Symmetric INT4 weights in groups along the input dimension, one fp16 scale per group.

The format (Kshipra, reference/kshipra-engine-article.txt, section 2), for one
projection matrix W [out, in] (HF layout: y = x @ W.T):

    groups      each row is cut into in / G groups of G consecutive input
                columns (G = model.int4_group_size, 128 by default)
    scale       s[r, g] = fp16(max |W[r, group g]| / 7), computed once; where
                the group is all zeros s = 0; where a tiny absmax would make an
                fp16 subnormal round below absmax / 7.5, s is one fp16 step up
    weight      q[r, c] = round_half_even(W[r, c] / s) in [-8, 7], with s the
                fp16-rounded scale widened to float32: the very value the
                decoder multiplies by (the Kshipra bug: encoding with the fp32
                scale and decoding with its fp16 rounding broke |w - w_hat| <=
                s/2 by up to |q| * 2^-11 * s)
    decode      w_hat[r, c] = q[r, c] * float32(s[r, c // G])
    bound       |W - w_hat| <= s / 2 for every weight (|W / s| <= 7 (1 + 2^-11)
                < 7.5, so rounding never has to clip)

Storage, per matrix:

    packed  uint8   [out, in / 2]   byte j of a row holds columns 2j (low
                                    nibble, bits 0-3) and 2j + 1 (high nibble,
                                    bits 4-7); a nibble stores q + 8 (0..15)
    scales  float16 [out, in / G]

4 bits per weight plus 16 per G weights: 4.125 bits per weight at G = 128.
The byte layout is, on a little-endian host, exactly the bytes of
compressed-tensors' pack-quantized int32 words (eight q + 8 nibbles per word,
the lowest first), so those checkpoints are read by reinterpreting their
buffer (compressed_tensors_layout.py). Which tensors of a model are stored so,
under which names, is int4_snapshot.py's business.
"""
from __future__ import annotations

import numpy as np

from ..config import INT4_BITS, INT4_SCALE_BYTES
from .spec import ModelFormatError

Q_MIN, Q_MAX = -8, 7            # the values a nibble holds
Q_SCALE_STEPS = 7               # absmax maps to +-7: symmetric, and 0 is exact
NIBBLE_OFFSET = 8               # stored nibble = q + 8
HALF_STEP_LIMIT = Q_MAX + 0.5  # |w / s| up to this rounds to a q within [-8, 7] and within s / 2 of w / s
FP16_MAX = float(np.finfo(np.float16).max)


def group_scales(w: np.ndarray, group_size: int) -> np.ndarray:
    """fp16 scales [out, in / G] of w [out, in]: max |w| / 7 per group, rounded to fp16 once."""
    out_dim, in_dim = _check_matrix(w, group_size)
    absmax = np.abs(w.reshape(out_dim, in_dim // group_size, group_size)).max(axis=2)  # [out, in / G]
    if not np.isfinite(absmax).all():
        raise ValueError("cannot quantize a matrix holding NaN or Inf")
    exact = absmax / np.float32(Q_SCALE_STEPS)                                       # [out, in / G] float32
    if (exact > FP16_MAX).any():
        raise ValueError(f"a weight of magnitude {float(absmax.max()):.3g} needs a scale beyond fp16's range "
                         f"({FP16_MAX}): not a weight matrix INT4 can hold")
    scales = exact.astype(np.float16)                                               # [out, in / G]
    # Rounding to nearest keeps a normal fp16 scale within 2^-11 of absmax / 7, so |w / s| < 7.5 and nothing
    # clips. A subnormal scale (absmax below ~4e-4) can round down by up to 50%, or to 0; one fp16 step up
    # restores |w / s| <= 7.5 (the step is 2^-24 there, more than the half step it was rounded down by).
    too_small = absmax.astype(np.float64) > HALF_STEP_LIMIT * scales.astype(np.float64)
    scales[too_small] = np.nextafter(scales[too_small], np.float16(np.inf))
    return scales


def quantize(w: np.ndarray, group_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(packed uint8 [out, in / 2], scales float16 [out, in / G]) of w [out, in] (any float dtype)."""
    w = np.asarray(w, dtype=np.float32)
    scales = group_scales(w, group_size)                                            # [out, in / G] fp16
    return pack_nibbles(quantize_with_scales(w, scales)), scales


def quantize_with_scales(w: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """int8 q [out, in] of w [out, in] against the given scales [out, in / G]: the fp16 values the decoder
    multiplies by, never an unrounded fp32 scale (the Kshipra bug)."""
    out_dim, in_dim = w.shape
    groups = scales.shape[1]
    # float64 division: float32 could round a ratio just past k + 0.5 onto the tie, and w_hat would then
    # miss w by a hair more than s / 2. fp16 -> float64 is exact, so s is still the decoder's value.
    s = scales.astype(np.float64)[:, :, None]                                       # [out, in / G, 1]
    wg = np.asarray(w, dtype=np.float64).reshape(out_dim, groups, in_dim // groups)  # [out, in / G, G]
    # An all-zero group has s = 0: q = 0 decodes it exactly.
    ratio = np.divide(wg, s, out=np.zeros_like(wg), where=s > 0)                    # [out, in / G, G]
    q = np.clip(np.rint(ratio), Q_MIN, Q_MAX)                                       # rint: round half to even
    return q.astype(np.int8).reshape(out_dim, in_dim)                               # [out, in]


def dequantize(packed: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """float32 w_hat [out, in] = q * scale of packed uint8 [out, in / 2] and scales [out, in / G] (fp16, or a
    wider float a foreign checkpoint stored); the group size is in / (in / G). Shapes and values are checked."""
    out_dim, in_dim, group_size = check_pair(packed, scales)
    q = unpack_nibbles(packed).reshape(out_dim, in_dim // group_size, group_size)   # [out, in / G, G] int8
    w_hat = q * scales.astype(np.float32)[:, :, None]                               # [out, in / G, G] float32
    return w_hat.reshape(out_dim, in_dim)                                           # [out, in]


def pack_nibbles(q: np.ndarray) -> np.ndarray:
    """int8 q [out, in] in [-8, 7] (in even) -> uint8 [out, in / 2]: column 2j low nibble, 2j + 1 high."""
    if q.ndim != 2 or q.shape[1] % 2:
        raise ValueError(f"pack_nibbles needs [out, in] with an even in, got {q.shape}")
    if q.size and (q.min() < Q_MIN or q.max() > Q_MAX):
        raise ValueError(f"INT4 values must lie in [{Q_MIN}, {Q_MAX}], got [{q.min()}, {q.max()}]")
    nib = (q.astype(np.int16) + NIBBLE_OFFSET).astype(np.uint8)                    # [out, in] 0..15
    return nib[:, 0::2] | (nib[:, 1::2] << 4)                                       # [out, in / 2]


def unpack_nibbles(packed: np.ndarray) -> np.ndarray:
    """uint8 [out, in / 2] -> int8 q [out, in] in [-8, 7] (the inverse of pack_nibbles)."""
    low = (packed & 0x0F).astype(np.int8) - NIBBLE_OFFSET                           # [out, in / 2] columns 2j
    high = (packed >> 4).astype(np.int8) - NIBBLE_OFFSET                            # [out, in / 2] columns 2j + 1
    return np.stack([low, high], axis=2).reshape(packed.shape[0], -1)               # [out, in]


def check_pair(packed: np.ndarray, scales: np.ndarray, name: str = "tensor",
               expected_shape: tuple | None = None) -> tuple[int, int, int]:
    """(out, in, group size) of a packed/scales pair, or ModelFormatError saying what is wrong with it."""
    if packed.dtype != np.uint8 or packed.ndim != 2:
        raise ModelFormatError(f"{name}: packed INT4 weights must be uint8 [out, in / 2], got {packed.dtype} "
                               f"{list(packed.shape)}")
    out_dim, in_dim = packed.shape[0], 2 * packed.shape[1]
    if expected_shape is not None and (out_dim, in_dim) != tuple(expected_shape):
        raise ModelFormatError(f"{name}: packed INT4 weights {list(packed.shape)} hold a [{out_dim}, {in_dim}] "
                               f"matrix, the model needs {list(expected_shape)}")
    if scales.ndim != 2 or scales.shape[0] != out_dim or scales.shape[1] == 0:
        raise ModelFormatError(f"{name}: scales {list(scales.shape)} do not fit packed weights "
                               f"{list(packed.shape)} (need [{out_dim}, groups])")
    groups = scales.shape[1]
    if in_dim % groups:
        raise ModelFormatError(f"{name}: {groups} scale groups per row do not divide the input dimension {in_dim}")
    if not np.isfinite(scales).all():
        bad = int(np.count_nonzero(~np.isfinite(scales)))
        raise ModelFormatError(f"{name}: {bad} of {scales.size} scales are NaN or Inf")
    if (scales < 0).any():
        raise ModelFormatError(f"{name}: negative scales (a symmetric INT4 scale is >= 0)")
    if scales.size and float(np.max(scales)) > FP16_MAX:
        # the device keeps scales in fp16, and 8 x a larger one overflows float32 products soon after: a scale
        # of 1e38 (a corrupt file) loaded as Inf weights and NaN logits
        raise ModelFormatError(f"{name}: a scale of {float(np.max(scales)):.3g} is beyond fp16's range "
                               f"({FP16_MAX:g}): not an INT4 weight matrix")
    return out_dim, in_dim, in_dim // groups


def device_bytes(num_weights: int, group_size: int) -> int:
    """Bytes INT4 weights take on a device: 4 bits each plus one fp16 scale per group (4.125 bits at 128)."""
    return num_weights * INT4_BITS // 8 + (num_weights // group_size) * INT4_SCALE_BYTES


def _check_matrix(w: np.ndarray, group_size: int) -> tuple[int, int]:
    if w.ndim != 2:
        raise ValueError(f"INT4 quantizes matrices [out, in], got shape {w.shape}")
    if group_size <= 0 or group_size % 2:
        raise ValueError(f"group size must be a positive even number, got {group_size}")
    out_dim, in_dim = w.shape
    if in_dim % group_size:
        raise ValueError(f"group size {group_size} does not divide the input dimension {in_dim}")
    return out_dim, in_dim
