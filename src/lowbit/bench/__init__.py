"""Benchmarks: machine read bandwidth (the roofline's roof), GEMV/GEMM per format, end to end."""
import json
import sys


def print_json(result) -> None:
    """A benchmark's result as the --json output of every `lowbit bench` verb (indent 1, then a newline)."""
    json.dump(result, sys.stdout, indent=1)
    print()
