"""Benchmark buffers: anonymous memory with transparent huge pages requested (MADV_HUGEPAGE), so reads
are not held back by TLB misses. The bandwidth roof and the GEMV weights use the same kind of memory."""
from __future__ import annotations

import mmap

import numpy as np


def buffer(nbytes: int, dtype=np.uint8) -> np.ndarray:
    """A zero-filled, page-touched array of `nbytes` bytes backed by huge pages where the kernel allows."""
    size = max(int(nbytes), 1)
    m = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            m.madvise(mmap.MADV_HUGEPAGE)
        except OSError:
            pass
    arr = np.frombuffer(m, np.uint8)[:nbytes]
    arr[::4096] = 0  # touch every page now, not inside the timed loop
    return arr.view(dtype)


def copy(a: np.ndarray) -> np.ndarray:
    out = buffer(a.nbytes, a.dtype).reshape(a.shape)
    out[...] = a
    return out
