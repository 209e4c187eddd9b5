"""Decode attention of one GQA layer in cache (the decoder's `attention` kernel, one query row), per position.

    GQA=HEADS,KV_HEADS,HD python scripts/attn_gqa_bench.py POS [THREADS]

GQA defaults to SmolLM2-135M's 9,3,64 (bitnet-2b: 20,5,128; llama3-8b: 32,8,128); a float16 cache of POS + 8
positions; best of 5 x 2000 calls, wall clock, less the same call at position 0 (the binding's cost)."""
import sys, time, numpy as np, lowbit
from lowbit import _native
lowbit.set_threads(int(sys.argv[2]) if len(sys.argv) > 2 else 1)
import os; pos = int(sys.argv[1]); H, KV, hd = (int(x) for x in os.environ.get("GQA", "9,3,64").split(",")); ctx = pos + 8
rng = np.random.default_rng(0)
k = rng.standard_normal((1, KV, ctx, hd)).astype(np.float16).view(np.uint16)
v = rng.standard_normal((1, KV, ctx, hd)).astype(np.float16).view(np.uint16)
q = (rng.standard_normal((1, H, hd)) * 0.1).astype(np.float32)
out = np.zeros((1, H * hd), np.float32)
P, S = np.array([pos], np.int64), np.array([0], np.int64)
def run(p, n=2000):
    t0 = time.perf_counter()
    for _ in range(n): _native.attention(q, k, v, p, S, out, 0, 0.0, 0)
    return (time.perf_counter() - t0) / n
best = min(run(P) for _ in range(5)); base = min(run(np.array([0], np.int64)) for _ in range(5))
print(f"pos {pos}: {best*1e6:.2f} us per layer (pos0 {base*1e6:.2f}); {(best-base)*1e9/(pos+1)/KV:.1f} ns per kv-head position")
