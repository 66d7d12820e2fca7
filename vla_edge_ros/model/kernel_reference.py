"""Plain numpy references of the kernels in cuda/*.cu, one per kernel, same arguments.

Each function mirrors its kernel's signature and layout (see the .cu header
comments) and is written for clarity, computing in float64 where the kernel
accumulates in fp32, so tests compare kernels against these with
`atol + |ref| * rtol`. Also bf16 bits to and from float32 as the device stores
weights; the weight layouts the kernels expect (interleaved gate/up, the
q|k|v rows of the decode pipeline) and the RoPE frequencies are the backend's
own (weight_layouts.py).
"""
from __future__ import annotations

import numpy as np

from . import kernel_constants as kc
from .weights import bf16_bits_to_float32, float32_to_bf16_bits

# MODE_* and CTL_* as the kernels see them: read from cuda/common.cuh on first use (kernel_constants.py).
__getattr__ = kc.reexport(__name__)


# ----------------------------------------------------------------------------
# Host-side layouts


def to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> uint16 bf16 bits (round to nearest even), the device weight format."""
    return float32_to_bf16_bits(x).reshape(np.shape(x))


def from_bf16_bits(bits: np.ndarray) -> np.ndarray:
    return bf16_bits_to_float32(bits).reshape(np.shape(bits))


# ----------------------------------------------------------------------------
# Kernels


def embed_gather_ref(table: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """table [V, H] float32 (or bf16 bits), ids [N] -> [N, H]; out-of-range ids give NaN rows."""
    t = from_bf16_bits(table) if table.dtype == np.uint16 else table
    out = np.full((len(ids), t.shape[1]), np.nan, np.float32)
    ok = (ids >= 0) & (ids < t.shape[0])
    out[ok] = t[ids[ok]]
    return out


def rmsnorm_rows_ref(x: np.ndarray, w: np.ndarray, eps: float, init_src: np.ndarray | None = None,
                     init_cols: int = 0) -> tuple[np.ndarray, np.ndarray | None]:
    """-> (out [N, H], init [N, init_cols] or None)."""
    x64 = x.astype(np.float64)
    inv = 1.0 / np.sqrt((x64 ** 2).mean(axis=1, keepdims=True) + eps)
    out = (w.astype(np.float64) * (x64 * inv)).astype(np.float32)
    init = None
    if init_cols:
        row = init_src if init_src is not None else np.zeros(init_cols, np.float32)
        init = np.tile(row.astype(np.float32), (x.shape[0], 1))
    return out, init


def projection_ref(W: np.ndarray, x: np.ndarray, mode: int, out: np.ndarray | None = None,
                   bias: np.ndarray | None = None, out_cols: int | None = None) -> np.ndarray:
    """W [rows, K] float32 or bf16 bits, x [N, >=K]; returns the new out [N, out_cols] (see projection_bf16.cu)."""
    w = (from_bf16_bits(W) if W.dtype == np.uint16 else W).astype(np.float64)
    rows, k = w.shape
    acc = x[:, :k].astype(np.float64) @ w.T                                    # [N, rows]
    if mode == kc.MODE_SWIGLU:
        tiles = acc.reshape(len(x), rows // 16, 2, 8)                         # [N, T, gate|up, 8]
        gate, up = tiles[:, :, 0].reshape(len(x), -1), tiles[:, :, 1].reshape(len(x), -1)
        res = gate / (1.0 + np.exp(-gate)) * up
        cols = out_cols or rows // 2
        return res[:, :cols].astype(np.float32)
    cols = out_cols or rows
    acc = acc[:, :cols]
    if mode == kc.MODE_STORE:
        return (acc + (bias[:cols] if bias is not None else 0.0)).astype(np.float32)
    if out is None:
        raise ValueError("projection_ref: MODE_ADD needs the output it adds into")
    return (out[:, :cols].astype(np.float64) + acc).astype(np.float32)


def folded_projection_ref(W: np.ndarray, x: np.ndarray, mode: int, out: np.ndarray | None = None,
                          norm_w: np.ndarray | None = None, eps: float = 0.0, bias: np.ndarray | None = None,
                          out_cols: int | None = None) -> np.ndarray:
    """gemv.cu's modes STORE / ADD / SWIGLU (the RMSNorm folded into the projection): the RMSNorm prologue
    (norm_w given) then projection_ref. (QKV_ROPE is rope_store_ref applied to a natural-layout STORE.)"""
    if norm_w is not None:
        x, _ = rmsnorm_rows_ref(x[:, :W.shape[1]], norm_w, eps)
    return projection_ref(W, x, mode, out=out, bias=bias, out_cols=out_cols)


def rope_store_ref(qkv: np.ndarray, pos_table: np.ndarray, slot_table: np.ndarray, ctl: np.ndarray,
                   inv_freq: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, n_q_heads: int,
                   n_kv_heads: int, head_dim: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """-> (qkv with rotated q, k_cache, v_cache) as new arrays; caches [KVH, capacity, hd]."""
    qkv, k_cache, v_cache = qkv.copy(), k_cache.copy(), v_cache.copy()
    half = head_dim // 2
    for i in range(qkv.shape[0]):
        t = ctl[kc.CTL_ROW_OFFSET] + i
        angle = np.float32(pos_table[t]) * inv_freq                           # [half] fp32 as HF
        c, s = np.cos(angle.astype(np.float64)), np.sin(angle.astype(np.float64))
        heads = qkv[i, :(n_q_heads + n_kv_heads) * head_dim].reshape(-1, head_dim).astype(np.float64)
        a, b = heads[:, :half], heads[:, half:]
        rot = np.concatenate([a * c - b * s, b * c + a * s], axis=1).astype(np.float32)   # [Hq+KVH, hd]
        qkv[i, :n_q_heads * head_dim] = rot[:n_q_heads].reshape(-1)
        slot = slot_table[t]
        k_cache[:, slot] = rot[n_q_heads:]
        v_off = (n_q_heads + n_kv_heads) * head_dim
        v_cache[:, slot] = qkv[i, v_off:v_off + n_kv_heads * head_dim].reshape(n_kv_heads, head_dim)
    return qkv, k_cache, v_cache


def attention_ref(qkv: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, attend_list: np.ndarray,
                  ctl: np.ndarray, n_q_heads: int, n_kv_heads: int, head_dim: int, scale: float) -> np.ndarray:
    """-> out [N, Hq*hd]; row i attends to attend_list[:ctx_len + row_offset + i + 1]."""
    group = n_q_heads // n_kv_heads
    out = np.zeros((qkv.shape[0], n_q_heads * head_dim), np.float32)
    for i in range(qkv.shape[0]):
        n = ctl[kc.CTL_CTX_LEN] + ctl[kc.CTL_ROW_OFFSET] + i + 1
        slots = attend_list[:n]
        for h in range(n_q_heads):
            q = qkv[i, h * head_dim:(h + 1) * head_dim].astype(np.float64)
            k = k_cache[h // group, slots].astype(np.float64)                 # [n, hd]
            v = v_cache[h // group, slots].astype(np.float64)
            s = (k @ q) * scale
            p = np.exp(s - s.max())
            out[i, h * head_dim:(h + 1) * head_dim] = (p @ v) / p.sum()
    return out


def argmax_bins_ref(logits: np.ndarray, bin_lo: int) -> int:
    """Token id of the largest logit (lowest on ties), or -1 if any logit is not finite."""
    if not np.all(np.isfinite(logits)):
        return -1
    return int(bin_lo + np.argmax(logits))


def kv_gather_ref(k_cache: np.ndarray, v_cache: np.ndarray, slots: np.ndarray) -> np.ndarray:
    """caches [L, KVH, capacity, hd] -> [2, L, n, KVH*hd]."""
    def pack(c):
        sel = c[:, :, slots]                                                   # [L, KVH, n, hd]
        return sel.transpose(0, 2, 1, 3).reshape(c.shape[0], len(slots), -1)
    return np.stack([pack(k_cache), pack(v_cache)])


def kv_scatter_ref(k_cache: np.ndarray, v_cache: np.ndarray, slots: np.ndarray, staging: np.ndarray):
    """Inverse of kv_gather_ref; returns new (k_cache, v_cache)."""
    k_cache, v_cache = k_cache.copy(), v_cache.copy()
    n_layers, n_kv_heads, _, hd = k_cache.shape
    for c, cache in enumerate((k_cache, v_cache)):
        vals = staging[c, :, :len(slots)].reshape(n_layers, len(slots), n_kv_heads, hd).transpose(0, 2, 1, 3)
        cache[:, :, slots] = vals
    return k_cache, v_cache


def patch_embed_ref(image: np.ndarray, grid_cols: int, patch: int, W: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """image [rows*p, cols*p, 3] uint8 -> tokens [rows*cols, hidden] (core/vision_encoder layout)."""
    img = image.astype(np.float32) / 127.5 - 1.0
    rows = image.shape[0] // patch
    grid = img.reshape(rows, patch, grid_cols, patch, 3).transpose(0, 2, 1, 3, 4)   # [r, c, y, x, ch]
    flat = grid.reshape(rows * grid_cols, -1).astype(np.float64)
    return (flat @ W.astype(np.float64).T + bias).astype(np.float32)


def pool_rows_ref(tokens: np.ndarray) -> np.ndarray:
    return tokens.astype(np.float64).mean(axis=0).astype(np.float32)


def adjacent_cosine_ref(pooled: np.ndarray) -> np.ndarray:
    a, b = pooled[:-1].astype(np.float64), pooled[1:].astype(np.float64)
    dots = (a * b).sum(axis=1)
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    return np.divide(dots, norms, out=np.zeros_like(dots), where=norms > 0).astype(np.float32)
