"""NaN and infinite activations propagate, the same way on every ISA.

The rule (kernels/ops.inc quantize_row): an int8-quantized input group holding a NaN or an infinity gets
scale NaN, so every output of that token is NaN for every quantized format; float formats follow IEEE
(NaN in -> NaN out, inf in -> inf or NaN out). Other tokens are untouched. Before, the int8 quantizer
dropped a NaN (std::max ignores it) and zeroed a group with an infinity: a finite, wrong answer. codebook: its int8
tables (b = 4, and b = 8 on AVX-512 VBMI) make a token with a non-finite input NaN throughout (they once rounded the
NaN away); its float paths follow IEEE."""
import numpy as np
import pytest

from lowbit import _native
from lowbit.formats import quantize
from lowbit.model import Model
from lowbit.model.dummy import dummy_weights
from lowbit.model.native import NativeDecoder

FORMATS = ["int8", "int4", "int2", "ternary", "binary", "tq1", "rsr", "codebook", "codebook b=4", "f32", "bf16"]
OPTIONS = {"codebook b=4": ("codebook", {"m": 2, "v": 4, "b": 4})}  # b = 4: the register tables on every ISA
# formats whose kernels keep float activations on some path (codebook: its dequantize path, and the float tables of
# b = 8 off VBMI): an infinity comes out as inf or NaN there, as in f32 / bf16
FLOAT_PATHS = ("f32", "bf16", "codebook", "codebook b=4")


@pytest.mark.parametrize("fmt", FORMATS)
def test_nonfinite_activations_propagate(isa, fmt, rng):
    m, k = 70, 200
    name, opts = OPTIONS.get(fmt, (fmt, {}))
    pw = quantize(rng.standard_normal((m, k)).astype(np.float32), name, **opts)
    x = rng.standard_normal((4, k)).astype(np.float32)
    clean = pw.matmul(x)
    x[1, 17] = np.nan
    x[2, 150] = np.inf
    x[3, 3] = -np.inf
    y = pw.matmul(x)
    np.testing.assert_array_equal(y[0], clean[0])  # other tokens untouched
    assert np.isnan(y[1]).all(), y[1]
    if fmt in FLOAT_PATHS:
        assert not np.isfinite(y[2:]).any()
    else:
        assert np.isnan(y[2:]).all()


def test_quantize_act_marks_only_the_nonfinite_group(isa):
    x = np.ones((1, 128), np.float32)
    x[0, 70] = np.nan
    q, s, sm = np.empty((1, 128), np.int8), np.empty((1, 4), np.float32), np.empty((1, 4), np.int32)
    _native.quantize_act(x, q, s, sm, 32)
    assert np.isnan(s[0, 2]) and np.isfinite(s[0, [0, 1, 3]]).all()
    assert (q[0, 64:96] == 0).all() and sm[0, 2] == 0
    assert (q[0, :64] == 127).all()


def test_native_decoder_propagates_nan(isa):
    cfg = dict(model_type="llama", hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, vocab_size=50, max_position_embeddings=64, rms_norm_eps=1e-5,
               rope_theta=10000.0, hidden_act="silu", tie_word_embeddings=False)
    model = Model.from_weights(cfg, dummy_weights(cfg), format="int4", max_context=16)
    model.prefill([1, 2])
    x = model.embed([3])[0].copy()
    x[5] = np.nan
    logits = NativeDecoder.build(model).decode(x, 2)
    assert np.isnan(logits).all()
