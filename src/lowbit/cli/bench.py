"""`lowbit bench bandwidth|roof|gemv|e2e|serve|rsr|convert|llamacpp`: speed against the machine's memory
bandwidth and int8 compute roof (and beside llama.cpp)."""
from __future__ import annotations

import importlib
import sys

from lowbit.bench import print_json


def add_parser(sub) -> None:
    p = sub.add_parser("bench", help="benchmarks: bandwidth, roof, gemv, e2e, serve, rsr, convert, llamacpp",
                       description="Benchmarks that measure lowbit against this machine's read bandwidth.")
    bsub = p.add_subparsers(dest="bench", metavar="BENCH")

    b = bsub.add_parser("bandwidth", help="read bandwidth for 1..N threads (the roofline's roof)",
                        description="Reads a buffer far larger than the L3 (default 1 GiB) on lowbit's thread pool.")
    b.add_argument("-t", "--threads", type=int, default=None, help="max threads (default: physical cores)")
    b.add_argument("--size-mb", type=int, default=1024, help="buffer size in MiB (default 1024)")
    b.add_argument("--json", action="store_true", help="print JSON instead of a table")
    b.set_defaults(func=main_bandwidth)

    r = bsub.add_parser("roof", help="int8 multiply-accumulate peak per core and for 1..N threads (prefill's roof)",
                        description="Runs the active ISA's int8 dot-product instructions on operands held in "
                                    "registers (AVX2: vpmaddubsw + vpaddw into s16; AVX-VNNI/AVX-512: vpdpbusd; "
                                    "scalar: a plain loop), with enough independent accumulators to hide their "
                                    "latency: the most u8 x s8 MACs/s a kernel of this ISA can reach, per core and "
                                    "on the thread pool. `bench e2e` reports prefill as a fraction of it. "
                                    "LOWBIT_ISA=... measures another level.")
    r.add_argument("-t", "--threads", type=int, default=None, help="max threads (default: physical cores)")
    r.add_argument("--min-time", type=float, default=0.1, help="seconds per run (default 0.1; best of 3)")
    r.add_argument("--json", action="store_true", help="print JSON instead of a table")
    r.set_defaults(func=main_roof)

    g = bsub.add_parser("gemv", help="GEMV/GEMM per format at Falcon3-1B, MobileLLM-1.5B, BitNet-2B, Llama3-8B shapes",
                        description="Times every weight format on real model shapes (weights rotated past the L3), "
                                    "reports GB/s of packed weights, the fraction of measured bandwidth and the "
                                    "speedup over bf16, plus each format's in-cache (L2) throughput.")
    g.add_argument("-t", "--threads", type=int, default=None, help="threads (default: physical cores)")
    g.add_argument("--models", default=None, help="comma-separated: falcon3-1b,mobilellm-1.5b,bitnet-2b,llama3-8b")
    g.add_argument("--formats", default=None, help="comma-separated formats (default bf16,int8,int4,int2,ternary,binary)")
    g.add_argument("-n", "--batch", type=int, default=1, help="tokens per call: 1 = GEMV (decode), e.g. 128 = GEMM (prefill)")
    g.add_argument("--tokens", default=None, metavar="N,N,...",
                   help="several token counts, one row each (e.g. 1,4,16,128; overrides -n): G MAC/s against the "
                        "int8 compute roof (`bench roof`) and each GEMM's time per token against the GEMV's")
    g.add_argument("--plot", metavar="FILE.png", default=None, help="draw GB/s per shape and format with the bandwidth line")
    g.add_argument("--rotate-mb", type=int, default=None,
                   help="MiB of weight copies each measurement cycles through (default 8x the L3)")
    g.add_argument("--min-time", type=float, default=0.25, help="seconds per timed run (default 0.25; 5 runs, median)")
    g.add_argument("--bandwidth-mb", type=int, default=1024, help="buffer for the bandwidth roof (default 1024 MiB)")
    g.add_argument("--json", action="store_true", help="print JSON instead of a table")
    g.set_defaults(func=main_gemv)

    importlib.import_module("lowbit.bench.rsr").add_parser(bsub)
    for mod in ("lowbit.bench.e2e", "lowbit.bench.serve", "lowbit.bench.convert", "lowbit.bench.llamacpp"):
        try:
            importlib.import_module(mod).add_parser(bsub)
        except ModuleNotFoundError as e:
            if e.name != mod:
                raise
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def _threads(args) -> int:
    import lowbit

    if args.threads is not None and args.threads < 1:
        raise ValueError("--threads must be >= 1")
    return args.threads or lowbit.cpu_info()["physical_cores"]


def main_bandwidth(args) -> int:
    from lowbit.bench import bandwidth

    res = bandwidth.sweep(_threads(args), nbytes=args.size_mb << 20)
    if args.json:
        print_json(res)
        return 0
    print(f"read bandwidth, {args.size_mb} MiB buffer (L3 defeated), best / mean of 3 runs x 3 passes")
    print(f"{'threads':>7}  {'GB/s':>7}  {'mean':>7}")
    for r in res:
        print(f"{r['threads']:>7}  {r['gbps']:7.1f}  {r['gbps_mean']:7.1f}")
    return 0


def main_roof(args) -> int:
    from lowbit.bench import roof

    if args.min_time <= 0:
        raise ValueError("--min-time must be > 0")
    res = roof.sweep(_threads(args), min_time=args.min_time)
    if args.json:
        print_json(res)
        return 0
    print(f"int8 compute roof, ISA {res[0]['isa']}: {res[0]['probe']}, operands in registers, best of 3")
    mhz = res[0]["mhz"]
    print(f"{'threads':>7}  {'G MAC/s':>8}  {'per thread':>10}  {'MAC/cycle':>9}" + (f"  (at {mhz:.0f} MHz nominal)" if mhz else ""))
    for r in res:
        cyc = f"{r['macs_per_cycle']:9.1f}" if r["macs_per_cycle"] else f"{'-':>9s}"
        print(f"{r['threads']:>7}  {r['gmacs']:8.1f}  {r['gmacs_per_thread']:10.1f}  {cyc}")
    return 0


def main_gemv(args) -> int:
    from lowbit.bench import gemv

    if args.batch < 1:
        raise ValueError("--batch must be >= 1")
    tokens = args.batch
    if args.tokens:
        try:
            tokens = [int(t) for t in args.tokens.split(",")]
        except ValueError:
            raise ValueError(f"--tokens must be comma-separated integers, got {args.tokens!r}") from None
        if min(tokens) < 1:
            raise ValueError("--tokens must all be >= 1")
    models = args.models.split(",") if args.models else None
    formats = args.formats.split(",") if args.formats else None
    from lowbit.bench.shapes import MODEL_SHAPES
    for m in models or []:
        if m not in MODEL_SHAPES:
            raise ValueError(f"unknown model shape {m!r}; known: {', '.join(MODEL_SHAPES)}")
    quiet = args.json
    res = gemv.run(models, formats, _threads(args), tokens,
                   progress=(lambda s: None) if quiet else (lambda s: print(s, file=sys.stderr)),
                   rotate_bytes=None if args.rotate_mb is None else args.rotate_mb << 20, min_time=args.min_time,
                   bandwidth_bytes=args.bandwidth_mb << 20)
    if args.plot:
        from lowbit.bench.plot import plot_gemv
        res["plot"] = str(plot_gemv(res, args.plot))
    if args.json:
        print_json(res)
        return 0
    print_gemv(res)
    return 0


def print_gemv(res: dict) -> None:
    bw, bw1 = res["bandwidth"], res["bandwidth_1thread"]
    tokens = res.get("tokens", [res["n_tokens"]])
    mode = ("GEMV (1 token)" if tokens == [1] else
            f"GEMM ({tokens[0]} tokens)" if len(tokens) == 1 else f"{', '.join(map(str, tokens))} tokens per call")
    print(f"lowbit bench gemv: {mode}, {res['threads']} thread(s), ISA {res['isa']}")
    print(f"read bandwidth: {bw['gbps']:.1f} GB/s with {res['threads']} thread(s), {bw1['gbps']:.1f} GB/s with 1; "
          f"weights rotated over >= {res['rotate_bytes'] >> 20} MiB ({res['rotate_bytes'] / res['l3_bytes']:.0f}x the L3)")
    print(f"int8 compute roof: {res['int8_roof_gmacs']:.0f} G MAC/s with {res['threads']} thread(s), "
          f"{res['int8_roof_gmacs_1thread']:.0f} with 1 (`lowbit bench roof`)")
    print("%BW: against the read bandwidth measured right before and after each row (the higher of the two); "
          "%roof: G MAC/s against the int8 compute roof")
    if len(tokens) > 1 and 1 in tokens:
        print("x GEMV/tok: the GEMV's time per token over this row's (how much cheaper a token is in the GEMM)")
    print(f"thread pool fork/join: {res['pool_overhead_us']:.2f} us per call")
    print()
    hdr = (f"{'model':15s} {'M x K':>12s} {'format':8s} {'N':>4s} {'bpw':>5s} {'MB':>7s} {'us/call':>9s} {'GB/s':>6s} "
           f"{'roof':>5s} {'%BW':>5s} {'x bf16':>6s} {'G MAC/s':>8s} {'%roof':>6s} {'x GEMV/tok':>10s}")
    print(hdr)
    last = None
    for r in res["rows"]:
        key = (r["model"], r["M"], r["K"])
        if last and key != last:
            print()
        last = key
        sp = f"{r['speedup_vs_bf16']:6.2f}" if r.get("speedup_vs_bf16") else f"{'-':>6s}"
        pt = f"{r['per_token_vs_gemv']:10.2f}" if r.get("per_token_vs_gemv") and r["tokens"] > 1 else f"{'-':>10s}"
        print(f"{r['model']:15s} {str(r['M']) + 'x' + str(r['K']):>12s} {r['format']:8s} {r['tokens']:4d} {r['bpw']:5.2f} "
              f"{r['bytes'] / 1e6:7.2f} {r['us']:9.1f} {r['gbps']:6.1f} {r['roof_gbps']:5.1f} "
              f"{100 * r['bw_fraction']:4.0f}% {sp} {r['gmacs']:8.1f} {100 * r['roof_fraction']:5.0f}% {pt}")
    print()
    print("in-cache throughput, 1 thread (paper 000's B/gamma; memory-bound when above the 1-thread roof):")
    for c in res["in_cache"]:
        bound = "memory-bound" if c["gbps"] > bw1["gbps"] else "compute-bound"
        print(f"  {c['format']:8s} N={c['tokens']:<4d} {c['gbps']:7.1f} GB/s {c['gmacs']:7.1f} G MAC/s "
              f"({100 * c['roof_fraction']:3.0f}% of roof)  ({c['shape'][0]}x{c['shape'][1]})"
              + (f"  -> {bound} at {bw1['gbps']:.1f} GB/s" if c["tokens"] == 1 else ""))
    if res.get("plot"):
        print(f"\nplot: {res['plot']}")
