"""The decoder on tiny random configs: shapes, incremental == teacher-forced, prefix reuse, context
errors, and equality with transformers' Llama and BitNet on the same float weights."""
import numpy as np
import pytest

from lowbit.model import ContextOverflowError, Model, ModelArgs, bitnet, get_model_class
from lowbit.model.dummy import dummy_weights
from tests.model.tiny import tiny_config, tiny_model

IDS = [256, 72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100, 33, 10, 65]


def test_args_from_hf_config():
    a = ModelArgs.from_config({"model_type": "llama", "hidden_size": 576, "num_attention_heads": 9,
                               "num_key_value_heads": 3, "rope_parameters": {"rope_type": "default", "rope_theta": 1e5},
                               "unknown_key": 1})
    assert a.head_dim == 64 and a.rope_theta == 1e5 and a.rope_scaling is None and a.extra["unknown_key"] == 1
    assert ModelArgs.from_config({"model_type": "mobilellm", "share_embedding": True}).tie_word_embeddings
    with pytest.raises(ValueError, match="unsupported model_type"):
        get_model_class("gpt2")


def test_shapes():
    m = tiny_model()
    assert m.prefill(IDS[:5]).shape == (260,)
    assert m.decode(7).shape == (260,)
    assert m.cache.length == 6 and m.cache.tokens == IDS[:5] + [7]
    assert m.logits(IDS).shape == (len(IDS), 260) and m.cache.length == 0
    assert m.cache.k.shape == (2, 2, 128, 16)


@pytest.mark.parametrize("native", [False, True])
@pytest.mark.parametrize("format", [None, "int8", "ternary"])
def test_decode_equals_teacher_forced(format, native):
    m = tiny_model(format=format)
    m.native_decode = native
    full = m.logits(IDS)  # [n, vocab]
    m.reset()
    got = [m.prefill(IDS[:4])]
    got += [m.decode(t) for t in IDS[4:]]
    assert (m._native is not None) == native
    if format:
        # Decode (one token, numpy or C++ attention) and the teacher-forced pass (native prefill attention)
        # sum attention in different orders; an activation that lands within an ulp of an int8 rounding
        # boundary can then round to a neighbouring code in one of them: one int8 step apart at most,
        # on a few positions, the top token unchanged (see test_native_decoder.py).
        got = np.stack(got)
        np.testing.assert_allclose(got, full[3:], rtol=0, atol=5e-2 * np.abs(full).max())
        assert (got.argmax(1) == full[3:].argmax(1)).all()
        close = np.isclose(got, full[3:], rtol=1e-4, atol=1e-4).all(axis=1)
        assert close.mean() >= 0.75, f"only {close.sum()} of {len(close)} positions agree to 1e-4"
    else:
        np.testing.assert_allclose(np.stack(got), full[3:], rtol=1e-4, atol=1e-4)


def test_chunked_prefill_and_prefix_continuation():
    m = tiny_model()
    full = m.logits(IDS)
    np.testing.assert_allclose(m.prefill(IDS, all_logits=True, chunk=5), full, rtol=1e-5, atol=1e-5)
    m.reset()
    m.prefill(IDS[:7])
    np.testing.assert_allclose(m.prefill(IDS[7:], all_logits=True), full[7:], rtol=1e-5, atol=1e-5)


def test_context_overflow():
    m = tiny_model(max_context=8)
    m.prefill(IDS[:8])
    with pytest.raises(ContextOverflowError, match="context"):
        m.decode(1)
    m.reset()
    with pytest.raises(ContextOverflowError):
        m.prefill(IDS[:9])


@pytest.mark.parametrize("native", [True, False])
def test_token_ids_out_of_range(native):
    m = tiny_model()
    m.native_decode = native
    vocab = m.embed.shape[0]
    for bad in (vocab, -1):  # -1 gathered the last row (numpy's negative index) without a word
        with pytest.raises(ValueError, match=f"token id {bad} is out of range: the vocabulary has {vocab} tokens"):
            m.prefill([1, bad, 2])
        with pytest.raises(ValueError, match="out of range"):
            m.logits([bad])
    m.reset()
    m.prefill([1, 2])
    with pytest.raises(ValueError, match=f"token id {vocab} (is out of range|outside the vocabulary)"):
        m.decode(vocab)
    assert m.cache.length == 2  # nothing written


def test_token_ids_helper():
    """layers.token_ids: integer lists, tuples and arrays of any integer dtype in; floats (even 2.0), bools,
    strings, scalars and 2-D arrays out, with what was wrong and what is allowed."""
    from lowbit.model.layers import token_ids

    for ok in ([3, 4], (np.int32(3), 4), np.array([3, 4], np.uint8), np.array([3, 4], np.int16)):
        got = token_ids(ok, 5)
        assert got.dtype == np.int64 and got.tolist() == [3, 4]
    assert token_ids([]).shape == (0,)
    for bad, what in ((np.array([1.0, 2.0]), "dtype float64"), (np.array([1, 0], bool), "dtype bool"),
                      ([1, 2.0], r"2\.0 \(float\) at index 1"), ([True], r"True \(bool\)"),
                      ([np.float32(1)], "float32"), ([1, "2"], "str"), ("12", "got str"), (5, "got int")):
        with pytest.raises(TypeError, match=what):
            token_ids(bad, 5)
    with pytest.raises(TypeError, match=r"Python int or a numpy integer"):
        token_ids([1.5])
    with pytest.raises(ValueError, match=r"1-D sequence, got an array of shape \(1, 2\)"):
        token_ids(np.array([[1, 2]]))
    for bad in (-1, 5, 2**64):
        with pytest.raises(ValueError, match=f"token id {bad} is out of range: the vocabulary has 5 tokens"):
            token_ids([1, bad], 5)
    with pytest.raises(ValueError, match="token id 300 is out of range"):
        token_ids(np.array([1, 300], np.uint16), 5)  # checked before the cast


@pytest.mark.parametrize("native", [True, False])
def test_float_token_ids_refused(native):
    """prefill / decode / logits / the batched step refuse float and bool ids (they were truncated: 1.5 -> 1)."""
    from lowbit.model.batch import BatchDecoder

    m = tiny_model()
    m.native_decode = native
    for bad in (np.array([1.0, 2.0]), [1, 2.5], np.array([True])):
        with pytest.raises(TypeError, match="token ids must be integers"):
            m.prefill(bad)
        with pytest.raises(TypeError, match="token ids must be integers"):
            m.logits(bad)
    m.prefill([1, 2])
    for bad in (2.0, np.float32(2), True):
        with pytest.raises(TypeError, match="token ids must be integers"):
            m.decode(bad)
    assert m.cache.length == 2 and m.cache.tokens == [1, 2]
    bd = BatchDecoder(m, 2, native=native)
    with pytest.raises(TypeError, match="token ids must be integers"):
        bd.prefill(0, [1, 2.0])
    with pytest.raises(TypeError, match="token ids must be integers"):
        bd.step([(0, [1], True), (1, np.array([1.0, 2.0]), True)])
    with pytest.raises(TypeError, match="token ids must be integers"):
        bd.decode([1, 2.0], [0, 1])
    with pytest.raises(ValueError, match="out of range"):
        bd.decode([1, m.embed.shape[0]], [0, 1])
    assert bd.slot(0).length == bd.slot(1).length == 0


def test_max_context_checked():
    with pytest.raises(ValueError, match="max_context must be >= 1, got 0"):
        tiny_model(max_context=0)  # 0 took the default before, without a word
    with pytest.warns(UserWarning, match="past the 128 positions the model was trained on"):
        m = tiny_model(max_context=200)
    assert m.cache.max_ctx == 200
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert tiny_model(max_context=128).cache.max_ctx == 128  # up to max_position_embeddings: no warning


def test_untied_gqa_bias_variants():
    cfg = tiny_config(tie_word_embeddings=False, num_key_value_heads=1, attention_bias=True)
    w = dummy_weights(cfg)
    for p in ("q", "k", "v"):
        w[f"model.layers.0.self_attn.{p}_proj.bias"] = np.full(w[f"model.layers.0.self_attn.{p}_proj.weight"].shape[0], 0.1, np.float32)
    m = Model.from_weights(cfg, w)
    assert not m.tied and np.all(m.layers[0].q.bias == 0.1)
    assert m.layers[1].o.bias is not None and m.layers[1].gate.bias is None  # attention_bias: q, k, v and o
    full = m.logits(IDS)
    m.prefill(IDS[:3])
    np.testing.assert_allclose(m.decode(IDS[3]), full[3], rtol=1e-5, atol=1e-5)


def test_bitnet_is_a_flag():
    m = tiny_model(model_type="bitnet", hidden_act="relu2")
    assert isinstance(m, bitnet.Model) and m.layers[0].attn_sub is not None
    with pytest.raises(KeyError, match="attn_sub_norm"):
        Model.from_weights(tiny_config(model_type="bitnet"), dummy_weights(tiny_config()))


@pytest.mark.parametrize("arch", ["llama", "llama3-rope", "bitnet"])
def test_matches_transformers(arch):
    """Same float weights in transformers and lowbit's f32 path: logits agree to float32 rounding."""
    torch = pytest.importorskip("torch")  # here, not at module level: the tests above need no torch
    transformers = pytest.importorskip("transformers")
    kw = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              vocab_size=120, max_position_embeddings=128, tie_word_embeddings=arch != "llama", rope_theta=500000.0,
              bos_token_id=1, eos_token_id=2)
    if arch == "bitnet":
        cfg, cls = transformers.BitNetConfig(**kw), transformers.BitNetForCausalLM
    else:
        if arch == "llama3-rope":
            kw["rope_scaling"] = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                      original_max_position_embeddings=16)
        cfg, cls = transformers.LlamaConfig(**kw), transformers.LlamaForCausalLM
    torch.manual_seed(0)
    hf = cls(cfg).eval()
    weights = {k: v.detach().numpy() for k, v in hf.state_dict().items()}
    m = Model.from_weights(cfg.to_dict(), weights)
    ids = [int(i) for i in np.random.default_rng(0).integers(0, 120, 40)]
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0].numpy()
    np.testing.assert_allclose(m.logits(ids), ref, rtol=1e-4, atol=1e-5)
