"""The generation loop on a tiny random model with a byte tokenizer: streaming across multi-byte
characters, EOS, stop strings, max_tokens, prompt too long, prefix reuse, stats."""
import numpy as np
import pytest

from lowbit.generate import Sampler, StopMatcher, StreamDecoder, generate, generate_step, stream
from lowbit.model import ContextOverflowError
from tests.model.tiny import EOS, ByteTokenizer, tiny_model


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=3)


def test_stream_decoder_multibyte():
    tok = ByteTokenizer()
    text = "héllo → 世界 🙂!"
    dec = StreamDecoder(tok)
    pieces = [dec.push(i) for i in text.encode("utf-8")] + [dec.flush()]
    assert "".join(pieces) == text
    assert not any("\ufffd" in p for p in pieces)
    assert pieces[text.encode().index("🙂".encode()) + 3] == "🙂"  # emitted whole, on its last byte


def test_stop_matcher_across_pieces():
    s = StopMatcher(["STOP", "\n\n"])
    out = [s.push(p) for p in ["abc S", "TO", "xST", "OP tail"]]
    assert "".join(out) == "abc STOx" and s.stopped
    s = StopMatcher(["END"])
    assert s.push("E") == "" and s.push("x") == "Ex" and s.flush() == ""
    s = StopMatcher(["END"])
    assert s.push("abE") == "ab" and s.flush() == "E"


def test_bad_stop_is_refused_up_front(model):
    # stop=5 failed in the first iteration with "'int' object is not iterable"; stop=[5] with an AttributeError
    tok = ByteTokenizer()
    for stop in (5, [5], ["ok", None]):
        with pytest.raises(TypeError, match="stop must be a string or a list of strings"):
            stream(model, tok, "ab", max_tokens=2, stop=stop)
    assert StopMatcher(("a", "")).stops == ["a"] and StopMatcher(None).stops == []


def test_generate_step_greedy_matches_argmax(model):
    model.reset()
    toks = list(generate_step(model, [256, 65, 66], Sampler(), max_tokens=6))
    model.reset()
    logits = model.prefill([256, 65, 66])
    ref = []
    for _ in range(6):
        ref.append(int(np.argmax(logits)))
        logits = model.decode(ref[-1])
    assert toks == ref


def test_stream_equals_generate_and_stats(model):
    model.reset()
    s = stream(model, model.tokenizer, "Hi", max_tokens=12)
    text = "".join(s)
    assert text == s.text == model.tokenizer.decode(s.tokens) and len(s.tokens) <= 12
    model.reset()
    assert generate(model, model.tokenizer, "Hi", max_tokens=12) == text
    st = s.stats
    assert st.prompt_tokens == 3 and st.generation_tokens == len(s.tokens) and st.peak_memory_gb > 0
    assert st.prompt_tps > 0 and "tokens/s" in str(st)


def test_seeded_sampling_reproducible(model):
    kw = dict(max_tokens=16, temperature=1.0, top_k=50, seed=11)
    a = stream(model, model.tokenizer, "x", **kw)
    b = stream(model, model.tokenizer, "x", **kw)
    assert list(a) and a.text == "".join(b) and a.tokens == b.tokens


def test_eos_stops_and_is_not_emitted(model):
    model.reset()
    g = stream(model, model.tokenizer, "Hi", max_tokens=20, temperature=1.0, seed=0)
    g.eos_ids = {g_tok for g_tok in range(260)}  # every token ends generation
    assert list(g) == [] and g.stats.finish_reason == "stop" and len(g.tokens) == 1


def test_stop_string_cuts_output(model):
    free = generate(model, model.tokenizer, "Hi", max_tokens=24, temperature=1.0, seed=5)
    assert len(free) >= 6
    stop = free[3:5]
    cut = free[:free.index(stop)]
    g = stream(model, model.tokenizer, "Hi", max_tokens=24, temperature=1.0, seed=5, stop=[stop])
    assert "".join(g) == cut and g.stats.finish_reason == "stop"


def test_prompt_too_long():
    m = tiny_model(max_context=16)
    with pytest.raises(ContextOverflowError, match="context holds 16"):
        generate(m, m.tokenizer, "x" * 40, max_tokens=4)
    # a prompt that fits stops with 'length' when the context fills
    g = stream(m, m.tokenizer, "x" * 10, max_tokens=50)
    list(g)
    assert len(g.tokens) == 16 - 11 + 1 and g.stats.finish_reason in ("length", "stop")
    assert g.stats.context_full == (g.stats.finish_reason == "length")
    g = stream(m, m.tokenizer, "x" * 10, max_tokens=3)
    list(g)
    assert not g.stats.context_full  # max_tokens ended it


def test_prefix_reuse(model):
    model.reset()
    a = stream(model, model.tokenizer, "Hello there", max_tokens=4)
    list(a)
    b = stream(model, model.tokenizer, "Hello there, friend", max_tokens=4)
    text_b = "".join(b)
    assert b.stats.cached_tokens == len(model.tokenizer.encode("Hello there"))
    model.reset()
    assert generate(model, model.tokenizer, "Hello there, friend", max_tokens=4) == text_b


def test_eos_id_from_tokenizer(model):
    g = stream(model, model.tokenizer, "Hi", max_tokens=2)
    assert EOS in g.eos_ids


def test_max_tokens_zero_runs_the_prompt_only(model):
    # as llama.cpp's -n 0: nothing generated, the prompt's K/V cached and its time and memory reported
    model.reset()
    g = stream(model, model.tokenizer, "Hello there", max_tokens=0)
    assert list(g) == [] and g.tokens == [] and g.stats.finish_reason == "length"
    n = len(g.prompt_ids)
    assert model.cache.length == n and g.stats.prompt_time > 0
    assert g.stats.generation_tokens == 0 and g.stats.peak_memory_gb > 0 and g.stats.rss_end_gb > 0
    # the next call reuses that prompt's K/V and continues exactly as a fresh run would
    b = stream(model, model.tokenizer, "Hello there, friend", max_tokens=4)
    text_b = "".join(b)
    assert b.stats.cached_tokens == n
    model.reset()
    assert generate(model, model.tokenizer, "Hello there, friend", max_tokens=4) == text_b
    with pytest.raises(ContextOverflowError, match="context holds 16"):
        list(stream(tiny_model(max_context=16), model.tokenizer, "x" * 40, max_tokens=0))
