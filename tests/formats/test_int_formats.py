"""Every integer-code format x every ISA path x shapes real models have, against numpy references.

Tolerances: the kernel's integer dot products are exact (checked bit-exactly with unit scales below);
with real scales the only difference is float32 rounding in the per-group finalize: rel. 1e-5 of max|y|.
"""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lowbit.formats import Activations, quantize
from lowbit.formats.intcodes import IntCodeWeight, pack_codes, unpack_codes
from tests.formats.reference import int_matmul, quantize_activations

INT_FORMATS = ["int8", "int4", "int2", "ternary", "binary"]
# (M, K, N): SmolLM2-135M's K=576/M=192, MobileLLM's M=1600, M not a multiple of 32, odd K, GEMM N>4
SHAPES = [(192, 576, 1), (1600, 576, 1), (100, 200, 3), (77, 130, 5), (64, 64, 1), (250, 1024, 9), (33, 960, 2)]
OPTIONS = {
    "int8": [{}, {"group_size": None}, {"group_size": 128}, {"group_size": 32}],
    "int4": [{}, {"group_size": 128, "symmetric": True}, {"group_size": 32}],
    "int2": [{}, {"symmetric": True}, {"group_size": 96}],
    "ternary": [{"scale": "tensor"}, {"scale": "row"}, {"group_size": 64}, {"group_size": 32}],
    "binary": [{}, {"group_size": 64}, {"group_size": 32}],
}


def reference(pw: IntCodeWeight, x: np.ndarray) -> np.ndarray:
    q, sx, sq = quantize_activations(x, pw.kp, pw.group)
    a, b = pw.affine()
    return int_matmul(pw.unpacked_codes(), a, b, pw.group, q, sx, sq)


@pytest.mark.parametrize("fmt", INT_FORMATS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_matmul_matches_reference(isa, fmt, shape, rng):
    m, k, n = shape
    w = rng.standard_normal((m, k)).astype(np.float32)
    x = rng.standard_normal((n, k)).astype(np.float32) * 3
    for opts in OPTIONS[fmt]:
        pw = quantize(w, fmt, **opts)
        y = pw.matmul(x)
        assert y.shape == (n, m) and y.dtype == np.float32
        ref = reference(pw, x)
        np.testing.assert_allclose(y, ref, rtol=0, atol=1e-5 * np.abs(ref).max(), err_msg=f"{fmt} {opts} {isa}")


@pytest.mark.parametrize("fmt", INT_FORMATS)
def test_integer_part_is_exact(isa, fmt, rng):
    """Unit scales and integer activations with absmax 127: every float op is exact, so y must be too."""
    m, k, n = 150, 448, 6
    cls = quantize(np.ones((2, 64), np.float32), fmt).__class__
    codes = rng.integers(0, 1 << cls.bits, size=(m, k)).astype(np.uint8)
    if fmt == "ternary":
        codes = np.minimum(codes, 2)
    g = 1
    a = np.ones((m, g), np.float32)
    pw = cls.from_codes(codes, a) if cls.zc is not None and fmt not in ("int4", "int2") else cls.from_codes(codes, a, -a * 3)
    x = rng.integers(-127, 128, size=(n, k)).astype(np.float32)
    x[:, 0] = 127
    y = pw.matmul(x)
    a_, b_ = pw.affine()
    exact = (x.astype(np.int64) @ codes.astype(np.int64).T) * a_[0, 0] + b_[:, 0] * x.sum(axis=1, keepdims=True)
    np.testing.assert_array_equal(y, exact.astype(np.float32))


def test_activation_quantizer_matches_numpy(isa, rng):
    """Codes, scales (bits) and sums equal numpy's on every ISA path: K not a multiple of 16 or 64, groups with
    masked tails, Kp > K padding (and whole groups past K), round-half-even ties, non-finite and zero groups,
    denormals, and magnitudes near FLT_MAX and near the 127 / absmax overflow."""
    big, tiny = np.finfo(np.float32).max, np.finfo(np.float32).smallest_subnormal
    x = (rng.standard_normal((16, 333)) * rng.uniform(0.01, 50, size=(16, 1))).astype(np.float32)
    x[3] = 0.0
    x[5, :40] = np.arange(40, dtype=np.float32) - 19.5  # halves: round-to-even ties (absmax 127 after the scale)
    x[5, 40] = 127.0
    x[6] = rng.integers(-127, 127, 333) * 2 + 1  # odd values, absmax 254 (below): x * 0.5 all ties
    x[6, ::50] = 254.0
    x[7, 37] = np.nan
    x[8, 70] = np.inf
    x[9, 332] = -np.inf  # in the last, partial group
    x[10] *= np.float32(1e-44)  # denormals throughout: 127 / absmax overflows
    x[11, ::3] = rng.integers(-100, 100, 111) * tiny  # denormals beside normal values
    x[12] *= np.float32(2e-37) / np.abs(x[12]).max()  # absmax about the overflow of 127 / absmax
    x[12, 200:] *= np.float32(30)
    x[13] *= np.float32(3e38) / np.abs(x[13]).max()  # up to FLT_MAX
    x[13, 5] = -big
    x[14, ::2] = -0.0
    x[15, 100:164] = 0.0  # one zero group of 64 in a row of normal values
    for k, kp, group in [(333, 384, 384), (333, 384, 64), (333, 384, 128), (333, 333, 333), (333, 352, 32),
                         (100, 128, 32), (100, 100, 100), (100, 192, 32), (17, 64, 16), (47, 48, 48)]:
        xk = np.ascontiguousarray(x[:, :k])
        got = Activations(xk).int8(kp, group)
        want = quantize_activations(xk, kp, group)
        for g_, w_ in zip(got, want):  # the scales as bits: NaN, and 0 against -0, must match too
            np.testing.assert_array_equal(g_.view(np.int32 if g_.dtype == np.float32 else g_.dtype),
                                          w_.view(np.int32 if w_.dtype == np.float32 else w_.dtype),
                                          err_msg=f"{isa} K={k} Kp={kp} group={group}")


@pytest.mark.parametrize("bits", [1, 2, 4, 8])
def test_pack_unpack_roundtrip(bits, rng):
    codes = rng.integers(0, 1 << bits, size=(70, 200)).astype(np.uint8)
    packed = pack_codes(codes, bits)
    assert packed.size == 128 * 256 * bits // 8  # Mb=2 blocks of 64 rows, Kp=256
    np.testing.assert_array_equal(unpack_codes(packed, bits, 70, 200), codes)


@pytest.mark.parametrize("fmt", INT_FORMATS)
def test_dequantize_is_close_to_weights(fmt, rng):
    w = rng.standard_normal((128, 320)).astype(np.float32)  # whole row blocks: no padding in bpw
    pw = quantize(w, fmt)
    err = np.sqrt(((pw.dequantize() - w) ** 2).mean())
    # relative RMS error bounds per format (Gaussian weights)
    bound = {"int8": 0.02, "int4": 0.12, "int2": 0.5, "ternary": 0.65, "binary": 0.65}[fmt]
    assert err < bound, (fmt, err)
    assert abs(pw.bits_per_weight - {"int8": 8, "int4": 4.5, "int2": 2.5, "ternary": 2, "binary": 1}[fmt]) < 0.6


def test_ternary_quantization_is_bitnet_absmean(rng):
    w = rng.standard_normal((64, 128)).astype(np.float32)
    pw = quantize(w, "ternary")
    s = np.abs(w).mean()
    t = np.clip(np.rint(w / np.float32(np.float16(s))), -1, 1)
    np.testing.assert_allclose(pw.dequantize(), t * np.float16(s), rtol=1e-6)


def test_binary_is_exact_plus_minus_scale(rng):
    w = rng.standard_normal((80, 192)).astype(np.float32)
    d = quantize(w, "binary").dequantize()
    s = np.abs(d).max(axis=1, keepdims=True)
    np.testing.assert_allclose(np.abs(d), np.broadcast_to(s, d.shape), rtol=1e-6)
    assert np.all(np.sign(d) == np.where(w >= 0, 1, -1))


def test_state_roundtrip_is_zero_copy(rng):
    from lowbit.formats import from_state

    w = rng.standard_normal((70, 130)).astype(np.float32)
    for fmt in INT_FORMATS + ["f32", "bf16"]:
        pw = quantize(w, fmt)
        meta, tensors = pw.state()
        pw2 = from_state(meta, tensors)
        for name, arr in pw2.state()[1].items():
            assert np.shares_memory(arr, tensors[name])
        x = rng.standard_normal((2, 130)).astype(np.float32)
        np.testing.assert_array_equal(pw.matmul(x), pw2.matmul(x))


def test_bad_inputs_raise_clear_errors(rng):
    pw = quantize(rng.standard_normal((64, 128)).astype(np.float32), "ternary")
    with pytest.raises(ValueError, match="K=100"):
        pw.matmul(np.zeros((1, 100), np.float32))
    with pytest.raises(ValueError, match="2-D"):
        quantize(np.zeros(10, np.float32), "int4")
    with pytest.raises(ValueError, match="NaN"):
        quantize(np.full((4, 64), np.nan, np.float32), "int8")
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize(np.ones((4, 256), np.float32), "int4", group_size=100)
    with pytest.raises(ValueError, match="unknown weight format"):
        quantize(np.ones((4, 64), np.float32), "int3")


@settings(max_examples=25, deadline=None, derandomize=True)  # reproducible in CI
@given(m=st.integers(1, 300), k=st.integers(1, 700), n=st.integers(1, 7),
       fmt=st.sampled_from(INT_FORMATS), seed=st.integers(0, 2**31))
def test_property_any_shape(m, k, n, fmt, seed):
    r = np.random.default_rng(seed)
    w = r.standard_normal((m, k)).astype(np.float32)
    x = r.standard_normal((n, k)).astype(np.float32)
    pw = quantize(w, fmt)
    ref = reference(pw, x)
    np.testing.assert_allclose(pw.matmul(x), ref, rtol=0, atol=1e-5 * max(np.abs(ref).max(), 1e-6))


def test_matmul_many_equals_separate_calls(isa, rng):
    from lowbit.formats import matmul_many

    k = 576
    ws = [quantize(rng.standard_normal((m, k)).astype(np.float32), "ternary") for m in (576, 192, 192)]
    mixed = ws + [quantize(rng.standard_normal((100, k)).astype(np.float32), "bf16")]
    for n in (1, 5, 70):
        x = rng.standard_normal((n, k)).astype(np.float32)
        for group in (ws, mixed):
            for got, w in zip(matmul_many(group, x), group):
                np.testing.assert_array_equal(got, w.matmul(x))
    assert matmul_many(ws, x[0])[0].shape == (576,)


# The AVX2 GEMM tiles tokens by 6 (the unpacked-panel path of 2-bit and 1-bit codes, N >= 4, groups >= 64),
# 8 (2-bit and 1-bit otherwise) or 5 (4-bit), remainders by 4, 2, 1, and rows by halves of 8 or pairs of 16;
# every token count up to two tiles and past the prefill chunk of 64 must match.
TOKEN_COUNTS = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 15, 16, 17, 130]
# A group of 256 splits into s16 runs of 10 chunks and 6 on the panel path, the last group partial at
# K = 1100 (Kp = 1152); groups of 32 stay on the tile path at every N.
PANEL_OPTIONS = {"int2": [{"group_size": 256}, {"group_size": 32}]}


@pytest.mark.parametrize("fmt", INT_FORMATS)
def test_gemm_token_tiles_match_reference(isa, fmt, rng):
    m, k = 77, 1100  # M: a partial half of 8 rows; K: not a multiple of 64, > 16 chunks (several s16 flushes)
    w = rng.standard_normal((m, k)).astype(np.float32)
    x = rng.standard_normal((max(TOKEN_COUNTS), k)).astype(np.float32) * 3
    for opts in OPTIONS[fmt][:2] + PANEL_OPTIONS.get(fmt, []):
        pw = quantize(w, fmt, **opts)
        for n in TOKEN_COUNTS:
            ref = reference(pw, x[:n])
            np.testing.assert_allclose(pw.matmul(x[:n]), ref, rtol=0, atol=1e-5 * np.abs(ref).max(),
                                       err_msg=f"{fmt} {opts} N={n} {isa}")


@pytest.mark.parametrize("fmt", INT_FORMATS)
@pytest.mark.parametrize("sign", [1, -1])
def test_s16_accumulators_at_the_bound(isa, fmt, sign):
    """Largest codes against activations of +-127 over one long group: every s16 run of the AVX2 kernel sits at
    its bound (kFlush chunks of 2 * maxc * 127 per instruction; the 2-bit GEMV's 4x planes: 5 chunks of
    2 * 2 * 12 * 127); one more instruction per run would wrap. N = 9 runs the GEMM tiles, N = 1 the GEMV."""
    m, k = 40, 500 if fmt == "int8" else 2000  # |y| < 2^24: exact in float32
    cls = quantize(np.ones((2, 64), np.float32), fmt).__class__
    top = 2 if fmt == "ternary" else (1 << cls.bits) - 1
    codes = np.full((m, k), top, np.uint8)
    codes[1::2, ::3] = 0  # some rows below the bound too
    a = np.ones((m, 1), np.float32)
    pw = cls.from_codes(codes, a) if cls.zc is not None and fmt not in ("int4", "int2") else cls.from_codes(codes, a, -a * 3)
    x = np.full((9, k), 127.0 * sign, np.float32)
    x[4, ::2] = -127.0 * sign  # one token of mixed signs
    y = pw.matmul(x)
    a_, b_ = pw.affine()
    exact = (x.astype(np.int64) @ codes.astype(np.int64).T) * a_[0, 0] + b_[:, 0] * x.sum(axis=1, keepdims=True)
    np.testing.assert_array_equal(y, exact.astype(np.float32))
    for n in (0, 4):
        np.testing.assert_array_equal(pw.matmul(x[n:n + 1]), exact[n:n + 1].astype(np.float32), err_msg=f"N=1 {n}")
