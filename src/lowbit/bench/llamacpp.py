"""Side by side with llama.cpp on the same GGUF: lowbit's e2e timing and `llama-bench`, alternating in one run,
prefill (pp) and decode (tg) tokens/s per quantization type and thread count.

    bash scripts/llamacpp.sh                      # builds llama-bench / llama-quantize (prints the bin folder)
    lowbit bench llamacpp --llama-bench ~/.cache/lowbit/llamacpp/build/bin/llama-bench -t 1,2

The model is a llama-architecture GGUF of a named shape (default bitnet-0.7b) with ternary-valued random
weights (one scale per tensor), written once as F16 and quantized by llama-quantize to each type. lowbit
converts the same quantized file (cached) and runs it in the lowbit format of LOWBIT_FORMAT: TQ2_0 -> ternary
(lossless: one scale per row, since each row's 256-blocks share it), Q4_0 -> int4 (the file's codes and scales,
symmetric around code 8: 4.5 bits per weight, as Q4_0). The output projection is written by llama-quantize
in the type matching lowbit's lm_head format (int8 <-> Q8_0, int4 <-> Q4_1: both 8.5 / 5 bits per weight,
same bytes per token on both sides).
"""
from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import numpy as np

from lowbit.bench import print_json

LOWBIT_FORMAT = {"TQ2_0": "ternary", "TQ1_0": "tq1", "Q4_0": "int4", "Q4_1": "int4", "Q8_0": "int8"}
OUTPUT_TYPE = {"int8": "q8_0", "int4": "q4_1"}  # llama-quantize --output-tensor-type per lowbit lm_head format
# A given GGUF's output matrix (or the tied embedding) -> the lowbit lm_head format that reads as many bytes
HEAD_FORMAT = {"Q8_0": "int8", "Q4_0": "int4", "Q4_1": "int4"}


def gguf_types(path) -> tuple[str, str]:
    """(the type holding most of the decoder blocks' weights, the output matrix's type, or the embedding's when
    tied) of a GGUF, as llama.cpp names them (e.g. "Q4_1", "Q8_0")."""
    from collections import Counter

    from lowbit.io.gguf_file import GGUFFile

    f = GGUFFile(path)
    blocks, by_name = Counter(), {t.name: t for t in f.tensors}
    for t in f.tensors:
        if t.name.startswith("blk.") and len(t.shape) == 2:
            blocks[t.tensor_type.name] += int(t.n_elements)
    if not blocks:
        raise ValueError(f"{path}: no decoder block matrices (blk.*) in this GGUF")
    head = by_name.get("output.weight") or by_name.get("token_embd.weight")
    return blocks.most_common(1)[0][0], head.tensor_type.name if head is not None else "?"


class _TernaryValues:
    """Ternary-valued float32 matrices (s * {-1, 0, +1}, s per tensor) tiled from a random pool; norms ~ 1."""

    def __init__(self, seed: int = 0, scale: float = 0.02):
        self.rng = np.random.default_rng(seed)
        self.scale = scale
        self.pool = (scale * self.rng.integers(-1, 2, 1 << 22)).astype(np.float32)

    def __call__(self, shape) -> np.ndarray:
        if len(shape) == 1:
            return (1.0 + 0.1 * self.rng.standard_normal(shape)).astype(np.float32)
        return np.resize(np.roll(self.pool, int(self.rng.integers(len(self.pool)))), shape)


def shape_config(shape: str, layers: int | None = None) -> dict:
    """A llama config of a named shape (lowbit.bench.shapes, or synthetic's "tiny") as an F16 GGUF writer takes it."""
    from lowbit.bench.shapes import MODEL_SHAPES
    from lowbit.bench.synthetic import SHAPES
    from lowbit.io.checkpoint import normalize_config

    known = {**SHAPES, **MODEL_SHAPES}
    if shape not in known:
        raise ValueError(f"unknown shape {shape!r}; known: {', '.join(known)}")
    cfg = {k: v for k, v in known[shape].items() if k not in ("label", "model_type")}
    if layers:
        cfg["num_hidden_layers"] = int(layers)
    cfg["tie_word_embeddings"] = False  # llama.cpp and lowbit both read a separate output.weight
    return normalize_config(dict(model_type="llama", architectures=["LlamaForCausalLM"], max_position_embeddings=4096,
                                 rms_norm_eps=1e-5, rope_theta=500000.0, bos_token_id=1, eos_token_id=2,
                                 hidden_act="silu", **cfg), shape)


def write_ternary_gguf(path, shape: str = "bitnet-0.7b", layers: int | None = None, seed: int = 0) -> pathlib.Path:
    """An F16 llama GGUF of `shape` with ternary-valued weights and a byte-level BPE vocabulary (written once)."""
    from lowbit.bench.synthetic import write_gguf_f16

    path = pathlib.Path(path)
    done = path.with_name(f".{path.name}.done")
    if path.exists() and done.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    write_gguf_f16(tmp, shape_config(shape, layers), values=_TernaryValues(seed))
    tmp.replace(path)
    done.touch()
    return path


def quantize_gguf(llama_quantize, src: pathlib.Path, qtype: str, lm_head_format: str) -> pathlib.Path:
    """src (F16 GGUF) -> SRC-QTYPE-head.gguf by llama-quantize (once); lm_head in the matching llama.cpp type."""
    dst = src.with_name(f"{src.stem}-{qtype}-{OUTPUT_TYPE[lm_head_format]}.gguf")
    if dst.exists():
        return dst
    tmp = dst.with_name(f".{dst.name}.tmp")
    cmd = [str(llama_quantize), "--output-tensor-type", OUTPUT_TYPE[lm_head_format], str(src), str(tmp), qtype]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"llama-quantize failed ({' '.join(cmd)}):\n{r.stderr[-2000:]}")
    tmp.replace(dst)
    return dst


def llama_bench(exe, gguf: pathlib.Path, threads: int, prompt_tokens: int, gen_tokens: int, repeats: int) -> dict:
    """pp/tg tokens/s of `llama-bench -m gguf -p P -n N -t T -r R -o json` (mean and sd over its repeats)."""
    cmd = [str(exe), "-m", str(gguf), "-p", str(prompt_tokens), "-n", str(gen_tokens), "-t", str(threads),
           "-r", str(repeats), "-o", "json"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"llama-bench failed ({' '.join(cmd)}):\n{r.stderr[-2000:]}")
    out = {}
    for rec in json.loads(r.stdout):
        key = "pp" if rec["n_gen"] == 0 else "tg"
        out[f"{key}_tps"], out[f"{key}_sd"] = float(rec["avg_ts"]), float(rec["stddev_ts"])
    if "pp_tps" not in out or "tg_tps" not in out:
        raise RuntimeError(f"llama-bench printed no pp and tg results: {r.stdout[:500]}")
    return out


def lowbit_bench(model, threads: int, prompt_tokens: int, gen_tokens: int, repeats: int) -> dict:
    import lowbit
    from lowbit.bench import e2e

    lowbit.set_threads(threads)
    r = e2e.run(model, prompt_tokens, gen_tokens, repeats)
    return {k: r[k] for k in ("pp_tps", "pp_sd", "tg_tps", "tg_sd")}


def run(llama_bench_exe, llama_quantize=None, shape: str = "bitnet-0.7b", layers: int | None = None,
        types=("TQ2_0", "Q4_0"), threads=(1, 2), lm_head_format: str | None = "int8", prompt_tokens: int = 128,
        gen_tokens: int = 64, repeats: int = 3, rounds: int = 2, workdir=None, log=print, model=None,
        fmt: str | None = None) -> dict:
    """Every (type, threads) timed `rounds` times on each side, lowbit and llama-bench alternating; rows hold
    the mean of the rounds' means (and every round's figures).

    model: a GGUF to run as it is instead (shape, layers, types and the quantizer unused): llama.cpp reads the file,
    lowbit converts it (cached) to `fmt` (default: LOWBIT_FORMAT of the blocks' type, else int4) with its lm_head
    in `lm_head_format` (default: the format reading the bytes of the file's output matrix, HEAD_FORMAT, else
    lowbit convert's default)."""
    import lowbit
    from lowbit.api import cache_root, load

    exe = pathlib.Path(llama_bench_exe)
    if not exe.is_file():
        raise FileNotFoundError(f"{exe}: no such file (build it with scripts/llamacpp.sh)")
    if any(t < 1 for t in threads) or rounds < 1 or repeats < 1:
        raise ValueError("threads, rounds and repeats must be >= 1")
    models, ggufs, formats = {}, {}, {}
    if model is not None:
        path = pathlib.Path(model)
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no such GGUF file")
        block_type, head_type = gguf_types(path)
        label = f"{block_type} (file)"
        types = (label,)
        ggufs[label] = path
        formats[label] = fmt or LOWBIT_FORMAT.get(block_type, "int4")
        lm_head_format = lm_head_format or HEAD_FORMAT.get(head_type)
        log(f"lowbit: loading {path.name} (blocks {block_type}, output {head_type}) as {formats[label]} "
            f"(lm_head {lm_head_format or 'convert default'})")
        models[label] = load(path, format=formats[label], lm_head_format=lm_head_format, progress=False,
                             max_context=prompt_tokens + gen_tokens + 8).model
        output_type = head_type
    else:
        quant = pathlib.Path(llama_quantize) if llama_quantize else exe.with_name("llama-quantize")
        if not quant.is_file():
            raise FileNotFoundError(f"{quant}: no such file (build it with scripts/llamacpp.sh)")
        for t in types:
            if t not in LOWBIT_FORMAT:
                raise ValueError(f"unsupported llama.cpp type {t!r}; choose from {', '.join(LOWBIT_FORMAT)}")
        lm_head_format = lm_head_format or "int8"
        if lm_head_format not in OUTPUT_TYPE:
            raise ValueError(f"lm_head format {lm_head_format!r}: choose one of {', '.join(OUTPUT_TYPE)}")
        output_type = OUTPUT_TYPE[lm_head_format]
        workdir = pathlib.Path(workdir) if workdir else cache_root() / "llamacpp-bench"
        f16 = workdir / f"{shape}{f'-{layers}l' if layers else ''}-ternary-f16.gguf"
        log(f"writing {f16} (once)")
        write_ternary_gguf(f16, shape, layers)
        for t in types:
            ggufs[t] = quantize_gguf(quant, f16, t, lm_head_format)
            formats[t] = LOWBIT_FORMAT[t]
            log(f"lowbit: loading {ggufs[t].name} as {formats[t]} (lm_head {lm_head_format})")
            models[t] = load(ggufs[t], format=formats[t], lm_head_format=lm_head_format, progress=False,
                             max_context=prompt_tokens + gen_tokens + 8).model
    samples: dict[tuple, dict[str, list]] = {}
    for rnd in range(rounds):
        for t in types:
            for n in threads:
                for side in ("lowbit", "llama.cpp"):
                    if side == "lowbit":
                        r = lowbit_bench(models[t], n, prompt_tokens, gen_tokens, repeats)
                    else:
                        r = llama_bench(exe, ggufs[t], n, prompt_tokens, gen_tokens, repeats)
                    log(f"round {rnd + 1}/{rounds} {t:6s} t={n} {side:9s} pp{prompt_tokens} {r['pp_tps']:8.1f}  "
                        f"tg{gen_tokens} {r['tg_tps']:7.1f} tok/s")
                    s = samples.setdefault((t, n, side), {"pp": [], "tg": []})
                    s["pp"].append(r["pp_tps"])
                    s["tg"].append(r["tg_tps"])
    rows = []
    for (t, n, side), s in samples.items():
        rows.append({"type": t, "threads": n, "side": side,
                     "lowbit_format": formats[t] if side == "lowbit" else t,
                     "pp_tps": float(np.mean(s["pp"])), "tg_tps": float(np.mean(s["tg"])),
                     "pp_rounds": s["pp"], "tg_rounds": s["tg"]})
    return {"shape": shape, "layers": layers, "model": str(model) if model is not None else None,
            "lm_head_format": lm_head_format, "output_type": output_type,
            "prompt_tokens": prompt_tokens, "gen_tokens": gen_tokens,
            "repeats": repeats, "rounds": rounds, "isa": lowbit.cpu_info()["isa"],
            "ggufs": {t: str(p) for t, p in ggufs.items()}, "rows": rows}


def print_table(res: dict) -> None:
    p, n = res["prompt_tokens"], res["gen_tokens"]
    what = (f"{pathlib.Path(res['model']).name}" if res.get("model") else
            f"{res['shape']} ({res['layers'] or 'all'} layers), ternary-valued weights")
    print(f"{what}, lm_head {res['lm_head_format'] or 'convert default'} (llama.cpp {res['output_type']}), "
          f"ISA {res['isa']}; mean of {res['rounds']} alternating rounds x {res['repeats']} repeats")
    w = max(6, *(len(r["type"]) for r in res["rows"]))
    wf = max(8, *(len(r["lowbit_format"]) for r in res["rows"]))
    print(f"{'type':{w}s} {'threads':>7s}  {'side':9s} {'runs as':{wf}s} {'pp' + str(p):>9s} {'tg' + str(n):>8s}  "
          f"{'pp ratio':>8s} {'tg ratio':>8s}")
    by = {(r["type"], r["threads"], r["side"]): r for r in res["rows"]}
    for r in res["rows"]:
        other = by.get((r["type"], r["threads"], "llama.cpp"))
        ratio = (f"{r['pp_tps'] / other['pp_tps']:8.2f} {r['tg_tps'] / other['tg_tps']:8.2f}"
                 if r["side"] == "lowbit" and other else "")
        print(f"{r['type']:{w}s} {r['threads']:7d}  {r['side']:9s} {r['lowbit_format']:{wf}s} {r['pp_tps']:9.1f} "
              f"{r['tg_tps']:8.1f}  {ratio}")
    print("ratio: lowbit / llama.cpp (tok/s). llama-bench's tg starts from an empty context, lowbit's after the prompt.")


def add_parser(bsub) -> None:
    p = bsub.add_parser("llamacpp", help="lowbit beside llama-bench on the same GGUF (TQ2_0, Q4_0), alternating",
                        description=__doc__.split("\n\n")[0] + " Needs llama.cpp's tools: bash scripts/llamacpp.sh.")
    p.add_argument("--llama-bench", required=True, metavar="PATH", help="the llama-bench executable")
    p.add_argument("-m", "--model", default=None, metavar="GGUF",
                   help="a GGUF to run as it is (e.g. the default model's); else a --shape model written and quantized "
                        "to each of --types")
    p.add_argument("--format", default=None,
                   help="with -m: lowbit's weight format (default: the file's type's, TQ2_0 -> ternary, Q4_0/Q4_1 -> "
                        "int4, Q8_0 -> int8; else int4)")
    p.add_argument("--llama-quantize", default=None, metavar="PATH",
                   help="the llama-quantize executable (default: beside llama-bench)")
    p.add_argument("--shape", default="bitnet-0.7b", help="model shape (lowbit.bench.shapes; default bitnet-0.7b)")
    p.add_argument("--layers", type=int, default=None, help="override the shape's number of layers")
    p.add_argument("--types", default="TQ2_0,Q4_0", help="llama.cpp types, comma-separated (default TQ2_0,Q4_0)")
    p.add_argument("-t", "--threads", default="1,2", help="thread counts, comma-separated (default 1,2)")
    p.add_argument("--lm-head-format", default=None, metavar="FMT",
                   help="lowbit lm_head format; llama.cpp's output.weight gets the matching type (int8: Q8_0, the "
                        "default; int4: Q4_1); with -m: the one reading the file's output bytes (Q8_0 -> int8, Q4_x -> "
                        "int4), else lowbit convert's")
    p.add_argument("-p", "--prompt-tokens", type=int, default=128, help="prompt length (default 128)")
    p.add_argument("-n", "--gen-tokens", type=int, default=64, help="generated tokens (default 64)")
    p.add_argument("-r", "--repeats", type=int, default=3, help="repeats per side and round (default 3)")
    p.add_argument("--rounds", type=int, default=2, help="alternating rounds (default 2)")
    p.add_argument("--workdir", default=None, help="where the GGUFs go (default: the lowbit cache/llamacpp-bench)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=main)


def main(args) -> int:
    threads = tuple(int(x) for x in args.threads.split(","))
    types = tuple(x.strip() for x in args.types.split(",") if x.strip())
    res = run(args.llama_bench, args.llama_quantize, args.shape, args.layers, types, threads, args.lm_head_format,
              args.prompt_tokens, args.gen_tokens, args.repeats, args.rounds, args.workdir,
              log=lambda s: print(s, file=sys.stderr, flush=True), model=args.model, fmt=args.format)
    if args.json:
        print_json(res)
    else:
        print_table(res)
    return 0
