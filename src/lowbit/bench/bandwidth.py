"""Machine read bandwidth: the roof of every fraction lowbit reports.

A buffer far larger than the L3 (default 1 GiB vs a 32 MB L3) is read end to end on the kernels' own
thread pool, in 256 KiB tasks handed out dynamically, with the widest loads of the active ISA and the
same software prefetch as the GEMV, in huge-page memory like the GEMV benchmark's weights.
"""
from __future__ import annotations

import numpy as np

import lowbit
from lowbit import _native
from lowbit.bench import memory

DEFAULT_BYTES = 1 << 30


def measure(threads: int, nbytes: int = DEFAULT_BYTES, passes: int = 3, repeats: int = 3,
            buf: np.ndarray | None = None) -> dict:
    """Read GB/s with `threads` threads: best and mean over `repeats` runs of `passes` passes."""
    if buf is None:
        buf = memory.buffer(nbytes)
    before = lowbit.get_threads()
    lowbit.set_threads(threads)
    try:
        _native.read_bandwidth(buf, 1)  # warm-up
        rates = [buf.nbytes * passes / _native.read_bandwidth(buf, passes) / 1e9 for _ in range(repeats)]
    finally:
        lowbit.set_threads(before)
    return {"threads": threads, "gbps": max(rates), "gbps_mean": float(np.mean(rates)), "bytes": int(buf.nbytes)}


def sweep(max_threads: int, nbytes: int = DEFAULT_BYTES, passes: int = 3, repeats: int = 3) -> list[dict]:
    buf = memory.buffer(nbytes)
    return [measure(t, passes=passes, repeats=repeats, buf=buf) for t in range(1, max_threads + 1)]
