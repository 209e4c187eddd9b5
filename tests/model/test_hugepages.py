"""The blocks' and an untied lm_head's packed codes moved onto 2 MiB pages (lowbit.model.hugepages, done by
NativeDecoder.build): the same bytes in decode order in one 2 MiB-aligned arena, bitwise the same logits,
file-backed codes left alone."""
import mmap

import numpy as np
import pytest

from lowbit.formats.int6 import Int6Weight
from lowbit.formats.intcodes import IntCodeWeight
from lowbit.bench.e2e import random_weight
from lowbit.model import Model
from lowbit.model.dummy import dummy_weights
from lowbit.model.hugepages import _streamed, codes_to_hugepages, file_backed, hugepage_buffer, mapping_of
from lowbit.model.native import NativeDecoder, decode_order_packed_weights

from .test_native_decoder import config
from .test_native_forward import IDS, build


def logits_of(model):
    model.reset()
    return [model.prefill(IDS[:5])] + [model.decode(t) for t in IDS[5:9]]


@pytest.mark.parametrize("fmt", ["ternary", "int4", "tq1", "codebook", "codebook-b4"])
def test_moved_codes_give_bitwise_the_same_logits(isa, fmt):
    if fmt == "codebook-b4":  # on an AVX-512 VBMI CPU its kernel streams codes16, which moves instead of codes
        cfg = config("llama")
        model = Model.from_weights(cfg, dummy_weights(cfg), format="codebook", max_context=48, m=2, v=4, b=4, g=64,
                                   iters=1)
    else:
        model = build(fmt, "llama")
    ws = decode_order_packed_weights(model)
    head = model.lm_head.weight
    n_head = 2 if isinstance(head, Int6Weight) else 1 if isinstance(head, IntCodeWeight) else 0
    assert n_head == 1 or fmt not in ("ternary", "int4")  # their int8 heads move too
    assert len(ws) == 7 * len(model.layers) + n_head and (n_head == 0 or ws[-1] is head or ws[-1] is head.hi)
    names = [_streamed(w) for w in ws]
    assert all(n == "codes" for n in names) or fmt == "codebook-b4"
    codes_of = lambda: [getattr(w, n) for w, n in zip(ws, names)]
    before = [c.copy() for c in codes_of()]
    model._native = NativeDecoder.build(model, hugepages=False)
    ref = logits_of(model)
    assert not any(getattr(w, "_on_hugepages", False) for w in ws)

    model._native = NativeDecoder.build(model)  # moves them
    assert all(w._on_hugepages for w in ws)
    assert all(np.array_equal(c, b) for c, b in zip(codes_of(), before))
    addrs = [c.ctypes.data for c in codes_of()]
    assert addrs[0] % (2 << 20) == 0 and addrs == sorted(addrs)  # one arena, in decode order
    assert all(a % 4096 == 0 for a in addrs)
    got = logits_of(model)
    assert all(np.array_equal(a, b) for a, b in zip(got, ref))

    assert codes_to_hugepages(ws) == 0  # already moved: nothing to do
    assert [c.ctypes.data for c in codes_of()] == addrs


def test_memmap_codes_move_and_raw_mmap_views_stay(tmp_path):
    class W:
        pass

    p = tmp_path / "codes.bin"
    p.write_bytes(bytes(range(256)) * 64)
    mm = np.memmap(p, dtype=np.uint8, mode="c")
    w, v, r = W(), W(), W()
    w.codes = mm[100:100 + 2 * 4096 + 5]  # a file view: moved, its whole pages dropped from the process
    v.codes = np.arange(300, dtype=np.uint8)
    r.codes = hugepage_buffer(64)  # a raw mmap's view (an arena's): left alone
    want_w = w.codes.copy()
    assert file_backed(w.codes) and not file_backed(v.codes)
    assert codes_to_hugepages([w, v, v, r]) == 3 * 4096 + 4096  # w: 8197 -> 12288 bytes, v once: 300 -> 4096
    assert w._on_hugepages and v._on_hugepages and not getattr(r, "_on_hugepages", False)
    assert np.array_equal(w.codes, want_w) and np.array_equal(v.codes, np.arange(300, dtype=np.uint8))
    assert np.array_equal(mm[100:100 + 2 * 4096 + 5], want_w)  # the dropped pages read back from the file
    assert w.codes.ctypes.data % (2 << 20) == 0
    assert codes_to_hugepages([]) == 0


def test_loaded_model_codes_move(tmp_path, monkeypatch):
    """A converted model loads its codes as views of the checkpoint's file mapping: they move too, same text."""
    import lowbit
    from tests.io.tiny import random_weights, tiny_config, write_gguf

    monkeypatch.setenv("LOWBIT_CACHE", str(tmp_path / "cache"))
    cfg = tiny_config()
    src = write_gguf(tmp_path / "m.gguf", cfg, random_weights(cfg))
    ref = lowbit.load(src, format="int4", progress=False, warmup=False)
    ref.model._native = NativeDecoder.build(ref.model, hugepages=False)
    assert any(file_backed(w.codes) for w in decode_order_packed_weights(ref.model))
    want = ref.generate("hello", max_tokens=6)
    got = lowbit.load(src, format="int4", progress=False, warmup=False)
    text = got.generate("hello", max_tokens=6)
    ws = decode_order_packed_weights(got.model)
    assert ws and all(getattr(w, "_on_hugepages", False) for w in ws)
    assert text == want


def test_hugepage_buffer():
    b = hugepage_buffer(5000)
    assert b.dtype == np.uint8 and b.shape == (5000,) and b.ctypes.data % (2 << 20) == 0
    assert not b.any() and b.flags.writeable
    b[:] = 7
    assert int(b.sum()) == 7 * 5000
    if hasattr(mmap, "MAP_PRIVATE"):
        assert file_backed(b)  # a raw mmap in its base chain: codes_to_hugepages never copies an arena's views
        # the mapping runs on to the end of the buffer's last huge page, so that page can be a huge one too
        for n in (5000, (2 << 20) + 4096, 3 << 20):
            m = mapping_of(hugepage_buffer(n))
            base = np.frombuffer(m, np.uint8).ctypes.data
            start = base + (-base) % (2 << 20)
            assert base + len(m) >= start + -(-n // (2 << 20)) * (2 << 20), n
    with pytest.raises(ValueError, match="nbytes must be positive"):
        hugepage_buffer(0)



def test_an_int6_head_moves_both_planes_and_a_tied_head_stays():
    # the default conversion's int6 lm_head: both planes into the arena after the blocks', bitwise the same logits
    cfg = {**config("llama"), "tie_word_embeddings": False}
    weights = dummy_weights(cfg)
    weights["lm_head.weight"] = random_weight("int6", cfg["vocab_size"], cfg["hidden_size"], np.random.default_rng(0))
    model = Model.from_weights(cfg, weights, format="int4", max_context=48)
    head = model.lm_head.weight
    assert isinstance(head, Int6Weight)
    ws = decode_order_packed_weights(model)
    assert len(ws) == 7 * len(model.layers) + 2 and ws[-2] is head.lo and ws[-1] is head.hi
    model._native = NativeDecoder.build(model, hugepages=False)
    ref = logits_of(model)
    model._native = NativeDecoder.build(model)
    assert head.lo._on_hugepages and head.hi._on_hugepages
    assert all(np.array_equal(a, b) for a, b in zip(logits_of(model), ref))
    # tied to the embedding, the head shares its table: moving it would copy it
    tied = {**config("llama"), "tie_word_embeddings": True}
    model = Model.from_weights(tied, dummy_weights(tied), format="int4", max_context=48)
    assert model.tied and len(decode_order_packed_weights(model)) == 7 * len(model.layers)
