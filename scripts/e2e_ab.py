"""Two lowbit builds side by side: `lowbit bench e2e` of each, alternating runs (A B B A A B ...), each run's
decode against the bandwidth read beside it (its own roofline fraction), then per measure the medians and the
per-round ratios B/A (with --profile also attention's and the whole token's ms, prefill and decode).

    python scripts/e2e_ab.py A_PYTHON B_PYTHON [--rounds 6] -- --shape bitnet-0.7b --format ternary -t 2 -r 2

A_PYTHON / B_PYTHON: the python of a venv with each build (e.g. a clone of main at the commit before, and
this tree's .venv). Everything after `--` goes to `lowbit bench e2e` (with --json added)."""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys


def run_e2e(python: str, args: list[str]) -> dict:
    out = subprocess.run([python, "-m", "lowbit", "bench", "e2e", *args, "--json"], check=True,
                         capture_output=True, text=True, cwd="/").stdout
    return json.loads(out[out.index("{"):])


def main() -> int:
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a_python")
    ap.add_argument("b_python")
    ap.add_argument("--rounds", type=int, default=6)
    opts = ap.parse_args(argv[:split])
    e2e = argv[split + 1:]
    res: dict[str, list[dict]] = {"A": [], "B": []}
    for r in range(opts.rounds):
        for side in ("AB" if r % 2 == 0 else "BA"):
            d = run_e2e(opts.a_python if side == "A" else opts.b_python, e2e)
            res[side].append(d)
            prof = d.get("profile", {}).get("decode")
            extra = "  " + " ".join(f"{k} {prof[k]:.3f}" for k in ("gemv", "join", "attention", "lm_head", "rest",
                                                                     "python", "total")) if prof else ""
            print(f"round {r} {side}: prefill {d['pp_tps']:.1f} tok/s, decode {d['tg_tps']:.1f} tok/s, "
                  f"{100 * d['roofline_fraction']:.1f}% of the roofline (bandwidth {d['bandwidth_gbps']:.1f} GB/s)"
                  f"{extra}", flush=True)
    def compare(name: str, get) -> None:
        va, vb = [get(d) for d in res["A"]], [get(d) for d in res["B"]]
        print(f"{name:30s} A median {statistics.median(va):9.3f}  B median {statistics.median(vb):9.3f}  B/A per round "
              f"{' '.join(f'{b / a:.3f}' for a, b in zip(va, vb))}; median {statistics.median(b / a for a, b in zip(va, vb)):.3f}")

    compare("decode, fraction of the roofline", lambda d: d["roofline_fraction"])
    compare("decode tok/s", lambda d: d["tg_tps"])
    compare("prefill tok/s", lambda d: d["pp_tps"])
    if all("profile" in d for side in res.values() for d in side):  # with --profile: ms a token by part
        for phase in ("prefill", "decode"):
            for part in ("attention", "total"):
                compare(f"{phase} {part} ms a token", lambda d: d["profile"][phase][part])
    return 0


if __name__ == "__main__":
    sys.exit(main())
