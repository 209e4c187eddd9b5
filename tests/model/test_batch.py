"""Batched decoding (model/batch.py): B sequences in their own slots of a SlotKVCache, one step together.

The native batched step must give bitwise the logits of decoding each sequence alone (sequential
native decode): the GEMM over B rows quantizes each row's activations as the GEMV does and accumulates
each (row, token) in int32, and attention is per sequence. The numpy batched step (the reference) agrees
to 1e-5 relative to the largest logit (1e-4 for bf16, whose cache is float16); with integer formats
as in test_native_decoder (most steps to 1e-5, every step to 5e-2: one int8 rounding step apart)."""
import numpy as np
import pytest

from lowbit.model import Model
from lowbit.model.batch import BatchDecoder
from lowbit.model.dummy import dummy_weights
from lowbit.model.kv_cache import ContextOverflowError, SlotKVCache

PROMPTS = [[1, 2, 3], [5, 6, 7, 8, 9, 10, 11], [12]]
STEPS = [[7, 8, 9, 299], [1, 1, 2, 3], [4, 5, 6, 7]]
SLOTS = [2, 0, 3]


def config(model_type: str) -> dict:
    return dict(model_type=model_type, hidden_size=128, intermediate_size=320, num_hidden_layers=3,
                num_attention_heads=4, num_key_value_heads=2, vocab_size=300, max_position_embeddings=256,
                rms_norm_eps=1e-5, rope_theta=10000.0, hidden_act="relu2" if model_type == "bitnet" else "silu",
                tie_word_embeddings=False)


def sequential_logits(model: Model) -> list[list[np.ndarray]]:
    """Each prompt prefilled alone, then its steps decoded one at a time: the logits batching must equal."""
    out = []
    for p, s in zip(PROMPTS, STEPS):
        model.reset()
        model.prefill(p)
        out.append([model.decode(t) for t in s])
    return out


def run_batched(bd: BatchDecoder) -> list[list[np.ndarray]]:
    for s, p in zip(SLOTS, PROMPTS):
        bd.prefill(s, p)
    out = [[] for _ in PROMPTS]
    for i in range(len(STEPS[0])):
        logits = bd.decode([s[i] for s in STEPS], SLOTS)
        assert logits.shape == (len(PROMPTS), bd.model.args.vocab_size)
        for b in range(len(PROMPTS)):
            out[b].append(logits[b])
    return out


@pytest.mark.parametrize("model_type", ["llama", "bitnet"])
@pytest.mark.parametrize("fmt", ["f32", "bf16", "int8", "int4", "int2", "ternary", "tq1", "binary"])
def test_batched_decode_equals_sequential(isa, model_type, fmt):
    cfg = config(model_type)
    model = Model.from_weights(cfg, dummy_weights(cfg), format=fmt, max_context=64)
    seq = sequential_logits(model)
    bd = BatchDecoder(model, 4)
    assert bd.native
    got = run_batched(bd)
    for b in range(len(PROMPTS)):
        for i, (r, g) in enumerate(zip(seq[b], got[b])):
            assert np.array_equal(r, g), (b, i, np.abs(r - g).max())
        c = bd.slot(SLOTS[b])
        assert c.length == len(PROMPTS[b]) + len(STEPS[b])
        assert c.tokens == PROMPTS[b] + STEPS[b]
    ref = run_batched(BatchDecoder(model, 4, native=False))
    errs = [np.abs(r - g).max() / np.abs(r).max() for b in range(len(PROMPTS)) for r, g in zip(ref[b], got[b])]
    if fmt in ("f32", "bf16"):
        assert max(errs) < (1e-4 if fmt == "bf16" else 1e-5), errs
    else:  # int8 activations: a last-bit difference in a norm may move one activation by one int8 step
        assert sorted(errs)[len(errs) // 2] < 1e-5 and max(errs) < 5e-2, errs
    assert model.cache.length == len(PROMPTS[-1]) + len(STEPS[-1])  # the single-sequence cache is untouched


@pytest.mark.parametrize("model_type", ["llama", "bitnet"])
@pytest.mark.parametrize("fmt", ["int4", "ternary"])
def test_gated_decode_with_a_partial_row_block(isa, model_type, fmt):
    """A decode step runs the activation inside the gate/up tasks, on each task's row blocks (run_gated);
    the batched step runs it after the GEMM over all rows. An intermediate size that is not a multiple of
    the 64-row block (100 = 64 + 36) still gives bitwise the batched step's logits."""
    cfg = {**config(model_type), "intermediate_size": 100}
    model = Model.from_weights(cfg, dummy_weights(cfg), format=fmt, max_context=64)
    seq = sequential_logits(model)
    got = run_batched(BatchDecoder(model, 4))
    for b in range(len(PROMPTS)):
        for i, (r, g) in enumerate(zip(seq[b], got[b])):
            assert np.all(np.isfinite(r))
            assert np.array_equal(r, g), (b, i, np.abs(r - g).max())


def test_slots_are_independent():
    cfg = config("llama")
    model = Model.from_weights(cfg, dummy_weights(cfg), format="int4", max_context=32)
    bd = BatchDecoder(model, 3)
    bd.prefill(1, [3, 4, 5])
    k_before = bd.cache.k[:, [0, 2]].copy()
    bd.decode([6], [1])
    assert np.array_equal(bd.cache.k[:, [0, 2]], k_before)
    assert bd.slot(1).length == 4 and bd.slot(0).length == 0


def test_bad_decode_calls():
    cfg = config("llama")
    model = Model.from_weights(cfg, dummy_weights(cfg), format="int4", max_context=8)
    bd = BatchDecoder(model, 2)
    with pytest.raises(ValueError, match="twice"):
        bd.decode([1, 2], [0, 0])
    with pytest.raises(ValueError, match="outside"):
        bd.decode([1], [2])
    with pytest.raises(ValueError, match="one token per slot"):
        bd.decode([1, 2], [0])
    bd.prefill(0, list(range(8)))
    with pytest.raises(ContextOverflowError):
        bd.decode([1], [0])
    with pytest.raises(ValueError, match="max_context"):
        BatchDecoder(model, 2, max_context=9)
    with pytest.raises(ValueError, match="slot"):
        SlotKVCache(0, 1, 1, 4, 4)


@pytest.mark.parametrize("native_gather", [True, False])
@pytest.mark.parametrize("fmt", ["int4", "ternary", "bf16"])
def test_mixed_step_equals_sequential(isa, fmt, native_gather):
    """One step carrying decode rows, a middle prompt chunk (no logits) and a last chunk (logits) gives
    bitwise each sequence's own prefill / decode logits, and leaves every slot where they leave it; the
    embedding rows gathered natively (token ids in) or in numpy (embeddings in)."""
    cfg = config("llama")
    model = Model.from_weights(cfg, dummy_weights(cfg), format=fmt, max_context=64)
    long = list(range(20, 43))  # a prompt run in chunks of 9, 9, 5
    want = {}
    for name, prompt, nxt in (("a", PROMPTS[0], 7), ("b", PROMPTS[1], 299)):
        model.reset()
        model.prefill(prompt)
        want[name] = model.decode(nxt)
    model.reset()
    want["long"] = model.prefill(long)
    bd = BatchDecoder(model, 4)
    assert bd._native.has_embedding
    bd._native.has_embedding = native_gather
    bd.prefill(2, PROMPTS[0])
    bd.prefill(0, PROMPTS[1])
    assert bd.step([(3, long[:9], False)]).shape == (0, cfg["vocab_size"])
    got = bd.step([(3, long[9:18], False), (2, [7], True), (0, [299], True)])
    assert np.array_equal(got[0], want["a"]) and np.array_equal(got[1], want["b"])
    got = bd.step([(3, long[18:], True)])
    assert np.array_equal(got[0], want["long"])
    assert bd.slot(3).tokens == long and bd.slot(2).length == len(PROMPTS[0]) + 1


def test_bad_step_calls():
    cfg = config("llama")
    model = Model.from_weights(cfg, dummy_weights(cfg), format="int4", max_context=8)
    bd = BatchDecoder(model, 2)
    with pytest.raises(ValueError, match="twice"):
        bd.step([(0, [1], True), (0, [2], True)])
    with pytest.raises(ValueError, match="outside"):
        bd.step([(2, [1], True)])
    with pytest.raises(ValueError, match="at least one token"):
        bd.step([(0, [], True)])
    with pytest.raises(ValueError, match="at least one item"):
        bd.step([])
    with pytest.raises(ContextOverflowError):
        bd.step([(1, list(range(9)), True)])
    assert bd.slot(1).length == 0
    nat = bd._native
    x = np.zeros((2, cfg["hidden_size"]), np.float32)
    with pytest.raises(ValueError, match="same slot and position"):
        nat.step_rows(x, [0, 0], [1, 1], 2)
    with pytest.raises(ValueError, match="first_logit"):
        nat.step_rows(x, [0, 1], [1, 1], 3)
    with pytest.raises(ValueError, match="logits must be"):
        nat.step_rows(x, [0, 1], [1, 1], 0, logits=np.empty((1, cfg["vocab_size"]), np.float32))
    with pytest.raises(ValueError, match="outside the cache"):
        nat.step_rows(x, [0, 8], [1, 1], 2)
    with pytest.raises(ValueError, match="not both"):
        nat.step_rows(x, [0, 1], [1, 1], 2, tokens=[1, 2])
    with pytest.raises(ValueError, match="not both"):
        nat.step_rows(None, [0, 1], [1, 1], 2)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        nat.step_rows(None, [0, 1], [1, 1], 2, tokens=[1, cfg["vocab_size"]])
    with pytest.raises(ValueError, match="pos and slot"):
        nat.step_rows(None, [0, 1], [1, 1], 2, tokens=[1, 2, 3])


def test_mixed_step_numpy_reference():
    """Without the native step, BatchDecoder.step runs the numpy reference (decode rows batched, prompt
    chunks alone) and agrees with the native step."""
    cfg = config("llama")
    model = Model.from_weights(cfg, dummy_weights(cfg), format="f32", max_context=64)
    outs = []
    for native in (True, False):
        bd = BatchDecoder(model, 3, native=native)
        assert bd.native == native
        bd.prefill(0, PROMPTS[1])
        got = [bd.step([(2, [4, 5, 6], False), (0, [9], True)])[0].copy()]
        got += list(bd.step([(0, [10], True), (2, [7, 8], True), (1, [3], True)]).copy())
        assert [bd.slot(i).length for i in range(3)] == [len(PROMPTS[1]) + 2, 1, 5]
        outs.append(got)
    for r, g in zip(*outs):
        assert np.abs(r - g).max() / np.abs(r).max() < 1e-5


@pytest.mark.parametrize("fmt", ["f32", "ternary"])
def test_int8_kv_cache_batched_equals_sequential(isa, fmt):
    """An int8 KV cache (each row's values and scale) in the slot cache: the batched native step still gives
    bitwise each sequence's own logits, and the numpy batched step (which writes the same int8 rows) agrees
    to float rounding."""
    model_type = "bitnet" if fmt == "ternary" else "llama"
    cfg = config(model_type)
    model = Model.from_weights(cfg, dummy_weights(cfg), format=fmt, max_context=64, kv_cache="int8")
    assert model.cache.k.dtype == np.int8 and model.cache.k.shape[-1] == cfg["hidden_size"] // 4 + 4
    seq = sequential_logits(model)
    bd = BatchDecoder(model, 4)
    assert bd.native and bd.cache.k.dtype == np.int8
    got = run_batched(bd)
    for b in range(len(PROMPTS)):
        for r, g in zip(seq[b], got[b]):
            assert np.array_equal(r, g)
    ref = run_batched(BatchDecoder(model, 4, native=False))
    errs = [np.abs(r - g).max() / np.abs(r).max() for b in range(len(PROMPTS)) for r, g in zip(ref[b], got[b])]
    if fmt == "f32":
        assert max(errs) < 1e-4, errs  # a K/V value may round to the next int8 step on either side
    else:
        assert sorted(errs)[len(errs) // 2] < 1e-4 and max(errs) < 5e-2, errs
