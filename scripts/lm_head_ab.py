"""Decode with two lm_head formats on the same random blocks: two models of one shape (the same seed), alternating
rounds in one process, the native profile's medians of the lm_head's time and the token's, and per-round ratios.

    python scripts/lm_head_ab.py SHAPE THREADS ROUNDS [LAYERS] [A,B]    (e.g. bitnet-0.7b 2 10, or bitnet-2b 2 6 8 int8,int6)
"""
import sys

import numpy as np

import lowbit
from lowbit.bench.e2e import shape_model


def main() -> None:
    shape, t, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    layers = int(sys.argv[4]) if len(sys.argv) > 4 and sys.argv[4] != "0" else None
    fmts = sys.argv[5].split(",") if len(sys.argv) > 5 else ["int8", "int6"]
    lowbit.set_threads(t)
    models = {f: shape_model(shape, "ternary", lm_head_format=f, layers=layers, max_context=256)[0] for f in fmts}
    nats = {f: m._native_decoder() for f, m in models.items()}
    prompt = list(range(1, 65))
    res = {f: [] for f in fmts}
    for r in range(rounds + 1):  # round 0 warms up
        for f in (fmts if r % 2 == 0 else fmts[::-1]):
            m, nat = models[f], nats[f]
            m.reset()
            m.prefill(prompt)
            tok = 1
            nat.set_profile(True)
            for _ in range(32):
                tok = int(np.argmax(m.decode(tok)))
            p = nat.profile()["decode"]
            nat.set_profile(False)
            if r:
                res[f].append((1e3 * p["lm_head"] / p["tokens"], 1e3 * p["seconds"] / p["tokens"]))
    a, b = np.array(res[fmts[0]]), np.array(res[fmts[1]])
    mb = [models[f].lm_head.weight.nbytes / 1e6 for f in fmts]
    print(f"{shape} -t {t}: lm_head {fmts[0]} {mb[0]:.1f} MB, {fmts[1]} {mb[1]:.1f} MB")
    print(f"lm_head ms: {fmts[0]} {np.median(a[:, 0]):.3f}, {fmts[1]} {np.median(b[:, 0]):.3f} "
          f"(per-round ratio median {np.median(b[:, 0] / a[:, 0]):.3f}); token ms: {fmts[0]} {np.median(a[:, 1]):.3f}, "
          f"{fmts[1]} {np.median(b[:, 1]):.3f} (ratio {np.median(b[:, 1] / a[:, 1]):.3f})")


if __name__ == "__main__":
    main()
