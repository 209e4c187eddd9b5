"""RSR / RSR++ (paper 003): the numpy algorithm, the native kernels on every ISA, k selection, the `rsr`
format and its model-directory round trip."""
import json
import warnings

import numpy as np
import pytest

import lowbit
from lowbit import _native
from lowbit.formats import Activations, from_state, quantize
from lowbit.formats.rsr import RSRWeight, check_index
from lowbit.formats.rsr_index import RSRIndex, code_terms, terms_matmul, ternary_terms
from lowbit.formats.rsr_tune import analytic_k, autotune, choose_k, tune_key, tune_path
from lowbit.formats.ternary import TernaryWeight

# (M, K, k): square, non-square, odd n and k, k wider than M, one row / one column
SHAPES = [(16, 16, 4), (37, 101, 3), (101, 37, 5), (5, 1, 2), (1, 9, 5), (3, 64, 7), (64, 300, 1)]


def special(kind, m, kk, rng, values):
    if kind == "random":
        return rng.choice(values, (m, kk))
    if kind == "zero":
        return np.zeros((m, kk), np.int64)
    if kind == "ones":
        return np.ones((m, kk), np.int64)
    eye = np.zeros((m, kk), np.int64)  # identity (rectangular)
    np.fill_diagonal(eye, 1)
    return eye


def dense(terms):
    return sum(c * idx.values[idx.digits()].astype(np.float64) for c, idx in terms)


@pytest.mark.parametrize("m,kdim,k", SHAPES)
@pytest.mark.parametrize("kind", ["random", "zero", "ones", "identity"])
def test_numpy_rsr_and_rsrpp_are_exact(rng, m, kdim, k, kind):
    x = rng.integers(-1000, 1000, (3, kdim))  # int64: exact
    t = special(kind, m, kdim, rng, [-1, 0, 1])
    b = special(kind, m, kdim, rng, [0, 1])
    c = special(kind, m, kdim, rng, [0, 1, 2, 3])
    cases = [(ternary_terms(t, k, "direct"), t), (ternary_terms(t, k, "planes"), t),
             (code_terms(b, 1, k), b), (code_terms(c, 2, k, "planes"), c)]
    if 4 ** k <= 1 << 16:
        cases.append((code_terms(c, 2, k, "direct"), c))
    for terms, a in cases:
        np.testing.assert_array_equal(dense(terms), a)  # the index is lossless
        for plus in (False, True):
            np.testing.assert_array_equal(terms_matmul(terms, x, plus), x @ a.T)  # GEMM
            np.testing.assert_array_equal(terms_matmul(terms, x[:1], plus), x[:1] @ a.T)  # GEMV


def test_index_structure_matches_the_paper():
    # Example 3.3 / Fig. 2 of the paper: block of two columns, rows 00, 00, 01, 01? -> full segmentation
    b = np.array([[0, 0, 1, 1, 1, 0], [0, 1, 1, 0, 0, 1]]).astype(np.uint8)  # digits [k=2 rows, K=6]
    idx = RSRIndex.build(b, 2, 2, (0, 1))
    keys = b[0].astype(int) * 2 + b[1]
    assert list(keys[idx.perm[0]]) == sorted(keys)  # binary row order
    assert list(idx.seg[0]) == [int(np.sum(keys < p)) for p in range(5)]  # full segmentation, S + 1 entries
    v = np.array([[3, 2, 4, 5, 9, 1]])
    u = idx.segmented_sums(v)[0, 0]
    assert list(u) == [sum(v[0, keys == p]) for p in range(4)]
    # RSR++'s folding and RSR's u . Bin_k agree
    np.testing.assert_array_equal(idx.block_product(u[None].astype(float), True), u[None] @ idx.bin_matrix())


def test_bad_indices_raise():
    with pytest.raises(ValueError, match="digit"):
        RSRIndex.build(np.full((2, 3), 3, np.uint8), 2, 3, (-1, 0, 1))
    with pytest.raises(ValueError, match="k="):
        RSRIndex.build(np.zeros((2, 3), np.uint8), 17, 2, (0, 1))
    with pytest.raises(ValueError, match="ternary"):
        ternary_terms(np.array([[2]]), 1)
    perm = np.zeros((1, 4), np.uint16)
    seg = np.array([[0, 2, 4]], np.uint16)
    check_index(perm, seg, 4)
    with pytest.raises(ValueError, match="corrupt"):
        check_index(perm + 4, seg, 4)
    with pytest.raises(ValueError, match="corrupt"):
        check_index(perm, np.array([[0, 3, 2]], np.uint16), 4)


def native(idx, x, plus, i8, coef=1.0, rowscale=None, sx=None):
    m, kdim = idx.shape
    y = np.full((x.shape[0], m), 0.5, np.float32)
    if i8:
        sx = np.ones(x.shape[0], np.float32) if sx is None else sx
        _native.rsr_gemm_i8(idx.perm, idx.seg, m, kdim, idx.k, idx.base, idx.values, x.astype(np.int8), sx, rowscale,
                            coef, False, plus, y)
    else:
        _native.rsr_gemm_f32(idx.perm, idx.seg, m, kdim, idx.k, idx.base, idx.values, x.astype(np.float32), rowscale,
                             coef, False, plus, y)
    return y


@pytest.mark.parametrize("m,kdim,k", SHAPES + [(70, 700, 2), (33, 650, 4)])
def test_native_every_isa_exact(isa, rng, m, kdim, k):
    # token counts: the GEMV path, one partial tile, several tiles with a ragged end; 12, 30, 45: the tiles of 16,
    # 32 and 48 tokens (int8; float: 16, 32, 48), which the AVX-512 step 1 runs as zmm plus an odd ymm
    for n in (1, 3, 12, 17, 30, 45, 70):
        x = rng.integers(-127, 128, (n, kdim))
        for kind in ("random", "zero", "ones"):  # zero / ones: one segment of all K rows (> 258: int16 flushes)
            t = special(kind, m, kdim, rng, [-1, 0, 1])
            c = special(kind, m, kdim, rng, [0, 1, 2, 3])
            indices = [ternary_terms(t, k)[0][1], code_terms(c, 1 if kind != "random" else 2, k, "planes")[0][1]]
            if 4 ** k <= 4096:
                indices.append(code_terms(c, 2, k, "direct")[0][1])
            for idx in indices:
                want = (x @ idx.values[idx.digits()].astype(np.int64).T).astype(np.float32)
                for plus in (True, False):
                    for i8 in (True, False):
                        np.testing.assert_array_equal(native(idx, x, plus, i8), want, err_msg=f"{isa} n={n} {kind}")


@pytest.mark.parametrize("m,kdim,k,kind", [(23, 5003, 10, "binary"), (9, 4099, 6, "ternary"), (5, 70001, 2, "ternary"),
                                           (7, 2053, 5, "int2")])
def test_native_gemv_long_rows_every_isa(isa, rng, m, kdim, k, kind):
    # one token: four prefix chains with a tail, uint16 perms read four at a time, and (K > 65536) uint32
    # perms and bounds; identity and all-ones rows put whole runs of K into one segment
    x = rng.integers(-127, 128, (1, kdim))
    for shape in ("random", "identity", "ones"):
        if kind == "binary":
            idx = code_terms(special(shape, m, kdim, rng, [0, 1]), 1, k)[0][1]
        elif kind == "ternary":
            idx = ternary_terms(special(shape, m, kdim, rng, [-1, 0, 1]), k)[0][1]
        else:
            idx = code_terms(special(shape, m, kdim, rng, [0, 1, 2, 3]), 2, k, "direct")[0][1]
        assert (idx.perm.dtype == np.uint32) == (kdim > 65536)
        want = (x @ idx.values[idx.digits()].astype(np.int64).T).astype(np.float32)
        for plus in (True, False):
            for i8 in (True, False):
                np.testing.assert_array_equal(native(idx, x, plus, i8), want, err_msg=f"{isa} {kind} {shape}")


def test_native_scales_and_accumulate(rng):
    idx = ternary_terms(rng.integers(-1, 2, (20, 50)), 3)[0][1]
    x = rng.integers(-127, 128, (5, 50))
    rs = rng.random(20).astype(np.float32)
    sx = rng.random(5).astype(np.float32)
    base = (x @ idx.values[idx.digits()].T).astype(np.float64)
    got = native(idx, x, True, True, coef=-2.0, rowscale=rs, sx=sx)
    np.testing.assert_allclose(got, -2.0 * base * rs[None] * sx[:, None], rtol=1e-6)
    y = np.ones((5, 20), np.float32)
    _native.rsr_gemm_i8(idx.perm, idx.seg, 20, 50, 3, 3, idx.values, x.astype(np.int8), sx, None, 1.0, True, True, y)
    np.testing.assert_allclose(y, 1.0 + base * sx[:, None], rtol=1e-6)


def test_native_rejects_bad_input(rng):
    idx = ternary_terms(rng.integers(-1, 2, (6, 10)), 2)[0][1]
    y = np.empty((1, 6), np.float32)
    q = np.zeros((1, 10), np.int8)
    args = (idx.perm, idx.seg, 6, 10, 2, 3, idx.values)
    with pytest.raises(ValueError, match="perm must be"):
        _native.rsr_gemm_i8(idx.perm[:2], idx.seg, 6, 10, 2, 3, idx.values, q, np.ones(1, np.float32), None, 1.0,
                            False, True, y)
    with pytest.raises(ValueError, match="seg must be"):
        _native.rsr_gemm_i8(idx.perm, np.ascontiguousarray(idx.seg[:, :5]), 6, 10, 2, 3, idx.values, q, np.ones(1, np.float32), None, 1.0,
                            False, True, y)
    with pytest.raises(ValueError, match="int16 bound"):
        _native.rsr_gemm_i8(*args, np.full((1, 10), -128, np.int8), np.ones(1, np.float32), None, 1.0, False, True, y)
    with pytest.raises(ValueError, match="integer digit values"):
        _native.rsr_gemm_i8(idx.perm, idx.seg, 6, 10, 2, 3, np.array([-1, 0.5, 1], np.float32), q,
                            np.ones(1, np.float32), None, 1.0, False, True, y)
    with pytest.raises(ValueError, match="y must be"):
        _native.rsr_gemm_f32(*args, np.zeros((2, 10), np.float32), None, 1.0, False, True, y)


def test_analytic_k():
    # eq. 7 (RSR++, base 2) and eq. 6 (RSR) by brute force over the paper's ranges
    for n in (2 ** 11, 2 ** 13, 2 ** 15):
        assert analytic_k(n, n, 2, True) == min(range(1, 16), key=lambda k: (n / k) * (n + 2 ** k))
        lg = np.log2(n)
        hi = int(np.floor(lg - np.log2(lg)))
        assert analytic_k(n, n, 2, False) == min(range(1, hi + 1), key=lambda k: (n / k) * (n + k * 2 ** k))
    assert analytic_k(2560, 2560, 3, True) == 6  # (2560 + 729) / 6 < (2560 + 243) / 5
    with pytest.raises(ValueError):
        choose_k(4, 4, 3, "fastest")


def test_autotune_candidates_keep_step2_buffer_in_cache():
    from lowbit.formats.rsr_tune import U_BYTES, candidates
    from lowbit.formats.rsr_tune import TILE_I8
    assert TILE_I8 == 64
    assert max(candidates(2560, 3, 1)) == 6 and max(candidates(2560, 3, 128)) == 5  # 3^5 x 64 x 4 B <= 64 KiB
    for n in (8, 32, 128, 512):
        assert all(3 ** k * min(n, TILE_I8) * 4 <= U_BYTES for k in candidates(2560, 3, n))


def test_autotune_is_cached_atomically(tmp_path, monkeypatch):
    monkeypatch.setenv("LOWBIT_CACHE", str(tmp_path))
    k = autotune(96, 3, 16, rounds=1)  # one real (native) timing round
    table = json.loads(tune_path().read_text())
    (key, entry), = table.items()
    assert entry["k"] == k and str(k) in entry["ns_per_row"] and "K96|b3|N16" in key
    entry["k"] = 1  # a cached answer is used as is
    tune_path().write_text(json.dumps(table))
    assert autotune(96, 3, 16) == 1 and choose_k(5, 96, 3, "auto", 16) == 1
    assert not list(tmp_path.glob(".rsr_tune.*"))  # no temp files left


def test_autotune_candidates_surround_the_analytic_optimum():
    from lowbit.formats.rsr_tune import candidates
    assert candidates(2560, 3, 1) == [4, 5, 6]   # eq. 7: k* = 6; 3^7 > K / 2
    assert candidates(2560, 3, 128) == [3, 4, 5]  # u [3^k][64-token tile] int32 <= 64 KiB caps the centre at 5
    assert candidates(2 ** 14, 2, 1) == [9, 10, 11, 12]  # k* = 11 (eq. 7, base 2), 2^12 segments at most
    assert candidates(8, 3, 1) == [1]


def test_autotune_median_of_interleaved_rounds_resists_outliers(tmp_path, monkeypatch):
    monkeypatch.setenv("LOWBIT_CACHE", str(tmp_path))
    order, calls = [], {}

    def cost(k):  # true cost minimal at k = 4; k = 3 gets one lucky (too fast) round, k = 4 one slow one
        order.append(k)
        calls[k] = calls.get(k, 0) + 1
        base = {3: 1.4, 4: 1.0, 5: 2.0}[k]
        if k == 3 and calls[k] == 3:
            return 0.1
        if k == 4 and calls[k] == 1:
            return 50.0
        return base

    assert autotune(2560, 3, 128, timer=cost, rounds=5) == 4
    assert order[:6] == [3, 4, 5, 3, 4, 5] and len(order) == 15  # interleaved rounds over the candidates
    entry = json.loads(tune_path().read_text())[tune_key(2560, 3, 128)]
    assert entry["k"] == 4 and entry["rounds"] == 5 and entry["ns_per_row"]["3"] == pytest.approx(1.4e9)
    # cached: no timing at all on the second call; a different N, ISA or thread count is a different key
    assert autotune(2560, 3, 128, timer=lambda k: 1 / 0) == 4
    assert autotune(2560, 3, 512, timer=lambda k: {3: 1.0, 4: 2.0, 5: 3.0}[k], rounds=3) == 3
    assert tune_key(2560, 3, 128) != tune_key(2560, 3, 512)
    old = _native.isa()
    try:
        _native.set_isa("scalar")
        assert tune_key(2560, 3, 128).split("|")[1] == "scalar"
        assert autotune(2560, 3, 128, timer=lambda k: {3: 3.0, 4: 2.0, 5: 1.0}[k], rounds=1) == 5
    finally:
        _native.set_isa(old)
    assert autotune(2560, 3, 128) == 4  # the avx2 answer was kept beside the scalar one
    # a refresh re-times; ties go to the larger k (fewer index bytes)
    assert autotune(2560, 3, 128, refresh=True, timer=lambda k: 1.0, rounds=1) == 5


def test_autotune_ignores_answers_of_the_old_tuner(tmp_path, monkeypatch):
    monkeypatch.setenv("LOWBIT_CACHE", str(tmp_path))
    old_key = f"{_native.rsr_path()}|t{_native.get_threads()}|K2560|b3|N128"  # the v1 key (no version, no ISA)
    tune_path().parent.mkdir(parents=True, exist_ok=True)
    tune_path().write_text(json.dumps({old_key: {"k": 2}}))
    assert autotune(2560, 3, 128, timer=lambda k: {3: 3.0, 4: 1.0, 5: 2.0}[k], rounds=1) == 4


@pytest.mark.parametrize("scale", ["row", "tensor"])
def test_format_matches_ternary_every_isa(isa, rng, scale):
    m, kdim = 70, 130
    w = rng.standard_normal((m, kdim)).astype(np.float32)
    pw = quantize(w, "rsr", scale=scale, k=4, min_tokens=4)
    tw = quantize(w, "ternary", scale=scale)
    np.testing.assert_array_equal(pw.dequantize(), tw.dequantize())
    for n in (1, 3, 4, 9):  # dense below min_tokens, the index from it on
        x = rng.standard_normal((n, kdim)).astype(np.float32)
        assert pw.uses_index(n) == (n >= 4)
        want = tw.matmul(x)
        np.testing.assert_allclose(pw.matmul(x), want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))
    vec = rng.standard_normal(kdim).astype(np.float32)
    assert pw.matmul(vec).shape == (m,)


def test_format_state_round_trip_without_copies(rng):
    pw = quantize(rng.standard_normal((40, 64)).astype(np.float32), "rsr", k=3)
    meta, tensors = pw.state()
    json.dumps(meta)
    back = from_state(meta, tensors)
    assert back.index.perm is tensors["perm"] and back.dense.codes is tensors["dense_codes"]
    x = Activations(rng.standard_normal((40, 64)).astype(np.float32))
    np.testing.assert_array_equal(back.matmul(x), pw.matmul(x))
    idx_only = quantize(rng.standard_normal((40, 64)).astype(np.float32), "rsr", k=3, dense=False)
    m2, t2 = idx_only.state()
    assert "dense_codes" not in t2 and from_state(m2, t2).uses_index(1)
    assert idx_only.nbytes == idx_only.index_nbytes + 40 * 4 == idx_only.decode_nbytes
    assert pw.decode_nbytes == pw.dense.nbytes < pw.nbytes
    with pytest.raises(ValueError, match="per-group"):
        quantize(np.ones((4, 64), np.float32), "rsr", group_size=32)
    bad = dict(tensors, perm=tensors["perm"] + np.uint16(64))
    with pytest.raises(ValueError, match="corrupt"):
        from_state(meta, bad)


def test_bitnet_converts_to_rsr_losslessly_and_generates_like_ternary(tmp_path, monkeypatch):
    from tests.io.tiny import tiny_config, write_bitnet_packed
    from lowbit.io.checkpoint import open_checkpoint
    from lowbit.io.convert import convert

    monkeypatch.setenv("LOWBIT_CACHE", str(tmp_path / "cache"))  # the autotune cache
    cfg = tiny_config(model_type="bitnet", hidden_act="relu2", tie_word_embeddings=True)
    src, truth = write_bitnet_packed(tmp_path / "src", cfg)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = convert(src, tmp_path / "rsr", format="rsr", progress=False)
    tern = convert(src, tmp_path / "ternary", format="ternary", progress=False)
    ck = open_checkpoint(out)
    for name, (t, _) in truth.items():
        got = ck.load(name)
        assert isinstance(got, RSRWeight) and isinstance(got.dense, TernaryWeight)
        np.testing.assert_array_equal(got.ternary(), t)
    a = lowbit.load(out).generate("The quick", max_tokens=6, temperature=0.0)
    b = lowbit.load(tern).generate("The quick", max_tokens=6, temperature=0.0)
    assert a == b


def test_default_k_is_fixed_unless_asked(rng, monkeypatch):
    w = rng.standard_normal((12, 40)).astype(np.float32)
    monkeypatch.delenv("LOWBIT_RSR_K", raising=False)
    assert quantize(w, "rsr").k == 5  # machine-independent bytes by default
    monkeypatch.setenv("LOWBIT_RSR_K", "3")
    assert quantize(w, "rsr").k == 3
    monkeypatch.setenv("LOWBIT_RSR_K", "analytic")
    assert quantize(w, "rsr").k == analytic_k(12, 40, 3)


def test_native_many_token_tiles_every_isa(isa, rng):
    t = rng.integers(-1, 2, (37, 301))
    for k in (3, 4):
        idx = ternary_terms(t, k)[0][1]
        for n in (150, 257):  # several int8 and float (64-token) tiles, ragged
            x = rng.integers(-127, 128, (n, 301))
            want = (x @ t.T).astype(np.float32)
            for i8 in (True, False):
                np.testing.assert_array_equal(native(idx, x, True, i8), want)
