"""Decode tok/s with the blocks' weight codes on 2 MiB pages (NativeDecoder.build's default) vs where quantize put
them (4 KiB pages below numpy's 4 MiB huge-page threshold), two copies of one random-weight model in one process,
alternating rounds: python scripts/hugepages_ab.py SHAPE THREADS [ROUNDS] [cpu] [layers=N] (e.g. bitnet-0.7b 2 8).
cpu: time by the process's CPU time instead of the wall clock (for -t 1 on a machine shared with other jobs: a
descheduled process then loses no time; with 2 threads the worker's spinning would count)."""
import sys, time
import numpy as np
import lowbit
from lowbit.bench.e2e import shape_model
from lowbit.model.native import NativeDecoder
shape, t = sys.argv[1], int(sys.argv[2]); rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 8
layers = next((int(a[7:]) for a in sys.argv[4:] if a.startswith("layers=")), None)
clock = time.process_time if "cpu" in sys.argv[4:] else time.perf_counter
lowbit.set_threads(t)
models = {}
for huge in (True, False):
    m, _ = shape_model(shape, "ternary", layers=layers, max_context=256)
    m._native = NativeDecoder.build(m, hugepages=huge)
    models[huge] = m
prompt = list(range(1, 33))
res = {True: [], False: []}
for r in range(rounds + 1):
    for huge in ([True, False] if r % 2 == 0 else [False, True]):
        m = models[huge]
        m.reset(); m.prefill(prompt); tok = 1
        t0 = clock()
        for _ in range(32):
            tok = int(np.argmax(m.decode(tok)))
        if r:
            res[huge].append(32 / (clock() - t0))
on, off = np.array(res[True]), np.array(res[False])
print(f"{shape} -t {t} ({clock.__name__}): 2 MiB pages {np.median(on):.1f} tok/s, 4 KiB pages {np.median(off):.1f} tok/s, "
      f"median ratio {np.median(on / off):.3f} (rounds: {' '.join(f'{a / b:.2f}' for a, b in zip(on, off))})")
