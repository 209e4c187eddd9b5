"""`lowbit chat`: an interactive multi-turn conversation.

The history is kept (and its KV cache re-used: each turn prefills only the new tokens). Commands:
/exit (or /quit, Ctrl-D) leaves, /reset clears the history, /stats toggles the tokens/s line.
Reads stdin line by line when it is not a terminal, so `lowbit chat < questions.txt` works.
When the conversation no longer fits in the context, the oldest turns are dropped.
"""
from __future__ import annotations

import sys

from lowbit.cli._common import (add_model_args, add_runtime_args, add_sampling_args, context_full_note, load_from_args,
                                sampling_kwargs)
from lowbit.model import ContextOverflowError

HELP = "commands: /exit, /reset (clear history), /stats (toggle tokens/s)"


def add_parser(subparsers):
    import argparse

    p = subparsers.add_parser("chat", help="interactive multi-turn chat", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(p)
    p.add_argument("--system", default=None, help="a system message for the whole conversation")
    add_runtime_args(p)
    add_sampling_args(p, max_tokens=512, prompt_only=False)
    p.add_argument("--stats", action="store_true", help="print tokens/s after each reply")
    p.set_defaults(func=main)
    return p


def _read(tty: bool) -> str | None:
    try:
        return input(">>> ") if tty else sys.stdin.readline() or None
    except EOFError:
        return None


def fit_history(llm, history: list[dict], reserve: int) -> list[dict]:
    """Drops the oldest non-system turns until the prompt leaves `reserve` tokens of context."""
    limit = llm.model.cache.max_ctx - reserve
    keep_system = 1 if history and history[0]["role"] == "system" else 0
    while len(history) > keep_system + 1 and len(llm.chat_prompt(history)) > limit:
        del history[keep_system]
    return history


def check_args(args) -> None:
    """Option values chat cannot use, refused before the model loads."""
    if args.max_tokens < 1:  # -n 0 printed an empty reply to every turn (and stored it in the history)
        raise ValueError(f"-n/--max-tokens must be at least 1 in chat, got {args.max_tokens}: every turn needs a "
                         "reply (`lowbit run -n 0` runs a prompt without generating)")


def main(args) -> int:
    check_args(args)
    llm = load_from_args(args)
    if not getattr(llm.tokenizer, "chat_template", None):
        raise ValueError("this model has no chat template, so it cannot chat; try `lowbit run --no-chat`")
    tty = sys.stdin.isatty()
    system = [{"role": "system", "content": args.system}] if args.system else []
    history = list(system)
    show_stats = args.stats
    kw = sampling_kwargs(args)
    reserve = min(kw["max_tokens"], llm.model.cache.max_ctx // 2)
    if tty:
        print(f"lowbit chat: {llm}. {HELP}", file=sys.stderr)
    while True:
        line = _read(tty)
        if line is None:
            break
        line = line.strip()
        if not line:
            continue
        if line in ("/exit", "/quit", "/bye"):
            break
        if line == "/reset":
            history = list(system)
            llm.model.reset()
            print("(history cleared)", file=sys.stderr)
            continue
        if line == "/stats":
            show_stats = not show_stats
            continue
        if line.startswith("/") and line[1:].isalpha():
            print(f"unknown command {line}; {HELP}", file=sys.stderr)
            continue
        if not tty:
            print(f">>> {line}", flush=True)
        history.append({"role": "user", "content": line})
        history = fit_history(llm, history, reserve)
        try:
            gen = llm.stream_chat(history, **kw)
            for piece in gen:
                sys.stdout.write(piece)
                sys.stdout.flush()
        except ContextOverflowError as e:
            history.pop()
            print(f"\nlowbit: {e}; /reset to start over", file=sys.stderr)
            continue
        print(flush=True)
        if gen.stats.context_full:
            print(context_full_note(llm, gen), file=sys.stderr)
        history.append({"role": "assistant", "content": gen.text})
        if show_stats:
            print(gen.stats, file=sys.stderr)
    return 0
