"""kernel_compare.assert_close on the CPU: the GPU kernel tests rely on it, and they skip where no device is."""
import numpy as np
import pytest

from kernel_compare import assert_close, peak


def test_passes_within_atol_plus_rtol_of_each_element():
    ref = np.array([[1.0, -100.0], [0.0, 1e-3]])
    got = ref + np.array([[1.5e-3, -0.05], [9e-4, 0.0]])      # allowed: 1e-3 + 1e-3 |ref|
    assert_close(got.astype(np.float32), ref, rtol=1e-3, atol=1e-3, what="ok")


def test_reports_the_worst_element_by_index_got_and_ref():
    ref = np.zeros((3, 4))
    got = ref.copy()
    got[0, 1] = 2e-3                                          # over, but less than the worst
    got[2, 3] = -5e-3
    with pytest.raises(AssertionError, match=r"mine: 2 of 12 elements .* worst at \(2, 3\): got -0\.005, ref 0,"):
        assert_close(got, ref, rtol=0.0, atol=1e-3, what="mine")


def test_nan_or_inf_where_the_reference_is_finite_fails():
    ref = np.ones(5)
    got = ref.copy()
    got[3] = np.nan
    with pytest.raises(AssertionError, match=r"1 of 5 elements are NaN/Inf .* at \(3,\)"):
        assert_close(got, ref, rtol=1.0, atol=1.0, what="nan")
    got[3] = np.inf
    with pytest.raises(AssertionError, match="NaN/Inf"):
        assert_close(got, ref, rtol=1.0, atol=1.0, what="inf")


def test_non_finite_reference_elements_must_be_matched():
    ref = np.array([1.0, np.nan, np.inf])
    assert_close(np.array([1.0, np.nan, np.inf]), ref, rtol=0.0, atol=0.0, what="same")
    with pytest.raises(AssertionError, match="where the reference is NaN/Inf"):
        assert_close(np.array([1.0, 0.0, np.inf]), ref, rtol=0.0, atol=0.0, what="nan expected")


def test_norm_check_bounds_the_typical_error():
    ref = np.ones(100)
    got = ref + 1e-3                                          # every element within atol, norm error 1e-3
    assert_close(got, ref, rtol=0.0, atol=2e-3, what="norm", norm_rtol=2e-3)
    with pytest.raises(AssertionError, match="norm-wise relative error 0.001"):
        assert_close(got, ref, rtol=0.0, atol=2e-3, what="norm", norm_rtol=5e-4)


def test_shape_mismatch_fails_and_peak_ignores_non_finite():
    with pytest.raises(AssertionError, match="shape"):
        assert_close(np.zeros(3), np.zeros((3, 1)), rtol=0.0, atol=0.0, what="shape")
    assert peak(np.array([-3.0, np.nan, 2.0, -np.inf])) == 3.0
