"""`lowbit bench rsr`: paper 003's figures on this machine, and RSR against lowbit's dense ternary kernel.

    fig11   NumPy RSR++ (the paper's NumPy method) vs np.dot, n = 2^11 .. 2^max-n, binary and ternary (B1 - B2).
            Two baselines: np.dot on float32 (BLAS sgemv) and np.dot on int64 {0,1} matrix and int64
            vector, the authors' NumPy baseline (UIC-InDeXLab/RSR NaiveMultiplier: np.dot(v, A) on
            np.random.randint arrays, which NumPy runs without BLAS) — the one their up-to-24x is against.
    fig4    native RSR and RSR++ (float vector, one token), RSR++ on int8 activations, and rsr-lut (the
            transposed table-lookup form, int8 activations; NOT the paper's RSR) vs a standard native
            GEMV over a uint8 {0,1} matrix and vs NumPy's float32 GEMV, binary, n = 2^11 .. 2^max-n
    dense   native RSR++ (int8 activations, direct base-3 ternary index, k tuned per shape and N) and
            rsr-lut (ternary as two planes) vs the dense ternary kernel at a model's shapes for
            N = 1, 8, 32, 128, 512 tokens
    size    index bytes per weight next to the 2-bit packed matrix and the paper's log-factor claim
    kscan   one-token RSR++ (binary) in ns per gathered input and ps per weight for each k near eq. 7's,
            1 thread, CPU time of the thread (not in the default parts: for comparing kernels on a busy machine)

Dense n x n baselines that would not fit in memory (a float32 2^15 x 2^15 matrix is 4 GiB) are timed on a
row slab of at most --slab-mb and scaled by n / rows: the product is a stream over the matrix, its time
linear in the rows. Rows say so ("slab"). Indices are built block by block from random digits.
"""
from __future__ import annotations

import math
import sys
import time

import numpy as np

import lowbit
from lowbit import _native
from lowbit.bench import print_json
from lowbit.bench.roof import nominal_mhz
from lowbit.bench.gemv import ROTATE_L3_FACTOR, l3_bytes, random_weight, time_matmul
from lowbit.bench.shapes import MODEL_SHAPES, linear_shapes
from lowbit.formats.rsr_index import RSRIndex
from lowbit.formats.rsr_lut import LUTMatrix
from lowbit.formats.rsr_tune import analytic_k, autotune, pick_k

BIN = (0.0, 1.0)
TERN = (-1.0, 0.0, 1.0)
TOKENS = (1, 8, 32, 128, 512)


def random_index(m: int, kdim: int, k: int, base: int, values, rng, rows_per_pass: int = 1 << 22) -> RSRIndex:
    """The index of random digits [M, K], built a slab of blocks at a time (never the whole matrix)."""
    nblocks = -(-m // k)
    per = max(1, rows_per_pass // (k * kdim))
    parts = []
    for b0 in range(0, nblocks, per):
        rows = min(m, (b0 + per) * k) - b0 * k
        parts.append(RSRIndex.build(rng.integers(0, base, (rows, kdim), dtype=np.uint8), k, base, values))
    if len(parts) == 1:
        return parts[0]
    return RSRIndex((m, kdim), k, base, parts[0].values, np.concatenate([p.perm for p in parts]),
                    np.concatenate([p.seg for p in parts]))


MIN_TIME = 0.2  # seconds per timed run (--min-time)


def best_of(f, repeats: int = 3, min_time: float | None = None) -> float:
    """Seconds per call of f(): the best of `repeats` runs of enough calls to last min_time."""
    t0 = time.perf_counter()
    f()
    once = time.perf_counter() - t0
    n = max(1, int((MIN_TIME if min_time is None else min_time) / max(once, 1e-7)))
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(n):
            f()
        best = min(best, (time.perf_counter() - t0) / n)
    return best


def slab_rows(n: int, itemsize: int, slab_bytes: int) -> int:
    return max(1, min(n, slab_bytes // (itemsize * n)))


def numpy_dot_seconds(n: int, rng, slab_bytes: int) -> tuple[float, int]:
    """np.dot(v, A) for a float32 {0,1} A [n, n] (v . A as the paper writes it), from a slab of rows."""
    rows = slab_rows(n, 4, slab_bytes)
    a = rng.integers(0, 2, (rows, n), dtype=np.uint8).astype(np.float32)
    v = rng.standard_normal(rows).astype(np.float32)
    return best_of(lambda: np.dot(v, a)) * n / rows, rows


def numpy_dot_int64_seconds(n: int, rng, slab_bytes: int) -> tuple[float, int]:
    """The authors' NumPy baseline: np.dot(v, A) with int64 v [n] and an int64 {0,1} A [n, n] (no BLAS)."""
    rows = slab_rows(n, 8, slab_bytes)
    a = rng.integers(0, 2, (rows, n), dtype=np.int64)
    v = rng.integers(0, 100, rows, dtype=np.int64)
    return best_of(lambda: np.dot(v, a), repeats=2, min_time=MIN_TIME / 2) * n / rows, rows


def random_lut(m: int, kdim: int, rng, kind: str = "binary", rows_per_pass: int = 1 << 26) -> LUTMatrix:
    """rsr-lut planes of a random binary or ternary [M, K], packed a slab of 64-row tiles at a time."""
    per = max(64, rows_per_pass // kdim // 64 * 64)
    parts = []
    for r0 in range(0, m, per):
        rows = min(per, m - r0)
        if kind == "binary":
            parts.append(LUTMatrix.binary(rng.integers(0, 2, (rows, kdim), dtype=np.uint8)))
        else:
            parts.append(LUTMatrix.ternary(rng.integers(-1, 2, (rows, kdim), dtype=np.int8)))
    if len(parts) == 1:
        return parts[0]
    return LUTMatrix((m, kdim), np.concatenate([p.w for p in parts]), parts[0].shifts, parts[0].negs)


def lut_seconds(lut: LUTMatrix, n_tok: int, rng, rotate_bytes: int = 0) -> float:
    """Seconds per product of rsr-lut with n_tok int8 tokens (tables included); copies of the packed
    planes rotated past the L3 for few tokens, as the dense kernel's are."""
    copies = max(1, math.ceil(rotate_bytes / lut.nbytes)) if rotate_bytes and n_tok < 32 else 1
    luts = [lut] + [LUTMatrix(lut.shape, lut.w.copy(), lut.shifts, lut.negs) for _ in range(copies - 1)]
    q = rng.integers(-127, 128, (n_tok, lut.shape[1]), dtype=np.int8)
    y = np.empty((n_tok, lut.shape[0]), np.float32)

    def run(iters):
        return sum(luts[i % copies].matmul_i8(q, out=y)[1] for i in range(iters))

    run(copies)
    once = run(1)
    iters = max(copies, int(MIN_TIME / max(once, 1e-7)))
    return sorted(run(iters) / iters for _ in range(3))[1]


# --- Figure 11: NumPy ------------------------------------------------------------------------------

def fig11(ns, rng, slab_bytes: int, progress) -> list[dict]:
    rows = []
    for n in ns:
        t_dot, slab = numpy_dot_seconds(n, rng, slab_bytes)
        t_int, slab_int = numpy_dot_int64_seconds(n, rng, slab_bytes)
        k = analytic_k(n, n, 2, plus=True)
        x = rng.standard_normal((1, n)).astype(np.float32)
        for kind in ("binary", "ternary"):
            planes = [random_index(n, n, k, 2, BIN, rng) for _ in range(1 if kind == "binary" else 2)]
            if kind == "binary":
                f = lambda: planes[0].matmul(x)  # noqa: E731
            else:
                f = lambda: planes[0].matmul(x) - planes[1].matmul(x)  # noqa: E731  (B1 - B2, Prop. 2.1)
            t = best_of(f, repeats=2, min_time=MIN_TIME / 2)
            rows.append({"n": n, "kind": kind, "k": k, "numpy_dot_s": t_dot, "numpy_rsr_s": t, "speedup": t_dot / t,
                         "dot_slab_rows": slab, "numpy_dot_int64_s": t_int, "speedup_vs_int64": t_int / t,
                         "dot_int64_slab_rows": slab_int})
            progress(f"  fig11 n=2^{int(math.log2(n))} {kind:7s} k={k:2d}  np.dot f32 {t_dot * 1e3:8.2f} ms  "
                     f"int64 {t_int * 1e3:9.2f} ms  NumPy RSR++ {t * 1e3:8.2f} ms  x{t_dot / t:.2f} / x{t_int / t:.2f}")
            del planes
    return rows


# --- Figure 4: native ------------------------------------------------------------------------------

def native_gemv(idx: RSRIndex, x: np.ndarray, plus: bool, repeats: int = 3, min_time: float | None = None) -> float:
    """Seconds per one-token product: float x [1, K], or int8 x (then per-token scale 1)."""
    m, kdim = idx.shape
    y = np.empty((1, m), np.float32)
    if x.dtype == np.int8:
        fn = _native.rsr_gemm_i8
        args = (idx.perm, idx.seg, m, kdim, idx.k, idx.base, idx.values, x, np.ones(1, np.float32), None, 1.0, False,
                plus, y)
    else:
        fn = _native.rsr_gemm_f32
        args = (idx.perm, idx.seg, m, kdim, idx.k, idx.base, idx.values, x, None, 1.0, False, plus, y)
    _, once = fn(*args, iters=1)
    iters = max(1, int((MIN_TIME if min_time is None else min_time) / max(once, 1e-7)))
    return min(fn(*args, iters=iters)[1] / iters for _ in range(repeats))


def tune_gemv_k(n: int, rng, plus: bool) -> tuple[int, dict]:
    """Fastest k for a one-token float GEMV at K = n, timed on a slice of rows (the paper's F.1 search),
    in interleaved rounds with the median deciding (rsr_tune.pick_k)."""
    a = analytic_k(n, n, 2, plus)
    rows = 256
    x = rng.standard_normal((1, n)).astype(np.float32)
    ks = list(range(max(2, a - 4), min(16, a + 1) + 1))
    idx = {k: random_index(rows - rows % k or k, n, k, 2, BIN, rng) for k in ks}
    return pick_k(ks, lambda k: native_gemv(idx[k], x, plus, repeats=1, min_time=MIN_TIME / 4) / idx[k].shape[0])


# Memory operations of the one-token RSR++ step 1 (kernels/rsr_step2.inc): per input one gathered x load,
# a quarter of a 64-bit load of four uint16 permutation entries and one prefix store; per segment bound one
# seg load, one prefix load and one u store. Zen 3 issues at most 3 memory operations a cycle.
MEMOPS_PER_INPUT = 2.25
MEMOPS_PER_SEGMENT = 3.0
MEMOPS_PER_CYCLE = 3.0


def rsrpp_gemv_bound(idx: RSRIndex, dot_s: float, threads: int, mhz: float | None) -> dict:
    """The fastest a one-token RSR++ product could run here: its index streamed at the bandwidth np.dot(v, A)
    reached in the same run (4 n^2 bytes per call), and its step-1 memory operations at the load/store ports
    (threads cores at the nominal clock). The larger of the two is the bound."""
    m, kdim = idx.shape
    bw = 4.0 * m * kdim / dot_s
    out = {"index_stream_s": idx.nbytes / bw, "dot_gb_s": bw / 1e9}
    if mhz:
        ops = idx.nblocks * (kdim * MEMOPS_PER_INPUT + idx.segments * MEMOPS_PER_SEGMENT)
        out["port_s"] = ops / MEMOPS_PER_CYCLE / (threads * mhz * 1e6)
    out["bound_s"] = max(out["index_stream_s"], out.get("port_s", 0.0))
    return out


def fig4(ns, rng, slab_bytes: int, progress) -> list[dict]:
    rows = []
    for n in ns:
        slab = slab_rows(n, 1, slab_bytes)
        w = rng.integers(0, 2, (slab, n), dtype=np.uint8)
        xv = rng.standard_normal(n).astype(np.float32)
        y = np.empty(slab, np.float32)
        _native.standard_gemv_u8(w, xv, y, 1)
        it = max(1, int(MIN_TIME / max(_native.standard_gemv_u8(w, xv, y, 1), 1e-7)))
        t_std = min(_native.standard_gemv_u8(w, xv, y, it) / it for _ in range(3)) * n / slab
        del w
        t_dot, _ = numpy_dot_seconds(n, rng, slab_bytes)
        x = xv[None, :]
        q = rng.integers(-127, 128, (1, n), dtype=np.int8)
        row = {"n": n, "standard_s": t_std, "numpy_dot_s": t_dot, "standard_slab_rows": slab}
        for name, plus in (("rsr", False), ("rsrpp", True)):
            k, _ = tune_gemv_k(n, rng, plus)
            idx = random_index(n, n, k, 2, BIN, rng)
            t = native_gemv(idx, x, plus)
            row.update({f"{name}_k": k, f"{name}_s": t, f"{name}_index_bytes": idx.nbytes})
            if plus:
                row["rsrpp_i8_s"] = native_gemv(idx, q, plus)  # same index and k, int8 activations
                bound = rsrpp_gemv_bound(idx, t_dot, lowbit.get_threads(), nominal_mhz())
                row.update({f"rsrpp_{key}": v for key, v in bound.items()})
                row["rsrpp_of_bound"] = bound["bound_s"] / t
            del idx
        lut = random_lut(n, n, rng)
        row["lut_s"] = lut_seconds(lut, 1, rng)
        row["lut_bytes"] = lut.nbytes
        del lut
        for key in ("rsr", "rsrpp", "rsrpp_i8", "lut"):
            row[f"speedup_{key}_vs_standard"] = t_std / row[f"{key}_s"]
            row[f"speedup_{key}_vs_numpy"] = t_dot / row[f"{key}_s"]
        rows.append(row)
        progress(f"  fig4 n=2^{int(math.log2(n))}  standard {t_std * 1e3:8.2f} ms  np.dot {t_dot * 1e3:8.2f} ms  "
                 f"RSR {row['rsr_s'] * 1e3:7.2f} ms (k={row['rsr_k']})  RSR++ {row['rsrpp_s'] * 1e3:7.2f} ms "
                 f"(k={row['rsrpp_k']})  RSR++ i8 {row['rsrpp_i8_s'] * 1e3:7.2f} ms  rsr-lut {row['lut_s'] * 1e3:7.2f} ms"
                 f"  vs numpy: RSR++ x{row['speedup_rsrpp_vs_numpy']:.1f}, i8 x{row['speedup_rsrpp_i8_vs_numpy']:.1f},"
                 f" lut x{row['speedup_lut_vs_numpy']:.1f}")
    return rows


# --- one-token cost per k, in CPU time ------------------------------------------------------------

def kscan(ns, rng, progress, rows: int = 1100, repeats: int = 7, iters: int = 5) -> list[dict]:
    """One-token RSR++ (binary, float and int8 x) in ns per gathered input and per weight for k around eq. 7,
    on ~100 blocks, 1 thread, timed in CPU time of the calling thread (the kernel runs on it with one
    thread): time taken from this process by other processes on a shared machine does not count."""
    old = lowbit.get_threads()
    lowbit.set_threads(1)
    out = []
    try:
        for n in ns:
            a = analytic_k(n, n, 2, True)
            x = rng.standard_normal((1, n)).astype(np.float32)
            q = rng.integers(-127, 128, (1, n), dtype=np.int8)
            for k in range(max(2, a - 3), min(16, a + 1) + 1):
                m = max(k, rows // k * k)
                idx = random_index(m, n, k, 2, BIN, rng)
                y = np.empty((1, m), np.float32)
                row = {"n": n, "k": k, "blocks": idx.nblocks}
                for name, xx in (("f32", x), ("i8", q)):
                    best = math.inf
                    for _ in range(repeats):
                        t0 = time.thread_time()
                        if name == "i8":
                            _native.rsr_gemm_i8(idx.perm, idx.seg, m, n, k, 2, idx.values, xx, np.ones(1, np.float32),
                                                None, 1.0, False, True, y, iters=iters)
                        else:
                            _native.rsr_gemm_f32(idx.perm, idx.seg, m, n, k, 2, idx.values, xx, None, 1.0, False, True,
                                                 y, iters=iters)
                        best = min(best, (time.thread_time() - t0) / iters)
                    row[f"{name}_ns_per_input"] = best / (idx.nblocks * n) * 1e9
                    row[f"{name}_ns_per_weight"] = best / (m * n) * 1e9
                out.append(row)
                progress(f"  kscan n=2^{int(math.log2(n))} k={k:2d}  f32 {row['f32_ns_per_input']:.3f} ns/input "
                         f"{row['f32_ns_per_weight'] * 1e3:.1f} ps/weight  i8 {row['i8_ns_per_input']:.3f} ns/input")
    finally:
        lowbit.set_threads(old)
    return out


# --- RSR vs the dense ternary kernel ----------------------------------------------------------------

def rsr_gemm_seconds(m: int, kdim: int, k: int, n_tok: int, rng, rotate_bytes: int) -> tuple[float, int]:
    """Native int8 RSR++ (direct ternary), copies of the index rotated past the L3 as the dense kernel's are."""
    idx = random_index(m, kdim, k, 3, TERN, rng)
    copies = max(1, math.ceil(rotate_bytes / idx.nbytes)) if n_tok < 32 else 1  # GEMM re-reads from cache anyway
    perms = [idx.perm] + [idx.perm.copy() for _ in range(copies - 1)]
    q = rng.integers(-127, 128, (n_tok, kdim), dtype=np.int8)
    sx = np.ones(n_tok, np.float32)
    rs = np.ones(m, np.float32)
    y = np.empty((n_tok, m), np.float32)

    def run(iters):
        s = 0.0
        for i in range(iters):
            s += _native.rsr_gemm_i8(perms[i % copies], idx.seg, m, kdim, k, 3, idx.values, q, sx, rs, 1.0, False,
                                     True, y)[1]
        return s

    run(copies)
    once = run(1)
    iters = max(copies, int(MIN_TIME / max(once, 1e-7)))
    return sorted(run(iters) / iters for _ in range(3))[1], idx.nbytes


def dense_vs_rsr(shape_name: str, tokens, rng, progress) -> list[dict]:
    rows = []
    rotate = ROTATE_L3_FACTOR * l3_bytes()
    for m, kdim in linear_shapes(MODEL_SHAPES[shape_name]):
        dense = random_weight("ternary", m, kdim, rng)
        lut = random_lut(m, kdim, rng, "ternary")
        for n_tok in tokens:
            t_dense = time_matmul(dense, n_tok, rotate_bytes=rotate if n_tok < 32 else 0, min_time=MIN_TIME,
                              rng=rng)["seconds"]
            k = autotune(kdim, 3, n_tok)
            t_rsr, ibytes = rsr_gemm_seconds(m, kdim, k, n_tok, rng, rotate)
            t_lut = lut_seconds(lut, n_tok, rng, rotate)
            w = m * kdim * n_tok
            rows.append({"shape": shape_name, "M": m, "K": kdim, "N": n_tok, "k": k, "dense_us": t_dense * 1e6,
                         "rsr_us": t_rsr * 1e6, "dense_gweights_s": w / t_dense / 1e9, "rsr_gweights_s": w / t_rsr / 1e9,
                         "rsr_speedup": t_dense / t_rsr, "dense_bytes": dense.nbytes, "index_bytes": ibytes,
                         "lut_us": t_lut * 1e6, "lut_gweights_s": w / t_lut / 1e9, "lut_speedup": t_dense / t_lut,
                         "lut_bytes": lut.nbytes})
            progress(f"  {m:5d}x{kdim:<5d} N={n_tok:4d} k={k}  dense {t_dense * 1e6:9.1f} us  RSR++ {t_rsr * 1e6:9.1f} us"
                     f"  x{t_dense / t_rsr:.2f}  rsr-lut {t_lut * 1e6:9.1f} us  x{t_dense / t_lut:.2f}")
    return rows


# --- index size ------------------------------------------------------------------------------------

def index_bits_per_weight(m: int, kdim: int, k: int, base: int) -> float:
    nb = -(-m // k)
    perm_b = 2 if kdim <= 0xFFFF + 1 else 4
    seg_b = 2 if kdim <= 0xFFFF else 4
    return 8.0 * nb * (kdim * perm_b + (base ** k + 1) * seg_b) / (m * kdim)


def size_table(ns) -> list[dict]:
    out = []
    for n in ns:
        kb = analytic_k(n, n, 2, True)
        kt = analytic_k(n, n, 3, True)
        out.append({"n": n, "binary_k": kb, "binary_index_bpw": index_bits_per_weight(n, n, kb, 2),
                    "ternary_planes_index_bpw": 2 * index_bits_per_weight(n, n, kb, 2),
                    "ternary_direct_k": kt, "ternary_direct_index_bpw": index_bits_per_weight(n, n, kt, 3),
                    "packed_binary_bpw": 1.0, "packed_ternary_bpw": 2.0, "uint8_matrix_bpw": 8.0,
                    "paper_claim_bpw_of_uint8": 8.0 / math.log2(n)})
    return out


# --- CLI ---------------------------------------------------------------------------------------------

PARTS = ("fig11", "fig4", "dense", "size", "kscan")


def add_parser(bsub) -> None:
    r = bsub.add_parser("rsr", help="RSR/RSR++ (paper 003): Figures 11 and 4, and against the dense ternary kernel",
                        description=__doc__, formatter_class=__import__("argparse").RawDescriptionHelpFormatter)
    r.add_argument("--parts", default=",".join(PARTS[:4]),
                   help=f"comma-separated subset of {','.join(PARTS)} (default: all but kscan)")
    r.add_argument("--min-n", type=int, default=11, help="smallest n = 2^min-n (default 11)")
    r.add_argument("--max-n", type=int, default=None,
                   help="largest n = 2^max-n (default 15 for fig11, 16 for fig4; lower it to run short)")
    r.add_argument("--shape", default="bitnet-2b", choices=sorted(MODEL_SHAPES), help="model shapes for 'dense'")
    r.add_argument("--tokens", default=",".join(map(str, TOKENS)), help="token counts for 'dense' (default 1,8,32,128,512)")
    r.add_argument("-t", "--threads", type=int, default=None, help="threads (default: physical cores)")
    r.add_argument("--slab-mb", type=int, default=512, help="largest dense baseline matrix held at once (MiB)")
    r.add_argument("--min-time", type=float, default=MIN_TIME, help=f"seconds per timed run (default {MIN_TIME})")
    r.add_argument("--json", action="store_true", help="print JSON instead of tables")
    r.add_argument("--plot", metavar="FILE.png", default=None, help="draw the figures")
    r.set_defaults(func=main)


def run(parts, min_n: int, max_n: int | None, shape: str, tokens, threads: int, slab_bytes: int, progress) -> dict:
    lowbit.set_threads(threads)
    rng = np.random.default_rng(0)
    res = {"threads": threads, "isa": lowbit.cpu_info()["isa"], "rsr_path": _native.rsr_path(),
           "rsr_lut_path": _native.rsr_lut_path(), "timestamp": time.strftime("%Y-%m-%d %H:%M:%S")}
    if "fig11" in parts:
        res["fig11"] = fig11([1 << e for e in range(min_n, (max_n or 15) + 1)], rng, slab_bytes, progress)
    if "fig4" in parts:
        res["fig4"] = fig4([1 << e for e in range(min_n, (max_n or 16) + 1)], rng, slab_bytes, progress)
    if "dense" in parts:
        res["dense"] = dense_vs_rsr(shape, tokens, rng, progress)
    if "size" in parts:
        res["size"] = size_table([1 << e for e in range(min_n, (max_n or 16) + 1)])
    if "kscan" in parts:
        res["kscan"] = kscan([1 << e for e in range(min_n, (max_n or 15) + 1)], rng, progress)
    return res


def main(args) -> int:
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    bad = [p for p in parts if p not in PARTS]
    if bad or not parts:
        raise ValueError(f"--parts: unknown {bad}; choose from {', '.join(PARTS)}")
    if args.min_n < 4 or (args.max_n is not None and args.max_n < args.min_n) or (args.max_n or 0) > 16:
        raise ValueError("need 4 <= --min-n <= --max-n <= 16")
    tokens = [int(t) for t in args.tokens.split(",")]
    if any(t < 1 for t in tokens):
        raise ValueError("--tokens must be positive integers")
    if args.threads is not None and args.threads < 1:
        raise ValueError("--threads must be >= 1")
    threads = args.threads or lowbit.cpu_info()["physical_cores"]
    global MIN_TIME
    if args.min_time <= 0:
        raise ValueError("--min-time must be positive")
    MIN_TIME = args.min_time
    progress = (lambda s: None) if args.json else (lambda s: print(s, file=sys.stderr))
    res = run(parts, args.min_n, args.max_n, args.shape, tokens, threads, args.slab_mb << 20, progress)
    if args.plot:
        from lowbit.bench.plot import plot_rsr
        res["plot"] = str(plot_rsr(res, args.plot))
    if args.json:
        print_json(res)
    else:
        print_rsr(res)
    return 0


def print_rsr(res: dict) -> None:
    print(f"lowbit bench rsr: {res['threads']} thread(s), ISA {res['isa']}, RSR kernel path {res['rsr_path']}, "
          f"rsr-lut kernel path {res['rsr_lut_path']}")
    if res.get("fig11"):
        print("\nFigure 11 (NumPy): NumPy RSR++ vs np.dot(v, A), A n x n, one vector; np.dot on float32 (BLAS) and on"
              " int64 (the authors' baseline, no BLAS)")
        print(f"{'n':>7s} {'kind':8s} {'k':>3s} {'f32 dot ms':>10s} {'i64 dot ms':>10s} {'RSR ms':>9s} {'vs f32':>7s} "
              f"{'vs i64':>7s}")
        for r in res["fig11"]:
            slab = "" if r["dot_slab_rows"] == r["n"] else f"  (np.dot from {r['dot_slab_rows']}/{r['dot_int64_slab_rows']}-row slabs)"
            print(f"{'2^' + str(int(math.log2(r['n']))):>7s} {r['kind']:8s} {r['k']:3d} {r['numpy_dot_s'] * 1e3:10.2f} "
                  f"{r['numpy_dot_int64_s'] * 1e3:10.2f} {r['numpy_rsr_s'] * 1e3:9.2f} {r['speedup']:6.2f}x "
                  f"{r['speedup_vs_int64']:6.2f}x{slab}")
    if res.get("fig4"):
        print("\nFigure 4 (native, binary, one vector): standard GEMV (uint8 {0,1}, plain C++) and np.dot float32 vs "
              "RSR / RSR++ (float vector), RSR++ i8 (int8 vector) and rsr-lut (int8; table lookup, not the paper's RSR)")
        print(f"{'n':>7s} {'std ms':>9s} {'np.dot ms':>10s} {'RSR ms':>8s} {'k':>3s} {'RSR++ ms':>9s} {'k':>3s} "
              f"{'++i8 ms':>8s} {'lut ms':>8s} {'++ vs std':>9s} {'++ vs np':>8s} {'++i8 vs np':>10s} {'lut vs np':>9s} "
              f"{'index MB':>9s} {'lut MB':>7s} {'++ bound ms':>11s} {'++ of bound':>11s}")
        for r in res["fig4"]:
            print(f"{'2^' + str(int(math.log2(r['n']))):>7s} {r['standard_s'] * 1e3:9.2f} {r['numpy_dot_s'] * 1e3:10.2f} "
                  f"{r['rsr_s'] * 1e3:8.2f} {r['rsr_k']:3d} {r['rsrpp_s'] * 1e3:9.2f} {r['rsrpp_k']:3d} "
                  f"{r['rsrpp_i8_s'] * 1e3:8.2f} {r['lut_s'] * 1e3:8.2f} "
                  f"{r['speedup_rsrpp_vs_standard']:8.1f}x {r['speedup_rsrpp_vs_numpy']:7.1f}x "
                  f"{r['speedup_rsrpp_i8_vs_numpy']:9.1f}x {r['speedup_lut_vs_numpy']:8.1f}x "
                  f"{r['rsrpp_index_bytes'] / 1e6:9.1f} {r['lut_bytes'] / 1e6:7.1f} {r['rsrpp_bound_s'] * 1e3:11.2f} "
                  f"{r['rsrpp_of_bound']:10.0%}")
        print("  ++ bound: the larger of RSR++'s index streamed at np.dot's bandwidth and its step-1 memory operations "
              f"({MEMOPS_PER_INPUT} per input, {MEMOPS_PER_SEGMENT:g} per segment) at {MEMOPS_PER_CYCLE:g} a cycle per "
              "core at the nominal clock (a core boosting above it can beat it); ++ of bound: bound / measured")
    if res.get("dense"):
        print("\nRSR++ (int8 activations, direct ternary index, k autotuned per K and N) and rsr-lut (ternary as two "
              "planes) vs lowbit's dense ternary kernel; speedup = dense time / time")
        print(f"{'M x K':>11s} {'N':>4s} {'k':>2s} {'dense us':>10s} {'RSR++ us':>10s} {'lut us':>10s} {'dense Gw/s':>10s} "
              f"{'RSR Gw/s':>9s} {'lut Gw/s':>9s} {'RSR':>7s} {'lut':>7s} {'dense MB':>8s} {'index MB':>8s} {'lut MB':>7s}")
        for r in res["dense"]:
            print(f"{str(r['M']) + 'x' + str(r['K']):>11s} {r['N']:4d} {r['k']:2d} {r['dense_us']:10.1f} "
                  f"{r['rsr_us']:10.1f} {r['lut_us']:10.1f} {r['dense_gweights_s']:10.1f} {r['rsr_gweights_s']:9.1f} "
                  f"{r['lut_gweights_s']:9.1f} {r['rsr_speedup']:6.2f}x {r['lut_speedup']:6.2f}x "
                  f"{r['dense_bytes'] / 1e6:8.2f} {r['index_bytes'] / 1e6:8.2f} {r['lut_bytes'] / 1e6:7.2f}")
    if res.get("size"):
        print("\nIndex size, bits per weight (perm uint16 + full segmentation), k from eq. 7")
        print(f"{'n':>7s} {'bin k':>5s} {'bin idx':>8s} {'tern B1-B2':>10s} {'tern k':>6s} {'tern direct':>11s} "
              f"{'packed 1b/2b':>12s} {'paper: 8/log2 n':>15s}")
        for r in res["size"]:
            print(f"{'2^' + str(int(math.log2(r['n']))):>7s} {r['binary_k']:5d} {r['binary_index_bpw']:8.2f} "
                  f"{r['ternary_planes_index_bpw']:10.2f} {r['ternary_direct_k']:6d} {r['ternary_direct_index_bpw']:11.2f} "
                  f"{'1 / 2':>12s} {r['paper_claim_bpw_of_uint8']:15.2f}")
    if res.get("kscan"):
        print("\nOne-token RSR++ per k (binary, ~100 blocks, 1 thread, CPU time of the thread: robust on a shared machine)")
        print(f"{'n':>7s} {'k':>3s} {'f32 ns/input':>12s} {'f32 ps/weight':>13s} {'i8 ns/input':>11s} {'i8 ps/weight':>12s}")
        for r in res["kscan"]:
            print(f"{'2^' + str(int(math.log2(r['n']))):>7s} {r['k']:3d} {r['f32_ns_per_input']:12.3f} "
                  f"{r['f32_ns_per_weight'] * 1e3:13.1f} {r['i8_ns_per_input']:11.3f} {r['i8_ns_per_weight'] * 1e3:12.1f}")
    if res.get("plot"):
        print(f"\nplot: {res['plot']}")
