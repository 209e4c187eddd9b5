"""Decode tok/s of bitnet-0.7b (ternary, random weights) with the decode schedule across matrices on vs off
(Decoder.set_prefetch_next), alternating rounds in one process: python scripts/decode_schedule_ab.py THREADS [ROUNDS]."""
import sys, time
import numpy as np
import lowbit
from lowbit.bench.e2e import shape_model
t = int(sys.argv[1]); rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 8
lowbit.set_threads(t)
model, _ = shape_model("bitnet-0.7b", "ternary", max_context=256)
nat = model._native_decoder()
prompt = list(range(1, 129))
res = {True: [], False: []}
for r in range(rounds + 1):
    for on in ([True, False] if r % 2 == 0 else [False, True]):
        nat._dec.set_prefetch_next(on)
        model.reset(); model.prefill(prompt); tok = 1
        t0 = time.perf_counter()
        for _ in range(48):
            tok = int(np.argmax(model.decode(tok)))
        if r:
            res[on].append(48 / (time.perf_counter() - t0))
on, off = np.array(res[True]), np.array(res[False])
print(f"-t {t}: schedule on {np.median(on):.1f} tok/s, off {np.median(off):.1f} tok/s, median ratio on/off {np.median(on / off):.3f} "
      f"(rounds: {' '.join(f'{a / b:.2f}' for a, b in zip(on, off))})")
