"""The attention driver and its tile kernel (kernels/attention.cpp, attn.inc) against numpy, on every ISA:
head dims that are and are not multiples of 8, GQA groups 1/4/8, context lengths around the 8-position
tile, sliding windows, Gemma 2's soft-cap, float16, float32 and int8 caches (int8: each row's values and
its float32 scale, kv_cache.py; the reference takes the dequantized values, so the kernel must match it to
float rounding like the others), prefill blocks (consecutive rows of one slot), decode batches over several
slots, and the flash-decoding split of a long context with its merge."""
import numpy as np
import pytest

from lowbit import _native
from lowbit.model.kv_cache import dequantize_kv_rows, quantize_kv_rows

KV = ["f16", "f32", "int8"]


def reference(q, kc, vc, pos, slot, window=0, softcap=0.0):
    """q [R, heads, hd]; kc/vc [slots, kv, max_ctx, hd] float32 or float16 bits as uint16, or int8 rows
    [..., hd + 4] -> [R, heads*hd]."""
    if kc.dtype == np.uint16:
        kc, vc = kc.view(np.float16), vc.view(np.float16)
    elif kc.dtype == np.int8:
        kc, vc = dequantize_kv_rows(kc), dequantize_kv_rows(vc)
    R, heads, hd = q.shape
    group = heads // kc.shape[1]
    out = np.zeros((R, heads, hd))
    for r in range(R):
        hi = pos[r] + 1
        lo = max(0, hi - window) if window > 0 else 0
        for h in range(heads):
            K = kc[slot[r], h // group, lo:hi].astype(np.float64)
            V = vc[slot[r], h // group, lo:hi].astype(np.float64)
            s = K @ q[r, h].astype(np.float64)
            if softcap > 0:
                s = softcap * np.tanh(s / softcap)
            p = np.exp(s - s.max())
            out[r, h] = (p / p.sum()) @ V
    return out.reshape(R, heads * hd)


def make_cache(rng, slots, kv, max_ctx, hd, kind):
    """kind: "f16" (float16 bits as uint16), "f32" or "int8" (rows of hd + 4)."""
    kc = rng.standard_normal((slots, kv, max_ctx, hd)).astype(np.float32)
    vc = rng.standard_normal((slots, kv, max_ctx, hd)).astype(np.float32)
    if kind == "f16":
        return kc.astype(np.float16).view(np.uint16), vc.astype(np.float16).view(np.uint16)
    if kind == "int8":
        return quantize_kv_rows(kc), quantize_kv_rows(vc)
    return kc, vc


def poison(c, at, d, value):
    """Puts a non-finite value at element d of row `at` (an index tuple) of cache c; an int8 row takes it as its
    scale (what writing a NaN / inf row gives: kv_quantize_row)."""
    if c.dtype == np.int8:
        c[at][-4:] = np.array([value], np.float32).view(np.int8)
    elif c.dtype == np.uint16:
        c.view(np.float16)[at + (d,)] = value
    else:
        c[at + (d,)] = value


def run(q, kc, vc, pos, slot, **kw):
    out = np.full((q.shape[0], q.shape[1] * q.shape[2]), np.nan, np.float32)
    _native.attention(q, kc, vc, np.asarray(pos, np.int64), np.asarray(slot, np.int64), out, **kw)
    return out


def check(q, kc, vc, pos, slot, **kw):
    got = run(q, kc, vc, pos, slot, **kw)
    want = reference(q, kc, vc, pos, slot, kw.get("window", 0), kw.get("softcap", 0.0))
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize("hd", [64, 80, 96, 128, 20, 3, 48, 256])
@pytest.mark.parametrize("kv", KV)
def test_decode_rows_every_head_dim(isa, rng, hd, kv):
    # decode: lone rows of several slots at lengths 1, 7, 8, 9, 129 (tile edges); on AVX-512 hd 48 and 256 take the
    # two passes' run-time head dim (scores) and value passes of 2 + 1 and 8 + 8 vectors, on AVX2 hd 80 and 256 (of 8
    # lanes: 10 and 32 vectors); hd 20 and 3 the tile loop
    kc, vc = make_cache(rng, 3, 2, 160, hd, kv)
    pos, slot = [0, 6, 7, 8, 128], [0, 2, 1, 0, 2]
    q = rng.standard_normal((5, 4, hd)).astype(np.float32) * 0.3
    check(q, kc, vc, pos, slot, split_min=0)


@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("kv", KV)
@pytest.mark.parametrize("hd", [64, 256])
def test_prefill_block_gqa(isa, rng, group, kv, hd):
    # a prefill chunk: 37 consecutive positions 5..41 of slot 1 (blocks of 16 // group rows), GQA groups; hd 256 (Gemma
    # 2): on AVX-512, runs of 3 or 4 queries take value passes of 6 + 6 + 4 vectors
    n_kv = 2
    kc, vc = make_cache(rng, 2, n_kv, 64, hd, kv)
    pos = np.arange(5, 42)
    q = rng.standard_normal((len(pos), n_kv * group, hd)).astype(np.float32) * 0.3
    check(q, kc, vc, pos, np.ones(len(pos), np.int64))


@pytest.mark.parametrize("window", [1, 5, 16])
@pytest.mark.parametrize("softcap", [0.0, 3.0])
@pytest.mark.parametrize("kv", ["f16", "int8"])
def test_window_and_softcap(isa, rng, window, softcap, kv):
    # rows mix a prefill run (slot 0, positions 3..27) and decode rows of slot 1; sliding window and cap
    kc, vc = make_cache(rng, 2, 2, 140, 96, kv)
    pos = list(range(3, 28)) + [0, 130, 64]
    slot = [0] * 25 + [1, 1, 1]
    q = rng.standard_normal((len(pos), 4, 96)).astype(np.float32)
    check(q, kc, vc, pos, slot, window=window, softcap=softcap)


@pytest.mark.parametrize("kv", KV)
@pytest.mark.parametrize("group", [1, 4])
def test_split_context_merges(isa, rng, kv, group):
    # one row, long context cut into chunks of >= 8 positions (flash-decoding), with and without window
    kc, vc = make_cache(rng, 1, 1, 400, 80, kv)
    q = rng.standard_normal((1, group, 80)).astype(np.float32) * 0.5
    for pos, window in [(399, 0), (129, 0), (300, 100), (9, 0)]:
        got = run(q, kc, vc, [pos], [0], window=window, split_min=8)
        whole = run(q, kc, vc, [pos], [0], window=window, split_min=0)
        want = reference(q, kc, vc, [pos], [0], window)
        np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-5)
        np.testing.assert_allclose(got, whole, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kv", ["f16", "int8"])
@pytest.mark.parametrize("group", [1, 3])  # one query a kv head or three (two passes on AVX-512 and AVX2, tiles on the scalar twin)
def test_nan_in_cache_reaches_only_rows_that_see_it(isa, rng, kv, group):
    kc, vc = make_cache(rng, 1, 1, 64, 64, kv)
    poison(kc, (0, 0, 10), 3, np.nan)
    q = rng.standard_normal((3, group, 64)).astype(np.float32)
    for split in (0, 4):
        out = run(q, kc, vc, [5, 20, 40], [0, 0, 0], window=25, split_min=split)
        assert np.isfinite(out[0]).all() and np.isfinite(out[2]).all()  # before position 10 / window past it
        assert np.isnan(out[1]).all()


@pytest.mark.parametrize("kv", ["f32", "int8"])
def test_prefill_binding_matches(isa, rng, kv):
    kc, vc = make_cache(rng, 1, 2, 50, 64, kv)
    q = rng.standard_normal((30, 4, 64)).astype(np.float32)
    out = np.zeros((30, 256), np.float32)
    _native.attention_prefill(q, kc[0], vc[0], 12, out)
    np.testing.assert_allclose(out, reference(q, kc, vc, np.arange(12, 42), np.zeros(30, np.int64)), rtol=2e-4, atol=2e-5)


def test_rejects_bad_rows(rng):
    kc, vc = make_cache(rng, 2, 1, 16, 8, "f32")
    q = np.ones((2, 2, 8), np.float32)
    with pytest.raises(ValueError, match="pos\\[1\\] = 16 is outside the cache"):
        run(q, kc, vc, [0, 16], [0, 0])
    with pytest.raises(ValueError, match="slot\\[0\\] = 2 is outside"):
        run(q, kc, vc, [0, 1], [2, 0])
    with pytest.raises(ValueError, match="softcap"):
        run(q, kc, vc, [0, 1], [0, 0], softcap=-1.0)
    with pytest.raises(ValueError, match="one entry per row"):
        run(q, kc, vc, [0], [0])
    with pytest.raises(ValueError, match="heads % kv_heads"):
        run(np.ones((2, 3, 8), np.float32), np.ones((1, 2, 16, 8), np.float32), np.ones((1, 2, 16, 8), np.float32),
            [0, 1], [0, 0])
    k8, v8 = make_cache(rng, 2, 1, 16, 8, "int8")
    with pytest.raises(ValueError, match="head_dim \\+ 4"):
        run(q, np.ascontiguousarray(k8[..., :-1]), np.ascontiguousarray(v8[..., :-1]), [0, 1], [0, 0])  # int8 rows without their whole scale
    with pytest.raises(ValueError, match="float32, float16 .* or int8"):
        run(q, kc.astype(np.float64), vc.astype(np.float64), [0, 1], [0, 0])


@pytest.mark.parametrize("kv", KV)
def test_later_nan_and_inf_stay_out_of_earlier_rows(isa, rng, kv):
    # a prefill block whose last rows wrote inf / NaN: the earlier rows of the same block must not see them
    kc, vc = make_cache(rng, 1, 1, 40, 64, kv)
    poison(vc, (0, 0, 21), 5, np.inf)
    poison(kc, (0, 0, 22), 0, np.nan)
    poison(vc, (0, 0, 22), 1, np.nan)
    pos = np.arange(10, 23)
    q = rng.standard_normal((len(pos), 2, 64)).astype(np.float32)
    out = run(q, kc, vc, pos, np.zeros(len(pos), np.int64))
    want = reference(q[:11], kc, vc, pos[:11], np.zeros(11, np.int64))
    np.testing.assert_allclose(out[:11], want, rtol=2e-4, atol=2e-5)  # rows before position 21
    assert not np.isfinite(out[11:]).all(axis=1).any()


@pytest.mark.parametrize("kv", ["f16", "int8"])
def test_split_is_the_same_alone_and_in_a_batch(isa, rng, kv):
    # a lone row's chunks depend on its own context only: decoding it alone or beside others gives the same bits
    kc, vc = make_cache(rng, 3, 1, 300, 64, kv)
    q = rng.standard_normal((3, 2, 64)).astype(np.float32)
    pos, slot = [299, 150, 7], [2, 0, 1]
    batch = run(q, kc, vc, pos, slot)
    for r in range(3):
        alone = run(q[r:r + 1], kc, vc, pos[r:r + 1], slot[r:r + 1])
        assert np.array_equal(alone[0], batch[r])
    np.testing.assert_allclose(batch, reference(q, kc, vc, pos, slot), rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("kv", ["f16", "int8"])
def test_batched_rows_take_several_heads_a_task(isa, rng, threads, kv):
    # a batched decode step: 12 lone rows x 8 kv heads, so a pool task takes several heads of one row
    # (attention.cpp, kAttnTasksPerThread); the same bits as each row alone (one head a task), and the reference
    before = _native.get_threads()
    try:
        _native.set_threads(threads)
        kc, vc = make_cache(rng, 12, 8, 80, 96, kv)
        q = rng.standard_normal((12, 8, 96)).astype(np.float32) * 0.3
        pos, slot = [3 + 6 * r for r in range(12)], [(5 * r) % 12 for r in range(12)]
        batch = run(q, kc, vc, pos, slot)
        for r in range(12):
            alone = run(q[r:r + 1], kc, vc, pos[r:r + 1], slot[r:r + 1])
            assert np.array_equal(alone[0], batch[r])
        np.testing.assert_allclose(batch, reference(q, kc, vc, pos, slot), rtol=2e-4, atol=2e-5)
    finally:
        _native.set_threads(before)


@pytest.mark.parametrize("group", [1, 2, 3, 8])
def test_int8_tiles_read_in_place_or_widened_give_the_same_bits(isa, rng, group):
    # a block of <= 2 queries reads an int8 tile in place, a larger one widens it first: both take the integers
    # and scale after, so a prefill row gets the same bits in a block of 1 row as in a block of many
    kc, vc = make_cache(rng, 1, 1, 64, 64, "int8")
    q = rng.standard_normal((20, group, 64)).astype(np.float32) * 0.5
    pos = np.arange(30, 50)
    block = run(q, kc, vc, pos, np.zeros(20, np.int64), split_min=0)
    for r in (0, 7, 19):
        alone = run(q[r:r + 1], kc, vc, pos[r:r + 1], [0], split_min=0)
        assert np.array_equal(alone[0], block[r])
    np.testing.assert_allclose(block, reference(q, kc, vc, pos, np.zeros(20, np.int64)), rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize("hd", [1, 7, 15, 16, 17, 33, 96, 100, 1541])
def test_kv_quantize_rows_native_equals_numpy(isa, rng, hd):
    # the native cache write and its numpy twin give the same bytes on every path: random rows, ties at .5, zeros,
    # -0, NaN, inf (also in the last element: the vector loops' tail), subnormals; lengths with every kind of tail
    x = rng.standard_normal((40, hd)).astype(np.float32) * rng.uniform(1e-3, 1e3, (40, 1)).astype(np.float32)
    x[1] = 0
    x[2] = np.arange(hd, dtype=np.float32) - np.float32(hd // 2 - 0.5)  # 96: max 48.5, many products near .5
    x[3, min(5, hd - 1)] = np.nan
    x[4, 0] = -np.inf
    x[5] = 1e-40  # subnormal
    x[6, -1] = np.nan
    x[7, -1] = np.inf
    x[8] = -0.0
    x[9, ::2] = -0.0
    got = np.zeros((40, hd + 4), np.int8)
    _native.kv_quantize_rows(x, got)
    want = quantize_kv_rows(x)
    assert np.array_equal(got[:, :hd], want[:, :hd])
    s_got, s_want = got[:, hd:].copy().view(np.float32), want[:, hd:].copy().view(np.float32)
    assert np.array_equal(s_got, s_want, equal_nan=True)
    assert np.isnan(s_got[[3, 4, 6, 7]]).all() and (got[[3, 4, 6, 7], :hd] == 0).all()
    assert s_got[1, 0] == 0 and (got[1, :hd] == 0).all() and s_got[8, 0] == 0 and (got[8, :hd] == 0).all()
    assert (got[5, :hd] == 0).all()  # a subnormal scale: zeros (1 / scale would overflow)
    back = dequantize_kv_rows(want)
    ok = np.isfinite(x).all(axis=1) & (np.abs(x).max(axis=1) >= 127 * np.finfo(np.float32).tiny)
    err = np.abs(back[ok] - x[ok]).max(axis=1)
    assert (err <= np.abs(x[ok]).max(axis=1) / 127 / 2 * 1.001 + 1e-45).all()  # half a step of the row's scale


@pytest.mark.parametrize("group", [2, 3, 4, 5, 6, 8])
@pytest.mark.parametrize("hd", [64, 80, 128])
@pytest.mark.parametrize("kv", KV)
@pytest.mark.parametrize("window", [0, 45])
def test_gqa_queries_fused_or_alone_give_the_same_bits(isa, rng, group, hd, kv, window):
    # The queries of a kv head go through the K / V rows together (AVX-512: runs of up to 4 in the two passes; AVX2:
    # a tile's queries), each row read once for them; a query's float operations stay its own: a decode step (a lone
    # row: its group in place, fused) gives the same bits as the same row inside a prefill block, and all match the
    # reference. The same heads as MHA (the cache repeated per query head, so one query a kv head) agree to rounding:
    # bit for bit on AVX-512, where every query's operations are the same alone or fused, to a few roundings below it.
    kc, vc = make_cache(rng, 1, 2, 160, hd, kv)
    q = rng.standard_normal((12, 2 * group, hd)).astype(np.float32) * 0.3
    pos = np.arange(122, 134)  # across a 64-position chunk edge (128)
    block = run(q, kc, vc, pos, np.zeros(12, np.int64), split_min=0, window=window)
    mha = run(q, np.repeat(kc, group, axis=1), np.repeat(vc, group, axis=1), pos, np.zeros(12, np.int64), split_min=0,
              window=window)
    if isa == "avx512":
        assert np.array_equal(block, mha)
    np.testing.assert_allclose(block, mha, rtol=1e-5, atol=1e-6)
    for r in (0, 5, 6, 11):
        alone = run(q[r:r + 1], kc, vc, pos[r:r + 1], [0], split_min=0, window=window)
        assert np.array_equal(alone[0], block[r])
    half = run(q[6:], kc, vc, pos[6:], np.zeros(6, np.int64), split_min=0, window=window)  # a later prefill chunk
    assert np.array_equal(half, block[6:])
    want = reference(q, kc, vc, pos, np.zeros(12, np.int64), window)
    np.testing.assert_allclose(block, want, rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize("hd", [64, 96, 80])
@pytest.mark.parametrize("window", [0, 5, 13, 70])
@pytest.mark.parametrize("kv", KV)
def test_mha_block_rows_fused_or_alone_give_the_same_bits(isa, rng, hd, window, kv):
    # MHA (one query a kv head): AVX-512 runs up to 3 rows of a prefill block through a tile together where each
    # sees the whole tile; the rows that see part of it (the diagonal, a window's start) go alone. A row's bits
    # are its own: the same as the row run alone (a decode step, its tiles read in place), and the reference's; with
    # 1 and 2 threads (a task's heads one after the other, the prefetch running on into the next head's).
    kc, vc = make_cache(rng, 1, 3, 160, hd, kv)
    q = rng.standard_normal((23, 3, hd)).astype(np.float32) * 0.3
    pos = np.arange(110, 133)
    before = _native.get_threads()
    try:
        for threads in (1, 2):
            _native.set_threads(threads)
            block = run(q, kc, vc, pos, np.zeros(23, np.int64), split_min=0, window=window)
            for r in range(23):
                alone = run(q[r:r + 1], kc, vc, pos[r:r + 1], [0], split_min=0, window=window)
                assert np.array_equal(alone[0], block[r])
            if threads == 1:
                first = block
            assert np.array_equal(block, first)
    finally:
        _native.set_threads(before)
    np.testing.assert_allclose(block, reference(q, kc, vc, pos, np.zeros(23, np.int64), window), rtol=2e-4, atol=2e-5)


def test_a_lone_query_reads_no_row_past_the_cache(isa, rng):
    # the last tile of a decode row at the cache's end, 5 rows of a tile of 8, is widened (read in place, its rows
    # 5-7 would be the next kv head's, or past the array for the last one: the sanitizer run would see it)
    for kv in KV:
        kc, vc = make_cache(rng, 1, 2, 13, 96, kv)
        q = rng.standard_normal((1, 2, 96)).astype(np.float32) * 0.3
        got = run(q, kc, vc, [12], [0], split_min=0)
        np.testing.assert_allclose(got, reference(q, kc, vc, [12], [0]), rtol=2e-4, atol=2e-5)
