"""GEMV time of b = 4 codebook settings against ternary, side by side in one process, alternating rounds
(the order rotates each round), weights rotated past the L3 (bench.gemv.time_matmul), at Llama3-8B's shapes:

    python scripts/codebook_ab.py THREADS [ROUNDS] [FORMATS]   # FORMATS: comma list, default below

Prints per shape the median us per call of each format and the median and best (over rounds) ratio
ternary_time / format_time (>= 0.8 is issue 8's target)."""
import sys

import numpy as np

import lowbit
from lowbit.bench.gemv import random_weight, time_matmul

threads = int(sys.argv[1]) if len(sys.argv) > 1 else 1
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
formats = sys.argv[3].split(",") if len(sys.argv) > 3 else ["ternary", "codebook-m4v8b4g128", "codebook-m2v4b4g128"]
shapes = [(4096, 4096), (1024, 4096), (14336, 4096), (4096, 14336)]
lowbit.set_threads(threads)
rng = np.random.default_rng(0)
print(f"threads {threads}, rounds {rounds}")
for m, k in shapes:
    weights = {f: random_weight(f, m, k, rng) for f in formats}
    times = {f: [] for f in formats}
    for r in range(rounds):
        order = formats[r % len(formats):] + formats[:r % len(formats)]
        for f in order:
            times[f].append(time_matmul(weights[f], min_time=0.15, repeats=3, rng=rng)["seconds"])
    base = np.array(times[formats[0]])
    cells = []
    for f in formats:
        t = np.array(times[f])
        ratio = base / t
        cells.append(f"{f} {np.median(t) * 1e6:.0f} us" + ("" if f == formats[0] else
                     f" ({np.median(ratio):.2f}x, best {ratio.max():.2f}x)"))
    print(f"{m}x{k}: " + " | ".join(cells), flush=True)
    del weights
