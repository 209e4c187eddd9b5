"""Tiny checkpoints written in each Hugging Face layout lowbit reads load through `lowbit.load` and
generate: Llama (bf16 safetensors, sharded), BitNet b1.58 2B4T (packed uint8 + weight_scale,
autobitlinear), Falcon3-1.58bit (packed, bitlinear), and a GGUF."""
import warnings

import numpy as np
import pytest

import lowbit
from tests.io.tiny import random_weights, tiny_config, write_bitnet_packed, write_gguf, write_hf


def check_runs(llm):
    from lowbit.generate import generate_step

    prompt = llm.tokenizer.encode("hello world")
    llm.model.reset()
    greedy = list(generate_step(llm.model, prompt, max_tokens=6))  # KV-cache path, greedy by default
    assert len(greedy) == 6
    # teacher-forced over prompt + greedy[:-1]: each greedy token is the argmax at its position
    forced = llm.logits(prompt + greedy[:-1])[len(prompt) - 1:]
    assert list(np.argmax(forced, axis=1)) == greedy
    ids = llm.tokenizer.encode("hello there")
    logits = llm.logits(ids)
    assert logits.shape == (len(ids), llm.model.args.vocab_size) and np.isfinite(logits).all()
    # the native decode step and the Python reference agree on this model
    llm.model.reset()
    llm.model.prefill(ids[:-1])
    native = llm.model.decode(ids[-1])
    llm.model.reset()
    llm.model.prefill(ids[:-1])
    ref = llm.model.decode_python(ids[-1])
    assert np.argmax(native) == np.argmax(ref)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LOWBIT_CACHE", str(tmp_path / "cache"))


def test_llama_bf16_sharded(tmp_path, cache):
    cfg = tiny_config()
    src = write_hf(tmp_path / "llama", cfg, random_weights(cfg), shards=2)
    for fmt in ("int4", "int8", "f32"):
        check_runs(lowbit.load(src, format=fmt))


@pytest.mark.parametrize("linear_class", ["autobitlinear", None], ids=["bitnet-2b4t", "falcon3-1.58bit"])
def test_packed_ternary(tmp_path, cache, linear_class):
    sub_norms = linear_class is not None
    cfg = tiny_config(model_type="bitnet" if sub_norms else "llama", hidden_act="relu2" if sub_norms else "silu",
                      tie_word_embeddings=True)
    src, _ = write_bitnet_packed(tmp_path / "src", cfg, linear_class=linear_class, sub_norms=sub_norms)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # lossless ternary: no quality warning, no slow-path warning
        llm = lowbit.load(src, format="ternary")
    check_runs(llm)
    assert llm.model.layers[0].q.weight.format == "ternary"


def test_gguf(tmp_path, cache):
    cfg = tiny_config()
    path = write_gguf(tmp_path / "tiny.gguf", cfg, random_weights(cfg))
    check_runs(lowbit.load(path, format="int4"))
