"""`lowbit bench convert`: how fast lowbit converts, and in how much memory.

Two figures per (source, format):
  * quantizer throughput: one 4096 x 4096 float16 matrix -> the format in this process (M weights/s);
  * end to end: `python -m lowbit convert SRC OUT` on a synthetic llama (default Llama-3.2-1B's shape, 1.24 B
    weights) written once under --dir as an F16 GGUF and as a bf16 safetensors folder, in a child process:
    wall time, weights/s over all the model's weights, and the child's peak RSS against the bound
    (the largest tensor in float32 + 300 MB).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import numpy as np

from lowbit.bench import print_json
from lowbit.bench.synthetic import KINDS, SHAPES, synthetic_config, tensors, write_synthetic

DEFAULT_DIR = "/tmp/lowbit-bench-convert"
BOUND_EXTRA = 300e6


def quantizer_rate(fmt: str, threads: int, repeats: int = 3) -> float:
    """M weights/s: a 4096 x 4096 float16 matrix -> fmt (native, on `threads` threads), best of repeats."""
    import lowbit
    from lowbit.formats import quantize

    lowbit.set_threads(threads)
    w = (np.random.default_rng(0).standard_normal((4096, 4096)) * 0.02).astype(np.float16)
    quantize(w, fmt)
    best = float("inf")
    for _ in range(repeats):
        tic = time.perf_counter()
        quantize(w, fmt)
        best = min(best, time.perf_counter() - tic)
    return w.size / best / 1e6


def convert_child(src, out, fmt: str, threads: int) -> dict:
    """Runs `python -m lowbit convert` in a child; its wall time and peak RSS (from wait4)."""
    env = dict(os.environ, LOWBIT_THREADS=str(threads))
    cmd = [sys.executable, "-m", "lowbit", "convert", str(src), str(out), "--format", fmt, "--force", "-q"]
    tic = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - tic
    err = proc.stderr.read().decode(errors="replace")
    proc.stderr.close()
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{err[-2000:]}")
    rss = usage.ru_maxrss * (1 if sys.platform == "darwin" else 1024)
    size = sum(f.stat().st_size for f in os.scandir(out) if f.is_file())
    return {"wall_s": wall, "peak_rss_bytes": rss, "out_bytes": size}


def run(shape: str = "llama-1b", kinds=KINDS, formats=("int4", "ternary"), threads: int | None = None,
        root=DEFAULT_DIR, keep: bool = False, progress=print) -> dict:
    import lowbit

    threads = threads or lowbit.cpu_info()["physical_cores"]
    config = synthetic_config(shape)
    specs = tensors(config)
    n_weights = sum(int(np.prod(s)) for _, s in specs)
    largest = max(int(np.prod(s)) for _, s in specs) * 4
    res = {"shape": shape, "threads": threads, "weights": n_weights, "largest_tensor_f32_bytes": largest,
           "rss_bound_bytes": largest + BOUND_EXTRA, "quantizer": {}, "convert": []}
    for fmt in formats:
        res["quantizer"][fmt] = quantizer_rate(fmt, threads)
        progress(f"quantizer F16 4096x4096 -> {fmt}: {res['quantizer'][fmt]:.0f} M weights/s ({threads} threads)")
    for kind in kinds:
        progress(f"writing the synthetic {shape} as {kind} under {root} (once)...")
        src = write_synthetic(root, shape, kind)
        for fmt in formats:
            out = os.path.join(str(root), f"out-{shape}-{kind}-{fmt}")
            r = convert_child(src, out, fmt, threads)
            r.update(kind=kind, format=fmt, weights_per_s=n_weights / r["wall_s"])
            r["within_bound"] = r["peak_rss_bytes"] <= res["rss_bound_bytes"]
            res["convert"].append(r)
            progress(f"{kind} -> {fmt}: {r['wall_s']:.1f} s, {r['weights_per_s'] / 1e6:.0f} M weights/s, "
                     f"peak RSS {r['peak_rss_bytes'] / 1e9:.2f} GB")
            if not keep:
                shutil.rmtree(out, ignore_errors=True)
    return res


def print_table(res: dict) -> None:
    print(f"lowbit bench convert: synthetic {res['shape']} ({res['weights'] / 1e9:.2f} B weights), "
          f"{res['threads']} thread(s)")
    print("quantizer, one F16 4096x4096 matrix: " +
          ", ".join(f"{f} {v:.0f} M weights/s" for f, v in res["quantizer"].items()))
    print(f"peak RSS bound: largest tensor in float32 ({res['largest_tensor_f32_bytes'] / 1e9:.2f} GB) + 0.30 GB = "
          f"{res['rss_bound_bytes'] / 1e9:.2f} GB")
    print(f"{'source':10s} {'format':8s} {'wall s':>7s} {'M w/s':>7s} {'peak RSS GB':>11s} {'out GB':>7s}  bound")
    for r in res["convert"]:
        print(f"{r['kind']:10s} {r['format']:8s} {r['wall_s']:7.1f} {r['weights_per_s'] / 1e6:7.0f} "
              f"{r['peak_rss_bytes'] / 1e9:11.2f} {r['out_bytes'] / 1e9:7.2f}  {'ok' if r['within_bound'] else 'OVER'}")


def add_parser(bsub) -> None:
    c = bsub.add_parser("convert", help="conversion speed (M weights/s) and peak memory on a synthetic llama",
                        description=__doc__, formatter_class=__import__("argparse").RawDescriptionHelpFormatter)
    c.add_argument("--shape", default="llama-1b", choices=list(SHAPES), help="synthetic model shape (default llama-1b)")
    c.add_argument("--sources", default=",".join(KINDS), help=f"comma-separated source kinds (default {','.join(KINDS)})")
    c.add_argument("--formats", default="int4,ternary", help="comma-separated target formats (default int4,ternary)")
    c.add_argument("-t", "--threads", type=int, default=None, help="threads (default: physical cores)")
    c.add_argument("--dir", default=DEFAULT_DIR, help=f"where the synthetic sources are written once (default {DEFAULT_DIR})")
    c.add_argument("--keep", action="store_true", help="keep the converted directories")
    c.add_argument("--json", action="store_true", help="print JSON instead of a table")
    c.set_defaults(func=main)


def main(args) -> int:
    from lowbit.formats import FORMATS

    kinds = [k for k in args.sources.split(",") if k]
    formats = [f for f in args.formats.split(",") if f]
    for k in kinds:
        if k not in KINDS:
            raise ValueError(f"unknown source kind {k!r}; known: {', '.join(KINDS)}")
    for f in formats:
        if f not in FORMATS:
            raise ValueError(f"unknown format {f!r}; known: {', '.join(FORMATS)}")
    if args.threads is not None and args.threads < 1:
        raise ValueError("--threads must be >= 1")
    res = run(args.shape, kinds, formats, args.threads, args.dir, args.keep,
              progress=(lambda s: None) if args.json else (lambda s: print(s, file=sys.stderr)))
    if args.json:
        print_json(res)
    else:
        print_table(res)
    return 0
