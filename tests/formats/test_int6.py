"""int6 (formats/int6.py): 64 levels as a 4-bit and a 2-bit plane, on every ISA path, against numpy.

The native quantizer's bit-identity with the numpy reference is in test_native_quantize.py (NATIVE); the product must equal the integer reference
(tests/formats/reference.py) on the 6-bit codes up to float32 rounding in the two planes' group steps (rel. 1e-5
of max|y|), and exactly where every float op is exact (unit scales, integer activations)."""
import numpy as np
import pytest

from lowbit import _native
from lowbit.formats import FORMATS, quantize
from lowbit.formats.int6 import Int6Weight
from lowbit.formats.intcodes import METHOD_AFFINE, ROW_BLOCK, padded_k
from tests.formats.reference import int_matmul, quantize_activations

def reference(pw: Int6Weight, x: np.ndarray) -> np.ndarray:
    q, sx, sq = quantize_activations(x, pw.kp, pw.group)
    a, b = pw.affine()
    return int_matmul(pw.unpacked_codes(), a, b, pw.group, q, sx, sq)


# 1100 rows: 18 row blocks, past one run of kHiBlocks (16) before the planes alternate
@pytest.mark.parametrize("shape", [(192, 576, 1), (100, 200, 3), (77, 130, 5), (64, 64, 1), (250, 1024, 9), (33, 960, 2),
                                   (1100, 96, 1), (1100, 160, 3)],
                         ids=lambda s: "x".join(map(str, s)))
def test_matmul_matches_reference(isa, shape, rng):
    m, k, n = shape
    w = rng.standard_normal((m, k)).astype(np.float32)
    x = rng.standard_normal((n, k)).astype(np.float32) * 3
    for opts in ({}, {"group_size": 128}):
        pw = quantize(w, "int6", **opts)
        y = pw.matmul(x)
        assert y.shape == (n, m) and y.dtype == np.float32
        ref = reference(pw, x)
        np.testing.assert_allclose(y, ref, rtol=0, atol=1e-5 * np.abs(ref).max(), err_msg=f"{opts} {isa}")


def test_integer_part_is_exact(isa, rng):
    """Unit scales, offset -3 and integer activations with absmax 127: every float op is exact, so y is too."""
    m, k, n = 150, 448, 6
    codes = rng.integers(0, 64, size=(m, k)).astype(np.uint8)
    codes[0] = 63
    a = np.ones((m, 1), np.float32)
    pw = Int6Weight.from_codes(codes, a, -3 * a, group=padded_k(k))
    x = rng.integers(-127, 128, size=(n, k)).astype(np.float32)
    x[:, 0] = 127
    exact = (x.astype(np.int64) @ codes.astype(np.int64).T) - 3 * x.sum(axis=1, keepdims=True)
    np.testing.assert_array_equal(pw.matmul(x), exact.astype(np.float32))


def test_planes_and_bits(rng):
    codes = rng.integers(0, 64, size=(70, 100)).astype(np.uint8)
    a = rng.uniform(0.1, 1, size=(70, 2)).astype(np.float32)
    pw = Int6Weight.from_codes(codes, a, -a, group=64)
    np.testing.assert_array_equal(pw.unpacked_codes(), codes)
    np.testing.assert_array_equal(pw.lo.unpacked_codes(), codes & 15)
    np.testing.assert_array_equal(pw.hi.unpacked_codes(), codes >> 4)
    assert pw.hi.scale is pw.lo.scale and pw.hi.offset is None  # one set of scales (16 x on the activations)
    w = rng.standard_normal((256, 512)).astype(np.float32)
    assert quantize(w, "int6").bits_per_weight == pytest.approx(7.0)  # 6 code bits + 2 float16 per 32


def test_error_falls_from_int4(rng):
    w = rng.standard_normal((64, 1024)).astype(np.float32)
    err = {f: np.sqrt(np.mean((quantize(w, f).dequantize() - w) ** 2)) for f in ("int4", "int6", "int8")}
    assert err["int6"] < err["int4"] / 3 and err["int8"] < err["int6"]


def test_state_roundtrip_is_zero_copy(rng):
    pw = quantize(rng.standard_normal((65, 100)).astype(np.float32), "int6")
    meta, tensors = pw.state()
    assert meta["format"] == "int6" and set(tensors) == {"codes", "codes_hi", "scale", "offset"}
    back = FORMATS["int6"].from_state(meta, tensors)
    assert back.lo.codes is tensors["codes"] and back.hi.codes is tensors["codes_hi"] and back.hi.scale is tensors["scale"]
    np.testing.assert_array_equal(back.dequantize(), pw.dequantize())


def test_bad_inputs_raise_clear_errors(rng):
    codes = rng.integers(0, 64, size=(4, 64)).astype(np.uint8)
    a = np.ones((4, 2), np.float32)
    with pytest.raises(ValueError, match="codes must be < 64"):
        Int6Weight.from_codes(codes + 64, a, a, group=32)
    with pytest.raises(ValueError, match=r"must be \[M=4, G=2\]"):
        Int6Weight.from_codes(codes, a[:, :1], a, group=32)
    pw = Int6Weight.from_codes(codes, a, a, group=32)
    with pytest.raises(ValueError, match="offsets are required"):
        Int6Weight(pw.shape, 32, pw.lo.codes, pw.hi.codes, pw.lo.scale, None)
    with pytest.raises(ValueError, match="packed codes have"):
        Int6Weight(pw.shape, 32, pw.lo.codes[:-1], pw.hi.codes, pw.lo.scale, pw.lo.offset)
    w = rng.standard_normal((4, 64)).astype(np.float32)
    mb, kp = 1, 64
    with pytest.raises(ValueError, match="codes_hi is given for bits 6 and only then"):
        _native.quantize_int(w, 0, 4, 64, None, METHOD_AFFINE, 6, 32, False, np.ones(1), np.empty(mb * kp * ROW_BLOCK // 2, np.uint8),
                             np.empty(2 * ROW_BLOCK, np.uint16), np.empty(2 * ROW_BLOCK, np.uint16))
    with pytest.raises(ValueError, match="codes_hi has the wrong size"):
        _native.quantize_int(w, 0, 4, 64, None, METHOD_AFFINE, 6, 32, False, np.ones(1), np.empty(mb * kp * ROW_BLOCK // 2, np.uint8),
                             np.empty(2 * ROW_BLOCK, np.uint16), np.empty(2 * ROW_BLOCK, np.uint16),
                             np.empty(7, np.uint8))
