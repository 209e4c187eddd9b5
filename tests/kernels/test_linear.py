"""The one-token GEMV's schedule across threads (kernels/linear.cpp, tq1.cpp): one equal run of row blocks a
thread, taken by whichever thread is free. Every block is computed once, so any thread count gives the 1-thread
result bit for bit: checked with the pool oversubscribed (more threads than cores: workers start late or are
preempted and the caller takes their runs), on row-block counts that do not divide among the threads and fewer
blocks than threads, for one row and a few, through the formats' matmul and through the decoder's fused gate/up and
its two-plane int6 projections."""
import numpy as np
import pytest

import lowbit
from lowbit.formats import quantize
from lowbit.model import Model
from lowbit.model.dummy import dummy_weights
from lowbit.model.native import NativeDecoder

THREADS = (2, 3, 5)  # 5 on a 2-core machine: oversubscribed
REPEATS = 20


@pytest.fixture
def threads():
    before = lowbit.get_threads()
    yield lowbit.set_threads
    lowbit.set_threads(before)


@pytest.mark.parametrize("fmt", ["ternary", "int4", "int8", "tq1", "bf16", "f32"])
@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("M", [64 * 7 + 5, 64 * 2, 40])  # 8 row blocks, 2, and 1 (fewer than the threads)
def test_gemv_bits_do_not_depend_on_threads(isa, threads, rng, fmt, rows, M):
    K = 320
    pw = quantize(rng.standard_normal((M, K)).astype(np.float32), fmt)
    x = rng.standard_normal((rows, K)).astype(np.float32)
    threads(1)
    ref = pw.matmul(x)
    assert np.isfinite(ref).all() and np.abs(ref).max() > 0
    for n in THREADS:
        threads(n)
        for _ in range(REPEATS):
            np.testing.assert_array_equal(pw.matmul(x), ref)


def config() -> dict:
    # gate/up of 9 row blocks and an lm_head of 5: runs that do not divide evenly among 2, 3 or 5 threads
    return dict(model_type="llama", hidden_size=128, intermediate_size=64 * 9, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, vocab_size=300, max_position_embeddings=64,
                rms_norm_eps=1e-5, rope_theta=10000.0, hidden_act="silu", tie_word_embeddings=False)


@pytest.mark.parametrize("fmt", ["ternary", "int6"])  # ternary: the fused gate/up tasks; int6: two planes a block
def test_decode_bits_do_not_depend_on_threads(isa, threads, fmt):
    cfg = config()
    model = Model.from_weights(cfg, dummy_weights(cfg), format=fmt, max_context=64)
    native = NativeDecoder.build(model)
    assert isinstance(native, NativeDecoder), native
    steps = [7, 8, 9, 299, 42, 100]

    def run() -> list[np.ndarray]:
        model.reset()
        model.prefill([1, 2, 3])
        return [native.decode(model.embed([t])[0], 3 + i).copy() for i, t in enumerate(steps)]

    threads(1)
    ref = run()
    for n in THREADS:
        threads(n)
        for _ in range(REPEATS // 4):
            for got, want in zip(run(), ref):
                np.testing.assert_array_equal(got, want)
