"""The host-side weight layouts the CUDA kernels read, built once at upload (model/cuda_device_memory.py) and by
the tests that feed kernels directly: gate/up rows interleaved in tiles of 8 (MODE_SWIGLU), the q|k|v rows in the
order of the decode pipeline's fused RoPE projection, and the RoPE inverse frequencies rounded as HF computes them.
numpy only; kernel_reference.py (the numeric oracle of the kernels) does not own these."""
from __future__ import annotations

import numpy as np


def interleave_gate_up(gate: np.ndarray, up: np.ndarray, fill=0) -> np.ndarray:
    """gate, up [I, H] -> [2*ceil8(I), H]: tile t holds gate rows 8t..8t+7 then up rows 8t..8t+7
    (rows of `fill` pad I to a multiple of 8), the layout of MODE_SWIGLU. Rows of any dtype: INT4 packed rows
    and their scale rows are interleaved alike (int4_rows)."""
    inter, hidden = gate.shape
    if up.shape != gate.shape:
        raise ValueError(f"interleave_gate_up: gate {gate.shape} and up {up.shape} differ")
    i8 = -(-inter // 8) * 8
    g = np.full((i8, hidden), fill, gate.dtype)
    u = np.full((i8, hidden), fill, up.dtype)
    g[:inter], u[:inter] = gate, up
    tiles = np.stack([g.reshape(i8 // 8, 8, hidden), u.reshape(i8 // 8, 8, hidden)], axis=1)   # [T, 2, 8, H]
    return np.ascontiguousarray(tiles.reshape(2 * i8, hidden))


def qkv_rope_row_order(n_q_heads: int, n_kv_heads: int, head_dim: int) -> np.ndarray:
    """Device row -> natural q|k|v row (-1: zero padding) of the QKV_ROPE weight layout.

    Pair tiles first: pair p = (head h, j < hd/2), h over the q heads then the k heads, sits in
    tile p // 8 at rows g = p % 8 (natural row h*hd + j) and g + 8 (natural row h*hd + j + hd/2),
    so one lane of gemv.cu's QKV_ROPE epilogue holds both halves RoPE rotates together. Then the v rows in
    natural order, starting at a fresh tile; both parts padded to whole 16-row tiles."""
    half = head_dim // 2
    n_pairs = (n_q_heads + n_kv_heads) * half
    pair_tiles = -(-n_pairs // 8)
    kv_dim = n_kv_heads * head_dim
    v_tiles = -(-kv_dim // 16)
    order = np.full(16 * (pair_tiles + v_tiles), -1, np.int64)
    p = np.arange(n_pairs)
    h, j = p // half, p % half
    dev_a = 16 * (p // 8) + p % 8
    order[dev_a] = h * head_dim + j
    order[dev_a + 8] = h * head_dim + j + half
    v0 = (n_q_heads + n_kv_heads) * head_dim
    order[16 * pair_tiles + np.arange(kv_dim)] = v0 + np.arange(kv_dim)
    return order


def permute_rows(w: np.ndarray, order: np.ndarray, fill=0) -> np.ndarray:
    """w [R, K] -> [len(order), K]: row i = w[order[i]], `fill` where order[i] == -1."""
    out = np.full((len(order), w.shape[1]), fill, w.dtype)
    keep = order >= 0
    out[keep] = w[order[keep]]
    return out


def rope_inv_freq(theta: float, head_dim: int) -> np.ndarray:
    """[head_dim/2] float32: 1 / theta^(2j/hd), rounded as HF computes it (float32 exponent)."""
    exponents = (np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / np.float32(head_dim))
    return (1.0 / (np.float32(theta) ** exponents)).astype(np.float32)


# A packed INT4 byte holding two q = 0 nibbles (q + 8 each): the padding rows of a permuted INT4 weight, so that
# with their zero scales they are exact zeros whatever the activations (a 0x00 byte is q = -8).
INT4_ZERO_BYTE = 0x88


def int4_rows(packed: np.ndarray, scales: np.ndarray, order: np.ndarray | None = None):
    """(packed, scales) of an INT4 matrix with its rows in `order` (permute_rows), padding rows q = 0, scale 0.
    Quantization is per row, so permuting packed rows and scale rows together permutes w_hat's rows."""
    if order is None:
        return packed, scales
    return permute_rows(packed, order, INT4_ZERO_BYTE), permute_rows(scales, order)


def interleave_gate_up_int4(gate: tuple, up: tuple) -> tuple:
    """interleave_gate_up of two INT4 matrices given as (packed, scales): packed and scale rows alike."""
    return (interleave_gate_up(gate[0], up[0], INT4_ZERO_BYTE), interleave_gate_up(gate[1], up[1]))
