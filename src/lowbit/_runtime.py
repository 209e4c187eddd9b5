"""The native extension's process-wide settings: ISA level and thread count, read once at import."""
from __future__ import annotations

import os

from lowbit import _native


def _init() -> None:
    isa = os.environ.get("LOWBIT_ISA", "auto")
    try:
        _native.set_isa(isa)
    except ValueError as e:
        raise RuntimeError(str(e)) from None
    env = os.environ.get("LOWBIT_THREADS")
    if env:
        try:
            n = int(env)
        except ValueError:
            raise RuntimeError(f"LOWBIT_THREADS must be a positive integer, got {env!r}") from None
        if n < 1:
            raise RuntimeError(f"LOWBIT_THREADS must be a positive integer, got {env!r}")
    else:
        n = _native.default_threads()  # physical cores in the affinity mask, capped by the cgroup quota
    _native.set_threads(n)


def set_threads(n: int) -> None:
    """Sets the number of threads the kernels use (the calling thread is one of them)."""
    if int(n) < 1:
        raise ValueError(f"threads must be >= 1, got {n}")
    if int(n) != _native.get_threads():
        _native.set_threads(int(n))


def get_threads() -> int:
    return _native.get_threads()


def set_isa(name: str) -> None:
    """Forces a kernel level: 'amx', 'avx512', 'avxvnni', 'avx2', 'scalar', or 'auto' (the best this CPU has)."""
    _native.set_isa(name)


_blas_controller = None


def single_threaded_blas():
    """A context in which numpy's BLAS (OpenBLAS, MKL) runs on one thread.

    lowbit's pool already occupies every core; a BLAS pool started beside it (numpy's matmul in the
    prefill attention) makes the two fight for the cores: measured on 2 cores, prefill ran 1.6x slower.
    """
    global _blas_controller
    if _blas_controller is None:
        from threadpoolctl import ThreadpoolController

        _blas_controller = ThreadpoolController()
    return _blas_controller.limit(limits=1, user_api="blas")


def cpu_info() -> dict:
    """What the CPU offers, which kernel level was chosen and why, and the thread count."""
    info = dict(_native.cpu_info())
    info["source"] = "LOWBIT_ISA" if os.environ.get("LOWBIT_ISA", "auto") not in ("", "auto") else "auto"
    return info


_init()
