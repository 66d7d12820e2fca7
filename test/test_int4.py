"""model/int4.py: the round-trip bound with the stored fp16 scale, nibble packing both ways, the Kshipra
encode/decode scale-mismatch guard, 4.125 bits per weight, and bad pairs refused by name."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from vla_edge_ros.model import int4
from vla_edge_ros.model.spec import ModelFormatError


def _bound_holds(w, packed, scales):
    """|w - w_hat| <= s / 2 elementwise, in float64, with the scale as stored."""
    group = w.shape[1] // scales.shape[1]
    s = np.repeat(scales.astype(np.float64), group, axis=1)                  # [out, in]
    err = np.abs(w.astype(np.float64) - int4.dequantize(packed, scales).astype(np.float64))
    return bool((err <= s / 2).all())


@settings(max_examples=60, deadline=None)
@given(data=st.data(), out_dim=st.integers(1, 6), groups=st.integers(1, 4), group=st.sampled_from([2, 8, 32, 128]),
       magnitude=st.sampled_from([1e-9, 1e-6, 3e-4, 0.02, 1.0, 300.0]))
def test_every_weight_comes_back_within_half_its_stored_scale(data, out_dim, groups, group, magnitude):
    shape = (out_dim, groups * group)
    w = data.draw(hnp.arrays(np.float32, shape, elements=st.floats(-1, 1, width=32)))
    w = (w * np.float32(magnitude)).astype(np.float32)                       # [out, in]
    packed, scales = int4.quantize(w, group)
    assert packed.dtype == np.uint8 and packed.shape == (out_dim, groups * group // 2)
    assert scales.dtype == np.float16 and scales.shape == (out_dim, groups)
    assert _bound_holds(w, packed, scales)
    q = int4.unpack_nibbles(packed)
    assert q.min() >= -8 and q.max() <= 7


def test_nibbles_pack_low_first_as_q_plus_8():
    q = np.array([[-8, 7, 0, -1, 3, -5]], dtype=np.int8)
    packed = int4.pack_nibbles(q)
    # column 0 (-8 -> 0) low, column 1 (7 -> 15) high; 0 -> 8 low, -1 -> 7 high; 3 -> 11 low, -5 -> 3 high
    assert packed.tolist() == [[0xF0, 0x78, 0x3B]]
    assert int4.unpack_nibbles(packed).tolist() == q.tolist()


@given(hnp.arrays(np.int8, st.tuples(st.integers(1, 5), st.integers(1, 8).map(lambda n: 2 * n)),
                  elements=st.integers(-8, 7)))
def test_pack_and_unpack_are_inverse(q):
    assert np.array_equal(int4.unpack_nibbles(int4.pack_nibbles(q)), q)
    every_byte = np.arange(256, dtype=np.uint8).reshape(2, 128)
    assert np.array_equal(int4.pack_nibbles(int4.unpack_nibbles(every_byte)), every_byte)


def test_encode_uses_the_fp16_scale_the_decoder_uses():
    # Kshipra's bug: q = round(w / s_fp32), w_hat = q * fp16(s_fp32). Build a group where that breaks the bound:
    # fp16 rounds s = absmax / 7 down by ~2^-12 relative, and a weight sits just below (k + 1/2) s_fp32.
    s32 = np.float32(1.0 + 2.0 ** -12 * 0.98)                   # rounds down to 1.0 in fp16
    s16 = np.float16(s32)
    assert np.float32(s16) < s32
    k = 6
    w = np.array([[7 * s32, np.nextafter(np.float32((k + 0.5) * s32), np.float32(0))]], dtype=np.float32)
    packed, scales = int4.quantize(w, group_size=2)
    assert scales[0, 0] == s16                                   # the scale is stored rounded
    assert _bound_holds(w, packed, scales)
    # The same matrix catches the bug: encoding with the unrounded scale misses the bound with the stored one.
    q_bad = np.clip(np.rint(w / s32), -8, 7).astype(np.int8)
    assert not _bound_holds(w, int4.pack_nibbles(q_bad), scales)


def test_tiny_groups_get_a_scale_that_still_bounds_them():
    w = np.array([[3e-8, -1e-8, 0.0, 2e-9], [0.0, 0.0, 0.0, 0.0]], dtype=np.float32)
    packed, scales = int4.quantize(w, group_size=4)
    assert scales[0, 0] > 0 and scales[1, 0] == 0               # fp16 alone would round row 0's scale to 0
    assert _bound_holds(w, packed, scales)
    assert not int4.dequantize(packed, scales)[1].any()


def test_a_device_holds_4_125_bits_per_weight_at_group_128():
    n = 4096 * 11008
    assert int4.device_bytes(n, 128) * 8 / n == 4.125


@pytest.mark.parametrize("packed, scales, fragment", [
    (np.zeros((4, 8), np.int8), np.ones((4, 1), np.float16), "uint8"),
    (np.zeros((4, 8), np.uint8), np.ones((3, 1), np.float16), "do not fit"),
    (np.zeros((4, 8), np.uint8), np.ones((4, 3), np.float16), "do not divide the input dimension 16"),
    (np.zeros((4, 8), np.uint8), np.array([[1.0], [np.nan], [1.0], [1.0]], np.float16), "NaN or Inf"),
    (np.zeros((4, 8), np.uint8), -np.ones((4, 1), np.float16), "negative scales"),
])
def test_bad_pairs_are_refused_with_the_reason(packed, scales, fragment):
    with pytest.raises(ModelFormatError, match=fragment):
        int4.dequantize(packed, scales)


def test_quantize_refuses_what_it_cannot_hold():
    with pytest.raises(ValueError, match="does not divide the input dimension 96"):
        int4.quantize(np.ones((2, 96), np.float32), 64)
    with pytest.raises(ValueError, match="NaN or Inf"):
        int4.quantize(np.full((1, 4), np.nan, np.float32), 4)
    with pytest.raises(ValueError, match="beyond fp16"):
        int4.quantize(np.full((1, 4), 1e6, np.float32), 4)
