"""The Python API: load / LLM methods on the tiny model dir, and the conversion cache for other sources."""
import json
import os

import numpy as np
import pytest

import lowbit
from lowbit.api import cache_dir_for, cache_root, conversion_settings
from tests.cli.conftest import make_tokenizer


def test_llm_methods(tiny_dir):
    llm = lowbit.load(tiny_dir)
    assert isinstance(llm, lowbit.LLM) and llm.path == tiny_dir
    ids = llm.tokenizer.encode("The quick brown fox")
    assert llm.logits(ids).shape == (len(ids), llm.tokenizer.vocab_size)
    text = llm.generate("The quick", max_tokens=10)
    s = llm.stream("The quick", max_tokens=10)
    assert "".join(s) == text and llm.last_stats is s.stats and s.stats.generation_tokens >= 1
    msgs = [{"role": "user", "content": "hi"}]
    reply = llm.chat(msgs, max_tokens=8, temperature=0.0)
    assert reply and reply == llm.generate(llm.chat_prompt(msgs), max_tokens=8, temperature=0.0)
    assert llm.chat_prompt([{"role": "user", "content": "hi"}])[0] == llm.tokenizer.token_to_id("<|im_start|>")


def test_generate_batch_max_batch_checked(tiny_dir):
    llm = lowbit.load(tiny_dir)
    with pytest.raises(ValueError, match="max_batch must be >= 1, got 0"):  # 0 silently meant the default
        llm.generate(["The quick", "fox"], max_tokens=2, max_batch=0)


NOT_IDS = [np.array([1.5, 2.0]), np.array([1.0, 2.0]), [3, 2.0], np.array([True, False]), [3, True]]


@pytest.mark.parametrize("ids", NOT_IDS, ids=["float-array", "integral-float-array", "float-in-list", "bool-array",
                                              "bool-in-list"])
def test_token_ids_must_be_integers(tiny_dir, ids):
    """Floats and bools given as token ids were cast (1.5 -> 1, True -> 1) without a word: generate, stream,
    batch generation, logits, prefill, decode and perplexity refuse them, before anything runs or is queued."""
    from lowbit.perplexity import perplexity

    llm = lowbit.load(tiny_dir)
    model = llm.model
    msg = "token ids must be integers"
    with pytest.raises(TypeError, match=msg):
        llm.generate(ids, max_tokens=2)
    with pytest.raises(TypeError, match=msg):
        llm.stream(ids, max_tokens=2)  # at the call, not at the first iteration
    with pytest.raises(TypeError, match=msg):
        llm.generate([[3, 4], ids], max_tokens=2)  # batched: the good prompt is not run either
    assert not llm.batch_engine(2).has_work()
    with pytest.raises(TypeError, match=msg):
        llm.logits(ids)
    with pytest.raises(TypeError, match=msg):
        model.prefill(ids)
    with pytest.raises(TypeError, match=msg):
        perplexity(model, ids, ctx=8)
    model.prefill([3, 4])
    with pytest.raises(TypeError, match=msg):
        model.decode(ids[-1])
    assert model.cache.length == 2  # nothing written


def test_integer_token_ids_of_any_dtype(tiny_dir):
    """numpy integer arrays and scalars of any width are ids; out-of-range ids in a batch fail the call
    before any prompt runs (they used to fail the whole engine step, other prompts included)."""
    llm = lowbit.load(tiny_dir)
    want = llm.logits([3, 4, 5])
    for ids in (np.array([3, 4, 5], np.int32), np.array([3, 4, 5], np.uint16), (np.int64(3), np.uint8(4), 5)):
        np.testing.assert_array_equal(llm.logits(ids), want)
    assert llm.generate(np.array([3, 4, 5], np.int16), max_tokens=3) == llm.generate([3, 4, 5], max_tokens=3)
    vocab = llm.model.args.vocab_size
    with pytest.raises(ValueError, match=f"token id {vocab} is out of range: the vocabulary has {vocab} tokens"):
        llm.generate([[3, 4], [3, vocab]], max_tokens=2)
    assert not llm.batch_engine(2).has_work()
    with pytest.raises(ValueError, match="1-D"):
        llm.logits(np.array([[3, 4]]))


def write_hf_folder(path):
    """A tiny HF-style folder: config.json, model.safetensors (float32), tokenizer files."""
    from safetensors.numpy import save_file

    from lowbit.model.dummy import dummy_weights

    tok = make_tokenizer()
    cfg = dict(model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, vocab_size=tok.vocab_size, max_position_embeddings=128, rms_norm_eps=1e-5,
               tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)
    path.mkdir()
    save_file(dummy_weights(cfg, seed=1, std=0.2), str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(cfg))
    tok.save(path)
    return path


def test_conversion_cache(tmp_path, monkeypatch):
    import sys

    import lowbit.io.convert  # noqa: F401  (lowbit.io re-exports the function under the module's name)

    conv = sys.modules["lowbit.io.convert"]
    src = write_hf_folder(tmp_path / "hf-tiny")
    calls = []
    real = conv.convert
    monkeypatch.setattr(conv, "convert", lambda *a, **k: calls.append(k) or real(*a, **k))
    a = lowbit.load(src, format="int8", progress=False)
    assert calls and calls[0]["format"] == "int8" and a.path.parent == cache_root()
    assert a.load_stats.convert_time > 0 and a.load_stats.convert_peak_gb > 0 and a.load_stats.load_time > 0
    b = lowbit.load(src, format="int8", progress=False)
    assert len(calls) == 1 and b.path == a.path  # converted once
    assert b.load_stats.convert_time == 0 and b.load_stats.rss_after_load_gb > 0
    assert b.model.cache.length == 0  # the warm-up token left no trace in the cache
    np.testing.assert_array_equal(a.logits([3, 4, 5]), b.logits([3, 4, 5]))
    c = lowbit.load(src, format="f32", progress=False)
    assert len(calls) == 2 and c.path != a.path and calls[1]["lm_head_format"] == "f32"
    os.utime(src / "model.safetensors", ns=(1, 1))  # the source changed: a new key
    assert cache_dir_for(src, **conversion_settings("int8")) != a.path


def test_cache_root_env(monkeypatch, tmp_path):
    monkeypatch.setenv("LOWBIT_CACHE", str(tmp_path / "c"))
    assert cache_root() == tmp_path / "c"


def test_missing_source():
    with pytest.raises(FileNotFoundError):
        lowbit.load("/nonexistent/model.gguf")


def test_load_with_an_int8_kv_cache(tiny_dir):
    llm = lowbit.load(tiny_dir, kv_cache="int8")
    assert llm.model.kv_cache == "int8" and llm.model.cache.k.dtype == np.int8
    text = llm.generate("The quick", max_tokens=8)
    assert text and llm.generate("The quick", max_tokens=8) == text  # the cache re-used or not, the same tokens
    with pytest.raises(ValueError, match="unknown KV cache type 'q4'"):
        lowbit.load(tiny_dir, kv_cache="q4")
    with pytest.raises(ValueError, match="kv_cache applies to backend='native'"):
        lowbit.load(tiny_dir, backend="openvino", kv_cache="int8")
