"""The KV cache's memory: a model's cache holds at most twice its filled length (it starts at KV_START
positions and doubles, the filled part copied), the batching slots' pages are backed as positions are
written, never at max_ctx; a model gives the same logits whether its cache grew on the way or not."""
import numpy as np
import pytest

from lowbit.memory import rss_gb
from lowbit.model.kv_cache import KV_START, ContextOverflowError, KVCache, SlotKVCache, lazy_zeros
from tests.model.tiny import tiny_model


def test_lazy_zeros_are_zero_and_writable():
    a = lazy_zeros((3, 5, 7), np.float16)
    assert a.shape == (3, 5, 7) and a.dtype == np.float16 and not a.any()
    a[1, 2, 3] = 2.5
    assert a[1, 2, 3] == 2.5 and a.sum() == 2.5
    assert lazy_zeros((0, 4), np.int8).shape == (0, 4)


@pytest.mark.skipif(not hasattr(__import__("os"), "sysconf"), reason="needs /proc/self/statm")
def test_first_token_backs_a_few_pages_not_the_slots():
    # 2 slots x 8 layers x 4 kv heads of 8192 positions (1 MiB each, 64 MiB a slot for K and V): writing position 0
    # of every run of slot 0 touches 64 pages of 4 KiB; on numpy's huge pages (np.zeros madvises them) it backed all
    before = rss_gb()
    c = SlotKVCache(2, 8, 4, 64, 8192, np.float16)
    k, v = c.k[:, 0], c.v[:, 0]
    assert k.nbytes + v.nbytes >= 64 << 20
    k[:, :, 0] = 1
    v[:, :, 0] = 1
    grown = (rss_gb() - before) * 1e9
    assert grown < 16 << 20, f"{grown / 2**20:.1f} MiB resident after one position"


@pytest.mark.skipif(not hasattr(__import__("os"), "sysconf"), reason="needs /proc/self/statm")
def test_a_model_cache_starts_small_whatever_its_context():
    # the same 8 x 4 x 64 cache at 8192 positions: KV_START positions allocated (2 MiB), not 64 MiB
    before = rss_gb()
    c = KVCache(8, 4, 64, 8192, np.float16)
    assert c.capacity == KV_START == 256 and c.max_ctx == 8192 and c.nbytes == 2 * 8 * 4 * 256 * 64 * 2
    c.k[:, :, 0] = 1
    c.v[:, :, 0] = 1
    grown = (rss_gb() - before) * 1e9
    assert grown < c.nbytes + (4 << 20), f"{grown / 2**20:.1f} MiB resident after one position"


def test_a_model_cache_lies_on_whole_huge_pages():
    # 2 MiB aligned, before and after a growth: mmap's own alignment (4 KiB) left the ends of the cache on small pages
    c = KVCache(3, 2, 64, 1024, np.float16)
    for grown in (False, True):
        if grown:
            assert c.grow(600)
        for a in (c.k, c.v):
            assert a.ctypes.data % (2 << 20) == 0, hex(a.ctypes.data)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int8])
def test_grow_doubles_keeps_the_filled_part_and_stops_at_max_ctx(dtype):
    rng = np.random.default_rng(0)
    c = KVCache(2, 3, 8, 700, dtype)
    assert c.capacity == 256 and c.k.shape == (2, 3, 256, 12 if dtype == np.int8 else 8)
    k = rng.integers(-100, 100, c.k.shape).astype(dtype)
    c.k[...] = k
    c.v[...] = -k
    c.length = 200
    assert not c.grow(256)  # fits: nothing replaced
    old = c.k
    assert c.grow(257) and c.capacity == 512 and c.k is not old
    assert np.array_equal(c.k[:, :, :200], k[:, :, :200]) and np.array_equal(c.v[:, :, :200], -k[:, :, :200])
    assert not c.k[:, :, 200:].any()  # only the filled part is copied
    assert c.grow(600) and c.capacity == 700  # doubling would pass max_ctx: max_ctx
    assert np.array_equal(c.k[:, :, :200], k[:, :, :200])
    with pytest.raises(ContextOverflowError, match="701 positions do not fit in the context of 700"):
        c.grow(701)
    assert c.used_bytes == c.nbytes * 200 // 700


def test_a_slot_of_the_batch_cache_never_grows():
    s = SlotKVCache(2, 1, 2, 4, 100, np.float16).slot(1)
    assert s.capacity == s.max_ctx == 100 and not s.grow(100)


@pytest.mark.parametrize("native", [True, False])
def test_logits_are_the_same_whether_the_cache_grew_or_not(native):
    # a prompt of 250, then decode steps across capacities 256 and 512 (the native step rebuilt over the new
    # arrays each time): bit for bit the logits of a model whose cache held all 600 positions from the start
    ids = [(7 * i + 3) % 250 for i in range(250)]
    steps = [(11 * i + 5) % 250 for i in range(270)] if native else [(11 * i + 5) % 250 for i in range(12)]
    runs = []
    for reserve in (False, True):
        m = tiny_model(max_context=600, max_position_embeddings=1024)
        m.native_decode = native
        if reserve:
            m.reserve(600)
            assert m.cache.capacity == 600
        else:
            assert m.cache.capacity == 256
        out = [m.prefill(ids)] + [m.decode(t) for t in steps]
        runs.append(np.stack(out))
        if not reserve:
            assert m.cache.capacity == (600 if native else 512)
    assert np.array_equal(runs[0], runs[1])
