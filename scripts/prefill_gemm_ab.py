"""Prefill GEMM speed against the int8 roof, alternating kernel variants in one process.

    python scripts/prefill_gemm_ab.py [-t 1] [--shape bitnet-0.7b] [-n 128] [--seconds 60] [VARIANT ...]

Each round times every variant (LOWBIT_PANEL_VARIANT=v: a temporary getenv in the kernel or linear.cpp under
test reads it per GEMM call; with none, every variant is the build's one kernel) once over the decoder linears of
one layer of the shape (3 copies each, so the weights come from beyond L2 as in a model) and reads the int8 roof
probe; prints each variant's best time as G MAC/s and fraction of the best roof, and its speed relative to the
first variant."""
from __future__ import annotations

import argparse
import os
import time

import numpy as np

import lowbit
from lowbit import _native
from lowbit.bench import roof
from lowbit.bench.gemv import random_weight
from lowbit.bench.shapes import MODEL_SHAPES
from lowbit.formats import Activations


def layer_shapes(shape: str) -> list[tuple[int, int]]:
    c = MODEL_SHAPES[shape]
    h, f = c["hidden_size"], c["intermediate_size"]
    hd = h // c["num_attention_heads"]
    kv = c["num_key_value_heads"] * hd
    return [(h, h), (kv, h), (kv, h), (h, h), (f, h), (f, h), (h, f)]


def variant_parser(doc: str) -> argparse.ArgumentParser:
    """The arguments of the kernel-variant A/B scripts (this one, prefill_ab.py): variants, threads, shape, format,
    seconds."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("variants", nargs="*", default=["0"])
    ap.add_argument("-t", "--threads", type=int, default=1)
    ap.add_argument("--shape", default="bitnet-0.7b", choices=sorted(MODEL_SHAPES))
    ap.add_argument("--format", default="ternary")
    ap.add_argument("--seconds", type=float, default=60, help="how long to alternate (default 60)")
    return ap


def main() -> int:
    ap = variant_parser(__doc__)
    ap.add_argument("-n", "--tokens", type=int, default=128)
    o = ap.parse_args()
    lowbit.set_threads(o.threads)
    rng = np.random.default_rng(0)
    timers, macs = [], 0
    for m, k in layer_shapes(o.shape):
        copies = [random_weight(o.format, m, k, rng) for _ in range(3)]
        pw = copies[0]
        x = rng.standard_normal((o.tokens, k)).astype(np.float32)
        y = np.empty((o.tokens, m), np.float32)
        q, sx, sq = Activations(x).int8(pw.kp, pw.group)
        tuples = [(c.codes, c._scale_u16, c._offset_u16) for c in copies]
        zc = float(pw.zc or 0.0)
        timers.append(lambda it, t=tuples, a=(zc, pw.bits, m, pw.kp, pw.group, q, sx, sq, y):
                      _native.bench_int(t, a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], it))
        macs += m * k * o.tokens

    def layer() -> float:
        return sum(f(1) for f in timers)

    # Best of many short runs, variants alternating: on a shared machine the minimum of each is what it
    # costs when it gets the core (medians of long runs drift with the other processes' load).
    best = {v: float("inf") for v in o.variants}
    roof_best = 0.0
    os.environ["LOWBIT_PANEL_VARIANT"] = o.variants[0]
    layer()
    t_end = time.perf_counter() + o.seconds
    r = 0
    while time.perf_counter() < t_end or r < 2:
        for v in (o.variants if r % 2 == 0 else o.variants[::-1]):
            os.environ["LOWBIT_PANEL_VARIANT"] = v
            best[v] = min(best[v], layer())
        roof_best = max(roof_best, roof.measure(o.threads, min_time=0.01, repeats=1)["gmacs"])
        r += 1
    base = o.variants[0]
    print(f"{o.shape} {o.format} N={o.tokens} t{o.threads}: {r} rounds, int8 roof {roof_best:.1f} G MAC/s (best)")
    for v in o.variants:
        g = macs / best[v] / 1e9
        print(f"  variant {v}: best {g:.1f} G MAC/s = {100 * g / roof_best:.1f}% of the roof; {best[base] / best[v]:.3f}x variant {base}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
