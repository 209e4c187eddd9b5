"""Sampling: greedy, seeded determinism, the top-k / top-p / min-p cuts, repetition penalty."""
import numpy as np
import pytest

from lowbit.generate import Sampler, SamplingParams, apply_repetition_penalty


def logits_of(n=1000, seed=0):
    return (np.random.default_rng(seed).standard_normal(n) * 3).astype(np.float32)


def draws(params, logits, n=50):
    s = Sampler(params)
    return [s(logits) for _ in range(n)]


def test_greedy_is_argmax():
    x = logits_of()
    assert Sampler(SamplingParams())(x) == int(np.argmax(x))


def test_seed_determinism():
    x = logits_of()
    p = SamplingParams(temperature=1.0, top_p=0.9, seed=7)
    assert draws(p, x) == draws(p, x)
    assert draws(p, x) != draws(SamplingParams(temperature=1.0, top_p=0.9, seed=8), x)


@pytest.mark.parametrize("kw", [dict(top_k=1), dict(top_p=1e-6), dict(top_p=0.0), dict(min_p=0.999)])
def test_narrow_cuts_are_greedy(kw):
    x = logits_of()
    assert set(draws(SamplingParams(temperature=1.5, seed=0, **kw), x)) == {int(np.argmax(x))}


@pytest.mark.parametrize("vocab", [100, 5000])  # all sorted / the partial sort of the best 256
@pytest.mark.parametrize("kw", [dict(), dict(top_k=40), dict(min_p=0.05), dict(top_k=3, min_p=0.5),
                                dict(repetition_penalty=4.0)])
def test_top_p_zero_keeps_the_most_likely_token(vocab, kw):
    # top_p 0 was refused ("must be in (0, 1]"); llama.cpp and HF read it as: keep the most likely token alone,
    # after the other filters (here the repetition penalty demotes the argmax: the runner-up is kept)
    x = logits_of(vocab, seed=5)
    history = [int(np.argmax(x))]
    want = int(np.argmax(apply_repetition_penalty(x, history, kw.get("repetition_penalty", 1.0), 64)))
    s = Sampler(SamplingParams(temperature=2.0, top_p=0.0, seed=0, **kw))
    assert {s(x, history) for _ in range(50)} == {want}
    assert reference_keep(x, 2.0, top_p=0.0) == {int(np.argmax(x))}


def reference_keep(x, temperature, top_k=0, top_p=1.0, min_p=0.0):
    """The set of ids a full sort keeps (HF order: temperature, top-k, top-p, min-p)."""
    z = x.astype(np.float64) / temperature
    order = np.argsort(-z, kind="stable")
    if top_k:
        order = order[:top_k]
    p = np.exp(z[order] - z[order[0]])
    p /= p.sum()
    n = len(order)
    if top_p < 1:
        n = min(n, int(np.searchsorted(np.cumsum(p), top_p)) + 1)
    if min_p > 0:
        n = min(n, int(np.count_nonzero(p >= min_p * p[0])))
    return set(order[:n].tolist())


@pytest.mark.parametrize("kw", [dict(top_k=5), dict(top_p=0.5), dict(top_p=0.999), dict(min_p=0.05),
                                dict(top_p=0.9, min_p=0.01), dict(top_k=50, top_p=0.8)])
def test_support_matches_full_sort(kw):
    x = logits_of(5000, seed=3)
    keep = reference_keep(x, 1.0, **kw)
    got = set(draws(SamplingParams(temperature=1.0, seed=1, **kw), x, n=400))
    assert got <= keep
    if len(keep) <= 5:
        assert got == keep


def test_frequencies_follow_softmax():
    x = np.array([2.0, 1.0, 0.0, -1.0], np.float32)
    counts = np.bincount(draws(SamplingParams(temperature=1.0, seed=0), x, n=20000), minlength=4) / 20000
    p = np.exp(x) / np.exp(x).sum()
    np.testing.assert_allclose(counts, p, atol=0.015)


def test_repetition_penalty():
    x = np.array([2.0, -2.0, 1.0], np.float32)
    y = apply_repetition_penalty(x, [0, 1], 2.0, 64)
    np.testing.assert_allclose(y, [1.0, -4.0, 1.0])
    assert x[0] == 2.0  # not modified in place
    assert Sampler(SamplingParams(repetition_penalty=3.0))(x, history=[0]) == 2


def test_bad_params():
    with pytest.raises(ValueError):
        SamplingParams(temperature=-1)
    assert SamplingParams(top_p=0.0).top_p == 0.0  # only the most likely token
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError, match=rf"top_p must be in \[0, 1\] \(1: off, 0: only the most likely "
                                             rf"token\), got {bad}"):
            SamplingParams(top_p=bad)


@pytest.mark.parametrize("kw", [dict(temperature=float("nan")), dict(temperature=float("inf")),
                                dict(top_p=float("nan")), dict(min_p=float("nan")),
                                dict(repetition_penalty=float("nan")), dict(repetition_penalty=float("inf"))])
def test_non_finite_params_are_refused(kw):
    # NaN passed every range check: temperature NaN sampled garbage, repetition_penalty NaN an empty reply
    with pytest.raises(ValueError, match=f"{next(iter(kw))} must be a finite number"):
        SamplingParams(**kw)


def test_negative_seed_is_refused_by_name():
    # it reached numpy, whose "expected non-negative integer" named no parameter
    with pytest.raises(ValueError, match="seed must be a non-negative integer"):
        SamplingParams(temperature=1.0, seed=-1)
    assert SamplingParams(seed=np.uint32(5)).seed == 5


@pytest.mark.parametrize("bad", [-2, -64, 1.5, True, "8"])
def test_bad_repetition_window_is_refused(bad):
    # -64 meant "the whole history" without a word, 1.5 sliced the history with a float
    with pytest.raises(ValueError, match="repetition_window must be an integer >= -1"):
        SamplingParams(repetition_penalty=1.3, repetition_window=bad)


def test_repetition_window_zero_and_minus_one_take_the_whole_history():
    logits = np.ones(6, np.float32)
    history = [1, 2, 3, 4]
    for w in (0, -1):
        SamplingParams(repetition_window=w)  # accepted
        out = apply_repetition_penalty(logits, history, 2.0, w)
        np.testing.assert_array_equal(out, [1, 0.5, 0.5, 0.5, 0.5, 1])
    np.testing.assert_array_equal(apply_repetition_penalty(logits, history, 2.0, 2), [1, 1, 1, 0.5, 0.5, 1])
