"""Prefill speed of a long prompt by chunk size (tokens per native forward), alternating in one process.

    python scripts/prefill_chunk_ab.py [--shape bitnet-0.7b] [-p 1024] [-t 1] [--layers 6] [--seconds 60] 128 256 512

Each round prefills the same random prompt once per chunk size (model.prefill(ids, chunk=c)); prints each
size's best tokens/s over the rounds (best of many: the machine may be shared) and its ratio to the first."""
from __future__ import annotations

import argparse
import time

import numpy as np

import lowbit
from lowbit.bench.e2e import shape_model
from lowbit.bench.shapes import MODEL_SHAPES


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("chunks", nargs="+", type=int)
    ap.add_argument("--shape", default="bitnet-0.7b", choices=sorted(MODEL_SHAPES))
    ap.add_argument("--format", default="ternary")
    ap.add_argument("-p", "--prompt-tokens", type=int, default=1024)
    ap.add_argument("-t", "--threads", type=int, default=1)
    ap.add_argument("--layers", type=int, default=6, help="layers of the shape (default 6: memory and time)")
    ap.add_argument("--seconds", type=float, default=60)
    o = ap.parse_args()
    lowbit.set_threads(o.threads)
    model, _ = shape_model(o.shape, o.format, layers=o.layers, max_context=o.prompt_tokens + 8)
    ids = [int(t) for t in np.random.default_rng(0).integers(0, model.args.vocab_size, size=o.prompt_tokens)]
    best = {c: float("inf") for c in o.chunks}
    t_end, r = time.perf_counter() + o.seconds, 0
    while time.perf_counter() < t_end or r < 2:
        for c in (o.chunks if r % 2 == 0 else o.chunks[::-1]):
            model.reset()
            t0 = time.perf_counter()
            model.prefill(ids, chunk=c)
            best[c] = min(best[c], time.perf_counter() - t0)
        r += 1
    print(f"{o.shape} ({o.layers} layers) {o.format} pp{o.prompt_tokens} t{o.threads}: {r} rounds")
    for c in o.chunks:
        print(f"  chunk {c:5d}: best {o.prompt_tokens / best[c]:8.1f} tok/s; {best[o.chunks[0]] / best[c]:.3f}x chunk {o.chunks[0]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
