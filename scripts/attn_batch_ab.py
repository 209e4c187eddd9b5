"""Batched decode attention (one query row per sequence, each in its own KV slot, the decoder's `attention`
kernel) over every layer of a model shape, the cache coming from beyond the L3 as in a serving step; kernel
variants alternating in one process.

    python scripts/attn_batch_ab.py [-t 2] [--rows 16] [--ctx 16:32] [--seconds 30] [VARIANT ...]

Each round times every variant (LOWBIT_ATTN_VARIANT=v: a temporary getenv in the code under test reads it per
call; with none, every variant is the build's one kernel) over the layers, wall time, and keeps each variant's
best; prints ms per step (all layers) and the speed relative to the first variant. --ctx LO:HI: the rows'
contexts spread evenly over [LO, HI] positions (the native step of `lowbit bench serve --profile` at -p 16:
16:32; its 16-client serving level at -p 16 -n 128: 16:144). Checks that every variant gives the same bits."""
from __future__ import annotations

import argparse
import os
import time

import numpy as np

import lowbit
from lowbit import _native
from lowbit.bench.shapes import MODEL_SHAPES


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("variants", nargs="*", default=["0"])
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--shape", default="bitnet-0.7b", choices=sorted(MODEL_SHAPES))
    ap.add_argument("--rows", type=int, default=16, help="sequences in the step, one slot each")
    ap.add_argument("--ctx", default="16:32", help="LO:HI, the rows' contexts (default 16:32)")
    ap.add_argument("--max-ctx", type=int, default=256, help="positions per slot in the cache (default 256)")
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--layers", type=int, default=0, help="distinct layer caches (default: the shape's; 1: in cache)")
    o = ap.parse_args()
    lowbit.set_threads(o.threads)
    c = MODEL_SHAPES[o.shape]
    heads, kv = c["num_attention_heads"], c["num_key_value_heads"]
    hd = c.get("head_dim", c["hidden_size"] // heads)
    L, R = c["num_hidden_layers"], o.rows
    n_cache = o.layers or L
    lo, hi = (int(x) for x in o.ctx.split(":"))
    if not 1 <= lo <= hi <= o.max_ctx:
        raise SystemExit(f"--ctx must be LO:HI with 1 <= LO <= HI <= --max-ctx, got {o.ctx}")
    rng = np.random.default_rng(0)
    caches = []
    for _ in range(n_cache):  # [slots, kv, max_ctx, hd] float16 as uint16
        k = rng.standard_normal((R, kv, o.max_ctx, hd), dtype=np.float32).astype(np.float16).view(np.uint16)
        v = rng.standard_normal((R, kv, o.max_ctx, hd), dtype=np.float32).astype(np.float16).view(np.uint16)
        caches.append((k, v))
    pos = np.linspace(lo, hi, R).astype(np.int64) - 1
    slot = np.arange(R, dtype=np.int64)
    q = (rng.standard_normal((R, heads, hd), dtype=np.float32) / np.sqrt(hd)).astype(np.float32)
    outs = {v: np.zeros((L, R, heads * hd), np.float32) for v in o.variants}

    def step(v: str) -> float:
        os.environ["LOWBIT_ATTN_VARIANT"] = v
        out = outs[v]
        t0 = time.perf_counter()
        for li in range(L):
            k, vv = caches[li % n_cache]
            _native.attention(q, k, vv, pos, slot, out[li], 0, 0.0, 64)
        return time.perf_counter() - t0

    best = {v: float("inf") for v in o.variants}
    t_end = time.perf_counter() + o.seconds
    r = 0
    while time.perf_counter() < t_end or r < 2:
        for v in (o.variants if r % 2 == 0 else o.variants[::-1]):
            best[v] = min(best[v], step(v))
        r += 1
    base = o.variants[0]
    kv_mb = 2 * L * kv * hd * 2 * int((pos + 1).sum()) / 1e6
    print(f"{o.shape} {R} rows ctx {lo}:{hi} t{o.threads}: {r} rounds, K/V read a step {kv_mb:.1f} MB")
    for v in o.variants:
        same = np.array_equal(outs[v], outs[base])
        print(f"  variant {v}: best {1e3 * best[v]:.2f} ms a step ({kv_mb / 1e3 / best[v]:.1f} GB/s); "
              f"{best[base] / best[v]:.3f}x variant {base}; bits {'==' if same else '!='} variant {base}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
