"""Whole-model prefill of a named shape, kernel variants alternating in one process: the prefill-side twin of
prefill_gemm_ab.py (the same LOWBIT_PANEL_VARIANT convention: a temporary getenv in the kernel under test reads
it per call; with none, every variant is the build's one kernel).

    python scripts/prefill_ab.py [-t 1] [--shape bitnet-0.7b] [-p 128] [--seconds 60] [VARIANT ...]

Each round runs `model.prefill` of the same random prompt once per variant (the order reversed every other round,
so neither variant always follows the other) and prints each variant's best and median tokens/s. Best of many
short runs is what a variant costs when it gets the cores; the median shows whether the gain survives the
machine's other load. A model of random weights in --format (ternary by default), as `lowbit bench e2e --shape`."""
from __future__ import annotations

import os
import time

import numpy as np

import lowbit
from lowbit.bench.e2e import shape_model
from prefill_gemm_ab import variant_parser  # scripts/ is sys.path[0] when run as a script


def main() -> int:
    ap = variant_parser(__doc__)
    ap.add_argument("-p", "--prompt", type=int, default=128, help="prompt tokens (default 128)")
    o = ap.parse_args()
    lowbit.set_threads(o.threads)
    model, _ = shape_model(o.shape, o.format, max_context=max(1024, o.prompt + 1))
    prompt = [int(t) for t in np.random.default_rng(0).integers(0, model.args.vocab_size, o.prompt)]
    os.environ["LOWBIT_PANEL_VARIANT"] = o.variants[0]
    model.reset()
    model.prefill(prompt)  # warm-up: buffers sized, pages touched
    times: dict[str, list[float]] = {v: [] for v in o.variants}
    t_end = time.perf_counter() + o.seconds
    r = 0
    while time.perf_counter() < t_end or r < 2:
        for v in (o.variants if r % 2 == 0 else o.variants[::-1]):
            os.environ["LOWBIT_PANEL_VARIANT"] = v
            model.reset()
            t0 = time.perf_counter()
            model.prefill(prompt)
            times[v].append(time.perf_counter() - t0)
        r += 1
    print(f"{o.shape} {o.format} pp{o.prompt} t{o.threads}: {r} rounds")
    base = o.variants[0]
    for v in o.variants:
        best, med = o.prompt / min(times[v]), o.prompt / float(np.median(times[v]))
        print(f"  variant {v}: best {best:.1f} tok/s, median {med:.1f}; median {np.median(times[base]) / np.median(times[v]):.3f}x "
              f"variant {base}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
