"""The blocks' packed codes moved onto 2 MiB pages (lowbit.model.hugepages, done by NativeDecoder.build): the
same bytes in decode order in one 2 MiB-aligned arena, bitwise the same logits, file-backed codes left alone."""
import mmap

import numpy as np
import pytest

from lowbit.model.hugepages import codes_to_hugepages, file_backed, hugepage_buffer
from lowbit.model.native import NativeDecoder, decode_order_packed_weights

from .test_native_forward import IDS, build


def logits_of(model):
    model.reset()
    return [model.prefill(IDS[:5])] + [model.decode(t) for t in IDS[5:9]]


@pytest.mark.parametrize("fmt", ["ternary", "int4", "tq1", "codebook"])
def test_moved_codes_give_bitwise_the_same_logits(isa, fmt):
    model = build(fmt, "llama")
    ws = decode_order_packed_weights(model)
    assert len(ws) == 7 * len(model.layers)
    before = [w.codes.copy() for w in ws]
    model._native = NativeDecoder.build(model, hugepages=False)
    ref = logits_of(model)
    assert not any(getattr(w, "_on_hugepages", False) for w in ws)

    model._native = NativeDecoder.build(model)  # moves them
    assert all(w._on_hugepages for w in ws)
    assert all(np.array_equal(w.codes, b) for w, b in zip(ws, before))
    addrs = [w.codes.ctypes.data for w in ws]
    assert addrs[0] % (2 << 20) == 0 and addrs == sorted(addrs)  # one arena, in decode order
    assert all(a % 4096 == 0 for a in addrs)
    got = logits_of(model)
    assert all(np.array_equal(a, b) for a, b in zip(got, ref))

    assert codes_to_hugepages(ws) == 0  # already moved: nothing to do
    assert [w.codes.ctypes.data for w in ws] == addrs


def test_file_backed_codes_stay(tmp_path):
    class W:
        pass

    p = tmp_path / "codes.bin"
    p.write_bytes(bytes(range(256)) * 64)
    mm = np.memmap(p, dtype=np.uint8, mode="r")
    w, v = W(), W()
    w.codes = mm[256:1280]
    v.codes = np.arange(300, dtype=np.uint8)
    assert file_backed(w.codes) and not file_backed(v.codes)
    assert codes_to_hugepages([w, v, v]) == 4096  # v once, padded to 4 KiB; w untouched
    assert isinstance(w.codes.base, np.memmap) or file_backed(w.codes)
    assert v._on_hugepages and np.array_equal(v.codes, np.arange(300, dtype=np.uint8))
    assert not getattr(w, "_on_hugepages", False)
    assert codes_to_hugepages([]) == 0


def test_hugepage_buffer():
    b = hugepage_buffer(5000)
    assert b.dtype == np.uint8 and b.shape == (5000,) and b.ctypes.data % (2 << 20) == 0
    assert not b.any() and b.flags.writeable
    b[:] = 7
    assert int(b.sum()) == 7 * 5000
    if hasattr(mmap, "MAP_PRIVATE"):
        assert file_backed(b)  # a raw mmap in its base chain: codes_to_hugepages never copies an arena's views
    with pytest.raises(ValueError, match="nbytes must be positive"):
        hugepage_buffer(0)
