"""Native quantizers (kernels/quantize.cpp) against the numpy references: bit-identical packed output
(codes, scales, offsets) on every format with a native path, odd shapes, every ISA this CPU has,
float32 / float16 / bf16 sources and row permutations."""
import numpy as np
import pytest

from lowbit import _native
from lowbit.formats import FORMATS
from lowbit.formats.base import SourceRows


NATIVE = {
    "int8": [{}, {"group_size": None}, {"group_size": 64}],
    "int4": [{}, {"group_size": 64}, {"group_size": None}, {"symmetric": True}],
    "int6": [{}, {"group_size": 64}, {"group_size": None}],
    "int2": [{}, {"group_size": 32}, {"symmetric": True}],
    "binary": [{}, {"group_size": 32}, {"group_size": 96}],
    "ternary": [{}, {"scale": "row"}, {"group_size": 64}, {"group_size": 32}],
    "tq1": [{}, {"scale": "row"}, {"group_size": 40}, {"group_size": 20}],
}
SHAPES = [(1, 1), (3, 31), (65, 100), (70, 200), (129, 257)]


def same_state(a, b):
    ma, ta = a.state()
    mb, tb = b.state()
    assert ma == mb
    assert ta.keys() == tb.keys()
    for k in ta:
        np.testing.assert_array_equal(ta[k].view(np.uint8), tb[k].view(np.uint8), err_msg=k)


def weights(shape, seed):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(shape).astype(np.float32) * rng.uniform(0.01, 3, size=(shape[0], 1)).astype(np.float32)
    w[0, : shape[1] // 3] = 0  # an all-zero stretch (a = 0 groups)
    if shape[1] > 40:
        w[-1, 5:40] = 1e-9  # tiny values: scales underflow float16
    return w


@pytest.mark.parametrize("fmt", list(NATIVE))
@pytest.mark.parametrize("shape", SHAPES)
def test_native_equals_reference(isa, fmt, shape):
    cls = FORMATS[fmt]
    w = weights(shape, shape[0] * 1000 + shape[1] + len(fmt))
    for opts in NATIVE[fmt]:
        same_state(cls.quantize(w, **opts), cls.quantize_reference(w, **opts))


def ternary_valued(shape, seed, per_row=False):
    """{-s, 0, +s} weights (an F16 export of a ternary model): one s, or one per row; row 1 all zero."""
    rng = np.random.default_rng(seed)
    s = rng.uniform(0.01, 2, size=(shape[0], 1)) if per_row else np.full((shape[0], 1), 0.37)
    w = (rng.integers(-1, 2, size=shape) * s).astype(np.float32)
    if shape[0] > 1:
        w[1] = 0
    return w


@pytest.mark.parametrize("fmt", ["ternary", "tq1", "binary"])
@pytest.mark.parametrize("shape", [(3, 31), (70, 200)])
def test_native_keeps_exact_levels(isa, fmt, shape):
    cls = FORMATS[fmt]
    for w in (ternary_valued(shape, 1), ternary_valued(shape, 2, per_row=True), np.sign(weights(shape, 3)) * 0.5):
        w = np.ascontiguousarray(w, np.float32)
        for opts in NATIVE[fmt]:
            same_state(cls.quantize(w, **opts), cls.quantize_reference(w, **opts))


@pytest.mark.parametrize("fmt", list(NATIVE))
def test_float16_bf16_and_permuted_sources(isa, fmt):
    cls = FORMATS[fmt]
    w = weights((67, 130), 5)
    h = w.astype(np.float16)
    same_state(cls.quantize(h), cls.quantize_reference(h.astype(np.float32)))
    bits = (w.view(np.uint32) >> 16).astype(np.uint16)
    as_f32 = (bits.astype(np.uint32) << 16).view(np.float32)
    same_state(cls.quantize(SourceRows(bits, "bf16")), cls.quantize_reference(as_f32))
    rows = np.random.default_rng(0).permutation(67)
    same_state(cls.quantize(SourceRows(w, rows=rows)), cls.quantize_reference(w[rows]))
    ro = w.copy()
    ro.flags.writeable = False  # a read-only mmap view
    same_state(cls.quantize(ro), cls.quantize_reference(w))


@pytest.mark.parametrize("fmt", list(NATIVE))
def test_bad_input(fmt):
    cls = FORMATS[fmt]
    for bad in (np.nan, np.inf, -np.inf):
        w = np.ones((70, 33), np.float32)
        w[69, 32] = bad
        with pytest.raises(ValueError, match="NaN or Inf"):
            cls.quantize(w)
    with pytest.raises(ValueError, match="2-D"):
        cls.quantize(np.ones(5, np.float32))
    with pytest.raises(ValueError, match="non-empty"):
        cls.quantize(np.ones((0, 5), np.float32))


def test_binding_checks():
    codes, scale = np.empty(64 * 64 // 2, np.uint8), np.empty(2 * 64, np.uint16)
    r = np.zeros(1)
    w = np.ones((3, 64), np.float32)
    with pytest.raises(ValueError, match="codes"):
        _native.quantize_int(w, 0, 3, 64, None, 1, 4, 32, True, r, codes[:-1], scale, None)
    with pytest.raises(ValueError, match="group"):
        _native.quantize_int(w, 0, 3, 64, None, 1, 4, 0, True, r, codes, scale, None)
    with pytest.raises(ValueError, match="row index"):
        _native.quantize_int(w, 0, 3, 64, np.array([0, 1, 3]), 1, 4, 32, True, r, codes, scale, None)
    with pytest.raises(ValueError, match="dtype"):
        _native.quantize_int(w.astype(np.float64), 0, 3, 64, None, 1, 4, 32, True, r, codes, scale, None)


def test_f64_to_f16_matches_numpy():
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.standard_normal(3000) * s for s in (1e-8, 1e-6, 1e-3, 1, 1e3, 7e4)])
    x = np.concatenate([x, [0.0, 65504.0, 65519.99, 65520.0, 2.0 ** -25, 3 * 2.0 ** -25, 1 + 2.0 ** -11]])
    with np.errstate(over="ignore"):
        want = x.astype(np.float16).view(np.uint16)
    got = np.array([_native.f64_to_f16(float(v)) for v in x], np.uint16)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("fmt", ["int4", "int2"])
def test_affine_search_eight_groups_at_once(isa, fmt):
    """The AVX2 search runs 8 groups per pass (group <= 128): wide rows, every such group size and one beyond,
    scales that round to float16 subnormals or overflow to inf, groups of signed zeros and near-ties."""
    cls = FORMATS[fmt]
    rng = np.random.default_rng(11)
    w = (rng.standard_normal((9, 1536)) * 0.02).astype(np.float32)
    w[1] *= 1e-4  # scales around float16's subnormals
    w[2, :700] *= 3e4  # scales past 65504: inf
    w[3, :64] = np.where(rng.random(64) < 0.5, -0.0, 0.0)  # signed zeros: the min's sign is the offset's
    w[3, 64:128] = np.abs(w[3, 64:128]) * np.where(rng.random(64) < 0.3, 0.0, 1.0)
    w[3, 128:160] = -np.abs(w[3, 128:160])
    w[3, 160:192] = np.float32(-0.0)
    w[4] = np.round(w[4] * 1000) / 1000  # values on a grid: ties in the error search
    w[5] = np.linspace(-1, 1, 1536, dtype=np.float32)
    for opts in ({"group_size": 32}, {"group_size": 64}, {"group_size": 96}, {"group_size": 128}, {"group_size": 160},
                 {"group_size": 32, "symmetric": True}, {"group_size": 128, "symmetric": True}):
        same_state(cls.quantize(w, **opts), cls.quantize_reference(w, **opts))


@pytest.mark.parametrize("fmt", ["ternary", "tq1"])
def test_ternary_scale_below_float16_is_clamped(isa, fmt):
    """A ternary-valued unit whose own s is below float16's range (1e-9) keeps the smallest float16 scale 2^-24,
    never 0 (w / 0 was inf, 0 / 0 NaN): native and numpy give the same bits and finite, exact-zero-aware codes."""
    cls = FORMATS[fmt]
    w = ternary_valued((5, 120), 3)
    w[2] *= np.float32(1e-9 / 0.37)  # row 2: {-1e-9, 0, 1e-9}
    for opts in ({"scale": "row"}, {"group_size": 40 if fmt == "tq1" else 32}):
        got, want = cls.quantize(w, **opts), cls.quantize_reference(w, **opts)
        same_state(got, want)
        assert np.all(got.dequantize()[2] == 0)  # 1e-9 / 2^-24 rounds to 0: the row stays (almost exactly) zero
        scales = np.asarray(got.scale, np.float32).reshape(-1, got.ngroups, 64)[0, :, :5]  # [G, rows]
        assert np.all(scales > 0) and np.all(scales[:, 2] == np.float32(2.0 ** -24))
    with pytest.raises(ValueError, match="finite and > 0"):
        _native.ternary_pack(w, 0, 5, 120, None, np.zeros(5, np.float32), 128, False,
                             np.empty(128 * 16, np.uint8), np.empty(64, np.uint16))


@pytest.mark.parametrize("bits", [1, 2, 4, 8])
def test_native_pack_codes_equals_reference(bits):
    """pack_codes (native, used by from_codes: e.g. a TQ2_0 GGUF's codes -> ternary) == the numpy reference."""
    from lowbit.formats.intcodes import pack_codes, pack_codes_reference

    rng = np.random.default_rng(bits)
    for shape in SHAPES + [(200, 1000)]:
        codes = rng.integers(0, 1 << bits, shape, dtype=np.uint8)
        np.testing.assert_array_equal(pack_codes(codes, bits), pack_codes_reference(codes, bits))
    with pytest.raises(ValueError, match="wrong size"):
        _native.pack_codes(np.zeros((3, 5), np.uint8), 3, 5, 2, np.empty(7, np.uint8))
