"""Prefill attention alone: `_native.attention` on R consecutive rows (positions 0..R-1) of one sequence over a
float16 cache, best of 200 calls.

    python scripts/attn_prefill_bench.py THREADS HEADS,KV_HEADS,HEAD_DIM,ROWS     (e.g. 1 16,16,96,128: bitnet-0.7b)
"""
import sys
import time

import numpy as np

import lowbit
from lowbit import _native

lowbit.set_threads(int(sys.argv[1]))
heads, kv, hd, R = [int(v) for v in sys.argv[2].split(",")]  # e.g. 16,16,96,128
rng = np.random.default_rng(0)
ctx = R + 64
kc = rng.standard_normal((1, kv, ctx, hd)).astype(np.float16).view(np.uint16)
vc = rng.standard_normal((1, kv, ctx, hd)).astype(np.float16).view(np.uint16)
q = (rng.standard_normal((R, heads, hd)) * 0.3).astype(np.float32)
pos = np.arange(R, dtype=np.int64); slot = np.zeros(R, np.int64)
out = np.empty((R, heads * hd), np.float32)
best = 1e9
for i in range(200):
    t0 = time.perf_counter(); _native.attention(q, kc, vc, pos, slot, out); best = min(best, time.perf_counter() - t0)
print(f"{sys.argv[2]} t{sys.argv[1]}: {best * 1e6:.0f} us per call ({best * 1e6 / R:.2f} us a row)")
