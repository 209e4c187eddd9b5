"""The C++ decode step with codebook projections (Psumbook kernel) against the Python decoder, every ISA.
Codebook products take float activations (no int8 step), so they agree like bf16: to 1e-4 of the largest
logit (float16 KV cache: a K/V value may round one ulp apart)."""
import numpy as np
import pytest

from lowbit.model import Model
from lowbit.model.dummy import dummy_weights
from lowbit.model.native import NativeDecoder

from .test_native_decoder import config


@pytest.mark.parametrize("m,v,b", [(2, 4, 5), (2, 4, 4)])  # b = 4: the register-table (int8 psum) layout
def test_native_decode_matches_python_codebook(isa, m, v, b):
    cfg = config("llama")
    cfg["intermediate_size"] = 322  # down_proj K not a multiple of v: the native path pads the input
    model = Model.from_weights(cfg, dummy_weights(cfg), format="codebook", max_context=64, m=m, v=v, b=b, g=64, iters=1)
    native = NativeDecoder.build(model)
    assert native is not None
    prompt, steps = [1, 2, 3, 4, 5], [7, 8, 9, 299]
    model.reset()
    model.prefill(prompt)
    ref = [model.decode_python(t) for t in steps]
    model.reset()
    model.prefill(prompt)
    got = [native.decode(model.embed([t])[0], len(prompt) + i) for i, t in enumerate(steps)]
    errs = [np.abs(g - r).max() / np.abs(r).max() for r, g in zip(ref, got)]
    # b = 4 quantizes each token's psum tables to int8: an input one float16 ulp apart (the KV cache) can move
    # a table entry near a rounding tie by one step (max|T|/127), so the two decoders agree to ~1e-2 there;
    # a layout or plumbing error would be O(1)
    assert max(errs) < (3e-2 if b == 4 else 1e-4), errs
