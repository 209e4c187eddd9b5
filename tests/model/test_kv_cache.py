"""The static KV cache's memory: pages are backed as positions are written, not at max_ctx."""
import numpy as np
import pytest

from lowbit.memory import rss_gb
from lowbit.model.kv_cache import KVCache, SlotKVCache, lazy_zeros


def test_lazy_zeros_are_zero_and_writable():
    a = lazy_zeros((3, 5, 7), np.float16)
    assert a.shape == (3, 5, 7) and a.dtype == np.float16 and not a.any()
    a[1, 2, 3] = 2.5
    assert a[1, 2, 3] == 2.5 and a.sum() == 2.5
    assert lazy_zeros((0, 4), np.int8).shape == (0, 4)


@pytest.mark.skipif(not hasattr(__import__("os"), "sysconf"), reason="needs /proc/self/statm")
@pytest.mark.parametrize("slots", [None, 2])
def test_first_token_backs_a_few_pages_not_the_cache(slots):
    # 8 layers x 4 kv heads of 8192 positions (1 MiB each, 64 MiB for K and V): writing position 0 of every run
    # touches 64 pages of 4 KiB; on numpy's huge pages (np.zeros madvises them) it backed all 64 MiB
    before = rss_gb()
    if slots is None:
        c = KVCache(8, 4, 64, 8192, np.float16)
        k, v = c.k, c.v
    else:
        c = SlotKVCache(slots, 8, 4, 64, 8192, np.float16)
        k, v = c.k[:, 0], c.v[:, 0]
    assert k.nbytes + v.nbytes >= 64 << 20
    k[:, :, 0] = 1
    v[:, :, 0] = 1
    grown = (rss_gb() - before) * 1e9
    assert grown < 16 << 20, f"{grown / 2**20:.1f} MiB resident after one position"
