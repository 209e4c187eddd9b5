"""The native batched decode step alone, per profile category: `batch` steps of 1 row against 1 step of `batch`
rows, alternating (as bench serve's step_ceiling), on a --shape model with random weights. Prints the median and
the best (min) ms per step of each side over the rounds; the best is the steadier figure on a shared machine. For
an A/B between builds, run it in alternating processes of each build's venv under /work/timed.sh.

    python scripts/step_ab.py [--shape bitnet-0.7b] [--format ternary] [--batch 16] [--rounds 12] [--threads 2]
"""
import argparse

import numpy as np

import lowbit
from lowbit.bench.e2e import shape_model
from lowbit.model.batch import BatchDecoder
from lowbit.model.profile import CATEGORIES, JOIN_PARTS


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="bitnet-0.7b")
    ap.add_argument("--format", default="ternary")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=16)
    ap.add_argument("--layers", type=int, default=None)
    args = ap.parse_args()
    lowbit.set_threads(args.threads)
    ctx = args.prompt + 2 * args.rounds + 8
    model, _ = shape_model(args.shape, args.format, layers=args.layers, max_context=ctx)
    bd = BatchDecoder(model, args.batch, max_context=ctx)
    nat = bd._native
    rng = np.random.default_rng(0)
    vocab = model.args.vocab_size
    for s in range(args.batch):
        bd.step([(s, [int(t) for t in rng.integers(0, vocab, args.prompt)], True)])
    cats = CATEGORIES + JOIN_PARTS + ("seconds",)
    runs = {"b1": [], "bn": []}
    try:
        for r in range(args.rounds):
            for kind in (("b1", "bn") if r % 2 == 0 else ("bn", "b1")):
                nat.set_profile(True)
                if kind == "b1":
                    for s in range(args.batch):
                        bd.step([(s, [int(rng.integers(0, vocab))], True)])
                else:
                    bd.step([(s, [int(rng.integers(0, vocab))], True) for s in range(args.batch)])
                p = nat.profile()["batch"]
                runs[kind].append({c: 1e3 * p[c] / p["steps"] for c in cats})
    finally:
        nat.set_profile(False)
    print(f"{args.shape} {args.format} t{args.threads}, {args.rounds} rounds: ms per step, median / best "
          f"({args.batch} steps of 1 row | 1 step of {args.batch} rows)")
    for c in cats:
        b1 = [x[c] for x in runs["b1"]]
        bn = [x[c] for x in runs["bn"]]
        print(f"  {c:10s} {np.median(b1):8.2f} / {min(b1):8.2f} | {np.median(bn):8.2f} / {min(bn):8.2f}")


if __name__ == "__main__":
    main()
