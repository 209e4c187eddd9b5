"""codebook_beam: the exact joint code search and the native AQLM beam search for additive codebooks."""
import itertools

import numpy as np
import pytest

import lowbit
from lowbit.formats import quantize
from lowbit.formats.codebook_beam import beam_codes, joint_books, joint_codes, search_codes


def sq_err(x, books, idx, wt=None):
    r = x.astype(np.float64).copy()
    for i in range(books.shape[0]):
        r -= books[i][idx[:, i]]
    return ((r ** 2) * (1.0 if wt is None else wt)).sum(axis=1)


def exhaustive(x, books, wt=None):
    """The best tuple per vector over all nc**m tuples (numpy, small problems)."""
    m, nc, _ = books.shape
    tuples = np.array(list(itertools.product(range(nc), repeat=m)), np.int64)  # c_0 slowest
    sums = joint_books(books).astype(np.float64)
    d = (((x[:, None, :] - sums[None]) ** 2) * (1.0 if wt is None else wt[:, None, :])).sum(axis=2)
    return tuples[np.argmin(d, axis=1)]


@pytest.fixture
def problem(rng):
    books = (rng.standard_normal((2, 16, 4)) * np.array([1.0, 0.4])[:, None, None]).astype(np.float32)
    x = rng.standard_normal((3000, 4)).astype(np.float32)
    wt = rng.uniform(0.2, 3.0, size=x.shape).astype(np.float32)
    return x, books, wt


def test_joint_codes_are_exhaustive_optimum(problem):
    x, books, wt = problem
    for w in (None, wt):
        np.testing.assert_allclose(sq_err(x, books, joint_codes(x, books, w), w),
                                   sq_err(x, books, exhaustive(x, books, w), w), rtol=1e-5, atol=1e-6)


def test_full_beam_is_exhaustive_for_two_codebooks(problem):
    # beam >= nc keeps every code of codebook 0, so the second step sees all nc^2 tuples
    x, books, wt = problem
    start = np.zeros((x.shape[0], 2), np.uint8)
    for w in (None, wt):
        got = beam_codes(x, books, start, w, beam=16)
        np.testing.assert_allclose(sq_err(x, books, got, w), sq_err(x, books, exhaustive(x, books, w), w),
                                   rtol=1e-5, atol=1e-6)


def test_beam_never_worse_than_start_and_wider_is_better(rng):
    m, nc, v = 4, 16, 8
    books = (rng.standard_normal((m, nc, v)) * 0.5).astype(np.float32)
    x = rng.standard_normal((4000, v)).astype(np.float32)
    start = rng.integers(0, nc, size=(x.shape[0], m), dtype=np.uint8)
    e0 = sq_err(x, books, start)
    errs = {}
    for beam in (1, 4, 16):
        idx = beam_codes(x, books, start, None, beam)
        assert idx.dtype == np.uint8 and idx.shape == start.shape
        errs[beam] = sq_err(x, books, idx)
        assert np.all(errs[beam] <= e0 * (1 + 1e-5) + 1e-6)
    assert errs[1].mean() > errs[4].mean() > errs[16].mean()


def test_beam_is_deterministic_across_threads(rng):
    books = rng.standard_normal((3, 16, 4)).astype(np.float32)
    x = rng.standard_normal((5000, 4)).astype(np.float32)
    start = np.zeros((x.shape[0], 3), np.uint8)
    before = lowbit.get_threads()
    try:
        lowbit.set_threads(1)
        a = search_codes(x, books, start, None, beam=8)
        lowbit.set_threads(2)
        b = search_codes(x, books, start, None, beam=8)
    finally:
        lowbit.set_threads(before)
    assert np.array_equal(a, b)


def test_beam_bad_input_raises(rng):
    books = rng.standard_normal((2, 16, 4)).astype(np.float32)
    x = rng.standard_normal((10, 4)).astype(np.float32)
    with pytest.raises(ValueError, match="start codes"):
        beam_codes(x, books, np.full((10, 2), 16, np.uint8), None, 4)
    with pytest.raises(ValueError, match="beam"):
        beam_codes(x, books, np.zeros((10, 2), np.uint8), None, 0)
    with pytest.raises(ValueError, match="beam"):
        quantize(rng.standard_normal((8, 64)).astype(np.float32), "codebook", m=2, v=8, b=6, beam=0)


def test_beam_improves_the_fit(rng):
    w = (rng.standard_normal((64, 512)) * rng.uniform(0.3, 2.0, size=(64, 1))).astype(np.float32)
    err = lambda pw: float(np.mean((pw.dequantize() - w) ** 2) / np.mean(w ** 2))
    narrow = err(quantize(w, "codebook", m=4, v=8, b=4, g=128, beam=1, iters=2))
    wide = err(quantize(w, "codebook", m=4, v=8, b=4, g=128, beam=8, iters=2))
    assert wide < 0.95 * narrow, (narrow, wide)
