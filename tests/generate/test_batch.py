"""Continuous batching (generate/batch.py) on a tiny random model: batched text equals one-at-a-time text
(greedy and seeded sampling, stop strings, EOS, max_tokens, a full context), more prompts than slots,
prefix re-use, cancellation, and llm.generate([...])."""
import numpy as np
import pytest

from lowbit.api import LLM
from lowbit.generate import Generation, SamplingParams, stream
from lowbit.generate.batch import BatchEngine, generate_batch
from lowbit.model import ContextOverflowError
from tests.model.tiny import ByteTokenizer, tiny_model

PROMPTS = ["Hello", "The quick brown fox", "a", "Once upon a time, in a land far away", "xyz", "12345"]


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=3, format="int4", max_context=64)


def sequential(model, prompts, **kw):
    out = []
    for p in prompts:
        model.reset()
        g = stream(model, ByteTokenizer(), p, **kw)
        out.append(("".join(g), g.stats.generation_tokens, g.stats.finish_reason))
    return out


@pytest.mark.parametrize("max_batch", [1, 2, 6])
def test_batched_greedy_equals_sequential(model, max_batch):
    want = sequential(model, PROMPTS, max_tokens=12)
    eng = BatchEngine(model, ByteTokenizer(), max_batch=max_batch, prefill_chunk=4)  # prompts span chunks
    seqs = generate_batch(model, ByteTokenizer(), PROMPTS, max_tokens=12, engine=eng)
    assert [(s.text, len(s.tokens), s.finish_reason) for s in seqs] == want
    assert not eng.active and sorted(eng.free) == list(range(max_batch))


def test_batched_sampling_stops_and_lengths_equal_sequential(model):
    kw = dict(temperature=0.9, top_p=0.9, seed=7)
    free = sequential(model, PROMPTS, max_tokens=20, **kw)
    stop = [free[0][0][4:6], free[1][0][7]]  # strings the sampled texts do contain
    want = sequential(model, PROMPTS, max_tokens=20, stop=stop, **kw)
    assert sum(r == "stop" for _, _, r in want) >= 2
    seqs = generate_batch(model, ByteTokenizer(), PROMPTS, max_tokens=20, stop=stop,
                          params=SamplingParams(**kw), max_batch=3)
    assert [(s.text, len(s.tokens), s.finish_reason) for s in seqs] == want
    # EOS: make a token the greedy run of PROMPTS[2] produces an end-of-sequence id
    eng = BatchEngine(model, ByteTokenizer(), max_batch=2)
    first = generate_batch(model, ByteTokenizer(), PROMPTS[2:3], max_tokens=8, engine=eng)[0]
    eng.eos_ids = {first.tokens[3]}
    seqs = generate_batch(model, ByteTokenizer(), PROMPTS[1:3], max_tokens=8, engine=eng)
    model.reset()
    g = Generation(model, ByteTokenizer(), PROMPTS[2], max_tokens=8, eos_ids={first.tokens[3]})
    assert seqs[1].text == "".join(g) and seqs[1].finish_reason == "stop" and len(seqs[1].tokens) == 4
    # the context fills: the tiny model's max_context is 64
    long = ["x" * 50]
    want = sequential(model, long, max_tokens=40)
    seqs = generate_batch(model, ByteTokenizer(), long, max_tokens=40)
    assert [(s.text, len(s.tokens), s.finish_reason) for s in seqs] == want
    assert seqs[0].finish_reason == "length" and len(seqs[0].tokens) < 40


def test_prefix_reuse_and_cancel(model):
    tok = ByteTokenizer()
    eng = BatchEngine(model, tok, max_batch=2)
    ids = tok.encode("Once upon a time")
    first = eng.submit(ids, max_tokens=4)
    eng.run()
    again = eng.submit(ids + first.tokens[:2], max_tokens=4)
    eng.run()
    assert again.stats.cached_tokens == len(ids) + 1  # the slot still held the prompt and the first reply
    model.reset()
    assert again.text == "".join(stream(model, tok, ids + first.tokens[:2], max_tokens=4))

    pieces = []
    a = eng.submit(tok.encode("abc"), max_tokens=30, on_piece=lambda s, p: pieces.append(p))
    b = eng.submit(tok.encode("def"), max_tokens=5)
    for _ in range(4):
        eng.step()
    a.cancel()
    eng.run()
    assert a.finish_reason == "cancelled" and len(a.tokens) < 30 and "".join(pieces) == a.text
    assert b.finish_reason == "length" and len(b.tokens) == 5
    w = eng.submit(tok.encode("ghi"), max_tokens=5)
    w.cancel()  # cancelled while still waiting
    eng.run()
    assert w.finish_reason == "cancelled" and w.tokens == [] and w.done_event.is_set()
    with pytest.raises(ContextOverflowError):
        eng.submit([65] * 64)
    with pytest.raises(ValueError, match="empty"):
        eng.submit([])
    assert sorted(eng.free) == [0, 1]


def test_llm_generate_list(model):
    llm = LLM(model, ByteTokenizer())
    texts = llm.generate(PROMPTS[:3], max_tokens=8)
    assert isinstance(texts, list) and len(texts) == 3
    assert texts == [llm.generate(p, max_tokens=8) for p in PROMPTS[:3]]
    assert len(llm.generate([ByteTokenizer().encode("hi")], max_tokens=3)) == 1  # a list of id lists
    assert isinstance(llm.generate(ByteTokenizer().encode("hi"), max_tokens=3), str)  # one id list: one prompt
    llm.generate(PROMPTS[:2], max_tokens=3)
    assert isinstance(llm.last_stats, list) and llm.last_stats[0].generation_tokens <= 3
    assert np.all([s.prompt_tokens > 0 for s in llm.last_stats])


def test_mixed_prefill_decode_equals_sequential(model):
    """Newcomers' prompt chunks run in the same steps as the running sequences' decode rows: a request
    arriving mid-decode with a prompt longer than the chunk delays nobody's next token, and every text is
    the one-at-a-time greedy text."""
    tok = ByteTokenizer()
    prompts = ["Hi", "The quick brown fox jumps over", "xy"]
    want = sequential(model, prompts, max_tokens=14)
    eng = BatchEngine(model, tok, max_batch=3, prefill_chunk=5)
    a = eng.submit(tok.encode(prompts[0]), max_tokens=14)
    for _ in range(3):
        eng.step()
    assert a.state == "decode" and len(a.tokens) == 3  # its 3-id prompt took one step
    b = eng.submit(tok.encode(prompts[1]), max_tokens=14)  # 31 ids: 7 chunks of <= 5
    c = eng.submit(tok.encode(prompts[2]), max_tokens=14)
    rows = eng.rows
    for i in range(3):
        eng.step()
        assert len(a.tokens) == 4 + i  # a gets a token every step while b is prefilled
    assert b.state == "prefill" and b.n_cached == 15 and eng.rows - rows == 3 + 15
    eng.run()
    assert [(s.text, len(s.tokens), s.finish_reason) for s in (a, b, c)] == want
