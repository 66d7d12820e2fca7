"""Host-side weight layouts of the CUDA kernels, checked on the CPU (no device needed).

The QKV_ROPE epilogue of cuda/gemv.cu (qkv_rope.cuh) finds the natural q|k|v column of each tile row
by arithmetic; weight_layouts.qkv_rope_row_order builds the weight in that order. Here the
epilogue's index arithmetic, transcribed, must agree with the order for every tile row, and the
reordered projection followed by that mapping must equal HF-layout RoPE.
"""
import numpy as np
import pytest

from vla_edge_ros.model import weight_layouts as layouts


def _epilogue_targets(n_q_heads, n_kv_heads, head_dim, n_tiles):
    """Natural column of tile rows (g, g+8) as the kernel computes it; -1 where it writes nothing."""
    half = head_dim // 2
    n_pairs = (n_q_heads + n_kv_heads) * half
    pair_tiles = -(-n_pairs // 8)
    kv_dim = n_kv_heads * head_dim
    v_col0 = (n_q_heads + n_kv_heads) * head_dim
    cols = np.full(16 * n_tiles, -1, np.int64)
    for tile in range(n_tiles):
        for g in range(8):
            if tile < pair_tiles:
                p = tile * 8 + g
                if p < n_pairs:
                    h, j = divmod(p, half)
                    cols[16 * tile + g] = h * head_dim + j
                    cols[16 * tile + g + 8] = h * head_dim + j + half
            else:
                for half_tile in (0, 1):
                    vr = (tile - pair_tiles) * 16 + g + 8 * half_tile
                    if vr < kv_dim:
                        cols[16 * tile + g + 8 * half_tile] = v_col0 + vr
    return cols


@pytest.mark.parametrize("hq,kvh,hd", [(12, 2, 128), (4, 1, 24), (4, 2, 32), (14, 2, 64), (3, 3, 6)])
def test_qkv_rope_order_matches_epilogue_arithmetic(hq, kvh, hd):
    order = layouts.qkv_rope_row_order(hq, kvh, hd)
    assert len(order) % 16 == 0
    np.testing.assert_array_equal(order, _epilogue_targets(hq, kvh, hd, len(order) // 16))
    kept = np.sort(order[order >= 0])
    np.testing.assert_array_equal(kept, np.arange((hq + 2 * kvh) * hd))   # a permutation plus padding


def test_reordered_projection_then_rope_equals_natural():
    hq, kvh, hd, hidden = 4, 1, 24, 96
    rng = np.random.default_rng(0)
    w = rng.standard_normal(((hq + 2 * kvh) * hd, hidden)).astype(np.float32)
    x = rng.standard_normal((3, hidden)).astype(np.float32)
    order = layouts.qkv_rope_row_order(hq, kvh, hd)
    dev = x.astype(np.float64) @ layouts.permute_rows(w, order).T.astype(np.float64)   # [3, device rows]
    natural = np.zeros((3, w.shape[0]))
    cols = _epilogue_targets(hq, kvh, hd, len(order) // 16)
    natural[:, cols[cols >= 0]] = dev[:, cols >= 0]
    np.testing.assert_allclose(natural, x.astype(np.float64) @ w.T.astype(np.float64), rtol=1e-12, atol=1e-9)
    assert not dev[:, order < 0].any(), "padding rows must be zero"
