"""The KV cache pattern in isolation: OpenVINO state (ReadValue/Assign) written by ScatterUpdate at explicit
slots (graph.cache_update), read back by attention in the same call, over many steps on the CPU device.

Checked against numpy: single-token steps, multi-token steps with padding rows sent to a scratch slot
(duplicate indices), and rewinding (a truncated cache rewrites slots it had filled), in f32 and under
the device's default precision.
"""
import numpy as np
import pytest

ov = pytest.importorskip("openvino", reason="the openvino package is not installed (pip install 'lowbit[openvino]')")
import openvino.opset13 as op  # noqa: E402

from lowbit.openvino.graph import cache_update  # noqa: E402

S, H, D = 12, 2, 8  # slots (the last is scratch), heads, head dim


def cache_model(t: int) -> ov.Model:
    """new [1, H, t, D], q [1, H, t, D], pos [t], mask [1, 1, t, S] -> attention output and the cache."""
    new = op.parameter([1, H, t, D], np.float32, name="new")
    q = op.parameter([1, H, t, D], np.float32, name="q")
    pos = op.parameter([t], np.int64, name="pos")
    mask = op.parameter([1, 1, t, S], np.float32, name="mask")
    sinks = []
    cur = cache_update("cache_k_0", new.output(0), pos.output(0), S, sinks)
    s = op.add(op.matmul(q, cur, False, True), mask)
    o = op.matmul(op.softmax(s, 3), cur, False, False)
    return ov.Model([op.result(o), op.result(cur)], sinks, [new, q, pos, mask], "cache")


def reference_attention(q, cache, mask):
    s = q @ cache.transpose(0, 1, 3, 2) + mask
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ cache


@pytest.mark.parametrize("precision", ["f32", None])
@pytest.mark.parametrize("t", [1, 3])
def test_scatter_cache_state(t, precision):
    config = {"INFERENCE_PRECISION_HINT": precision} if precision else {}
    req = ov.Core().compile_model(cache_model(t), "CPU", config).create_infer_request()
    rng = np.random.default_rng(t)
    ref = np.zeros((1, H, S, D), np.float32)
    length = 0
    # fill, rewind to half, fill again past the old end (at most S - 1 = 11 real slots): every step's
    # output and state must match numpy
    schedule = [t] * 3 + ["rewind"] + [t] * 2 + [1]
    tol = 1e-5 if precision == "f32" else 3e-2  # bf16 on CPUs that have it
    for step in schedule:
        if step == "rewind":
            length //= 2
            continue
        n = min(step, t)
        new = rng.standard_normal((1, H, t, D)).astype(np.float32)
        q = rng.standard_normal((1, H, t, D)).astype(np.float32)
        pos = np.full(t, S - 1, np.int64)
        pos[:n] = np.arange(length, length + n)
        mask = np.full((1, 1, t, S), -np.inf, np.float32)
        for j in range(t):
            if j < n:
                mask[0, 0, j, :length + j + 1] = 0
            else:
                mask[0, 0, j, S - 1] = 0  # padding rows see only the scratch slot
        out, cache = req.infer({"new": new, "q": q, "pos": pos, "mask": mask}).values()
        for j in range(t):
            ref[:, :, pos[j]] = new[:, :, j]  # padding rows: the last write to the scratch slot wins
        state = req.query_state()[0].state.data
        np.testing.assert_allclose(cache[:, :, :S - 1], ref[:, :, :S - 1], atol=tol)
        np.testing.assert_allclose(state[:, :, :S - 1], ref[:, :, :S - 1], atol=tol)
        want = reference_attention(q[:, :, :n], ref, mask[:, :, :n])
        np.testing.assert_allclose(out[:, :, :n], want, atol=tol, rtol=tol)
        length += n
