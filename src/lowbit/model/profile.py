"""Where a decode step's time goes: inside the matmul kernels vs the Python/numpy around them.

    from lowbit.model.profile import decode_profile
    print(decode_profile(model, n_tokens=32))   # {'step_ms', 'matmul_ms', 'overhead_ms', ...}

The overhead (norms, RoPE, attention, softmax, activation quantization, residuals, dispatch) is
the per-token cost that does not shrink with fewer bits per weight.
"""
from __future__ import annotations

import time

import numpy as np

from lowbit.model import llama


def timed2(fn, spent):
    def call(ws, x):
        t = time.perf_counter()
        y = fn(ws, x)
        spent[0] += time.perf_counter() - t
        return y
    return call


def decode_profile(model, n_tokens: int = 32, prompt_len: int = 16, warmup: int = 4) -> dict:
    """Runs prompt_len + warmup + n_tokens single-token steps and splits their time (medians, ms/token)."""
    lins = list(model.linears().values())
    spent = [0.0]
    originals = [lin._mm for lin in lins]

    def timed(mm):
        def call(x):
            t = time.perf_counter()
            y = mm(x)
            spent[0] += time.perf_counter() - t
            return y
        return call

    many = llama.matmul_many
    for lin, mm in zip(lins, originals):
        lin._mm = timed(mm)
    llama.matmul_many = timed2(many, spent)
    steps, mats = [], []
    try:
        model.reset()
        model.prefill(list(range(1, prompt_len + 1)))
        tok = 1
        for i in range(warmup + n_tokens):
            spent[0] = 0.0
            t = time.perf_counter()
            logits = model.decode(tok)
            dt = time.perf_counter() - t
            tok = int(np.argmax(logits))
            if i >= warmup:
                steps.append(dt)
                mats.append(spent[0])
    finally:
        for lin, mm in zip(lins, originals):
            lin._mm = mm
        llama.matmul_many = many
        model.reset()
    step, mat = float(np.median(steps)) * 1e3, float(np.median(mats)) * 1e3
    over = float(np.median(np.subtract(steps, mats))) * 1e3
    return {"step_ms": step, "matmul_ms": mat, "overhead_ms": over, "overhead_us_per_layer": over * 1e3 / len(model.layers),
            "layers": len(model.layers)}
