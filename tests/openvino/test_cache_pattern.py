"""The KV cache pattern in isolation: OpenVINO state (ReadValue/Assign) written by ScatterUpdate at explicit
slots (graph.cache_update), read back by attention in the same call, over many steps on the CPU device.

Checked against numpy: single-token steps, multi-token steps with padding rows sent to a scratch slot
(duplicate indices), and rewinding (a truncated cache rewrites slots it had filled), in f32 and under
the device's default precision (bf16 on CPUs with AVX-512 BF16 / AMX).

The attention is the exported decoder's (graph.decoder_layer): K and V two states, queries 5-D
[1, kv heads, group, T, hd] against the caches unsqueezed to [1, kv heads, 1, S, hd]. The plain 4-D
pattern (softmax(q.K^T) V on [1, H, T, hd]) is one the model never builds, and OpenVINO 2026.4's CPU plugin
gets it wrong for single-token steps under bf16 (AMX / AVX-512 BF16 Xeons: outputs read at stride 2, the
state itself correct), so this test would not speak for the model there.
"""
import numpy as np
import pytest

ov = pytest.importorskip("openvino", reason="the openvino package is not installed (pip install 'lowbit[openvino]')")
import openvino.opset13 as op  # noqa: E402

from lowbit.openvino.graph import cache_update  # noqa: E402

S, H, G, D = 12, 2, 2, 8  # slots (the last is scratch), kv heads, query heads per kv head, head dim


def cache_model(t: int) -> ov.Model:
    """new_k, new_v [1, H, t, D], q [1, H, G, t, D], pos [t], mask [1, 1, 1, t, S] -> attention output
    [1, H, G, t, D] and the two caches."""
    new_k = op.parameter([1, H, t, D], np.float32, name="new_k")
    new_v = op.parameter([1, H, t, D], np.float32, name="new_v")
    q = op.parameter([1, H, G, t, D], np.float32, name="q")
    pos = op.parameter([t], np.int64, name="pos")
    mask = op.parameter([1, 1, 1, t, S], np.float32, name="mask")
    sinks = []
    k = cache_update("cache_k_0", new_k.output(0), pos.output(0), S, sinks)
    v = cache_update("cache_v_0", new_v.output(0), pos.output(0), S, sinks)
    axis = op.constant(np.array([2], np.int64))
    s = op.add(op.matmul(q, op.unsqueeze(k, axis), False, True), mask)
    o = op.matmul(op.softmax(s, 4), op.unsqueeze(v, axis), False, False)
    return ov.Model([op.result(o), op.result(k), op.result(v)], sinks, [new_k, new_v, q, pos, mask], "cache")


def reference_attention(q, k, v, mask):
    k, v = k[:, :, None], v[:, :, None]
    s = q @ k.transpose(0, 1, 2, 4, 3) + mask
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


@pytest.mark.parametrize("precision", ["f32", None])
@pytest.mark.parametrize("t", [1, 3])
def test_scatter_cache_state(t, precision):
    config = {"INFERENCE_PRECISION_HINT": precision} if precision else {}
    req = ov.Core().compile_model(cache_model(t), "CPU", config).create_infer_request()
    rng = np.random.default_rng(t)
    ref = {"k": np.zeros((1, H, S, D), np.float32), "v": np.zeros((1, H, S, D), np.float32)}
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
        new = {c: rng.standard_normal((1, H, t, D)).astype(np.float32) for c in "kv"}
        q = rng.standard_normal((1, H, G, t, D)).astype(np.float32)
        pos = np.full(t, S - 1, np.int64)
        pos[:n] = np.arange(length, length + n)
        mask = np.full((1, 1, 1, t, S), -np.inf, np.float32)
        for j in range(t):
            if j < n:
                mask[0, 0, 0, j, :length + j + 1] = 0
            else:
                mask[0, 0, 0, j, S - 1] = 0  # padding rows see only the scratch slot
        out, cache_k, cache_v = req.infer({"new_k": new["k"], "new_v": new["v"], "q": q, "pos": pos,
                                           "mask": mask}).values()
        for c in "kv":
            for j in range(t):
                ref[c][:, :, pos[j]] = new[c][:, :, j]  # padding rows: the last write to the scratch slot wins
        states = {s.name: s.state.data for s in req.query_state()}
        for c, cache in (("k", cache_k), ("v", cache_v)):
            np.testing.assert_allclose(cache[:, :, :S - 1], ref[c][:, :, :S - 1], atol=tol)
            np.testing.assert_allclose(states[f"cache_{c}_0"][:, :, :S - 1], ref[c][:, :, :S - 1], atol=tol)
        want = reference_attention(q[:, :, :, :n], ref["k"], ref["v"], mask[:, :, :, :n])
        np.testing.assert_allclose(out[:, :, :, :n], want, atol=tol, rtol=tol)
        length += n
