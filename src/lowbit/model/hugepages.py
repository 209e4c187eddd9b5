"""The decoder's packed weight codes (the blocks', then the lm_head's) on 2 MiB pages (transparent huge pages), in
the order decode reads them.

A decode step streams every weight once. On 4 KiB pages that is a TLB miss every 4 KiB (a page walk the
hardware prefetcher does not cross into). Where a model's codes land is otherwise an accident: numpy
madvises huge pages only for allocations >= 4 MiB (a smaller array gets them only if the heap reuses a
range a big temporary had advised: ~80 % of bitnet-0.7b's codes when built by quantize in-process), and a
loaded model's codes are views of its file mapping (np.memmap, 4 KiB page-cache pages). Measured on Zen 3,
one thread streaming the 2-bit GEMV from DRAM: 0.4-1.6 MB matrices x1.02-1.30 faster on 2 MiB pages.

    moved = codes_to_hugepages(weights)   # weights with flat uint8 ``codes`` -> bytes moved into one arena
(a codebook b = 4 weight on an AVX-512 VBMI CPU moves its ``codes16`` instead: the copy its kernel reads).

Each weight's ``codes`` becomes a view into one anonymous mapping (2 MiB aligned, MADV_HUGEPAGE), packed in
the given order with 4 KiB between matrices. Memory: an owned array is freed once copied and the freed heap
handed back every 32 MiB (malloc_trim); a view of an np.memmap has the whole pages of its old range
dropped from the process (MADV_DONTNEED: packed codes are never written, so the pages, should anything
read them again, fault back from the page cache with the file's bytes). The peak RSS stays within ~32 MiB
of the weights. Left where they are: views of a raw mmap (an arena's own, or unknown) and weights already
moved. Without madvise/MADV_HUGEPAGE (or with THP off) the arena is still one contiguous block.
"""
from __future__ import annotations

import mmap

import numpy as np

HUGE = 2 << 20
ALIGN = 4096


def mapping_of(a: np.ndarray):
    """The np.memmap or raw mmap.mmap at the root of `a`'s base chain, or None (heap memory)."""
    b = a
    while b is not None:
        if isinstance(b, (np.memmap, mmap.mmap)):
            return b
        b = b.base if isinstance(b, np.ndarray) else getattr(b, "obj", None)
    return None


def file_backed(a: np.ndarray) -> bool:
    """True when `a`'s memory may come from a file mapping: an np.memmap or a raw mmap in its base chain."""
    return mapping_of(a) is not None


def release_range(mm: np.memmap, a: np.ndarray) -> bool:
    """MADV_DONTNEED on the whole pages of `a` (a view of the np.memmap `mm`); False where unsupported."""
    m = getattr(mm, "_mmap", None)
    if m is None or not hasattr(m, "madvise") or not hasattr(mmap, "MADV_DONTNEED"):
        return False
    base = np.frombuffer(m, np.uint8).ctypes.data
    start = a.ctypes.data
    s, e = -(-start // mmap.PAGESIZE) * mmap.PAGESIZE, (start + a.nbytes) // mmap.PAGESIZE * mmap.PAGESIZE
    if e <= s:
        return True
    try:
        m.madvise(mmap.MADV_DONTNEED, s - base, e - s)
    except (OSError, ValueError):
        return False
    return True


def hugepage_buffer(nbytes: int) -> np.ndarray:
    """uint8 [nbytes], zeroed, 2 MiB aligned, advised onto transparent huge pages where the OS has them."""
    if nbytes <= 0:
        raise ValueError(f"hugepage_buffer: nbytes must be positive, got {nbytes}")
    if not hasattr(mmap, "MAP_PRIVATE"):  # not POSIX: no THP to ask for, a plain aligned buffer
        buf = np.zeros(nbytes + HUGE, np.uint8)
        off = (-buf.ctypes.data) % HUGE
        return buf[off:off + nbytes]
    # private: a shared anonymous mapping is shmem, which THP leaves alone (shmem_enabled is usually never).
    # Whole huge pages past the aligned start: with only nbytes + HUGE mapped, the last partial huge page of the
    # buffer could end past the mapping and stay on 4 KiB pages.
    m = mmap.mmap(-1, -(-nbytes // HUGE) * HUGE + HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(m, "madvise") and hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            m.madvise(mmap.MADV_HUGEPAGE)
        except OSError:  # THP compiled out: the arena still works on small pages
            pass
    buf = np.frombuffer(m, np.uint8)
    off = (-buf.ctypes.data) % HUGE
    return buf[off:off + nbytes]


def _streamed(w) -> str:
    """The attribute holding the codes w's kernel streams: ``codes``, or a codebook b = 4 weight's AVX-512 copy
    (``codes16``, made here: then the kernel never reads ``codes``, which stays where it is)."""
    return "_codes16" if getattr(w, "codes16", None) is not None else "codes"


def codes_to_hugepages(weights) -> int:
    """Moves the ``codes`` of `weights` (IntCodeWeight-like: a uint8 ``codes`` array) into one huge-page arena,
    in order; returns the bytes moved (0 when nothing qualified)."""
    todo, seen = [], set()
    for w in weights:
        c = getattr(w, "codes", None)
        if (not isinstance(c, np.ndarray) or c.dtype != np.uint8 or c.ndim != 1 or id(w) in seen
                or getattr(w, "_on_hugepages", False) or isinstance(mapping_of(c), mmap.mmap)):
            continue
        seen.add(id(w))
        todo.append((w, _streamed(w)))
    if not todo:
        return 0
    sizes = [-(-getattr(w, name).nbytes // ALIGN) * ALIGN for w, name in todo]
    arena = hugepage_buffer(sum(sizes))
    at = since_trim = 0
    for (w, name), n in zip(todo, sizes):
        src = getattr(w, name)
        dst = arena[at:at + src.nbytes]
        dst[:] = src
        mm = mapping_of(w.codes)  # codes16 is made on the heap: only the nibble codes can be a file's pages
        if mm is not None:  # an np.memmap view: drop its pages (the array itself stays valid)
            release_range(mm, w.codes)
        setattr(w, name, dst)
        w._on_hugepages = True
        at += n
        since_trim += n
        if since_trim >= TRIM_EVERY:
            since_trim = 0
            release_freed_heap()
    release_freed_heap()
    return at


TRIM_EVERY = 32 << 20


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
