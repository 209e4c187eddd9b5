"""`lowbit perplexity`: teacher-forced perplexity of a model on a text file.

The text is tokenized and cut into consecutive windows of --ctx tokens; each window is scored
from an empty cache (every token after the window's first), and ppl = exp(mean NLL). Compare
formats on the same text and --ctx, e.g. (SmolLM2-135M-Instruct, GPL-3.0 text, ctx 512):

    for f in bf16 int8 int4 int2 ternary binary; do lowbit perplexity --format $f -f tests/data/GPL-3.0.txt; done

    bf16 22.35 | int8 22.39 (+0.2 %, blocks of 32) | int4 22.43 (+0.4 %, groups of 32) | int2 2.1e5 | ternary 1.1e8
    | binary 1.6e6   (7624 tokens; a 135M model was not trained for 2 bits or less)
"""
from __future__ import annotations

import pathlib
import sys

from lowbit.cli._common import add_model_args, add_runtime_args, load_from_args


def add_parser(subparsers):
    import argparse

    p = subparsers.add_parser("perplexity", help="perplexity of a model on a text file", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(p)
    p.add_argument("-f", "--file", dest="text_file", required=True, metavar="TEXT", help="a UTF-8 text file")
    p.add_argument("--ctx", type=int, default=512, help="tokens per window (default: 512)")
    p.add_argument("--max-tokens", type=int, default=None, metavar="N", help="score at most about N tokens")
    p.add_argument("--llamacpp", action="store_true",
                   help="score as llama.cpp's llama-perplexity -c CTX does (only the second half of each window, "
                        "which gives lower figures): for tables beside llama.cpp")
    add_runtime_args(p)
    p.add_argument("-q", "--quiet", action="store_true", help="print only the perplexity")
    p.set_defaults(func=main)
    return p


def main(args) -> int:
    from lowbit.perplexity import perplexity, perplexity_llamacpp

    path = pathlib.Path(args.text_file)
    if path.is_dir():
        raise ValueError(f"{path} is a directory; -f takes a text file")
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file")
    least = 4 if args.llamacpp else 2
    if args.ctx < least:  # before loading (it also sizes the cache: the error named max_context)
        raise ValueError(f"--ctx must be >= {least}, got {args.ctx}")
    if args.max_tokens is not None and args.max_tokens < 1:
        raise ValueError(f"--max-tokens must be >= 1, got {args.max_tokens}")
    text = path.read_text(encoding="utf-8", errors="replace")
    if args.max_context is None:
        args.max_context = args.ctx
    llm = load_from_args(args, quiet=args.quiet)
    tok = llm.tokenizer
    ids = tok.encode(text, add_bos=False)
    bos = tok.bos_id if getattr(tok, "add_bos", False) else None

    def progress(done, total):
        if not args.quiet and sys.stderr.isatty():
            print(f"\r{done}/{total} tokens", end="", file=sys.stderr, flush=True)

    if args.llamacpp:
        if args.max_tokens:
            raise ValueError("--max-tokens does not apply with --llamacpp (llama.cpp scores whole windows)")
        r = perplexity_llamacpp(llm.model, ids, ctx=args.ctx, bos_id=bos, progress=progress)
    else:
        r = perplexity(llm.model, ids, ctx=args.ctx, max_tokens=args.max_tokens, bos_id=bos, progress=progress)
    if args.quiet:
        print(f"{r.ppl:.4f}")
    else:
        if sys.stderr.isatty():
            print(file=sys.stderr)
        print(f"{path.name}: {r}")
    return 0
