# Ternary GEMV from DRAM at one ISA level against others, alternating in one process (set_isa):
#     python scripts/gemv_isa_ab.py THREADS ROUNDS amx,avxvnni,avx2
import sys, math, numpy as np, lowbit
from lowbit import _native
from lowbit.bench.gemv import random_weight, _copy, _timer, l3_bytes, ROTATE_L3_FACTOR
from lowbit.model.hugepages import codes_to_hugepages
t = int(sys.argv[1]); rounds = int(sys.argv[2]); isas = sys.argv[3].split(",")
shapes = [(1536,1536),(4096,1536),(1536,4096),(2560,2560),(6912,2560),(4096,4096),(14336,4096)]
lowbit.set_threads(t)
rng = np.random.default_rng(0)
for (m,k) in shapes:
    pw = random_weight("ternary", m, k, rng)
    copies = [_copy(pw) for _ in range(max(1, math.ceil(ROTATE_L3_FACTOR * l3_bytes() / pw.nbytes)))]
    codes_to_hugepages(copies)
    run = _timer(pw, 1, copies, rng)
    run(2 * len(copies))
    res = {i: [] for i in isas}
    for r in range(rounds):
        for isa in (isas if r % 2 == 0 else isas[::-1]):
            _native.set_isa(isa)
            n = 4 * len(copies)
            res[isa].append(run(n) / n)
    base = np.median(res[isas[0]])
    print(f"{m}x{k} ({pw.nbytes/1e6:.2f} MB): " + " | ".join(f"{i} {np.median(res[i])*1e6:.1f} us {pw.nbytes/np.median(res[i])/1e9:.1f} GB/s ({base/np.median(res[i]):.3f})" for i in isas), flush=True)
_native.set_isa("amx")
