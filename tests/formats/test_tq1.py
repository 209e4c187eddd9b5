"""tq1 (5 trits per byte): layout, exact decode, and every kernel path against a numpy reference."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import lowbit
from lowbit import _native
from lowbit.formats import Activations, from_state, get_format, quantize
from lowbit.formats.ternary import TernaryWeight
from lowbit.formats.tq1 import (KC, VALID_BYTES, TQ1Weight, decode_bytes, pack_tq1, padded_k, resolve_group,
                                unpack_tq1)

from .reference import int_matmul, quantize_activations

SHAPES = [(192, 576, 1), (1600, 576, 1), (100, 200, 3), (77, 130, 5), (250, 1024, 9)]


def reference(pw: TQ1Weight, x: np.ndarray) -> np.ndarray:
    """Independent of the packing: codes from the digits of v, scales from the packed float16."""
    q, sx, sq = quantize_activations(x, pw.kp, pw.group)
    a = pw.scales()
    return int_matmul(pw.unpacked_codes(), a, -a, pw.group, q, sx, sq)


def check(pw, x, isa):
    y = pw.matmul(x)
    ref = reference(pw, x)
    assert y.shape == ref.shape and y.dtype == np.float32
    tol = 1e-5 * max(float(np.abs(ref).max()), 1e-30)
    assert np.abs(y - ref).max() <= tol, f"{isa}: max err {np.abs(y - ref).max()} > {tol}"


@pytest.mark.parametrize("m,k,n", SHAPES)
@pytest.mark.parametrize("scale", ["tensor", "row"])
def test_matmul_every_isa(isa, rng, m, k, n, scale):
    w = rng.standard_normal((m, k)).astype(np.float32)
    pw = quantize(w, "tq1", scale=scale)
    x = rng.standard_normal((n, k)).astype(np.float32)
    check(pw, x, isa)
    check(pw, x[:1], isa)  # GEMV path


@pytest.mark.parametrize("group", [20, 60, 120])
def test_groups_every_isa(isa, rng, group):
    m, k = 130, 250
    pw = quantize(rng.standard_normal((m, k)).astype(np.float32), "tq1", group_size=group)
    assert pw.group == group and pw.ngroups == -(-pw.kp // group) and pw.meta_extra["scale_mode"] == "group"
    for n in (1, 2, 11):
        check(pw, rng.standard_normal((n, k)).astype(np.float32), isa)


def test_kernel_path_per_isa(isa, rng):
    pw = quantize(rng.standard_normal((64, 40)).astype(np.float32), "tq1")
    q, sx, sq = Activations(rng.standard_normal((1, 40)).astype(np.float32)).int8(pw.kp, pw.group)
    path, secs = _native.gemm_tq1([pw.native_args()], 64, pw.kp, pw.group, q, sx, sq, np.empty((1, 64), np.float32))
    vbmi_paths = {"amx": {"avx512-vbmi", "avx2"}, "avx512": {"avx512-vbmi", "avx2"}, "avxvnni": {"avx2"}, "avx2": {"avx2"}, "scalar": {"scalar"}}
    assert path in vbmi_paths[isa] and secs >= 0


def test_same_weights_as_ternary(rng):
    w = rng.standard_normal((150, 333)).astype(np.float32)
    for opts in ({}, {"scale": "row"}, {"group_size": 0}):
        t, p = TernaryWeight.quantize(w, **opts), TQ1Weight.quantize(w, **opts)
        np.testing.assert_array_equal(p.dequantize(), t.dequantize())
        np.testing.assert_array_equal(p.ternary(), t.unpacked_codes().astype(np.int8) - 1)


def test_every_byte_decodes_to_its_trits():
    v = np.arange(243)
    digits = np.stack([(v // 3 ** (4 - j)) % 3 for j in range(5)], axis=1)
    np.testing.assert_array_equal(decode_bytes(VALID_BYTES), digits)
    assert len(set(VALID_BYTES.tolist())) == 243
    # the native decoders agree on all 243 codes: one row block whose bytes run through every value
    m, k = 64, 20 * 16
    codes = np.resize(VALID_BYTES, 64 * k // 5).astype(np.uint8)
    pw = TQ1Weight((m, k), k, codes, np.ones(64, np.float16))
    x = np.random.default_rng(0).standard_normal((1, k)).astype(np.float32)
    for isa in _native.cpu_info()["available"]:
        lowbit.set_isa(isa)
        try:
            check(pw, x, isa)
            check(pw, np.repeat(x, 3, axis=0), isa)
        finally:
            lowbit.set_isa("auto")


def test_pack_unpack_round_trip(rng):
    for m, k in [(1, 1), (64, 20), (77, 130), (130, 576)]:
        codes = rng.integers(0, 3, size=(m, k), dtype=np.uint8)
        packed = pack_tq1(codes)
        assert packed.size == -(-m // 64) * padded_k(k) // KC * 256
        np.testing.assert_array_equal(unpack_tq1(packed, m, k), codes)


def test_layout_byte_position():
    """Byte p of tile t holds row 16t + p/4 at k = 4j + p%4 (digit j)."""
    m, k = 64, 40
    codes = np.zeros((m, k), np.uint8)
    codes[16 * 2 + 5, 20 + 4 * 3 + 1] = 2  # tile 2, row 5, chunk 1, j = 3, kk = 1
    packed = pack_tq1(codes).reshape(1, 2, 4, 64)
    nz = np.argwhere(packed)
    assert nz.tolist() == [[0, 1, 2, 5 * 4 + 1]]
    np.testing.assert_array_equal(decode_bytes(packed[0, 1, 2, 21]), [0, 0, 0, 2, 0])


def test_state_round_trip_zero_copy(rng):
    pw = quantize(rng.standard_normal((70, 576)).astype(np.float32), "tq1", scale="row")
    meta, tensors = pw.state()
    back = from_state(meta, tensors)
    assert isinstance(back, TQ1Weight) and back.shape == pw.shape and back.group == pw.group
    assert np.shares_memory(back.codes, pw.codes) and np.shares_memory(back.scale, pw.scale)
    assert meta["scale_mode"] == "row" and back.meta_extra == pw.meta_extra
    x = rng.standard_normal((2, 576)).astype(np.float32)
    np.testing.assert_array_equal(back.matmul(x), pw.matmul(x))


def test_bits_per_weight(rng):
    pw = TQ1Weight.from_ternary(rng.integers(-1, 2, size=(4096, 4100)).astype(np.int8), 0.5)
    assert 1.6 <= pw.bits_per_weight < 1.605
    assert get_format("tq1") is TQ1Weight


def test_bad_arguments_raise_value_error(rng):
    pw = quantize(rng.standard_normal((64, 40)).astype(np.float32), "tq1")
    q, sx, sq = Activations(rng.standard_normal((1, 40)).astype(np.float32)).int8(pw.kp, pw.group)
    y = np.empty((1, 64), np.float32)
    with pytest.raises(ValueError, match="Kp must be"):
        _native.gemm_tq1([pw.native_args()], 64, 50, 50, q, sx, sq, y)
    with pytest.raises(ValueError, match="packed codes"):
        _native.gemm_tq1([(pw.codes[:-1], pw._scale_u16)], 64, pw.kp, pw.group, q, sx, sq, y)
    with pytest.raises(ValueError, match="output"):
        _native.gemm_tq1([pw.native_args()], 64, pw.kp, pw.group, q, sx, sq, np.empty((2, 64), np.float32))
    with pytest.raises(ValueError, match="multiple of 20"):
        resolve_group(64, 200)
    with pytest.raises(ValueError, match="ternary"):
        TQ1Weight.from_ternary(np.full((2, 3), 2, np.int8), 1.0)


@settings(max_examples=25, deadline=None, derandomize=True)  # reproducible in CI
@given(m=st.integers(1, 150), k=st.integers(1, 300), n=st.integers(1, 6), seed=st.integers(0, 2**31),
       group=st.sampled_from([None, 20, 40, 100]))
def test_property_random_shapes(m, k, n, seed, group):
    rng = np.random.default_rng(seed)
    pw = quantize(rng.standard_normal((m, k)).astype(np.float32), "tq1", group_size=group)
    x = rng.standard_normal((n, k)).astype(np.float32)
    np.testing.assert_array_equal(pw.dequantize(), pw.ternary() * pw.scales()[:, np.arange(k) // pw.group])
    check(pw, x, lowbit.cpu_info()["isa"])
