"""Input-activation statistics of every linear layer on a calibration text (the codebook quantizer's
importance weights: mean x_k^2 per input channel = the diagonal of the layer's Hessian X^T X / n).

    stats = activation_stats(ckpt, text, tokens=4096)    # "model.layers.0.self_attn.q_proj.weight" -> float64 [K]

The source model runs in float32 (its weights dequantized) over consecutive windows of the text.
"""
from __future__ import annotations

import numpy as np

from lowbit.formats import PackedWeight
from lowbit.formats.floats import F32Weight
from lowbit.io.checkpoint import is_linear


class _Recorder(F32Weight):
    """An f32 weight that adds sum x^2 per input channel of every input it multiplies."""

    def __init__(self, w: np.ndarray):
        super().__init__(w)
        self.sq = np.zeros(w.shape[1], np.float64)
        self.rows = 0

    def _matmul(self, acts):
        x = acts.x
        self.sq += np.einsum("nk,nk->k", x, x, dtype=np.float64)
        self.rows += x.shape[0]
        return super()._matmul(acts)


def calibration_ids(ckpt, text: str, tokens: int) -> list[int]:
    """The first `tokens` token ids of the calibration text, by the source's own tokenizer."""
    tok = ckpt.tokenizer()
    if tok is None:
        raise ValueError("calibration needs the source's tokenizer")
    ids = [int(i) for i in tok.encode(text, add_bos=False)][:tokens]
    if len(ids) < 2:
        raise ValueError("the calibration text is too short (needs at least 2 tokens)")
    return ids


def activation_stats(ckpt, text: str, tokens: int = 4096, ctx: int = 512, progress=None) -> dict[str, np.ndarray]:
    """HF weight name of each decoder linear -> mean x^2 per input channel over about `tokens` tokens."""
    from lowbit.model import Model

    tok = ckpt.tokenizer()
    ids = calibration_ids(ckpt, text, tokens)
    weights, recorders = {}, {}
    for name in ckpt.tensor_names():
        value = ckpt.load(name)
        dense = value.dequantize() if isinstance(value, PackedWeight) else np.asarray(value, np.float32)
        if is_linear(name):
            recorders[name] = weights[name] = _Recorder(np.ascontiguousarray(dense, np.float32))
        else:
            weights[name] = dense
    model = Model.from_weights(dict(ckpt.config), weights, tokenizer=tok, max_context=ctx, native_decode=False)
    bos = tok.bos_id if getattr(tok, "add_bos", False) else None
    body = ctx - (bos is not None)
    for start in range(0, len(ids), body):
        window = ([bos] if bos is not None else []) + ids[start:start + body]
        model.logits(window)
        if progress:
            progress(min(start + body, len(ids)), len(ids))
    return {name: r.sq / max(r.rows, 1) for name, r in recorders.items()}
