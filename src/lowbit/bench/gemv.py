"""GEMV (one token) and GEMM (N tokens) per weight format at real model shapes.

The roof moves: on a shared machine the DRAM bandwidth a VM gets drifts by tens of percent within
minutes. So every row is measured between two reads of a 256 MiB buffer with the same threads, and its
fraction is taken against the higher of the two (the conservative choice) — a ratio measured side by side.

Weights are random codes in each format's packed layout. A call reads one of several copies in turn,
with enough copies to exceed the L3 `ROTATE_L3_FACTOR` times over, so the bytes come from DRAM, as in
decoding; their packed codes sit on 2 MiB pages in one arena as the decoder's do (lowbit.model.hugepages;
float weights stay where numpy put them, as in the decoder). Timing runs in C++ (the same thread-pool path
as `PackedWeight.matmul`) with no Python between calls; activation quantization (once per input row, shared
by the projections reading it) is not timed.
"""
from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np

import lowbit
from lowbit.model.hugepages import codes_to_hugepages
from lowbit import _native
from lowbit.bench import bandwidth, memory, roof
from lowbit.bench.shapes import GEMV_MODELS, MODEL_SHAPES, linear_shapes
from lowbit.formats import Activations, get_format
from lowbit.formats.codebook import CodebookWeight, codes_bytes, padded_rows, parse_spec, row_tile
from lowbit.formats.floats import BF16Weight, F32Weight
from lowbit.formats.int6 import Int6Weight
from lowbit.formats.intcodes import ROW_BLOCK, IntCodeWeight, padded_k, resolve_group
from lowbit.formats.rsr import RSRWeight
from lowbit.formats.tq1 import TQ1Weight
from lowbit.formats import tq1 as _tq1

FORMATS = ["bf16", "int8", "int4", "int2", "ternary", "tq1", "binary"]
# Codebook settings are named codebook-m{m}v{v}b{b}g{g} (the Psumbook kernel) or with a "-dequant" suffix
# (the dequantize-then-multiply kernel on the same bytes), e.g. --formats codebook-m1v4b8g128,codebook-m1v4b8g128-dequant
CODEBOOK_FORMATS = ["codebook-m1v4b8g128", "codebook-m1v4b8g128-dequant", "codebook-m2v8b8g128", "codebook-m3v8b8g128"]
DEQUANT_SUFFIX = "-dequant"


def codebook_setting(fmt: str) -> tuple[dict, bool] | None:
    """'codebook-m2v8b8g128[-dequant]' -> (parameters, psum kernel?); None if fmt is not a codebook name."""
    psum = not fmt.endswith(DEQUANT_SUFFIX)
    spec = parse_spec(fmt if psum else fmt[:-len(DEQUANT_SUFFIX)])
    return None if spec is None else (spec, psum)
ROTATE_L3_FACTOR = 8
DEFAULT_GROUP = {"int8": 32, "int4": 32, "int2": 64}  # the formats' own defaults (int8: Q8_0-like blocks)


def l3_bytes() -> int:
    try:
        text = Path("/sys/devices/system/cpu/cpu0/cache/index3/size").read_text().strip()
        mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1], 1)
        return int(text.rstrip("KMG")) * mult
    except (OSError, ValueError):
        return 32 << 20


_TERNARY_BYTES = np.array([a | b << 2 | c << 4 | d << 6 for a in range(3) for b in range(3) for c in range(3)
                           for d in range(3)], np.uint8)  # bytes whose four 2-bit codes are all in {0,1,2}


def random_weight(fmt: str, m: int, k: int, rng: np.random.Generator):
    """A packed weight of `fmt` with random codes and scales: the layout and byte count of a real one.

    Codes are drawn directly in the packed layout (every byte is valid; ternary bytes hold codes 0..2),
    so building an 8B-parameter model takes seconds."""
    cb = codebook_setting(fmt)
    if cb is not None:
        p, psum = cb
        kp = -(-k // p["v"]) * p["v"]
        group = min(p["g"], kp)
        tile = row_tile(p["b"])
        mt, g = padded_rows(m, p["b"]) // tile, -(-kp // group)  # b != 4: whole blocks of 64 rows
        n_codes = codes_bytes(m, kp, p["m"], p["v"], p["b"], group)  # b == 4: two codes per byte, any byte valid
        codes = rng.integers(0, 256 if p["b"] == 4 else 1 << p["b"], size=n_codes, dtype=np.uint8)
        scale = rng.uniform(0.01, 0.02, size=g * mt * tile).astype(np.float16)
        books = rng.standard_normal((p["m"], 1 << p["b"], p["v"])).astype(np.float16)
        pw = CodebookWeight((m, k), p["m"], p["v"], p["b"], group, codes, scale, books)
        pw.bench_psum = psum
        return pw
    cls = get_format(fmt)
    if cls is F32Weight:
        return F32Weight(rng.standard_normal((m, k), dtype=np.float32))
    if cls is BF16Weight:
        # bf16 bits of +-[1, 2): random mantissas, random signs
        bits = rng.integers(0x3F80, 0x4000, size=(m, k), dtype=np.uint16)
        return BF16Weight(bits | (rng.integers(0, 2, size=(m, k), dtype=np.uint16) << np.uint16(15)))
    if cls is RSRWeight:  # random ternary values, indexed (k = the format's default) with dense codes beside
        t = rng.integers(-1, 2, size=(m, k), dtype=np.int8)
        return RSRWeight.from_ternary(t, rng.uniform(0.01, 0.02, size=m).astype(np.float16).astype(np.float32))
    if cls is TQ1Weight:  # random valid bytes (each one of the 243 codes of 5 trits)
        kp, mb = _tq1.padded_k(k), -(-m // ROW_BLOCK)
        codes = _tq1.VALID_BYTES[rng.integers(0, 243, size=mb * (kp // _tq1.KC) * _tq1.CHUNK_BYTES)]
        scale = rng.uniform(0.01, 0.02, size=mb * ROW_BLOCK).astype(np.float16)
        return TQ1Weight((m, k), kp, codes, scale)
    if cls is Int6Weight:  # a random int4 weight as the low plane (groups of 32), random bytes as the high one
        lo = random_weight("int4", m, k, rng)
        return Int6Weight((m, k), lo.group, lo.codes, rng.integers(0, 256, size=lo.codes.size // 2, dtype=np.uint8),
                          lo.scale, lo.offset)
    assert issubclass(cls, IntCodeWeight)
    kp = padded_k(k)
    mb = -(-m // ROW_BLOCK)
    n_bytes = mb * kp * ROW_BLOCK * cls.bits // 8
    if fmt == "ternary":
        codes = _TERNARY_BYTES[rng.integers(0, len(_TERNARY_BYTES), size=n_bytes)]
    else:
        codes = rng.integers(0, 256, size=n_bytes, dtype=np.uint8)
    group = resolve_group(DEFAULT_GROUP.get(fmt), k)
    g = -(-kp // group)
    scale = rng.uniform(0.01, 0.02, size=mb * g * ROW_BLOCK).astype(np.float16)
    offset = (-scale * 1.5).astype(np.float16) if fmt in ("int4", "int2") else None
    return cls((m, k), group, codes, scale, offset)


def _timer(pw, n_tokens: int, copies: list, rng):
    """Returns f(iters) -> seconds for `iters` calls over the copies."""
    m, k = pw.shape
    x = rng.standard_normal((n_tokens, k)).astype(np.float32)
    y = np.empty((n_tokens, m), np.float32)
    if isinstance(pw, IntCodeWeight):
        q, sx, sq = Activations(x).int8(pw.kp, pw.group)
        tuples = [(c.codes, c._scale_u16, c._offset_u16) for c in copies]
        zc = float(pw.zc or 0.0)
        return lambda iters: _native.bench_int(tuples, zc, pw.bits, m, pw.kp, pw.group, q, sx, sq, y, iters)
    if isinstance(pw, TQ1Weight):
        q, sx, sq = Activations(x).int8(pw.kp, pw.group)
        tuples = [c.native_args() for c in copies]
        return lambda iters: _native.gemm_tq1(tuples, m, pw.kp, pw.group, q, sx, sq, y, iters)[1]
    # Through matmul: rsr (dense codes or the index, as the model would pick) and int6 (its two planes one after the
    # other; the native decoder interleaves them a few row blocks at a time, in one pool run)
    if isinstance(pw, (RSRWeight, Int6Weight)):
        acts = Activations(x)

        def loop(iters):
            t0 = time.perf_counter()
            for i in range(iters):
                copies[i % len(copies)]._matmul(acts)
            return time.perf_counter() - t0
        return loop
    if isinstance(pw, CodebookWeight):
        xp = pw.padded_input(x)
        tuples = [c.native_args() for c in copies]
        psum = getattr(pw, "bench_psum", True)
        return lambda iters: _native.gemm_codebook(tuples, pw._cbT, pw._cb, m, pw.kp, pw.group, xp, y, psum, iters)[1]
    ws = [c.w for c in copies]
    return lambda iters: _native.bench_float(ws, x, y, iters)


def time_matmul(pw, n_tokens: int = 1, rotate_bytes: int | None = None, min_time: float = 0.25,
                repeats: int = 5, rng=None) -> dict:
    """Median seconds per call over `repeats` runs; weights rotate through enough copies to defeat the L3."""
    rng = rng or np.random.default_rng(0)
    run, n_copies = rotating_run(pw, n_tokens, rotate_bytes, rng)
    run(max(2, n_copies))  # warm-up: page in every copy
    once = run(n_copies) / n_copies
    iters = max(n_copies, int(min_time / max(once, 1e-7)))
    times = sorted(run(iters) / iters for _ in range(repeats))
    return {"seconds": times[len(times) // 2], "copies": n_copies, "iters": iters}


def rotating_run(pw, n_tokens: int, rotate_bytes: int | None, rng) -> tuple:
    """(run, n_copies): run(iters) -> seconds for `iters` calls of pw's kernel on n_tokens, rotating through enough
    copies of pw (on huge pages) to read rotate_bytes (default ROTATE_L3_FACTOR x the L3; 0: one copy, in cache)."""
    rotate_bytes = ROTATE_L3_FACTOR * l3_bytes() if rotate_bytes is None else rotate_bytes
    n_copies = max(1, math.ceil(rotate_bytes / pw.nbytes)) if rotate_bytes else 1
    copies = [_copy(pw) for _ in range(n_copies)]
    codes_to_hugepages(copies)  # as NativeDecoder.build places a model's codes
    return _timer(pw, n_tokens, copies, rng), n_copies


def _copy(pw):
    meta, tensors = pw.state()
    return type(pw).from_state(meta, {k: memory.copy(v) for k, v in tensors.items()})


def in_cache_rate(fmt: str, threads: int = 1, target_bytes: int = 512 << 10, k: int = 4096,
                  min_time: float = 0.25, n_tokens: int = 1) -> dict:
    """GB/s of packed weights (and MAC/s for n_tokens) on a matrix that stays in L2 (the paper's B/gamma:
    decode-and-compute speed)."""
    rng = np.random.default_rng(1)
    probe = random_weight(fmt, 64, k, rng)
    m = max(64, int(target_bytes * threads / probe.nbytes) * 64)
    pw = random_weight(fmt, m, k, rng)
    before = lowbit.get_threads()
    lowbit.set_threads(threads)
    try:
        t = time_matmul(pw, n_tokens, rotate_bytes=0, min_time=min_time, rng=rng)["seconds"]
    finally:
        lowbit.set_threads(before)
    return {"format": fmt, "threads": threads, "shape": [m, k], "tokens": n_tokens, "gbps": pw.nbytes / t / 1e9,
            "us": t * 1e6, "gmacs": m * k * n_tokens / t / 1e9}


def run(models=None, formats=None, threads: int | None = None, n_tokens: int | list[int] = 1, progress=print,
        rotate_bytes: int | None = None, min_time: float = 0.25, bandwidth_bytes: int = bandwidth.DEFAULT_BYTES) -> dict:
    """The full GEMV (or GEMM, n_tokens > 1) table for the given models' shapes; n_tokens may be a list (one
    row per count). MAC/s are reported against the int8 compute roof (`lowbit bench roof`) of the same
    threads, and a GEMM row's time per token against the GEMV's (1 token) when that was measured too."""
    tokens = [n_tokens] if isinstance(n_tokens, int) else list(n_tokens)
    if not tokens or min(tokens) < 1:
        raise ValueError("token counts must be >= 1")
    models = models or GEMV_MODELS
    formats = formats or FORMATS
    threads = threads or lowbit.get_threads()
    lowbit.set_threads(threads)
    rng = np.random.default_rng(0)
    progress(f"measuring read bandwidth with {threads} thread(s) ...")
    bw = bandwidth.measure(threads, nbytes=bandwidth_bytes)
    bw1 = bandwidth.measure(1, nbytes=bandwidth_bytes) if threads != 1 else bw
    rotate = ROTATE_L3_FACTOR * l3_bytes() if rotate_bytes is None else rotate_bytes
    roof_buf = memory.buffer(256 << 20)
    compute = roof.measure(threads)["gmacs"]
    compute1 = roof.measure(1)["gmacs"] if threads != 1 else compute

    def local_roof() -> float:
        return bandwidth.measure(threads, passes=2, repeats=1, buf=roof_buf)["gbps"]

    rows = []
    for model in models:
        for m, k in linear_shapes(MODEL_SHAPES[model]):
            base = None
            for fmt in formats:
                pw = random_weight(fmt, m, k, rng)
                gemv_us = None
                for n in tokens:
                    before = local_roof()
                    r = time_matmul(pw, n, rotate_bytes=rotate, min_time=min_time, rng=rng)
                    roof_bw = max(before, local_roof())
                    t = r["seconds"]
                    row = {"model": model, "M": m, "K": k, "format": fmt, "tokens": n, "bpw": pw.bits_per_weight,
                           "bytes": pw.nbytes, "us": t * 1e6, "gbps": pw.nbytes / t / 1e9, "copies": r["copies"],
                           "gops": 2.0 * m * k * n / t / 1e9, "gmacs": m * k * n / t / 1e9}
                    row["roof_gbps"] = roof_bw
                    row["bw_fraction"] = row["gbps"] / roof_bw
                    row["roof_fraction"] = row["gmacs"] / compute
                    if n == 1:
                        gemv_us = row["us"]
                    # GEMV time per token / this row's time per token: how much cheaper a token is here
                    row["per_token_vs_gemv"] = gemv_us / (row["us"] / n) if gemv_us else None
                    if fmt == "bf16" and n == tokens[0]:
                        base = t
                    row["speedup_vs_bf16"] = base / t if base and n == tokens[0] else None
                    rows.append(row)
                    progress(f"  {model:15s} {m:6d}x{k:<6d} {fmt:8s} N={n:<4d} {row['us']:9.1f} us  "
                             f"{row['gbps']:6.1f} GB/s  {row['gmacs']:6.1f} G MAC/s")
    cache = [in_cache_rate(f, 1, min_time=min_time, n_tokens=n) for f in formats for n in tokens]
    for c in cache:
        c["roof_fraction"] = c["gmacs"] / compute1
    return {"threads": threads, "n_tokens": tokens[0], "tokens": tokens, "int8_roof_gmacs": compute,
            "int8_roof_gmacs_1thread": compute1, "isa": lowbit.cpu_info()["isa"], "bandwidth": bw,
            "bandwidth_1thread": bw1, "pool_overhead_us": _native.pool_overhead(20000) * 1e6,
            "rotate_bytes": rotate, "l3_bytes": l3_bytes(), "rows": rows, "in_cache": cache,
            "timestamp": time.strftime("%Y-%m-%d %H:%M:%S")}
