"""rsr-lut's kernel alone: in cache on 1 thread (thread CPU time, so other processes' load does not count), and
binary 2^15 x 2^15 for one token from DRAM (the L3 flushed before each call, wall clock, 2 threads). Run it under
two builds in alternation (their pythons) to compare kernels:

    for r in 1 2 3; do OLD_PY scripts/rsr_lut_bench.py; NEW_PY scripts/rsr_lut_bench.py; done"""
from __future__ import annotations

import time

import numpy as np

import lowbit
from lowbit import _native
from lowbit.formats.rsr_lut import LUTMatrix

IN_CACHE = [("binary", 4096, 4096, 1), ("ternary", 2560, 2560, 1), ("ternary", 2560, 2560, 16),
            ("ternary", 2560, 2560, 128), ("binary", 2560, 2560, 128)]


def make(kind, m, k, rng):
    a = rng.integers(0, 2, (m, k), dtype=np.uint8) if kind == "binary" else rng.integers(-1, 2, (m, k))
    return LUTMatrix.binary(a) if kind == "binary" else LUTMatrix.ternary(a)


def main() -> None:
    rng = np.random.default_rng(0)
    lowbit.set_threads(1)
    out = []
    for kind, m, k, n in IN_CACHE:
        lut = make(kind, m, k, rng)
        q = rng.integers(-127, 128, (n, k), dtype=np.int8)
        y = np.empty((n, m), np.float32)
        iters = max(1, int(2e8 / (m * k * n)))
        lut.matmul_i8(q, out=y)
        best = float("inf")
        for _ in range(7):
            t0 = time.thread_time()
            for _ in range(iters):
                lut.matmul_i8(q, out=y)
            best = min(best, (time.thread_time() - t0) / iters)
        out.append(f"{kind} {m}x{k} N={n} {m * k * n / best / 1e9:.1f}")
    print(f"rsr-lut {_native.rsr_lut_path()}, 1 thread, in cache, G weight-tokens/s: " + " | ".join(out))

    lowbit.set_threads(2)
    lut = make("binary", 1 << 15, 1 << 15, rng)
    q = rng.integers(-127, 128, (1, 1 << 15), dtype=np.int8)
    y = np.empty((1, 1 << 15), np.float32)
    flush = np.ones(512 << 20, np.uint8)
    times = []
    for _ in range(9):
        flush.sum()
        t0 = time.perf_counter()
        lut.matmul_i8(q, out=y)
        times.append(time.perf_counter() - t0)
    med = sorted(times)[len(times) // 2]
    print(f"binary 2^15 x 2^15, one token from DRAM, 2 threads: median {med * 1e3:.2f} ms, best {min(times) * 1e3:.2f} "
          f"({lut.nbytes / med / 1e9:.1f} GB/s)")


if __name__ == "__main__":
    main()
