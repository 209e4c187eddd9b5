"""The native forward over N tokens (kernels/decoder.cpp: Decoder::forward, what prefill runs) against the
numpy reference block (Model.prefill_python), on every ISA path and every weight format.

The native step treats every row alone (each row's activations are quantized and accumulated by itself, and
attention of row r reads the cache up to its own position), so the same tokens give bitwise the same logits
and cache however they are cut: one chunk, chunks of 16, a cached prefix plus the rest, or one decode step
per token. Against the numpy reference they differ by float rounding only: 1e-5 of the largest logit for
f32, 1e-4 where the cache is float16 (bf16, codebook: a K/V value may round one ulp apart), and for the int8
activation formats one activation may round one int8 step the other way (see test_native_decoder.py):
every position to 5e-2, and the same top token at >= 90 % of them."""
import numpy as np
import pytest

from lowbit.model import Model
from lowbit.model.dummy import dummy_weights
from lowbit.model.kv_cache import dequantize_kv_rows
from lowbit.model.native import NativeDecoder

from .test_native_decoder import FAMILY_EXTRAS, config

FORMATS = ["f32", "bf16", "int8", "int6", "int4", "int2", "ternary", "tq1", "binary", "codebook"]
IDS = [(37 * i + 11) % 300 for i in range(40)]  # 40 tokens: chunks of 16 leave a ragged 8


def build(fmt: str, model_type: str = "llama", max_context: int = 48, kv_cache: str | None = None, **over) -> Model:
    cfg = {**config(model_type), **over}
    opts = dict(m=2, v=4, b=5, g=64, iters=1) if fmt == "codebook" else {}
    return Model.from_weights(cfg, dummy_weights(cfg), format=fmt, max_context=max_context, kv_cache=kv_cache, **opts)


def rel_err(a: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(a - ref).max() / np.abs(ref).max())


def check_close(got: np.ndarray, ref: np.ndarray, fmt: str) -> None:
    """got, ref: logits [n, vocab] (the tolerances of the module docstring)."""
    if fmt == "f32":
        assert rel_err(got, ref) < 1e-5
    elif fmt in ("bf16", "codebook"):
        assert rel_err(got, ref) < 1e-4
    else:
        assert rel_err(got, ref) < 5e-2
        assert (got.argmax(1) == ref.argmax(1)).mean() >= 0.9


@pytest.mark.parametrize("fmt", FORMATS)
def test_native_forward_matches_numpy_reference(isa, fmt):
    # BitNet (sub-norms, squared ReLU) for the formats made for it, Llama (SiLU) for the others
    model = build(fmt, "bitnet" if fmt in ("ternary", "tq1", "binary") else "llama")
    assert isinstance(NativeDecoder.build(model), NativeDecoder)
    n = len(IDS)
    ref = model.prefill_python(IDS, all_logits=True)  # the numpy block, one pass
    ref_k = model.cache.k[:, :, :n].astype(np.float32)
    model.reset()
    whole = model.prefill(IDS, all_logits=True, chunk=n)  # native, one chunk of 40 rows
    assert model.cache.length == n and model.cache.tokens == IDS
    whole_k = model.cache.k[:, :, :n].copy()
    check_close(whole, ref, fmt)
    tol = {"f32": 1e-5, "bf16": 1e-4, "codebook": 1e-4}.get(fmt, 5e-2)
    if model.cache.k.dtype == np.float16:
        tol = max(tol, 2.0**-10)  # both write float16: one ulp apart
    np.testing.assert_allclose(whole_k.astype(np.float32), ref_k, rtol=0, atol=tol * np.abs(ref_k).max())
    # chunked (16, 16, 8) after a cached prefix of 5: bitwise the one-chunk result (codebook picks its kernel
    # by the number of rows, Psumbook for few and dequantize-then-multiply for many: float rounding apart,
    # and a float16 K/V value one ulp)
    same = np.array_equal if fmt != "codebook" else (lambda a, b: rel_err(a, b) < 2.0**-10)
    model.reset()
    head = model.prefill(IDS[:5], all_logits=True)
    rest = model.prefill(IDS[5:], all_logits=True, chunk=16)
    assert same(np.concatenate([head, rest]), whole)
    assert same(model.cache.k[:, :, :n].astype(np.float32), whole_k.astype(np.float32))
    # only the last token's logits (the chunks before compute none): the same row
    model.reset()
    assert same(model.prefill(IDS, chunk=16), whole[-1])


@pytest.mark.parametrize("fmt", ["f32", "int8"])
def test_decode_steps_equal_one_forward(isa, fmt):
    """decode (one row per call) and forward (N rows) are one step: token by token gives the chunk's logits."""
    model = build(fmt)
    whole = model.prefill(IDS[:20], all_logits=True)
    model.reset()
    steps = [model.prefill(IDS[:1])] + [model.decode(t) for t in IDS[1:20]]
    assert np.array_equal(np.stack(steps), whole)


@pytest.mark.parametrize("family", list(FAMILY_EXTRAS))
@pytest.mark.parametrize("fmt", ["f32", "int8"])
def test_native_forward_families(isa, family, fmt):
    """Windows (shorter than the prompt and than a chunk, crossing chunk edges), attention soft-caps, q/k
    norms, post norms, GELU and the query scale in the native forward, against the numpy block."""
    cfg = {**config(family), "hidden_act": "silu", **FAMILY_EXTRAS[family]}
    model = Model.from_weights(cfg, dummy_weights(cfg, std=0.2), format=fmt, max_context=16)
    ids = IDS[:15]
    ref = model.prefill_python(ids, all_logits=True)
    model.reset()
    whole = model.prefill(ids, all_logits=True)
    model.reset()
    chunked = model.prefill(ids, all_logits=True, chunk=4)
    assert np.array_equal(chunked, whole)
    if fmt == "f32":  # (numpy's tanh and exp against the native ones under the soft-caps: 1.1e-5 seen)
        assert rel_err(whole, ref) < 3e-5
    else:  # int8 (float16 cache): most positions to rounding, each to one int8 step
        errs = sorted(rel_err(whole[i], ref[i]) for i in range(len(ids)))
        assert errs[len(errs) // 2] < 1e-4 and errs[-1] < 5e-2, errs


def test_forward_rejects_bad_arguments():
    model = build("int8", max_context=16)
    nat = NativeDecoder.build(model)
    dec, H, V = nat._dec, 128, 300
    x = np.zeros((4, H), np.float32)
    with pytest.raises(ValueError, match="x must be"):
        dec.forward(np.zeros((4, H + 1), np.float32), 0, 0, np.zeros((1, V), np.float32), 1)
    with pytest.raises(ValueError, match="inside the cache"):
        dec.forward(x, 13, 0, np.zeros((1, V), np.float32), 1)
    with pytest.raises(ValueError, match="slot"):
        dec.forward(x, 0, 1, np.zeros((1, V), np.float32), 1)
    with pytest.raises(ValueError, match="logits must be"):
        dec.forward(x, 0, 0, np.zeros((1, V), np.float32), 2)  # every token's logits need [4, vocab]
    with pytest.raises(ValueError, match="logits_of"):
        dec.forward(x, 0, 0, None, 3)
    with pytest.raises(ValueError, match="logits_of"):
        nat.forward(x, 0, "every")
    assert nat.forward(x, 0, "none") is None  # a chunk before the last computes no logits


def test_profile_counts_steps():
    """The native timers: off by default; when on, every category is filled and they add up to the wall time."""
    model = build("int8")
    nat = model._native_decoder()  # the one prefill and decode run
    model.prefill(IDS[:12])
    assert nat.profile()["prefill"]["steps"] == 0  # off: nothing counted
    nat.set_profile(True)
    model.reset()
    model.prefill(IDS[:12])
    for t in IDS[12:20]:
        model.decode(t)
    p = nat.profile()
    nat.set_profile(False)
    assert p["prefill"]["steps"] == 1 and p["prefill"]["tokens"] == 12
    assert p["decode"]["steps"] == 8 and p["decode"]["tokens"] == 8
    for kind in ("prefill", "decode"):
        d = p[kind]
        parts = [d[c] for c in ("gemv", "join", "attention", "lm_head", "rest")]
        assert all(v >= 0 for v in parts) and d["gemv"] > 0 and d["attention"] > 0 and d["lm_head"] > 0
        assert sum(parts) == pytest.approx(d["seconds"], rel=1e-6)
        joins = [d[f"join_{c}"] for c in ("gemv", "attention", "lm_head", "rest")]  # the join by stretch
        assert min(joins) >= 0 and sum(joins) == pytest.approx(d["join"], rel=1e-6, abs=1e-12)


def test_schedule_across_matrices_changes_no_number():
    """Idle threads prefetching the next matrix (on by default) is a hint: the logits are bitwise the same off."""
    model = build("ternary", "bitnet")
    nat = model._native_decoder()
    got = {}
    for on in (True, False):
        nat._dec.set_prefetch_next(on)
        model.reset()
        got[on] = [model.prefill(IDS[:6])] + [model.decode(t) for t in IDS[6:12]]
    nat._dec.set_prefetch_next(True)
    assert all(np.array_equal(a, b) for a, b in zip(got[True], got[False]))


@pytest.mark.parametrize("fmt", ["f32", "ternary"])
def test_int8_kv_cache(isa, fmt):
    """kv_cache="int8": the native forward writes each K/V row as int8 values and a float32 scale, the numpy
    block writes the same rows (kv_cache.quantize_kv_rows), and they agree to float rounding (f32: a value near
    a rounding edge may land one int8 step apart; ternary: as with the float cache, an int8 activation one step
    apart moves K/V further); chunks and decode steps give the one-chunk bits."""
    model = build(fmt, "bitnet" if fmt == "ternary" else "llama")
    n = len(IDS)
    f16 = model.prefill_python(IDS, all_logits=True)
    model.set_kv_cache("int8")
    assert model.cache.k.dtype == np.int8 and model.kv_cache == "int8"
    ref = model.prefill_python(IDS, all_logits=True)
    ref_kv = dequantize_kv_rows(model.cache.k[:, :, :n])
    model.reset()
    whole = model.prefill(IDS, all_logits=True, chunk=n)
    got_kv = dequantize_kv_rows(model.cache.k[:, :, :n])
    if fmt == "f32":
        step = np.abs(ref_kv).max(axis=-1, keepdims=True) / 127
        assert (np.abs(got_kv - ref_kv) <= 1.01 * step + 1e-6).all()
    else:  # an int8 activation one step apart moves K by more than a step: the float cache's tolerance
        np.testing.assert_allclose(got_kv, ref_kv, rtol=0, atol=5e-2 * np.abs(ref_kv).max())
    assert rel_err(whole, ref) < (1e-4 if fmt == "f32" else 5e-2)  # one K/V value an int8 step apart moves it
    assert rel_err(ref, f16) < 0.1  # (random weights: the logits of a trained model move far less, see docs)
    model.reset()
    head = model.prefill(IDS[:5], all_logits=True)
    rest = model.prefill(IDS[5:], all_logits=True, chunk=16)
    assert np.array_equal(np.concatenate([head, rest]), whole)
    model.reset()
    steps = [model.prefill(IDS[:1], all_logits=True)[0]] + [model.decode(t) for t in IDS[1:]]
    assert np.array_equal(np.stack(steps), whole)


def test_set_kv_cache_rejects_unknown_types():
    model = build("f32")
    with pytest.raises(ValueError, match="unknown KV cache type 'int4'"):
        model.set_kv_cache("int4")
    with pytest.raises(ValueError, match="unknown KV cache type"):
        build("f32", kv_cache="q8")
