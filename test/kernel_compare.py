"""assert_close: a kernel's output against its numpy reference, element by element; rel_norm: one number for
the error of a whole output.

Every element where the reference is finite must satisfy |got - ref| <= atol + rtol * |ref|
(llm.c's validate_result, and what model/kernel_reference.py promises); a NaN or Inf in `got`
there fails outright, since the tests poison outputs with NaN and an unwritten element stays NaN.
Where the reference itself is not finite, `got` must be the same (NaN for NaN, Inf for Inf).
A failure names the worst element: its index, got, ref and how far it is over.

`norm_rtol` adds the norm-wise check ||got - ref|| / ||ref|| <= norm_rtol: it bounds the typical
error, while the per-element bound catches the one bad element a norm over thousands would hide.
"""
import numpy as np


def rel_norm(got, ref) -> float:
    """||got - ref|| / ||ref|| in float64: the typical error of a whole output (logits, a layer's states)."""
    return float(np.linalg.norm(np.asarray(got, np.float64) - ref) / np.linalg.norm(ref))


def peak(ref) -> float:
    """Largest finite |ref|: the scale of an output, for absolute tolerances."""
    ref = np.asarray(ref, dtype=np.float64)
    finite = np.abs(ref[np.isfinite(ref)])
    return float(finite.max()) if finite.size else 0.0


def assert_close(got, ref, rtol: float, atol: float, what: str, norm_rtol: float | None = None) -> None:
    got, ref = np.asarray(got), np.asarray(ref)
    assert got.shape == ref.shape, f"{what}: shape {got.shape}, reference {ref.shape}"
    g, r = got.astype(np.float64), ref.astype(np.float64)
    finite = np.isfinite(r)

    broken = finite & ~np.isfinite(g)
    if broken.any():
        i = _index(np.argmax(broken), r.shape)
        raise AssertionError(f"{what}: {int(broken.sum())} of {r.size} elements are NaN/Inf where the reference is "
                             f"finite (unwritten?); first at {i}: got {g[i]:.9g}, ref {r[i]:.9g}")
    same_special = (np.isnan(r) & np.isnan(g)) | (g == r)
    unmatched = ~finite & ~same_special
    if unmatched.any():
        i = _index(np.argmax(unmatched), r.shape)
        raise AssertionError(f"{what}: {int(unmatched.sum())} elements differ where the reference is NaN/Inf; "
                             f"first at {i}: got {g[i]:.9g}, ref {r[i]:.9g}")

    err = np.where(finite, np.abs(g - np.where(finite, r, 0.0)), 0.0)
    allowed = atol + rtol * np.abs(np.where(finite, r, 0.0))
    over = err > allowed
    if over.any():
        # worst = the largest err / allowed; an element allowed nothing (atol = rtol*|ref| = 0) ranks first
        ratio = np.divide(err, allowed, out=np.full(err.shape, np.inf), where=allowed > 0)
        ratio[~over] = 0.0
        i = _index(np.argmax(ratio), r.shape)
        raise AssertionError(f"{what}: {int(over.sum())} of {r.size} elements off by more than atol {atol:.3g} + "
                             f"rtol {rtol:.3g} * |ref|; worst at {i}: got {g[i]:.9g}, ref {r[i]:.9g}, "
                             f"|diff| {err[i]:.3g} > {allowed[i]:.3g}")

    if norm_rtol is not None:
        rel = float(np.linalg.norm(err) / max(np.linalg.norm(r[finite]), 1e-30))
        assert rel <= norm_rtol, f"{what}: norm-wise relative error {rel:.3g} > {norm_rtol:.3g}"


def _index(flat: int, shape: tuple) -> tuple:
    return tuple(int(v) for v in np.unravel_index(int(flat), shape))
