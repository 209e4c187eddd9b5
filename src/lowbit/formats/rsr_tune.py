"""Choosing RSR's block width k: the paper's analytic optimum and an empirical autotune, cached.

Analytic (paper 003, eqs. 6 and 7, generalized to base-b digits: b = 2 binary planes, 3 direct ternary):
    RSR:   k* = argmin_k  (M / k) (K + k b^k)      k in [1, log_b(K) - log_b(log_b(K))]
    RSR++: k* = argmin_k  (M / k) (K + b^k)        k in [1, log_b(K)]
The count is per token and ignores what a CPU charges: branch misses at segment ends (segments average
K / b^k rows), the u buffer of b^k x tokens leaving L1, the token tile. So ``autotune`` times the native
kernel for each k on this machine at the given K, base and token count, over a slice of rows (blocks
are independent, so the time per block does not depend on M), and caches the answer in
``<lowbit cache>/rsr_tune.json`` keyed by tuner version, ISA, threads, K, base and tokens (written atomically).
Robustness on a shared machine: only k near the analytic optimum are timed, in interleaved rounds (every
k once per round), and the median round decides: an earlier tuner timed each k's best of 3 one after
another and, under load, picked k = 2-3 at N = 128, where step 1 alone
costs twice (k = 2) or 1.33x (k = 3) what it costs at k = 4.
"""
from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np

from lowbit import _native
from lowbit._fileio import atomic_write_text
from lowbit.formats.rsr_index import MAX_SEGMENTS, RSRIndex

TUNE_FILE = "rsr_tune.json"


def _cost(m: int, k_dim: int, base: int, k: int, plus: bool) -> float:
    step2 = base ** k if plus else k * base ** k
    return math.ceil(m / k) * (k_dim + step2)


def analytic_k(m: int, k_dim: int, base: int = 2, plus: bool = True) -> int:
    """Eq. 7 (plus=True, RSR++) or eq. 6 (RSR) over the paper's range, generalized to base b."""
    logn = math.log(max(k_dim, 2), base)
    hi = logn if plus else logn - math.log(max(logn, 1.0 + 1e-9), base)
    hi = max(1, min(int(math.floor(hi)), int(math.log(MAX_SEGMENTS, base))))
    return min(range(1, hi + 1), key=lambda k: (_cost(m, k_dim, base, k, plus), k))


def tune_path() -> Path:
    from lowbit.api import cache_root

    return cache_root() / TUNE_FILE


def _load(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _store(path: Path, key: str, entry: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    table = _load(path)
    table[key] = entry
    atomic_write_text(path, json.dumps(table, indent=1, sort_keys=True))


TUNER_VERSION = 3  # in the cache key: answers of an older tuner or kernel (v1: best of 3, one k after another;
# v2: the 128-token int8 tile) are not reused


def tune_key(k_dim: int, base: int, n_tokens: int) -> str:
    """Cache key: tuner version, ISA and kernel path, threads, K, base and token count N."""
    return (f"v{TUNER_VERSION}|{_native.isa()}|{_native.rsr_path()}|t{_native.get_threads()}|K{k_dim}|b{base}"
            f"|N{n_tokens}")


def time_k(k_dim: int, base: int, k: int, n_tokens: int, rows: int | None = None, seconds: float = 0.02,
           rng: np.random.Generator | None = None) -> float:
    """Seconds per output row of one timed run of the native int8 RSR++ kernel at block width k (random
    digits; enough rows for 16 blocks per thread, so the pool's dispatch is amortized)."""
    rng = rng or np.random.default_rng(0)
    rows = rows or max(16 * _native.get_threads() * k, 64 // k * k)
    values = np.arange(base, dtype=np.float32) - (1 if base == 3 else 0)
    idx = RSRIndex.build(rng.integers(0, base, (rows, k_dim), dtype=np.uint8), k, base, values)
    q = rng.integers(-127, 128, (n_tokens, k_dim), dtype=np.int8)
    sx = np.ones(n_tokens, np.float32)
    y = np.empty((n_tokens, rows), np.float32)
    args = (idx.perm, idx.seg, rows, k_dim, k, base, idx.values, q, sx, None, 1.0, False, True, y)
    _, once = _native.rsr_gemm_i8(*args, iters=1)
    iters = max(1, min(200, int(seconds / max(once, 1e-6))))
    _, s = _native.rsr_gemm_i8(*args, iters=iters)
    return s / iters / rows


U_BYTES = 64 << 10  # largest step-2 buffer u [b^k][token tile] of int32 worth timing (see candidates)
TILE_I8 = 64  # kRsrTileI8 in kernels/rsr.h: the int8 kernel's token tile (16-token steps below it)


def feasible(k_dim: int, base: int, n_tokens: int = 1) -> list[int]:
    """Block widths within 2 <= b^k <= 4096 segments and at least ~2 rows per segment. With a token tile,
    u [b^k][tile] int32 must stay within U_BYTES: past it step 2's folds run from L2 and cost as much as
    step 1 (a 128-token tile, ternary: k = 4, 41 KB: 1.3 ps per weight-token; k = 5, 124 KB: 6.4 ps)."""
    tile = 1 if n_tokens == 1 else min(TILE_I8, n_tokens)
    ks = [k for k in range(1, 13) if 2 <= base ** k <= 4096 and base ** k <= max(2, k_dim // 2)
          and (tile == 1 or base ** k * tile * 4 <= U_BYTES)]
    return ks or [1]


def candidates(k_dim: int, base: int, n_tokens: int = 1) -> list[int]:
    """The feasible k from two below to one above the analytic optimum (eq. 7; the cache bound may pull the
    centre down): the count favours large k, the machine (step 2, segment ends) smaller ones."""
    ks = feasible(k_dim, base, n_tokens)
    centre = min(analytic_k(k_dim, k_dim, base, plus=True), max(ks))
    return [k for k in ks if centre - 2 <= k <= centre + 1] or [max(ks)]


def pick_k(ks, timer, rounds: int = 5) -> tuple[int, dict]:
    """The k with the lowest median time over `rounds` rounds, each timing every k once in turn (so load
    from other processes falls on all of them alike). timer(k) -> seconds (any unit). Ties -> larger k
    (fewer index bytes). Returns (k, {k: median})."""
    samples = {k: [] for k in ks}
    for _ in range(max(1, rounds)):
        for k in ks:
            samples[k].append(float(timer(k)))
    med = {k: float(np.median(v)) for k, v in samples.items()}
    return min(med, key=lambda k: (med[k], -k)), med


def autotune(k_dim: int, base: int = 3, n_tokens: int = 128, refresh: bool = False, timer=None,
             rounds: int = 5) -> int:
    """The fastest k for K inputs, base-b digits and n_tokens tokens on this machine (cached per key,
    tune_key). timer(k) -> seconds per row replaces the native timing (tests)."""
    path, key = tune_path(), tune_key(k_dim, base, n_tokens)
    if not refresh:
        hit = _load(path).get(key)
        if hit and isinstance(hit.get("k"), int):
            return hit["k"]
    t0 = time.perf_counter()
    timer = timer or (lambda k: time_k(k_dim, base, k, n_tokens))
    best, med = pick_k(candidates(k_dim, base, n_tokens), timer, rounds)
    _store(path, key, {"k": best, "ns_per_row": {str(k): round(v * 1e9, 1) for k, v in med.items()},
                       "rounds": rounds, "tuned_s": round(time.perf_counter() - t0, 2)})
    return best


def choose_k(m: int, k_dim: int, base: int, k="auto", n_tokens: int = 128) -> int:
    """k as asked: an int, "analytic" (eq. 7), or "auto" (autotune, cached)."""
    if isinstance(k, (int, np.integer)) and not isinstance(k, bool):
        if k < 1 or base ** int(k) > MAX_SEGMENTS:
            raise ValueError(f"rsr: k must be >= 1 with {base}^k <= {MAX_SEGMENTS}, got {k}")
        return int(k)
    if k == "analytic":
        return analytic_k(m, k_dim, base, plus=True)
    if k == "auto":
        return autotune(k_dim, base, n_tokens)
    raise ValueError(f"rsr: k must be an integer, 'analytic' or 'auto', got {k!r}")
