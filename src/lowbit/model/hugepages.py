"""The decoder's packed weight codes on 2 MiB pages (transparent huge pages), in the order decode reads them.

A decode step streams every weight once. On 4 KiB pages that is a TLB miss every 4 KiB (a page walk the
hardware prefetcher does not cross into), and numpy puts only allocations >= 4 MiB on huge pages, so a small
model's matrices (bitnet-0.7b: 0.6-1.6 MB each) all sit on 4 KiB pages. Measured on Zen 3, one thread
streaming the 2-bit GEMV from DRAM: 1536x1536 x1.18, 4096x1536 x1.24 faster on 2 MiB pages.

    moved = codes_to_hugepages(weights)   # IntCodeWeight list -> bytes moved into one huge-page arena

Each weight's ``codes`` becomes a view into one anonymous mapping (2 MiB aligned, MADV_HUGEPAGE), packed in
the given order with 4 KiB between matrices; the old arrays are freed as each is copied and the freed heap
handed back every 256 MiB (malloc_trim), so the peak RSS is at most ~256 MiB above the weights. Skipped (left where they are): codes backed by a file mapping (a loaded model's
np.memmap: copying would keep both copies resident) and weights already moved. A system without
madvise/MADV_HUGEPAGE (or THP set to never) still gets the contiguous arena, on whatever pages the OS gives.
"""
from __future__ import annotations

import mmap

import numpy as np

HUGE = 2 << 20
ALIGN = 4096


def file_backed(a: np.ndarray) -> bool:
    """True when `a`'s memory may come from a file mapping: an np.memmap or a raw mmap in its base chain."""
    b = a
    while b is not None:
        if isinstance(b, (np.memmap, mmap.mmap)):
            return True
        b = b.base if isinstance(b, np.ndarray) else getattr(b, "obj", None)
    return False


def hugepage_buffer(nbytes: int) -> np.ndarray:
    """uint8 [nbytes], zeroed, 2 MiB aligned, advised onto transparent huge pages where the OS has them."""
    if nbytes <= 0:
        raise ValueError(f"hugepage_buffer: nbytes must be positive, got {nbytes}")
    if not hasattr(mmap, "MAP_PRIVATE"):  # not POSIX: no THP to ask for, a plain aligned buffer
        buf = np.zeros(nbytes + HUGE, np.uint8)
        off = (-buf.ctypes.data) % HUGE
        return buf[off:off + nbytes]
    # private: a shared anonymous mapping is shmem, which THP leaves alone (shmem_enabled is usually never)
    m = mmap.mmap(-1, nbytes + HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(m, "madvise") and hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            m.madvise(mmap.MADV_HUGEPAGE)
        except OSError:  # THP compiled out: the arena still works on small pages
            pass
    buf = np.frombuffer(m, np.uint8)
    off = (-buf.ctypes.data) % HUGE
    return buf[off:off + nbytes]


def codes_to_hugepages(weights) -> int:
    """Moves the ``codes`` of `weights` (IntCodeWeight-like: a uint8 ``codes`` array) into one huge-page arena,
    in order; returns the bytes moved (0 when nothing qualified)."""
    todo, seen = [], set()
    for w in weights:
        c = getattr(w, "codes", None)
        if (not isinstance(c, np.ndarray) or c.dtype != np.uint8 or c.ndim != 1 or id(w) in seen
                or getattr(w, "_on_hugepages", False) or file_backed(c)):
            continue
        seen.add(id(w))
        todo.append(w)
    if not todo:
        return 0
    sizes = [-(-w.codes.nbytes // ALIGN) * ALIGN for w in todo]
    arena = hugepage_buffer(sum(sizes))
    at = since_trim = 0
    for w, n in zip(todo, sizes):
        dst = arena[at:at + w.codes.nbytes]
        dst[:] = w.codes
        w.codes = dst
        w._on_hugepages = True
        at += n
        since_trim += n
        if since_trim >= TRIM_EVERY:
            since_trim = 0
            release_freed_heap()
    release_freed_heap()
    return at


TRIM_EVERY = 256 << 20


def release_freed_heap() -> None:
    """Hands the heap's freed pages back to the OS (glibc malloc_trim): the old codes arrays were under glibc's
    mmap threshold, so their free() kept them resident and the move would have doubled the RSS."""
    global _trim
    if _trim is None:
        try:
            import ctypes

            _trim = ctypes.CDLL("libc.so.6").malloc_trim
        except (OSError, AttributeError):
            _trim = False
    if _trim:
        _trim(0)


_trim = None
