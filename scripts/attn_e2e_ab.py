"""Two lowbit builds side by side on attention: `lowbit bench e2e --profile` of each, alternating runs (A B B A ...),
then per measure (prefill / decode tok/s, attention and total ms a token) both medians and the per-round ratios B/A.

    python scripts/attn_e2e_ab.py A_PYTHON B_PYTHON ROUNDS -m MODEL.gguf -t 2 -p 512 -n 32 -r 2

A_PYTHON / B_PYTHON: a python that imports each build (a venv, or a wrapper setting PYTHONPATH to a --target
install); the rest goes to `lowbit bench e2e`."""
import json, subprocess, sys, statistics
A, B, rounds, *args = sys.argv[1:]
res = {"A": [], "B": []}
for r in range(int(rounds)):
    for side in ("AB" if r % 2 == 0 else "BA"):
        py = A if side == "A" else B
        s = subprocess.run([py, "-m", "lowbit", "bench", "e2e", *args, "--profile", "--json"], capture_output=True, text=True, check=True, cwd="/").stdout
        d = json.loads(s[s.index("{"):])
        p = d["profile"]
        row = (d["pp_tps"], d["tg_tps"], p["prefill"]["attention"], p["prefill"]["total"], p["decode"]["attention"], p["decode"]["total"])
        res[side].append(row)
        print(f"round {r} {side}: pp {row[0]:.1f} tg {row[1]:.1f} | prefill attn {row[2]:.3f} / total {row[3]:.3f} ms | decode attn {row[4]:.3f} / total {row[5]:.3f} ms", flush=True)
names = ["pp tok/s", "tg tok/s", "prefill attn ms", "prefill total ms", "decode attn ms", "decode total ms"]
for i, n in enumerate(names):
    a = [x[i] for x in res["A"]]; b = [x[i] for x in res["B"]]
    print(f"{n:18s} A {statistics.median(a):8.3f}  B {statistics.median(b):8.3f}  B/A per round {' '.join(f'{y/x:.3f}' for x, y in zip(a, b))}  median {statistics.median(y/x for x, y in zip(a, b)):.3f}")
