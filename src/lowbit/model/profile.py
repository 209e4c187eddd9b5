"""Where a token's time goes, from the native step's own timers (kernels/decoder.h: StepProfile).

    from lowbit.model.profile import step_profile, format_profile
    p = step_profile(model, prompt_tokens=128, gen_tokens=64)
    print(format_profile(p))

Per decode token and per prefill token: time in the GEMVs / GEMMs (the threads' busy time inside the pool
runs of the projections, activation quantization included), join waits (the mean over threads of the
time each sat idle at the end of a pool run, from its last task to the join; split by the stretch they
ended: the GEMVs', attention's, the lm_head's), attention, the lm_head, the
rest of the native step (norms, RoPE, KV writes, activations, residuals), and the Python around the
native call (embedding gather, logits soft-cap, bookkeeping: the wall time of Model.decode / prefill less
the native step's). The timers are off unless profiling (then they cost a TSC read per stretch and per
pool task), so the figures are a separate run from the benchmark's.
"""
from __future__ import annotations

import time

import numpy as np

CATEGORIES = ("gemv", "join", "attention", "lm_head", "rest")
# the join waits split by the stretch whose pool runs they ended (they sum to "join")
JOIN_PARTS = ("join_gemv", "join_attention", "join_lm_head", "join_rest")
LABELS = {"gemv": "GEMV (GEMM in prefill)", "join": "join waits (idle at the barrier)", "attention": "attention",
          "lm_head": "lm_head", "rest": "rest (norms, RoPE, KV, act)", "python": "Python around the step",
          "join_gemv": "  of which at GEMV ends", "join_attention": "  of which at attention's end",
          "join_lm_head": "  of which at the lm_head's end", "join_rest": "  of which elsewhere"}


def step_profile(model, prompt_tokens: int = 128, gen_tokens: int = 64, repeats: int = 2, seed: int = 0) -> dict:
    """Runs `repeats` rounds (after a warm-up) of a prefill of prompt_tokens and gen_tokens greedy decode
    steps with the native timers on. -> {"decode" | "prefill": {category: ms per token, "python": ms per
    token, "total": ms per token, "tokens": n}}."""
    if prompt_tokens + gen_tokens > model.max_context:
        raise ValueError(f"prompt + generation ({prompt_tokens + gen_tokens}) exceed the context ({model.max_context})")
    model.reserve(prompt_tokens + gen_tokens)  # a cache that grew mid-run would replace the native step timed here
    nat = model._native_decoder()
    if nat is None:
        raise ValueError("profiling needs the native step, and this model runs the numpy reference")
    rng = np.random.default_rng(seed)
    prompt = [int(t) for t in rng.integers(0, model.args.vocab_size, size=prompt_tokens)]
    wall = {"decode": 0.0, "prefill": 0.0}
    for r in range(repeats + 1):  # the first round is the warm-up
        if r == 1:
            nat.set_profile(True)
            wall = {"decode": 0.0, "prefill": 0.0}
        model.reset()
        t0 = time.perf_counter()
        tok = int(np.argmax(model.prefill(prompt)))
        wall["prefill"] += time.perf_counter() - t0
        for _ in range(gen_tokens):
            t0 = time.perf_counter()
            logits = model.decode(tok)
            wall["decode"] += time.perf_counter() - t0
            tok = int(np.argmax(logits))
    native = nat.profile()
    nat.set_profile(False)
    model.reset()
    out = {}
    for kind in ("prefill", "decode"):
        p, n = native[kind], max(native[kind]["tokens"], 1)
        row = {c: 1e3 * p[c] / n for c in (*CATEGORIES, *JOIN_PARTS)}
        row["python"] = 1e3 * max(wall[kind] - p["seconds"], 0.0) / n
        row["total"] = 1e3 * wall[kind] / n
        row["tokens"] = int(native[kind]["tokens"])
        out[kind] = row
    out["prompt_tokens"], out["gen_tokens"], out["repeats"] = prompt_tokens, gen_tokens, repeats
    return out


def format_profile(p: dict) -> str:
    """The profile as a small table: ms per token and share of the token's time, decode and prefill."""
    head = f"  {'per token':34s} {'decode tg' + str(p['gen_tokens']):>18s}  {'prefill pp' + str(p['prompt_tokens']):>18s}"
    lines = [head, f"  {'':34s} {'ms':>9s} {'%':>8s}  {'ms':>9s} {'%':>8s}"]
    d, f = p["decode"], p["prefill"]
    for c in (*CATEGORIES, "python"):
        for c2 in (c, *JOIN_PARTS) if c == "join" else (c,):
            lines.append(f"  {LABELS[c2]:34s} {d[c2]:9.3f} {100 * d[c2] / d['total']:7.1f}%  "
                         f"{f[c2]:9.3f} {100 * f[c2] / f['total']:7.1f}%")
    lines.append(f"  {'total':34s} {d['total']:9.3f} {100.0:7.1f}%  {f['total']:9.3f} {100.0:7.1f}%")
    return "\n".join(lines)
