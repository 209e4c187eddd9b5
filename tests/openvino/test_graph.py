"""Weights in compact OpenVINO types: each lowbit integer format's decompression subgraph reproduces its
dequantize() on the CPU device, and the CPU plugin keeps u8/u4/u2 codes compressed in FullyConnected."""
import numpy as np
import openvino as ov
import openvino.opset13 as op
import pytest

from lowbit.formats import quantize
from lowbit.openvino.graph import linear

M, K = 80, 160  # K pads to 192 in lowbit: exercises the slice after the grouped reshape


def fc_model(w) -> ov.Model:
    x = op.parameter([1, 3, K], np.float32, name="x")
    return ov.Model([op.result(linear(x.output(0), w, "w"))], [x])


@pytest.mark.parametrize("fmt,opts", [("int8", {}), ("int4", {}), ("int4", {"symmetric": True}),
                                      ("int4", {"group_size": 64}), ("int2", {}), ("ternary", {}), ("binary", {})])
def test_decompression_matches_dequantize(fmt, opts, rng):
    pw = quantize(rng.standard_normal((M, K)).astype(np.float32), fmt, **opts)
    compiled = ov.Core().compile_model(fc_model(pw), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    x = rng.standard_normal((1, 3, K)).astype(np.float32)
    got = compiled({"x": x})[0]
    want = x @ pw.dequantize().T
    # the zero point is stored as float16 (-b/a): off by at most a * |zp| * 2^-11 per weight
    np.testing.assert_allclose(got, want, atol=2e-3 * np.abs(want).max(), rtol=0)
    fcs = [n for n in compiled.get_runtime_model().get_ops()
           if n.get_rt_info()["layerType"].astype(str) == "FullyConnected"]
    assert len(fcs) == 1
    # compressed: the FullyConnected takes the codes plus scale and zero point (5 inputs), not a float matrix
    assert len(list(fcs[0].inputs())) == 5, f"{fmt}: the CPU plugin decompressed the weights at compile time"


def test_float_weights(rng):
    w = rng.standard_normal((M, K)).astype(np.float32)
    x = rng.standard_normal((1, 3, K)).astype(np.float32)
    for arr, tol in ((w, 1e-5), (w.astype(np.float16), 1e-5)):
        compiled = ov.Core().compile_model(fc_model(arr), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
        np.testing.assert_allclose(compiled({"x": x})[0], x @ arr.astype(np.float32).T, atol=tol * K, rtol=tol)
