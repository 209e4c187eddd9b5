"""f32 and bf16 kernels on every ISA path against numpy (float32 sums: rel. tolerance 1e-5 of the row scale)."""
import numpy as np
import pytest

from lowbit.formats import quantize
from lowbit.formats.floats import bf16_bits_to_f32, f32_to_bf16_bits

SHAPES = [(192, 576, 1), (1600, 576, 2), (100, 200, 3), (77, 131, 5), (9, 17, 1), (250, 1024, 9)]


@pytest.mark.parametrize("fmt", ["f32", "bf16"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_float_matmul(isa, fmt, shape, rng):
    m, k, n = shape
    w = rng.standard_normal((m, k)).astype(np.float32)
    x = rng.standard_normal((n, k)).astype(np.float32)
    pw = quantize(w, fmt)
    ref = x.astype(np.float64) @ pw.dequantize().astype(np.float64).T
    y = pw.matmul(x)
    np.testing.assert_allclose(y, ref, rtol=0, atol=1e-5 * np.sqrt(k) * np.abs(x).max())


def test_bf16_rounding_is_nearest_even():
    vals = np.array([1.0, 1.00390625, 1.005859375, -2.5e-3, 3.0e38], np.float32)
    bits = f32_to_bf16_bits(vals)
    back = bf16_bits_to_f32(bits)
    assert np.all(np.abs(back - vals) <= np.abs(vals) * 2**-8)
    assert back[1] == 1.0  # halfway between 1 and 1+2^-7 rounds to even (1.0)


def test_vector_input(rng):
    w = rng.standard_normal((40, 70)).astype(np.float32)
    x = rng.standard_normal(70).astype(np.float32)
    for fmt in ["f32", "bf16", "int8", "ternary"]:
        y = quantize(w, fmt).matmul(x)
        assert y.shape == (40,)


def test_native_bf16_rounding_equals_reference(isa):
    """f32_to_bf16_bits (native, thread pool) == the numpy reference bit for bit: random bits (NaN, Inf,
    subnormals), exact ties, odd and empty shapes, more than one pool chunk."""
    from lowbit.formats.floats import f32_to_bf16_bits, f32_to_bf16_bits_reference

    rng = np.random.default_rng(3)
    bits = rng.integers(0, 1 << 32, 200_003, dtype=np.uint64).astype(np.uint32)
    bits[:8] = [0x7F800000, 0xFF800000, 0x7FC00001, 0x7FFFFFFF, 0x00008000, 0x3F808000, 0x3F818000, 0x80000001]
    for w in (bits.view(np.float32), bits[:77].view(np.float32).reshape(7, 11), np.zeros((0, 5), np.float32),
              rng.standard_normal((3, 70001)).astype(np.float32)):
        got, want = f32_to_bf16_bits(w), f32_to_bf16_bits_reference(w)
        assert got.shape == want.shape and got.dtype == np.uint16
        np.testing.assert_array_equal(got, want)
