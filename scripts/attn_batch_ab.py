"""Batched decode attention (one query row per sequence, each in its own KV slot, the decoder's `attention`
kernel) over every layer of a model shape, the cache coming from beyond the L3 as in a serving step; kernel
variants alternating in one process.

    python scripts/attn_batch_ab.py [-t 2] [--rows 16] [--ctx 16:32] [--kv f16,int8] [--seconds 30] [VARIANT ...]

Each round times every variant (LOWBIT_ATTN_VARIANT=v: a temporary getenv in the code under test reads it per
call; with none, every variant is the build's one kernel) over the layers, wall time, and keeps each variant's
best; prints ms per step (all layers) and the speed relative to the first variant. --ctx LO:HI: the rows'
contexts spread evenly over [LO, HI] positions (the native step of `lowbit bench serve --profile` at -p 16:
16:32; its 16-client serving level at -p 16 -n 128: 16:144). --kv: the cache types, each timed as a variant of
its own (default f16). Checks that every variant of one cache type gives the same bits."""
from __future__ import annotations

import argparse
import os
import time

import numpy as np

import lowbit
from lowbit import _native
from lowbit.bench.shapes import MODEL_SHAPES
from lowbit.model.kv_cache import quantize_kv_rows


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
    ap.add_argument("--kv", default="f16", help="cache types, comma-separated: f16, int8 (default f16)")
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
    kvs = o.kv.split(",")
    if not set(kvs) <= {"f16", "int8"}:
        raise SystemExit(f"--kv takes f16 and int8, got {o.kv}")
    caches = {t: [] for t in kvs}
    for _ in range(n_cache):  # [slots, kv, max_ctx, row]: float16 as uint16, or int8 rows with their scale
        k = rng.standard_normal((R, kv, o.max_ctx, hd), dtype=np.float32)
        v = rng.standard_normal((R, kv, o.max_ctx, hd), dtype=np.float32)
        for t in kvs:
            if t == "f16":
                caches[t].append((k.astype(np.float16).view(np.uint16), v.astype(np.float16).view(np.uint16)))
            else:
                caches[t].append((quantize_kv_rows(k), quantize_kv_rows(v)))
    pos = np.linspace(lo, hi, R).astype(np.int64) - 1
    slot = np.arange(R, dtype=np.int64)
    q = (rng.standard_normal((R, heads, hd), dtype=np.float32) / np.sqrt(hd)).astype(np.float32)
    configs = [(t, v) for t in kvs for v in o.variants]
    outs = {c: np.zeros((L, R, heads * hd), np.float32) for c in configs}

    def step(c) -> float:
        os.environ["LOWBIT_ATTN_VARIANT"] = c[1]
        out = outs[c]
        t0 = time.perf_counter()
        for li in range(L):
            k, vv = caches[c[0]][li % n_cache]
            _native.attention(q, k, vv, pos, slot, out[li], 0, 0.0, 64)
        return time.perf_counter() - t0

    best = {c: float("inf") for c in configs}
    t_end = time.perf_counter() + o.seconds
    r = 0
    while time.perf_counter() < t_end or r < 2:
        for c in (configs if r % 2 == 0 else configs[::-1]):
            best[c] = min(best[c], step(c))
        r += 1
    base = configs[0]
    print(f"{o.shape} {R} rows ctx {lo}:{hi} t{o.threads}: {r} rounds")
    for c in configs:
        t, v = c
        row = hd * 2 if t == "f16" else hd + 4
        kv_mb = 2 * L * kv * row * int((pos + 1).sum()) / 1e6
        same = np.array_equal(outs[c], outs[(t, o.variants[0])])
        print(f"  {t} variant {v}: best {1e3 * best[c]:.2f} ms a step, K/V {kv_mb:.1f} MB ({kv_mb / 1e3 / best[c]:.1f} "
              f"GB/s); {best[base] / best[c]:.3f}x {base[0]} variant {base[1]}; bits {'==' if same else '!='} "
              f"{t} variant {o.variants[0]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
