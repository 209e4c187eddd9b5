"""The int8 compute roof: peak u8 x s8 multiply-accumulates per second in registers, per core and on the
thread pool, with the instructions the active ISA's integer kernels use (AVX2: vpmaddubsw + vpaddw;
AVX-VNNI / AVX-512: vpdpbusd; scalar: a plain C++ loop). Prefill (GEMM) speed is reported against it,
as decode is against the read bandwidth.

    lowbit bench roof -t 2
"""
from __future__ import annotations

from pathlib import Path

import lowbit
from lowbit import _native


def nominal_mhz() -> float | None:
    """The clock /proc/cpuinfo reports (for MACs per cycle; a VM often shows the base clock only)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("cpu MHz"):
                return float(line.split(":")[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def measure(threads: int = 1, min_time: float = 0.1, repeats: int = 3) -> dict:
    """G MAC/s of the active ISA's probe on `threads` threads: the best of `repeats` runs of ~min_time s."""
    if threads < 1:
        raise ValueError("threads must be >= 1")
    before = lowbit.get_threads()
    if threads > before:
        lowbit.set_threads(threads)
    try:
        iters = 1 << 12
        while True:  # calibrate on one thread: each run lasts about min_time
            s, _, what = _native.int8_roof(iters, 1)
            if s >= min_time / 4 or iters >= 1 << 40:
                break
            iters *= 4
        iters = max(1, int(iters * min_time / max(s, 1e-9)))
        rates = []
        for _ in range(repeats):
            s, macs, what = _native.int8_roof(iters, threads)
            rates.append(macs / s / 1e9)
    finally:
        if lowbit.get_threads() != before:
            lowbit.set_threads(before)
    best = max(rates)
    mhz = nominal_mhz()
    return {"threads": threads, "isa": lowbit.cpu_info()["isa"], "probe": what, "gmacs": best,
            "gmacs_per_thread": best / threads, "gmacs_runs": rates,
            "macs_per_cycle": best / threads * 1e3 / mhz if mhz else None, "mhz": mhz}


def measure_isa(isa: str, threads: int = 1, min_time: float = 0.1, repeats: int = 3) -> dict:
    """measure() with the kernel level `isa` active for its duration (the active level is restored)."""
    before = lowbit.cpu_info()["isa"]
    lowbit.set_isa(isa)
    try:
        return measure(threads, min_time, repeats)
    finally:
        lowbit.set_isa(before)


def sweep(max_threads: int, min_time: float = 0.1, repeats: int = 3) -> list[dict]:
    return [measure(t, min_time, repeats) for t in range(1, max_threads + 1)]
