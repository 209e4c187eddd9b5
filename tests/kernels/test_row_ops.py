"""The decoder's per-row ops (ops.inc: rope, rmsnorm, act_mul) against numpy, bit for bit on every kernel path,
on lengths that leave every kind of vector tail (8- and 16-lane steps, AVX-512's masked ones) and on NaN, inf
and -0 where the op defines what they give."""
import numpy as np
import pytest

from lowbit import _native

LENGTHS = [1, 7, 8, 15, 16, 17, 33, 100, 1541]
SPECIALS = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 100.0, -100.0, 88.5, -87.5, 1e-40, -1e-40], np.float32)


def assert_same_bits(got, want):
    """The same float32 bit patterns, NaN payloads aside (NaN where NaN, and only there)."""
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))


def with_specials(rng, v):
    """v with SPECIALS written at random places, always including its last element (the tail)."""
    v = v.copy()
    k = min(len(v), len(SPECIALS))
    at = rng.choice(len(v), k, replace=False)
    at[-1] = len(v) - 1
    v[np.unique(at)] = SPECIALS[rng.permutation(len(SPECIALS))[:len(np.unique(at))]]
    return v


def fma32(a, b, c):
    """float32 a * b + c rounded once, as the FMA: the product is exact in float64, their sum is rounded to odd
    (its error from TwoSum), so the final rounding to float32 is the single rounding of the exact value."""
    a, b, c = (np.asarray(v, np.float32).astype(np.float64) for v in (a, b, c))
    x = a * b
    s = x + c
    bp = s - x
    with np.errstate(invalid="ignore"):
        e = (x - (s - bp)) + (c - bp)
        fix = np.isfinite(s) & (e != 0) & ((s.view(np.int64) & 1) == 0)
    s = np.where(fix, np.nextafter(s, np.where(e > 0, np.inf, -np.inf)), s)
    return s.astype(np.float32)


def fast_exp(x, fma):
    """ops.inc fast_exp; fma: its p * f + c contracted (the AVX2 / AVX-512 translation units, and exp256/512)."""
    f32 = np.float32
    x = np.where(f32(-87) < x, x, f32(-87))  # std::max(-87, x): NaN -> -87
    x = np.where(x < f32(88), x, f32(88))
    t = x * f32(1.44269504088896341)
    r = np.rint(t)
    f = t - r
    p = np.full_like(f, f32(1.5403530393381606e-4))
    for c in [1.3333558146428443e-3, 9.6181291076284772e-3, 5.5504108664821580e-2, 2.4022650695910071e-1,
              6.9314718055994531e-1, 1.0]:
        p = fma32(p, f, f32(c)) if fma else p * f + f32(c)
    return (p.view(np.int32) + (r.astype(np.int32) << 23)).view(np.float32)


def act_reference(g, u, act, fma):
    with np.errstate(invalid="ignore", over="ignore"):
        if act == 1:
            r = np.where(g < 0, np.float32(0), g)  # std::max(g, 0): NaN and -0 stay
            return r * r * u
        return g / (np.float32(1) + fast_exp(-g, fma)) * u


@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("act", [0, 1])
@pytest.mark.parametrize("special", [False, True])
def test_act_mul_bitwise(isa, rng, n, act, special):
    # SiLU (g / (1 + fast_exp(-g)) * u) and squared ReLU (max(g, 0)^2 * u), every path against numpy
    g = (rng.standard_normal(n) * 6).astype(np.float32)
    u = rng.standard_normal(n).astype(np.float32)
    if special:
        g = with_specials(rng, g)
        u[rng.integers(0, n)] = -0.0
    want = act_reference(g, u, act, fma=isa != "scalar")
    _native.act_mul_row(g, u, act)
    assert_same_bits(g, want)


@pytest.mark.parametrize("n", LENGTHS)
def test_rmsnorm_bitwise(isa, rng, n):
    # x in steps of 1/8 up to 8: its sum of squares is exact whatever the order or FMA contraction, so the
    # scale r = 1 / sqrt(ss / n + eps) is numpy's and out = x * (w * r) is checked bit for bit; rows with inf
    # (r = 0: NaN there, +-0 elsewhere), NaN (all NaN) and -0
    x = (rng.integers(-64, 65, (5, n)) / 8).astype(np.float32)
    x[1, -1] = np.inf
    x[2, n // 2] = np.nan
    x[3] = -0.0
    x[4, ::3] = -0.0
    w = rng.standard_normal(n).astype(np.float32)
    w[0] = -0.0
    eps = np.float32(1e-5)
    with np.errstate(invalid="ignore"):
        ss = np.sum(x.astype(np.float64) ** 2, axis=1, keepdims=True).astype(np.float32)
        r = np.float32(1) / np.sqrt(ss / np.float32(n) + eps)
        want = x * (w * r)
    out = np.full_like(x, 7.0)
    _native.rmsnorm_rows(x, w, eps, out)
    assert_same_bits(out, want)
    _native.rmsnorm_rows(x, w, eps, x)  # in place, as the decoder's sub-norms
    assert_same_bits(x, want)


def reference(x, c, s, scale):
    h = x.shape[1] // 2
    a, b = x[:, :h], x[:, h:]
    with np.errstate(invalid="ignore"):
        r1 = (a * c[:h] + b * s[:h]) * np.float32(scale)
        r2 = (b * c[h:] + a * s[h:]) * np.float32(scale)
    return np.concatenate([r1, r2], axis=1)


@pytest.mark.parametrize("heads,hd", [(5, 2 * h) for h in LENGTHS + [5, 9, 32, 40, 48, 64, 128]] +
                         [(16, 96), (9, 64)])
@pytest.mark.parametrize("scale", [1.0, 0.10206207261596575])
@pytest.mark.parametrize("special", [False, True])
def test_rope_rows_bitwise(isa, rng, heads, hd, scale, special):
    # products and sums rounded one at a time (no FMA contraction), then the query scale
    x = rng.standard_normal((heads, hd)).astype(np.float32) * 3
    if special:
        x = with_specials(rng, x.ravel()).reshape(heads, hd)
    theta = rng.uniform(0, 50, hd // 2).astype(np.float32)
    c = np.concatenate([np.cos(theta), np.cos(theta)]).astype(np.float32)
    s = np.concatenate([-np.sin(theta), np.sin(theta)]).astype(np.float32)  # rotate_half's sign in the table
    want = reference(x, c, s, scale)
    _native.rope_rows(x, c, s, scale)
    assert_same_bits(x, want)


def test_rope_rows_rejects_bad_shapes(rng):
    x = np.zeros((2, 7), np.float32)
    with pytest.raises(ValueError, match="even"):
        _native.rope_rows(x, np.zeros(7, np.float32), np.zeros(7, np.float32))
    x = np.zeros((2, 8), np.float32)
    with pytest.raises(ValueError, match=r"\[hd\]"):
        _native.rope_rows(x, np.zeros(6, np.float32), np.zeros(8, np.float32))


def test_row_ops_reject_bad_shapes():
    with pytest.raises(ValueError, match="one length"):
        _native.act_mul_row(np.zeros(8, np.float32), np.zeros(7, np.float32), 0)
    with pytest.raises(ValueError, match="act must be"):
        _native.act_mul_row(np.zeros(8, np.float32), np.zeros(8, np.float32), 3)
    with pytest.raises(ValueError, match=r"\[d\]"):
        _native.rmsnorm_rows(np.zeros((2, 8), np.float32), np.zeros(7, np.float32), 1e-5, np.zeros((2, 8), np.float32))
