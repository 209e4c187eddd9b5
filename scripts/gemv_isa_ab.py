"""The ternary GEMV from DRAM at one ISA level against others, alternating in one process (set_isa), at bitnet and
Llama3-8B shapes; prints the median us per call, GB/s and the speed relative to the first level:

    python scripts/gemv_isa_ab.py THREADS ROUNDS amx,avxvnni,avx2"""
import sys

import numpy as np

import lowbit
from lowbit import _native
from lowbit.bench.gemv import random_weight, rotating_run

SHAPES = [(1536, 1536), (4096, 1536), (1536, 4096), (2560, 2560), (6912, 2560), (4096, 4096), (14336, 4096)]


def main() -> None:
    threads, rounds, isas = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3].split(",")
    lowbit.set_threads(threads)
    rng = np.random.default_rng(0)
    start = _native.isa()
    for m, k in SHAPES:
        pw = random_weight("ternary", m, k, rng)
        run, n_copies = rotating_run(pw, 1, None, rng)
        run(2 * n_copies)
        times = {isa: [] for isa in isas}
        for r in range(rounds):
            for isa in isas if r % 2 == 0 else isas[::-1]:
                _native.set_isa(isa)
                n = 4 * n_copies
                times[isa].append(run(n) / n)
        med = {isa: float(np.median(t)) for isa, t in times.items()}
        cells = [f"{isa} {med[isa] * 1e6:.1f} us {pw.nbytes / med[isa] / 1e9:.1f} GB/s ({med[isas[0]] / med[isa]:.3f})"
                 for isa in isas]
        print(f"{m}x{k} ({pw.nbytes / 1e6:.2f} MB): " + " | ".join(cells), flush=True)
    _native.set_isa(start)


if __name__ == "__main__":
    main()
