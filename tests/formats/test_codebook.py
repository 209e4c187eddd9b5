"""codebook (AQLM codes, CodeGEMM Psumbook): layout, both kernels against the numpy dequantize reference on
odd shapes and every ISA, the quantizer's error against bits per weight, determinism, state round trip."""
import numpy as np
import pytest

import lowbit

from lowbit.formats import from_state, get_format, quantize
from lowbit import _native
from lowbit.formats.codebook import (CodebookWeight, codes16_bytes, pack_codes, pack_codes16, parse_spec, unpack_codes,
                                    unpack_codes16)
from lowbit.formats.codebook_quant import fit_codebooks

ISAS = _native.cpu_info()["available"]

# (m, v, b, g, M, K): the paper's two settings, a ~3-bit one, small tables (b < 3 takes the non-SIMD table
# build), v not a power of two, K not a multiple of v or g (a partial last group), M not a multiple of 8, and
# b = 8 with more than 4 blocks of 64 rows (the VBMI kernel's runs of 4 blocks and its tail).
CASES = [(1, 4, 8, 128, 70, 300), (2, 8, 8, 128, 33, 256), (3, 8, 8, 64, 9, 200), (2, 3, 5, 12, 13, 37),
         (1, 2, 2, 8, 5, 21), (1, 4, 6, 1024, 17, 96), (1, 4, 8, 128, 333, 300), (2, 8, 8, 64, 300, 520)]


def random_parts(rng, m, v, b, g, rows, k):
    """A packed weight with random codes, scales and codebooks (no fitting: fast, every code value used)."""
    kp = -(-k // v) * v
    group = min(g, kp)
    idx = rng.integers(0, 1 << b, size=(rows, kp // v, m), dtype=np.uint8)
    s = rng.uniform(0.5, 2.0, size=(rows, -(-kp // group))).astype(np.float16).astype(np.float32)
    books = rng.standard_normal((m, 1 << b, v)).astype(np.float16).astype(np.float32)
    return CodebookWeight.from_parts(idx, s, books, group, k=k)


@pytest.mark.parametrize("m,v,b,g,rows,k", CASES)
def test_pack_roundtrip(rng, m, v, b, g, rows, k):
    pw = random_parts(rng, m, v, b, g, rows, k)
    idx = pw.unpacked_codes()
    assert np.array_equal(unpack_codes(pack_codes(idx, pw.group, v), rows, pw.kp // v, m, pw.group, v), idx)


@pytest.mark.parametrize("m,v,b,g,rows,k", [c for c in CASES if c[2] != 4])
def test_state_of_the_8_row_layout_is_repacked(rng, m, v, b, g, rows, k):
    # a state written before the 64-row blocks: codes [G][ceil(M/8)][S_g][m][8], scales [G][ceil(M/8)*8], no
    # "code_block" in its meta
    from lowbit.formats.codebook import _pack_rows
    pw = random_parts(rng, m, v, b, g, rows, k)
    meta, tensors = pw.state()
    assert meta.pop("code_block") == 64
    old_rows = -(-rows // 8) * 8
    scale = pw.scale.reshape(pw.ngroups, -1)[:, :old_rows].reshape(-1)
    old = {"codes": _pack_rows(pw.unpacked_codes(), pw.group, v, 8), "scale": scale, "codebooks": tensors["codebooks"]}
    back = from_state(meta, old)
    assert np.array_equal(back.codes, pw.codes) and np.array_equal(back.scale, pw.scale)
    assert np.array_equal(back.dequantize(), pw.dequantize())


@pytest.mark.parametrize("m,v,b,g,rows,k", CASES)
@pytest.mark.parametrize("n", [1, 3, 21])
def test_kernels_match_dequantize_every_isa(isa, rng, m, v, b, g, rows, k, n):
    pw = random_parts(rng, m, v, b, g, rows, k)
    x = rng.standard_normal((n, k)).astype(np.float32)
    w = pw.dequantize().astype(np.float64)
    ref = x.astype(np.float64) @ w.T
    # Tables and accumulators are float32 (no activation or psum quantization): each output is a sum of
    # K*m float32 products, so its error is bounded by ~K*m*eps32 * sum|w x|; 1e-5 of that bound is ~100x slack.
    bound = np.abs(x.astype(np.float64)) @ np.abs(w).T
    tol = 2e-5 * bound + 1e-6
    for psum in (True, False):
        y = pw.matmul_kernel(x, psum)
        assert y.shape == (n, rows) and y.dtype == np.float32
        err = np.abs(y - ref)
        if psum and int8_psums(pw):
            # b = 8 on AVX-512 VBMI: int8 tables (the b = 4 scheme): within the psum-quantization bound, equal to
            # the numpy int8 emulation up to float rounding
            emu, bound, slack = int8_psum_reference(pw, x)
            assert np.all(err <= bound + tol), f"{isa} psum: max err/bound {(err / (bound + tol)).max()}"
            assert np.all(np.abs(y - emu) <= slack + tol), f"{isa} psum vs int8 emulation: {np.abs(y - emu).max()}"
            assert np.sqrt(np.mean(err ** 2)) < 0.05 * np.sqrt(np.mean(ref ** 2))
            continue
        assert np.all(err <= tol), f"{isa} psum={psum}: max err {err.max()} (tol {tol.max()})"
    if int8_psums(pw):
        np.testing.assert_allclose(pw.matmul(x[0]), pw.matmul_kernel(x[:1], True)[0], rtol=0, atol=float(tol.max()))
    else:
        np.testing.assert_allclose(pw.matmul(x[0]), ref[0], rtol=0, atol=float(tol.max()))


def int8_psums(pw) -> bool:
    """Whether this weight's Psumbook kernel on the active ISA uses int8 tables: b = 4 everywhere, b = 8 on the
    AVX-512 VBMI path."""
    if pw.b == 4:
        return True
    if pw.b != 8:
        return False
    x = np.zeros((1, pw.kp), np.float32)
    y = np.empty((1, pw.shape[0]), np.float32)
    path, _ = lowbit._native.gemm_codebook([pw.native_args()], pw._cbT, pw._cb, pw.shape[0], pw.kp, pw.group, x, y,
                                           True, 1)
    return path == "avx512vbmi"


def test_error_falls_as_bits_rise(rng):
    w = (rng.standard_normal((64, 512)) * rng.uniform(0.2, 2.0, size=(64, 1))).astype(np.float32)
    errs = []
    for m, v in [(1, 8), (1, 4), (3, 8)]:  # ~1.1, ~2.1, ~3.1 bits per weight
        pw = quantize(w, "codebook", m=m, v=v, b=8, g=128, iters=3)
        errs.append(float(np.mean((pw.dequantize() - w) ** 2) / np.mean(w ** 2)))
    assert errs[0] > errs[1] > errs[2], errs
    assert errs[1] < 0.2, errs  # 2 bits of a Gaussian: a uniform 2-bit grid gives ~0.12


def test_refinement_beats_kmeans_init(rng):
    w = rng.standard_normal((32, 512)).astype(np.float32)
    e = [np.mean((quantize(w, "codebook", m=2, v=8, b=6, g=128, iters=it).dequantize() - w) ** 2) for it in (0, 3)]
    assert e[1] < e[0], e


def test_importance_weights_the_error(rng):
    w = rng.standard_normal((64, 256)).astype(np.float32)
    imp = np.ones(256, np.float32)
    imp[:32] = 100.0  # 32 important input channels
    plain = quantize(w, "codebook", m=1, v=4, b=6, g=64)
    weighted = quantize(w, "codebook", m=1, v=4, b=6, g=64, importance=imp)
    err = lambda pw: float(np.mean((pw.dequantize()[:, :32] - w[:, :32]) ** 2))
    assert err(weighted) < err(plain)


def test_quantize_is_deterministic(rng):
    w = rng.standard_normal((40, 200)).astype(np.float32)
    a = quantize(w, "codebook", m=2, v=8, b=6, g=64, seed=3)
    b = quantize(w, "codebook", m=2, v=8, b=6, g=64, seed=3)
    for x, y in zip(a.state()[1].values(), b.state()[1].values()):
        assert np.array_equal(x, y)


def test_bits_per_weight_and_state_is_zero_copy(rng):
    pw = random_parts(rng, 1, 4, 8, 128, 256, 1024)
    assert pw.nominal_bpw == pytest.approx(2.125)
    assert pw.bits_per_weight == pytest.approx(2.125 + pw.codebook_bpw)
    meta, tensors = pw.state()
    back = from_state(meta, tensors)
    assert isinstance(back, CodebookWeight) and back.shape == pw.shape
    assert all(np.shares_memory(getattr(back, n), tensors[n]) for n in ("codes", "scale", "codebooks"))
    assert np.array_equal(back.dequantize(), pw.dequantize())


def test_spec_names():
    assert parse_spec("codebook-m2v8b8g128") == {"m": 2, "v": 8, "b": 8, "g": 128}
    assert parse_spec("codebook") == {"m": 1, "v": 4, "b": 8, "g": 128}
    assert parse_spec("int4") is None
    assert get_format("codebook") is CodebookWeight


def test_bad_parameters_raise(rng):
    w = rng.standard_normal((8, 64)).astype(np.float32)
    with pytest.raises(ValueError, match="multiple of v"):
        quantize(w, "codebook", v=4, g=30)
    with pytest.raises(ValueError, match="b \\(bits"):
        quantize(w, "codebook", b=9)
    pw = random_parts(rng, 1, 4, 8, 128, 8, 64)
    with pytest.raises(ValueError, match="K=64"):
        pw.matmul(np.zeros((1, 65), np.float32))
    meta, t = pw.state()
    with pytest.raises(ValueError, match="packed codes"):
        from_state(meta, {**t, "codes": t["codes"][:-1]})
    books = t["codebooks"].copy()
    books[0, 3, 1] = np.nan
    with pytest.raises(ValueError, match="NaN or Inf"):
        from_state(meta, {**t, "codebooks": books})


# b == 4: the register-table layout (32-row tiles, nibble codes, int8 psums). Odd pair counts (m3 v4 g12: 9
# pairs, padded), a partial last group, M not a multiple of 32, and m8 v1 g64 (512 pairs per group: the int16
# accumulators are flushed every 256 pairs).
LUT4_CASES = [(4, 8, 4, 128, 70, 300), (2, 4, 4, 128, 33, 256), (3, 4, 4, 12, 37, 50), (1, 2, 4, 8, 5, 21),
              (8, 1, 4, 64, 40, 130), (6, 8, 4, 64, 64, 192)]


def lut4_scales(T):
    """kernels/codebook.h's int8 psum scales of one token and group: T float32 [P, nc] (P pairs, unpadded) ->
    (inv [P] float32: the pairs' table multipliers inv0 * 2^e_q, mult [P]: the int multipliers 2^(E - e_q),
    unit d = mx / 127 / 2^E), computed as the kernels do, in float32."""
    P = T.shape[0]
    mxq = np.abs(T).max(axis=1).astype(np.float32)
    mx = np.float32(mxq.max(initial=0.0))
    inv0 = np.float32(127.0) / mx if mx > 0 else np.float32(0.0)
    pp = P + P % 2
    a_sums = [int(np.ceil(mxq[q0:q0 + 256] * inv0).sum()) for q0 in range(0, pp, 256)]
    width = min(pp, 256)
    E = next(e for e in range(7, -1, -1) if (2 * max(a_sums) + width) << e <= 65534 or e == 0)
    with np.errstate(divide="ignore"):
        quot = np.where(mxq > 0, mx / np.where(mxq > 0, mxq, 1), np.inf).astype(np.float32)
    ex = np.frexp(quot)[1] - 1  # floor(log2(quot)) for finite quot
    e = np.where(np.isfinite(quot), np.clip(ex, 0, E), E).astype(np.int64)
    inv = (inv0 * np.exp2(e)).astype(np.float32)
    return inv, np.exp2(E - e), float(mx) / 127.0 / 2.0 ** E


def int16_operand_tables(pw, xs):
    """The VBMI kernel's tables from int16 operands (codebook_vbmi.cpp build_tables_i16, b = 8 with v = 4 or 8): the
    codebooks int16 per codebook, each segment's activations int16 on their own scale (both on kQ = 16383 steps),
    the integer dots scaled back, in the kernel's float32 operations. xs [n, S_g, v] float32 -> T [n, S_g, m, nc]."""
    f = np.float32
    kq = f(16383)
    cb = pw._cb.astype(f)  # [m][nc][v]
    cmx = np.abs(cb).reshape(pw.m, -1).max(axis=1)
    cinv = np.where(cmx > 0, kq / np.where(cmx > 0, cmx, f(1)), f(0)).astype(f)
    cbq = np.rint(cb * cinv[:, None, None]).astype(np.int64)
    scb = (cmx / kq).astype(f)
    xmx = np.abs(xs).max(axis=2)  # [n, S_g]: one scale a segment
    xinv = np.where(xmx > 0, kq / np.where(xmx > 0, xmx, f(1)), f(0)).astype(f)
    xq = np.rint(xs * xinv[:, :, None]).astype(np.int64)
    tint = np.einsum("icv,nsv->nsic", cbq, xq)
    assert np.abs(tint).max(initial=0) < 2 ** 31
    sc = ((xmx / kq).astype(f)[:, :, None] * scb[None, None, :]).astype(f)  # [n, S_g, m]
    return (tint.astype(f) * sc[..., None]).astype(f)


def int8_psum_reference(pw, x):
    """The int8-psum product in numpy (float32 tables quantized with the kernels' per-pair power-of-two scales,
    lut4_scales) and the error bound of the psum quantization: per output sum_grp |s[r, grp]| * sum_q quantum_q / 2,
    quantum_q = d * mult_q, plus, where the tables come from int16 operands (b = 8, v = 4 or 8: the VBMI kernel), their
    entries' distance from the exact ones; returns also the one-quantum-per-group slack of table entries at rounding
    ties."""
    operands_i16 = pw.b == 8 and pw.v in (4, 8)
    n = x.shape[0]
    xp = pw.padded_input(x)
    idx = pw.unpacked_codes().astype(np.int64)  # [M, nseg, m]
    s = pw.scales()  # [M, G]
    S = pw.group // pw.v
    y = np.zeros((n, pw.shape[0]))
    bound = np.zeros((n, pw.shape[0]))
    slack = np.zeros((n, pw.shape[0]))
    for grp in range(pw.ngroups):
        segs = range(grp * S, min((grp + 1) * S, pw.kp // pw.v))
        xs = xp[:, grp * pw.group:grp * pw.group + len(segs) * pw.v].reshape(n, len(segs), pw.v)
        T = np.einsum("icv,nsv->nsic", pw._cb, xs).astype(np.float32)  # [n, S_g, m, nc]
        sel = idx[:, segs.start:segs.stop]  # [M, S_g, m]
        if operands_i16:
            exact, T = T, int16_operand_tables(pw, xs.astype(np.float32))
            for t in range(n):
                for i in range(pw.m):
                    dt = np.abs(T[t, :, i, :] - exact[t, :, i, :]).astype(np.float64)  # [S_g, nc]
                    bound[t] += np.abs(s[:, grp]) * np.take_along_axis(dt[None], sel[:, :, i, None], axis=2)[..., 0].sum(axis=1)
        for t in range(n):
            inv, mult, d = lut4_scales(T[t].reshape(-1, pw.nc))
            Tq = (np.rint(T[t].reshape(-1, pw.nc) * inv[:, None]) * mult[:, None]).reshape(len(segs), pw.m, pw.nc)
            acc = np.zeros(pw.shape[0])
            for i in range(pw.m):
                acc += np.take_along_axis(Tq[None, :, i, :], sel[:, :, i, None], axis=2)[..., 0].sum(axis=1)
            y[t] += acc * d * s[:, grp]
            bound[t] += np.abs(s[:, grp]) * d * mult.sum() / 2
            slack[t] += np.abs(s[:, grp]) * d * mult.max()
    return y, bound, slack


def test_lut4_scales_keep_small_tables_precise_and_int16_safe():
    rng = np.random.default_rng(3)
    T = (rng.standard_normal((64, 16)) * np.exp2(-rng.integers(0, 9, size=(64, 1)))).astype(np.float32)
    T[5] *= 0  # a zero table
    inv, mult, d = lut4_scales(T)
    q = np.rint(T * inv[:, None])
    assert np.abs(q).max() <= 127 and mult.max() <= 128
    assert np.abs(q * mult[:, None]).max(axis=1).sum() <= 32767  # the accumulated worst case fits int16
    err = np.abs(q * mult[:, None] * d - T).max(axis=1)
    single = np.abs(T).max() / 127 / 2  # the single-scale (one d per group) worst error
    assert np.all(err <= d * mult / 2 * (1 + 1e-6))
    small = np.abs(T).max(axis=1) < np.abs(T).max() / 8
    assert np.all(err[small] <= single / 4 + 1e-12)  # tables 8x smaller than the largest: >= 4x finer steps
    # one table holds all the energy: the others get the finest step, 2^7 below the single scale
    T2 = np.zeros((64, 16), np.float32)
    T2[0] = 100.0
    T2[1:, 0] = 0.01
    inv2, mult2, d2 = lut4_scales(T2)
    assert mult2[0] == 128 and np.all(mult2[1:] == 1) and d2 == pytest.approx(100.0 / 127 / 128)


@pytest.mark.parametrize("m,v,b,g,rows,k", LUT4_CASES)
def test_lut4_pack_roundtrip(rng, m, v, b, g, rows, k):
    pw = random_parts(rng, m, v, b, g, rows, k)
    assert pw.tile == 32 and pw.codes.size == (-(-rows // 32)) * 32 * sum(
        -(-min(pw.group // v, pw.kp // v - s0) * m // 2) for s0 in range(0, pw.kp // v, pw.group // v))
    idx = pw.unpacked_codes()
    assert idx.max() <= 15
    assert np.array_equal(unpack_codes(pack_codes(idx, pw.group, v, 4), rows, pw.kp // v, m, pw.group, v, 4), idx)


@pytest.mark.parametrize("m,v,b,g,rows,k", LUT4_CASES + [(2, 4, 4, 128, 100, 4100)])
def test_codes16_layout(rng, m, v, b, g, rows, k):
    # the AVX-512 layout (16-row blocks, pairs padded to 8 per group): numpy round trip, and the native repack
    # of the nibble layout gives numpy's bytes (pad pairs and pad rows code 0)
    pw = random_parts(rng, m, v, b, g, rows, k)
    idx = pw.unpacked_codes()
    c16 = pack_codes16(idx, pw.group, v)
    assert c16.size == codes16_bytes(rows, pw.kp, m, v, pw.group)
    assert np.array_equal(unpack_codes16(c16, rows, pw.kp // v, m, pw.group, v), idx)
    out = np.full(c16.size, 0xAB, np.uint8)
    _native.codebook_codes16(pw.codes, rows, pw.kp, pw.group, m, v, out)
    assert np.array_equal(out, c16)
    with pytest.raises(ValueError, match="wrong size"):
        _native.codebook_codes16(pw.codes, rows, pw.kp, pw.group, m, v, out[:-1])


def test_codes16_feeds_the_avx512_kernel(rng):
    # on a VBMI CPU the b = 4 weight carries codes16, and the avx512 level reads the codes from it (a copy with
    # other codes gives other outputs) with the AVX2 kernel's bits; elsewhere there is no second copy
    pw = random_parts(rng, 2, 4, 4, 128, 70, 300)
    x = rng.standard_normal((3, 300)).astype(np.float32)
    if "avx512" not in ISAS or not _native.cpu_info()["features"]["avx512_vbmi"]:
        assert pw.codes16 is None
        return
    assert pw.codes16 is not None and pw.native_args()[2] is pw.codes16
    try:
        lowbit.set_isa("avx2")
        ref = pw.matmul_kernel(x, True)
        lowbit.set_isa("avx512")
        for n in (1, 3):
            assert np.array_equal(pw.matmul_kernel(x[:n], True), ref[:n])
        y = np.empty((3, 70), np.float32)
        other = np.zeros_like(pw.codes16)
        _native.gemm_codebook([(pw.codes, pw._scale_u16, other)], pw._cbT, pw._cb, 70, pw.kp, pw.group, x, y, True)
        assert not np.allclose(y, ref)
        with pytest.raises(ValueError, match="codes16"):
            _native.gemm_codebook([(pw.codes, pw._scale_u16, other[:-1])], pw._cbT, pw._cb, 70, pw.kp, pw.group, x, y, True)
    finally:
        lowbit.set_isa("auto")


@pytest.mark.parametrize("m,v,b,g,rows,k", LUT4_CASES)
@pytest.mark.parametrize("n", [1, 5, 20])
def test_lut4_kernels_every_isa(isa, rng, m, v, b, g, rows, k, n):
    pw = random_parts(rng, m, v, b, g, rows, k)
    x = rng.standard_normal((n, k)).astype(np.float32)
    w = pw.dequantize().astype(np.float64)
    ref = x.astype(np.float64) @ w.T
    float_tol = 2e-5 * (np.abs(x.astype(np.float64)) @ np.abs(w).T) + 1e-6
    # dequantize-then-multiply: float32 only
    err = np.abs(pw.matmul_kernel(x, False) - ref)
    assert np.all(err <= float_tol), f"{isa} dequant: max err {err.max()}"
    # Psumbook with int8 tables: within the psum-quantization bound of the exact product, and equal to the
    # numpy int8 emulation (per-pair power-of-two scales) up to float rounding (a table entry at a rounding tie
    # may round either way: one of the group's largest quanta per row and group is allowed, far below the
    # bound's sum of half quanta)
    y = pw.matmul_kernel(x, True)
    emu, bound, slack = int8_psum_reference(pw, x)
    err = np.abs(y - ref)
    assert np.all(err <= bound + float_tol), f"{isa} psum: max err/bound {(err / (bound + float_tol)).max()}"
    assert np.all(np.abs(y - emu) <= slack + float_tol), f"{isa} psum vs int8 emulation: {np.abs(y - emu).max()}"
    # the int8 psums cost little: typical error a small fraction of the output scale
    assert np.sqrt(np.mean((y - ref) ** 2)) < 0.05 * np.sqrt(np.mean(ref ** 2))


@pytest.mark.parametrize("m,v,g,rows,k", [(4, 8, 128, 300, 1000), (2, 4, 128, 333, 1100), (3, 4, 12, 97, 250)])
def test_lut4_decode_matches_batched_bitwise(isa, rng, m, v, g, rows, k):
    # One token takes the decode path (AVX2: the next group's tables are built in steps between this group's row
    # tiles, into a double buffer; partial last group, a pair count that is no multiple of the build step, more
    # and fewer steps than tile pairs): on one thread it must give the batched path's bytes (same groups, same
    # order), and on two (K split into runs of groups) stay within the int8 emulation's slack.
    pw = random_parts(rng, m, v, 4, g, rows, k)
    x = rng.standard_normal((3, k)).astype(np.float32)
    before = lowbit.get_threads()
    try:
        lowbit.set_threads(1)
        batched = pw.matmul_kernel(x, True)
        for t in range(3):
            assert np.array_equal(pw.matmul_kernel(x[t:t + 1], True)[0], batched[t]), f"{isa} token {t}"
        lowbit.set_threads(2)
        emu, bound, slack = int8_psum_reference(pw, x[:1])
        float_tol = 2e-5 * (np.abs(x[:1].astype(np.float64)) @ np.abs(pw.dequantize().astype(np.float64)).T) + 1e-6
        assert np.all(np.abs(pw.matmul_kernel(x[:1], True) - emu) <= slack + float_tol)
    finally:
        lowbit.set_threads(before)


def test_lut4_error_falls_as_bits_rise_and_kernel_follows(rng):
    w = (rng.standard_normal((64, 512)) * rng.uniform(0.2, 2.0, size=(64, 1))).astype(np.float32)
    x = rng.standard_normal((2, 512)).astype(np.float32)
    errs = []
    for m, v in [(2, 8), (2, 4), (3, 4)]:  # ~1.1, ~2.1, ~3.1 bits per weight, all b = 4 (register tables)
        pw = quantize(w, "codebook", m=m, v=v, b=4, g=128, iters=2)
        assert pw.tile == 32
        errs.append(float(np.mean((pw.dequantize() - w) ** 2) / np.mean(w ** 2)))
        ref = x @ pw.dequantize().T
        assert np.sqrt(np.mean((pw.matmul(x) - ref) ** 2)) < 0.02 * np.sqrt(np.mean(ref ** 2))
    assert errs[0] > errs[1] > errs[2], errs
    assert errs[1] < 0.15, errs


@pytest.mark.parametrize("m,v,g", [(4, 8, 128), (2, 4, 128), (3, 4, 12)])
def test_lut4_outlier_activations_get_finer_tables(isa, rng, m, v, g):
    # a few input channels 100x the others (as in LLM activations): with one int8 scale per group, every other
    # segment of those groups would be quantized on the outliers' step; the per-pair scales keep them fine
    pw = random_parts(rng, m, v, 4, g, 40, 256)
    x = rng.standard_normal((3, 256)).astype(np.float32)
    x[:, [3, 130, 200]] *= 100.0
    ref = x.astype(np.float64) @ pw.dequantize().astype(np.float64).T
    y = pw.matmul_kernel(x, True)
    emu, bound, slack = int8_psum_reference(pw, x)
    float_tol = 2e-5 * (np.abs(x.astype(np.float64)) @ np.abs(pw.dequantize().astype(np.float64)).T) + 1e-6
    assert np.all(np.abs(y - emu) <= slack + float_tol), f"{isa}: {np.abs(y - emu).max()}"
    assert np.all(np.abs(y - ref) <= bound + float_tol)
    single = 0.0  # the single-scale bound: P/2 quanta of max|T|/127 per group
    xp = pw.padded_input(x)
    for grp in range(pw.ngroups):
        xs = xp[:, grp * pw.group:(grp + 1) * pw.group].reshape(3, -1, v)
        T = np.einsum("icv,nsv->nsic", pw._cb, xs)
        single = single + np.abs(pw.scales()[None, :, grp]) * T[0].size / 16 * np.abs(T).reshape(3, -1).max(axis=1)[:, None] / 127 / 2
    assert bound.mean() < 0.5 * single.mean()


@pytest.mark.parametrize("m,v,b,g,rows,k", CASES[:3] + LUT4_CASES[:3])
def test_nonfinite_activations_give_nonfinite_outputs(isa, rng, m, v, b, g, rows, k):
    # The int8-table builds (b = 4 everywhere, b = 8 on VBMI) once let a NaN vanish in the table rounding: the
    # token's outputs came out finite and plausible. Now every path gives that token non-finite outputs (as the
    # dequantize path does) and leaves the other tokens as they were.
    pw = random_parts(rng, m, v, b, g, rows, k)
    x = rng.standard_normal((3, k)).astype(np.float32)
    for psum in (True, False):
        clean = pw.matmul_kernel(x, psum)
        bad = x.copy()
        bad[0, 5] = np.nan
        bad[2, k - 1] = np.inf
        y = pw.matmul_kernel(bad, psum)
        assert not np.isfinite(y[0]).any() and not np.isfinite(y[2]).any(), f"{isa} psum={psum}"
        assert np.array_equal(y[1], clean[1]), f"{isa} psum={psum}: the clean token changed"
        assert not np.isfinite(pw.matmul_kernel(bad[:1], psum)).any(), f"{isa} psum={psum}: one token"
