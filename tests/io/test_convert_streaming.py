"""Streaming conversion: matrices read as stored (SourceRows over the mmapped f16/bf16/f32 data) give the
same packed output as the float32 path; shards are written straight to disk (SafetensorsStreamWriter)."""
import json

import numpy as np
import pytest

from lowbit.formats.base import SourceRows
from lowbit.io.checkpoint import EMBED, is_linear, open_checkpoint
from lowbit.io.convert import convert, pack
from lowbit.io.modeldir import ModelDirWriter
from lowbit.io.safetensors_file import SafetensorsFile, SafetensorsStreamWriter

from tests.io.tiny import random_weights, tiny_config, write_gguf, write_hf, write_tokenizer

FORMATS = ["int8", "int4", "int2", "ternary", "tq1", "binary", "bf16", "f32"]


def same_state(a, b):
    ma, ta = a.state()
    mb, tb = b.state()
    assert ma == mb and ta.keys() == tb.keys()
    for k in ta:
        np.testing.assert_array_equal(np.asarray(ta[k]).view(np.uint8), np.asarray(tb[k]).view(np.uint8), err_msg=k)


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    d = tmp_path_factory.mktemp("src")
    cfg = tiny_config(vocab_size=300)
    w = random_weights(cfg, seed=3)
    hf = d / "hf-bf16"
    write_hf(hf, cfg, w, dtype="bf16")
    write_tokenizer(hf)
    hf16 = d / "hf-f16"
    write_hf(hf16, cfg, w, dtype="f16")
    write_tokenizer(hf16)
    gg = write_gguf(d / "m.gguf", cfg, w, default_type="F16")
    return [hf, hf16, gg]


@pytest.mark.parametrize("fmt", FORMATS)
def test_source_rows_pack_like_float32(sources, fmt):
    for src in sources:
        ck = open_checkpoint(src)
        for name in ck.tensor_names():
            if not (is_linear(name) or name == EMBED):
                continue
            s = ck.load_source(name)
            assert isinstance(s, SourceRows), (src, name)
            np.testing.assert_array_equal(s.float32(), ck.load(name))  # Q/K un-permuted by the row index
            same_state(pack(s, fmt), pack(ck.load(name), fmt))


def test_converted_dirs_equal(sources, tmp_path):
    a = convert(sources[2], tmp_path / "a", format="int4", progress=False)
    ck = open_checkpoint(a)
    for name in ck.tensor_names():
        v = ck.load(name)
        ref = open_checkpoint(sources[2]).load(name)
        if isinstance(v, np.ndarray):
            np.testing.assert_array_equal(v, ref)
        else:
            same_state(v, pack(ref, ck.lowbit["tensors"][name]["format"]))


def test_stream_writer_round_trip(tmp_path):
    from safetensors.numpy import load_file

    arrays = {"a": np.arange(10, dtype=np.float32), "b": np.ones((3, 5), np.uint8), "c": np.full(7, 2, np.float16),
              "d": np.arange(6, dtype=np.uint16).reshape(2, 3)}
    w = SafetensorsStreamWriter(tmp_path / "x.safetensors", header_room=4096)
    for k, v in arrays.items():
        assert w.fits(k, v)
        w.add(k, v)
    w.close({"format": "lowbit"})
    back = load_file(str(tmp_path / "x.safetensors"))  # the reference reader accepts the padded header
    ours = SafetensorsFile(tmp_path / "x.safetensors")
    assert ours.metadata == {"format": "lowbit"}
    for k, v in arrays.items():
        np.testing.assert_array_equal(back[k], v)
        np.testing.assert_array_equal(ours.raw(k), v)
    with pytest.raises(ValueError, match="twice"):
        w2 = SafetensorsStreamWriter(tmp_path / "y.safetensors")
        w2.add("a", arrays["a"])
        w2.add("a", arrays["a"])
    small = SafetensorsStreamWriter(tmp_path / "z.safetensors", header_room=64)
    assert not small.fits("a-long-name-" * 10, arrays["a"])


def test_stream_writer_fits_is_exact(tmp_path):
    """fits() (a cached header length + the new entry) says yes exactly when the full header would fit."""
    meta = {"format": "lowbit"}
    rng = np.random.default_rng(0)
    for room in (256, 1000):
        w = SafetensorsStreamWriter(tmp_path / f"f{room}.safetensors", header_room=room)
        for i in range(40):
            key, arr = f"t.{i}." + "x" * int(rng.integers(0, 20)), np.zeros(int(rng.integers(1, 5000)), np.uint8)
            full = len(w._header(meta, {key: w._entry(arr)})) <= w.room
            assert w.fits(key, arr, meta) == full
            if not full:
                break
            w.add(key, arr)
        assert not full  # the room filled up at some point
        w.close(meta)


def test_writer_starts_a_new_shard_when_the_header_room_fills(tmp_path, monkeypatch):
    import lowbit.io.modeldir as md

    monkeypatch.setattr(md, "SafetensorsStreamWriter",
                        lambda path: SafetensorsStreamWriter(path, header_room=512))
    with ModelDirWriter(tmp_path / "out") as w:
        for i in range(20):
            w.add(f"t{i}", np.full(4, i, np.float32))
        w.finish({"model_type": "llama"}, None, {})
    index = json.loads((tmp_path / "out" / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 1
    for i in range(20):
        f = SafetensorsFile(tmp_path / "out" / index["weight_map"][f"t{i}"])
        np.testing.assert_array_equal(f.raw(f"t{i}"), np.full(4, i, np.float32))
