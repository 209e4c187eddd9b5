"""Decode attention (one query row, the decoder's `attention` kernel) per kv head: in cache against from DRAM,
and a pass that only loads the same K/V lines, so the three say whether compute and memory overlap.

    python scripts/attn_decode_bench.py [--pos 160] [--hd 96] [--heads 16] [--group 1] [--layers 24] [--f32 | --int8]

SmolLM2-135M: --heads 3 --group 3 --hd 64 --layers 30; bitnet-2b: --heads 5 --group 4 --hd 128 --layers 30.

1 thread, thread CPU time (a shared machine's other processes do not count), best of --repeats. "in cache":
4 heads (fits the L2) called over and over, less the same call at position 0 (the binding's cost); "from DRAM": every layer's cache once after reading 64 MiB
(flushes the L3); "loads only": from DRAM, `lowbit bench bandwidth`'s read kernel over a copy of the same
bytes as one stream (what the K/V bytes cost with no compute; its wall time)."""
from __future__ import annotations

import argparse
import time

import numpy as np

import lowbit
from lowbit import _native
from lowbit.model.kv_cache import quantize_kv_rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pos", type=int, default=160, help="position of the query (attends pos + 1 positions)")
    ap.add_argument("--hd", type=int, default=96)
    ap.add_argument("--heads", type=int, default=16, help="kv heads (bitnet-0.7b: 16)")
    ap.add_argument("--group", type=int, default=1, help="query heads per kv head (GQA; bitnet-0.7b: 1)")
    ap.add_argument("--layers", type=int, default=24)
    kind = ap.add_mutually_exclusive_group()
    kind.add_argument("--f32", action="store_true", help="float32 cache (default float16, as quantized models)")
    kind.add_argument("--int8", action="store_true", help="int8 rows + a float32 scale each (--kv-cache int8)")
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    lowbit.set_threads(1)
    L, H, G, hd, pos, ctx = a.layers, a.heads, a.group, a.hd, a.pos, a.pos + 8
    rng = np.random.default_rng(0)

    def cache():
        c = rng.standard_normal((L, 1, H, ctx, hd)).astype(np.float32)
        if a.int8:
            return quantize_kv_rows(c)
        return c if a.f32 else c.astype(np.float16).view(np.uint16)
    kc, vc = cache(), cache()
    q = (rng.standard_normal((1, H * G, hd)) * 0.1).astype(np.float32)
    out = np.zeros((1, H * G * hd), np.float32)
    P, S = np.array([pos], np.int64), np.array([0], np.int64)
    flush = np.ones(64 << 20, np.uint8)
    n4 = min(4, H)
    q4 = np.ascontiguousarray(q[:, :n4 * G])
    k4, v4 = (np.ascontiguousarray(x[:, :n4]) for x in (kc[0], vc[0]))
    out4 = np.zeros((1, n4 * G * hd), np.float32)
    stream = np.ascontiguousarray(np.stack([kc[:, 0, :, : pos + 1], vc[:, 0, :, : pos + 1]]).view(np.uint8).ravel())
    stream = stream[: stream.size // 256 * 256]

    def calls(p, n=500):
        t0 = time.thread_time()
        for _ in range(n):
            _native.attention(q4, k4, v4, p, S, out4, 0, 0.0, 0)
        return (time.thread_time() - t0) / n / n4

    def in_cache():  # less the call's own cost (the binding, one tile a head: position 0 only)
        return calls(P) - calls(np.array([0], np.int64))

    def from_dram():
        flush.sum()
        t0 = time.thread_time()
        for layer in range(L):
            _native.attention(q, kc[layer], vc[layer], P, S, out, 0, 0.0, 0)
        return (time.thread_time() - t0) / L / H

    def loads_only():
        flush.sum()
        return _native.read_bandwidth(stream, 1) / L / H  # seconds of one pass

    best = {f.__name__: min(f() for _ in range(a.repeats)) for f in (in_cache, from_dram, loads_only)}
    nbytes = 2 * (pos + 1) * kc.shape[-1] * kc.itemsize
    for name, t in best.items():
        print(f"{name:10s} {t * 1e6:7.2f} us per kv head  {nbytes / t / 1e9:6.1f} GB/s of K/V  "
              f"{t * 1e9 / ((pos + 1) / 8):6.0f} ns per 8 positions")
    print(f"in cache + loads only = {(best['in_cache'] + best['loads_only']) * 1e6:.2f} us: from DRAM near this sum "
          f"means compute and memory do not overlap; near the larger of the two, they do")


if __name__ == "__main__":
    main()
