"""The decoder's RoPE (ops.rope) against numpy, bit for bit on every kernel path: products and sums rounded one
at a time (no FMA contraction), then the query scale."""
import numpy as np
import pytest

from lowbit import _native


def reference(x, c, s, scale):
    h = x.shape[1] // 2
    a, b = x[:, :h], x[:, h:]
    r1 = (a * c[:h] + b * s[:h]) * np.float32(scale)
    r2 = (b * c[h:] + a * s[h:]) * np.float32(scale)
    return np.concatenate([r1, r2], axis=1)


@pytest.mark.parametrize("hd", [2, 6, 10, 18, 32, 64, 80, 96, 128, 256])
@pytest.mark.parametrize("scale", [1.0, 0.10206207261596575])
def test_rope_rows_bitwise(isa, rng, hd, scale):
    heads = 5
    x = rng.standard_normal((heads, hd)).astype(np.float32) * 3
    theta = rng.uniform(0, 50, hd // 2).astype(np.float32)
    c = np.concatenate([np.cos(theta), np.cos(theta)]).astype(np.float32)
    s = np.concatenate([-np.sin(theta), np.sin(theta)]).astype(np.float32)  # rotate_half's sign in the table
    want = reference(x, c, s, scale)
    _native.rope_rows(x, c, s, scale)
    assert np.array_equal(x, want)


def test_rope_rows_rejects_bad_shapes(rng):
    x = np.zeros((2, 7), np.float32)
    with pytest.raises(ValueError, match="even"):
        _native.rope_rows(x, np.zeros(7, np.float32), np.zeros(7, np.float32))
    x = np.zeros((2, 8), np.float32)
    with pytest.raises(ValueError, match=r"\[hd\]"):
        _native.rope_rows(x, np.zeros(6, np.float32), np.zeros(8, np.float32))
