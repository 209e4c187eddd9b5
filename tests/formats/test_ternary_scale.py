"""Ternary / tq1 / binary scales: already-quantized input keeps its scale exactly (issue 6, item 1), the
error-minimizing option, and BitNet's absmean as the default."""
import numpy as np
import pytest

from lowbit.formats import quantize
from lowbit.formats.ternary import exact_levels, is_ternary_valued, mse_scale, row_scales_if_uniform


def ternary_valued(shape, s, rng, zeros=1 / 3):
    """{-s, 0, +s} with about `zeros` of the entries 0 (an F16 export of a BitNet model), s float16-exact."""
    t = rng.choice([-1, 0, 1], size=shape, p=[(1 - zeros) / 2, zeros, (1 - zeros) / 2]).astype(np.float32)
    return t * np.float32(np.float16(s)), t


@pytest.mark.parametrize("fmt", ["ternary", "tq1"])
@pytest.mark.parametrize("method", ["absmean", "mse"])
def test_ternary_valued_tensor_keeps_its_scale(fmt, method, rng):
    w, t = ternary_valued((70, 200), 0.0421, rng)
    pw = quantize(w, fmt, method=method)
    # before: absmean gave ~2/3 s, so every weight came back at ~2/3 of its size (max error 33 %)
    np.testing.assert_array_equal(pw.dequantize(), w)
    np.testing.assert_array_equal(pw.ternary() if fmt == "tq1" else pw.unpacked_codes().astype(np.int8) - 1, t)


@pytest.mark.parametrize("fmt,group", [("ternary", 64), ("tq1", 40)])
def test_ternary_valued_per_row_and_group(fmt, group, rng):
    s_row = rng.uniform(0.01, 0.1, size=(50, 1)).astype(np.float16).astype(np.float32)
    t = rng.integers(-1, 2, size=(50, 160)).astype(np.float32)
    w = t * s_row
    for kw in ({"scale": "row"}, {"scale": "tensor"}, {"group_size": group}):
        np.testing.assert_array_equal(quantize(w, fmt, **kw).dequantize(), w, err_msg=str(kw))
    # a different s in every group: exact only with per-group scales
    s_grp = rng.uniform(0.01, 0.1, size=(50, -(-160 // group))).astype(np.float16).astype(np.float32)
    wg = t * np.repeat(s_grp, group, axis=1)[:, :160]
    np.testing.assert_array_equal(quantize(wg, fmt, group_size=group).dequantize(), wg)


def test_tensor_scope_falls_back_to_rows_only_when_exact(rng):
    w, _ = ternary_valued((64, 128), 0.05, rng)
    w[3] *= 2  # row 3 has its own s: exact per row, not per tensor
    pw = quantize(w, "ternary")
    assert pw.meta_extra["scale_mode"] == "row"
    np.testing.assert_array_equal(pw.dequantize(), w)
    g = rng.standard_normal((64, 128)).astype(np.float32)
    assert quantize(g, "ternary").meta_extra["scale_mode"] == "tensor"
    assert is_ternary_valued(w) and not is_ternary_valued(g)


def test_binary_valued_input_keeps_plus_minus_s(rng):
    s = rng.uniform(0.01, 0.1, size=(40, 1)).astype(np.float16).astype(np.float32)
    w = np.where(rng.random((40, 100)) < 0.5, -1.0, 1.0).astype(np.float32) * s
    np.testing.assert_array_equal(quantize(w, "binary").dequantize(), w)
    sg = rng.uniform(0.01, 0.1, size=(40, 4)).astype(np.float16).astype(np.float32)
    wg = np.sign(w) * np.repeat(sg, 32, axis=1)[:, :100]
    np.testing.assert_array_equal(quantize(wg, "binary", group_size=32).dequantize(), wg)


def test_absmean_is_still_the_default(rng):
    w = rng.standard_normal((64, 128)).astype(np.float32)
    a = np.float32(np.float16(np.abs(w).astype(np.float64).mean()))
    np.testing.assert_array_equal(quantize(w, "ternary").dequantize(), np.clip(np.rint(w / a), -1, 1) * a)
    np.testing.assert_array_equal(quantize(w, "ternary", method="absmean").codes, quantize(w, "ternary").codes)


def test_mse_scale_is_the_least_squares_optimum(rng):
    w = rng.standard_normal((6, 333)).astype(np.float32) * rng.uniform(0.5, 2, size=(6, 1)).astype(np.float32)
    absw = np.abs(w)
    a = mse_scale(absw)
    grid = np.linspace(0.05, 3, 6000)  # brute force over a: t = clamp(round(w / a)) is optimal for fixed a
    for r in range(6):
        err = [((w[r] - g * np.clip(np.rint(w[r] / g), -1, 1)) ** 2).sum() for g in grid]
        best = grid[int(np.argmin(err))]
        mine = ((w[r] - a[r] * np.clip(np.rint(w[r] / a[r]), -1, 1)) ** 2).sum()
        assert mine <= min(err) + 1e-4, (r, a[r], best)
    e_mse = np.square(quantize(w, "ternary", scale="row", method="mse").dequantize() - w).sum()
    e_abs = np.square(quantize(w, "ternary", scale="row").dequantize() - w).sum()
    assert e_mse < 0.97 * e_abs, (e_mse, e_abs)  # Gaussian rows: absmean is ~5 % worse than the optimum


def test_exact_levels_and_uniform_rows():
    absw = np.array([[0, 2, 2, 0], [1, 2, 2, 2], [0, 0, 0, 0]], np.float32)
    exact, s = exact_levels(absw)
    assert exact.tolist() == [True, False, False] and s[0] == 2
    t = np.array([[1, 0, -1, 0], [0, 0, 1, 0]], np.int8)
    a = np.array([[0.5, 0.5], [0.0, 0.25]], np.float32)  # row 1's first group is all zero: its d does not count
    np.testing.assert_array_equal(row_scales_if_uniform(t, a, 2), [[0.5], [0.25]])
    assert row_scales_if_uniform(t, np.array([[0.5, 0.4], [0, 0.25]], np.float32), 2) is None


def test_bad_method_and_huge_scale_raise(rng):
    w = rng.standard_normal((8, 64)).astype(np.float32)
    with pytest.raises(ValueError, match="method"):
        quantize(w, "ternary", method="max")
    with pytest.raises(ValueError, match="float16"):
        quantize(w * 1e6, "ternary")
