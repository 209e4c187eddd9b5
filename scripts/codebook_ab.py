"""GEMV time of b = 4 codebook settings against ternary, side by side in one process, alternating rounds
(the order rotates each round), weights rotated past the L3 (bench.gemv.time_matmul), at Llama3-8B's shapes:

    python scripts/codebook_ab.py THREADS [ROUNDS] [FORMATS] [--cpu]   # FORMATS: comma list, default below

Prints per shape the median us per call of each format and the median and best (over rounds) ratio
ternary_time / format_time (>= 0.8 is issue 8's target). --cpu: process CPU time (all threads) per call instead
of wall time: on a loaded machine it leaves out the time the threads were descheduled (not the memory stalls)."""
import sys
import time

import numpy as np

import lowbit
from lowbit.bench.gemv import random_weight, rotating_run, time_matmul

cpu = "--cpu" in sys.argv
args = [a for a in sys.argv[1:] if a != "--cpu"]
threads = int(args[0]) if args else 1
rounds = int(args[1]) if len(args) > 1 else 3
formats = args[2].split(",") if len(args) > 2 else ["ternary", "codebook-m4v8b4g128", "codebook-m2v4b4g128"]


def cpu_timer(pw, rng):
    """time_matmul's setup (copies past the L3, on huge pages), timed by process CPU time; f() -> s per call."""
    run, n_copies = rotating_run(pw, 1, None, rng)
    run(2 * n_copies)

    def once():
        iters = 4 * n_copies
        t0 = time.process_time()
        run(iters)
        return (time.process_time() - t0) / iters
    return once

shapes = [(4096, 4096), (1024, 4096), (14336, 4096), (4096, 14336)]
lowbit.set_threads(threads)
rng = np.random.default_rng(0)
print(f"threads {threads}, rounds {rounds}, {'process CPU' if cpu else 'wall'} time")
for m, k in shapes:
    weights = {f: random_weight(f, m, k, rng) for f in formats}
    timers = {f: cpu_timer(weights[f], rng) for f in formats} if cpu else {}
    times = {f: [] for f in formats}
    for r in range(rounds):
        order = formats[r % len(formats):] + formats[:r % len(formats)]
        for f in order:
            times[f].append(timers[f]() if cpu else time_matmul(weights[f], min_time=0.15, repeats=3, rng=rng)["seconds"])
    base = np.array(times[formats[0]])
    cells = []
    for f in formats:
        t = np.array(times[f])
        ratio = base / t
        cells.append(f"{f} {np.median(t) * 1e6:.0f} us" + ("" if f == formats[0] else
                     f" ({np.median(ratio):.2f}x, best {ratio.max():.2f}x)"))
    print(f"{m}x{k}: " + " | ".join(cells), flush=True)
    del weights, timers
