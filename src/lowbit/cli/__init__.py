"""`lowbit` command line. One module per verb, each with add_parser(subparsers) and main(args)."""
from __future__ import annotations

import argparse
import importlib
import sys
import warnings

VERBS = ("run", "chat", "convert", "info", "perplexity", "bench", "serve", "export-openvino")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lowbit",
        description="Run ultra-low-bit LLMs (1-bit, ternary, 2-bit, 4-bit) on CPUs at the speed of memory.",
    )
    sub = parser.add_subparsers(dest="verb", metavar="COMMAND")
    for verb in VERBS:
        name = f"lowbit.cli.{verb.replace('-', '_')}"
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name == name:
                continue  # verb not built yet
            raise
        module.add_parser(sub)
    return parser


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    print(f"lowbit: warning: {message}", file=sys.stderr)  # a user's line, not a source location


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _show_warning
            return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    except (ValueError, FileNotFoundError, RuntimeError) as e:
        print(f"lowbit: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
