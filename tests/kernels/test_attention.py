"""The attention driver and its tile kernel (kernels/attention.cpp, attn.inc) against numpy, on every ISA:
head dims that are and are not multiples of 8, GQA groups 1/4/8, context lengths around the 8-position
tile, sliding windows, Gemma 2's soft-cap, float16 and float32 caches, prefill blocks (consecutive rows of
one slot), decode batches over several slots, and the flash-decoding split of a long context with its
merge."""
import numpy as np
import pytest

from lowbit import _native


def reference(q, kc, vc, pos, slot, window=0, softcap=0.0):
    """q [R, heads, hd]; kc/vc [slots, kv, max_ctx, hd] float32 or float16 bits as uint16 -> [R, heads*hd]."""
    if kc.dtype == np.uint16:
        kc, vc = kc.view(np.float16), vc.view(np.float16)
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


def make_cache(rng, slots, kv, max_ctx, hd, f16):
    kc = rng.standard_normal((slots, kv, max_ctx, hd)).astype(np.float32)
    vc = rng.standard_normal((slots, kv, max_ctx, hd)).astype(np.float32)
    if f16:
        return kc.astype(np.float16).view(np.uint16), vc.astype(np.float16).view(np.uint16)
    return kc, vc


def run(q, kc, vc, pos, slot, **kw):
    out = np.full((q.shape[0], q.shape[1] * q.shape[2]), np.nan, np.float32)
    _native.attention(q, kc, vc, np.asarray(pos, np.int64), np.asarray(slot, np.int64), out, **kw)
    return out


def check(q, kc, vc, pos, slot, **kw):
    got = run(q, kc, vc, pos, slot, **kw)
    want = reference(q, kc, vc, pos, slot, kw.get("window", 0), kw.get("softcap", 0.0))
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize("hd", [64, 80, 96, 128, 20, 3])
@pytest.mark.parametrize("f16", [True, False])
def test_decode_rows_every_head_dim(isa, rng, hd, f16):
    # decode: lone rows of several slots at lengths 1, 7, 8, 9, 129 (tile edges)
    kc, vc = make_cache(rng, 3, 2, 160, hd, f16)
    pos, slot = [0, 6, 7, 8, 128], [0, 2, 1, 0, 2]
    q = rng.standard_normal((5, 4, hd)).astype(np.float32) * 0.3
    check(q, kc, vc, pos, slot, split_min=0)


@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("f16", [True, False])
def test_prefill_block_gqa(isa, rng, group, f16):
    # a prefill chunk: 37 consecutive positions 5..41 of slot 1 (blocks of 16 // group rows), GQA groups
    kv, hd = 2, 64
    kc, vc = make_cache(rng, 2, kv, 64, hd, f16)
    pos = np.arange(5, 42)
    q = rng.standard_normal((len(pos), kv * group, hd)).astype(np.float32) * 0.3
    check(q, kc, vc, pos, np.ones(len(pos), np.int64))


@pytest.mark.parametrize("window", [1, 5, 16])
@pytest.mark.parametrize("softcap", [0.0, 3.0])
def test_window_and_softcap(isa, rng, window, softcap):
    # rows mix a prefill run (slot 0, positions 3..27) and decode rows of slot 1; sliding window and cap
    kc, vc = make_cache(rng, 2, 2, 140, 96, True)
    pos = list(range(3, 28)) + [0, 130, 64]
    slot = [0] * 25 + [1, 1, 1]
    q = rng.standard_normal((len(pos), 4, 96)).astype(np.float32)
    check(q, kc, vc, pos, slot, window=window, softcap=softcap)


@pytest.mark.parametrize("f16", [True, False])
@pytest.mark.parametrize("group", [1, 4])
def test_split_context_merges(isa, rng, f16, group):
    # one row, long context cut into chunks of >= 8 positions (flash-decoding), with and without window
    kc, vc = make_cache(rng, 1, 1, 400, 80, f16)
    q = rng.standard_normal((1, group, 80)).astype(np.float32) * 0.5
    for pos, window in [(399, 0), (129, 0), (300, 100), (9, 0)]:
        got = run(q, kc, vc, [pos], [0], window=window, split_min=8)
        whole = run(q, kc, vc, [pos], [0], window=window, split_min=0)
        want = reference(q, kc, vc, [pos], [0], window)
        np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-5)
        np.testing.assert_allclose(got, whole, rtol=1e-4, atol=1e-5)


def test_nan_in_cache_reaches_only_rows_that_see_it(isa, rng):
    kc, vc = make_cache(rng, 1, 1, 64, 64, True)
    kf = kc.view(np.float16)
    kf[0, 0, 10, 3] = np.nan
    q = rng.standard_normal((3, 1, 64)).astype(np.float32)
    for split in (0, 4):
        out = run(q, kc, vc, [5, 20, 40], [0, 0, 0], window=25, split_min=split)
        assert np.isfinite(out[0]).all() and np.isfinite(out[2]).all()  # before position 10 / window past it
        assert np.isnan(out[1]).all()


def test_prefill_binding_matches(isa, rng):
    kc, vc = make_cache(rng, 1, 2, 50, 64, False)
    q = rng.standard_normal((30, 4, 64)).astype(np.float32)
    out = np.zeros((30, 256), np.float32)
    _native.attention_prefill(q, kc[0], vc[0], 12, out)
    np.testing.assert_allclose(out, reference(q, kc, vc, np.arange(12, 42), np.zeros(30, np.int64)), rtol=2e-4, atol=2e-5)


def test_rejects_bad_rows(rng):
    kc, vc = make_cache(rng, 2, 1, 16, 8, False)
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


@pytest.mark.parametrize("f16", [True, False])
def test_later_nan_and_inf_stay_out_of_earlier_rows(isa, rng, f16):
    # a prefill block whose last rows wrote inf / NaN: the earlier rows of the same block must not see them
    kc, vc = make_cache(rng, 1, 1, 40, 64, f16)
    kv_view = (lambda a: a.view(np.float16)) if f16 else (lambda a: a)
    kv_view(vc)[0, 0, 21, 5] = np.inf
    kv_view(kc)[0, 0, 22, 0] = np.nan
    kv_view(vc)[0, 0, 22, 1] = np.nan
    pos = np.arange(10, 23)
    q = rng.standard_normal((len(pos), 2, 64)).astype(np.float32)
    out = run(q, kc, vc, pos, np.zeros(len(pos), np.int64))
    want = reference(q[:11], kc, vc, pos[:11], np.zeros(11, np.int64))
    np.testing.assert_allclose(out[:11], want, rtol=2e-4, atol=2e-5)  # rows before position 21
    assert not np.isfinite(out[11:]).all(axis=1).any()


def test_split_is_the_same_alone_and_in_a_batch(isa, rng):
    # a lone row's chunks depend on its own context only: decoding it alone or beside others gives the same bits
    kc, vc = make_cache(rng, 3, 1, 300, 64, True)
    q = rng.standard_normal((3, 2, 64)).astype(np.float32)
    pos, slot = [299, 150, 7], [2, 0, 1]
    batch = run(q, kc, vc, pos, slot)
    for r in range(3):
        alone = run(q[r:r + 1], kc, vc, pos[r:r + 1], slot[r:r + 1])
        assert np.array_equal(alone[0], batch[r])
    np.testing.assert_allclose(batch, reference(q, kc, vc, pos, slot), rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_batched_rows_take_several_heads_a_task(isa, rng, threads):
    # a batched decode step: 12 lone rows x 8 kv heads, so a pool task takes several heads of one row
    # (attention.cpp, kAttnTasksPerThread); the same bits as each row alone (one head a task), and the reference
    before = _native.get_threads()
    try:
        _native.set_threads(threads)
        kc, vc = make_cache(rng, 12, 8, 80, 96, True)
        q = rng.standard_normal((12, 8, 96)).astype(np.float32) * 0.3
        pos, slot = [3 + 6 * r for r in range(12)], [(5 * r) % 12 for r in range(12)]
        batch = run(q, kc, vc, pos, slot)
        for r in range(12):
            alone = run(q[r:r + 1], kc, vc, pos[r:r + 1], slot[r:r + 1])
            assert np.array_equal(alone[0], batch[r])
        np.testing.assert_allclose(batch, reference(q, kc, vc, pos, slot), rtol=2e-4, atol=2e-5)
    finally:
        _native.set_threads(before)
