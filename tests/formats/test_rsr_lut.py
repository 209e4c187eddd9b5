"""rsr-lut (the transposed, table-lookup form of RSR's idea): packing, the native kernels on every ISA
against numpy (exact for integer inputs), the int16 widening bound, scales, bad input."""
import numpy as np
import pytest

from lowbit import _native
from lowbit.formats.rsr_lut import LUTMatrix, pack_plane

# (M, K): one row / one input, odd M and K (ragged tiles and chunks), M > 64 tiles, K past several int16 spans
SHAPES = [(1, 1), (5, 3), (63, 7), (64, 4), (65, 101), (130, 257), (37, 1030),
          (580, 301)]  # 10 tiles: binary runs tile pairs (AVX-512) and a lone last tile


def make(kind, m, k, rng):
    if kind == "binary":
        a = rng.integers(0, 2, (m, k))
        return a, LUTMatrix.binary(a)
    if kind == "ternary":
        a = rng.integers(-1, 2, (m, k))
        return a, LUTMatrix.ternary(a)
    bits = {"int2": 2, "int3": 3, "int4": 4}[kind]
    a = rng.integers(0, 1 << bits, (m, k))
    return a, LUTMatrix.codes(a, bits)


@pytest.mark.parametrize("m,k", SHAPES)
@pytest.mark.parametrize("kind", ["binary", "ternary", "int2", "int3", "int4"])
def test_native_every_isa_exact(isa, rng, m, k, kind):
    a, lut = make(kind, m, k, rng)
    np.testing.assert_array_equal(lut.dense(), a)
    for n in (1, 3):
        q = rng.integers(-127, 128, (n, k)).astype(np.int8)
        y, _ = lut.matmul_i8(q)
        np.testing.assert_array_equal(y, (q.astype(np.int64) @ a.T).astype(np.float32), err_msg=f"{isa} {kind} n={n}")


def test_kernel_path_follows_the_isa(isa):
    # the AVX-512BW kernel on the levels that guarantee it, AVX2's on avx2 / avxvnni, the scalar twin on scalar
    want = {"amx": "avx512", "avx512": "avx512", "avxvnni": "avx2", "avx2": "avx2", "scalar": "scalar"}[isa]
    assert _native.rsr_lut_path() == want


@pytest.mark.parametrize("kind", ["binary", "ternary", "int2", "int3", "int4"])
def test_int16_bound_at_extreme_inputs(isa, kind):
    # every table entry at its largest magnitude (all ones / all -1 / all top codes, |x| = 127) over many spans
    m, k = 70 + 64 * 8, 64 * 4 * 5 + 3  # 9 tiles: tile pairs (binary, AVX-512) and a lone last tile
    a = {"binary": np.ones((m, k), np.int64), "ternary": -np.ones((m, k), np.int64),
         "int2": np.full((m, k), 3), "int3": np.full((m, k), 7), "int4": np.full((m, k), 15)}[kind]
    lut = {"binary": LUTMatrix.binary, "ternary": LUTMatrix.ternary,
           "int2": lambda c: LUTMatrix.codes(c, 2), "int3": lambda c: LUTMatrix.codes(c, 3),
           "int4": lambda c: LUTMatrix.codes(c, 4)}[kind](a)
    for v in (127, -127):
        q = np.full((2, k), v, np.int8)
        y, _ = lut.matmul_i8(q)
        np.testing.assert_array_equal(y, np.full((2, m), float(v * a[0].sum()), np.float32), err_msg=f"{isa} {kind}")


def test_scales_and_accumulate(rng):
    a, lut = make("ternary", 70, 50, rng)
    q = rng.integers(-127, 128, (4, 50)).astype(np.int8)
    rs = rng.random(70).astype(np.float32)
    sx = rng.random(4).astype(np.float32)
    base = (q.astype(np.int64) @ a.T).astype(np.float64)
    y, _ = lut.matmul_i8(q, sx, rs, coef=-2.0)
    np.testing.assert_allclose(y, -2.0 * base * rs[None] * sx[:, None], rtol=1e-6)
    out = np.ones((4, 70), np.float32)
    lut.matmul_i8(q, sx, out=out, accumulate=True)
    np.testing.assert_allclose(out, 1.0 + base * sx[:, None], rtol=1e-6, atol=1e-4)


def test_packing_layout():
    b = np.zeros((65, 9), np.uint8)
    b[0, 0] = b[33, 1] = b[64, 8] = 1
    w = pack_plane(b)
    assert w.shape == (2, 3, 32)
    assert w[0, 0, 0] == 0x01 and w[0, 0, 1] == 0x20 and w[1, 2, 0] == 0x01  # row 33 = high nibble of byte 1
    assert int(w.sum()) == 0x01 + 0x20 + 0x01


def test_bad_input_raises(rng):
    with pytest.raises(ValueError, match="0 and 1"):
        pack_plane(np.full((3, 3), 2))
    with pytest.raises(ValueError, match="ternary"):
        LUTMatrix.ternary(np.full((3, 3), 2))
    with pytest.raises(ValueError, match="code width"):
        LUTMatrix.codes(np.zeros((3, 3), np.int64), 5)
    _, lut = make("binary", 10, 12, rng)
    with pytest.raises(ValueError, match="-127, 127"):
        lut.matmul_i8(np.full((1, 12), -128, np.int8))
    with pytest.raises(ValueError, match="q must be"):
        lut.matmul_i8(np.zeros((1, 11), np.int8))
    y = np.empty((1, 10), np.float32)
    with pytest.raises(ValueError, match="w must be"):
        _native.rsr_lut_gemm(lut.w[:, :2].copy(), 10, 12, [0], [False], np.zeros((1, 12), np.int8),
                             np.ones(1, np.float32), None, 1.0, False, y)
    with pytest.raises(ValueError, match="shifts"):
        _native.rsr_lut_gemm(lut.w, 10, 12, [4], [False], np.zeros((1, 12), np.int8), np.ones(1, np.float32), None,
                             1.0, False, y)
