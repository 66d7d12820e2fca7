"""SampleWindow (admission's tail, the swap statistics): median, tail and max equal numpy's over the same window,
to the bit."""
from collections import deque

import numpy as np
import pytest

from vla_edge_ros.core.sample_window import TAIL_MIN_SAMPLES, SampleWindow, sorted_quantile


@pytest.mark.parametrize("size", [1, 2, 9, 10, 11, 90])
def test_window_statistics_equal_numpys_as_samples_come_and_go(size):
    rng = np.random.default_rng(size)
    window, plain = SampleWindow(size), deque(maxlen=size)
    for i in range(3 * size + 20):
        # Repeated values too (ties in the sorted list), and a heavy tail like the recompute samples.
        x = float(rng.choice([rng.exponential(), round(rng.exponential(), 1), 1.0]))
        window.append(x)
        plain.append(x)
        values = np.fromiter(plain, float)
        assert list(window) == list(plain) and len(window) == len(plain)
        assert window.median() == float(np.median(values))
        assert window.max() == max(plain)
        for q in (0.0, 0.5, 0.9, 0.95, 0.99, 0.999, 1.0, float(rng.random())):
            expected = float(np.quantile(values, q)) if len(plain) >= TAIL_MIN_SAMPLES else None
            assert window.tail(q) == expected
    assert (window.tail(0.99) is None) == (size < TAIL_MIN_SAMPLES)


def test_sorted_quantile_is_np_quantile_on_sorted_values():
    values = sorted(np.random.default_rng(0).standard_normal(57).tolist())
    for q in np.linspace(0.0, 1.0, 101):
        assert sorted_quantile(values, float(q)) == float(np.quantile(values, float(q)))


def test_window_size_must_be_positive():
    with pytest.raises(ValueError, match="size must be > 0"):
        SampleWindow(0)


def test_dropping_the_oldest_keeps_the_statistics_of_what_is_left():
    """Admission expires ratios by age (core/admission.py): the oldest leaves without a new one arriving."""
    rng = np.random.default_rng(5)
    w = SampleWindow(12)
    values = list(rng.normal(1.0, 0.2, 12))
    for v in values:
        w.append(v)
    assert w.size == 12
    for n in range(11, 0, -1):
        w.drop_oldest()
        left = values[-n:]
        assert list(w) == left and len(w) == n
        assert w.median() == np.median(left) and w.max() == max(left)
    w.drop_oldest()
    assert len(w) == 0 and w.tail(0.95) is None
    w.append(2.0)                                   # and it fills again as before
    assert list(w) == [2.0]
