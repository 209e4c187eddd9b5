"""Where a decode step's time goes: inside native code vs the Python/numpy around it.

    from lowbit.model.profile import decode_profile
    print(decode_profile(model, n_tokens=32))                # the path decode() takes (native if it can)
    print(decode_profile(model, n_tokens=32, native=False))  # the numpy reference path

On the numpy path the kernel time is the matmul calls and the overhead is everything else (norms,
RoPE, attention, softmax, activations, residuals, dispatch); on the native path the kernel time is
the one C++ call per token and the overhead is the embedding gather and bookkeeping around it.
"""
from __future__ import annotations

import time

import numpy as np

from lowbit.model import llama


def _timed(fn, spent: list):
    def call(*a):
        t = time.perf_counter()
        y = fn(*a)
        spent[0] += time.perf_counter() - t
        return y
    return call


def decode_profile(model, n_tokens: int = 32, prompt_len: int = 16, warmup: int = 4,
                   native: bool | None = None) -> dict:
    """Runs prompt_len + warmup + n_tokens single-token steps; medians in ms per token."""
    spent = [0.0]
    saved_flag = model.native_decode
    if native is not None:
        model.native_decode = native
    nat = model._native_decoder()
    lins = list(model.linears().values())
    originals = [lin._mm for lin in lins]
    many = llama.matmul_many
    if nat is not None:
        nat.decode = _timed(type(nat).decode.__get__(nat), spent)  # instance attribute shadows the method
    else:
        for lin, mm in zip(lins, originals):
            lin._mm = _timed(mm, spent)
        llama.matmul_many = _timed(many, spent)
    steps, kern = [], []
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
                kern.append(spent[0])
    finally:
        if nat is not None:
            del nat.decode
        for lin, mm in zip(lins, originals):
            lin._mm = mm
        llama.matmul_many = many
        model.native_decode = saved_flag
        model.reset()
    over = float(np.median(np.subtract(steps, kern))) * 1e3
    return {"path": "native" if nat is not None else "numpy", "step_ms": float(np.median(steps)) * 1e3,
            "kernel_ms": float(np.median(kern)) * 1e3, "overhead_ms": over,
            "overhead_us_per_layer": over * 1e3 / len(model.layers), "layers": len(model.layers)}
