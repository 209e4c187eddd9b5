"""The KV cache (NITRO's static cache): a fixed shape between growths, up to the maximum context.

    k, v: [layers, kv_heads, capacity, head_dim], float16 (the default for quantized models: half the bytes
          attention reads per token, as llama.cpp and bitnet.cpp keep it) or float32 (the f32 reference path);
          or int8 [layers, kv_heads, capacity, head_dim + 4]: each row its int8 values, then their float32
          scale (max |x| / 127) in the last 4 bytes -- half float16's bytes again (`kv_cache="int8"`)

Positions 0..length-1 are filled; attention reads only that part (k[l, :, :length]). A model's cache
(KVCache) starts at KV_START positions and doubles (KVCache.grow, up to max_ctx) when a prompt or a token
would pass its capacity, the filled part copied: the model rebuilds its native step over the new arrays.
Its buffers are on transparent huge pages (a private mapping): on 4 KiB pages every kv head's K/V walk crossed
a page every 4 KiB (a TLB miss, the hardware prefetchers restarting), and bitnet-0.7b's decode attention took
1.4x the time (2.02 -> 1.45 ms a token at 1 thread, docs/kv_cache.md, stop 38). Memory stays at most twice the filled length (capacity, not
max_ctx). The multi-slot cache of batching (SlotKVCache) is allocated whole at max_ctx, so it stays on
lazily mapped 4 KiB pages that grow with what is written. `tokens` remembers which ids fill the cache, so a
new prompt that extends the old one (multi-turn chat) re-uses the prefix.
"""
from __future__ import annotations

import mmap

import numpy as np

from lowbit.model.hugepages import hugepage_buffer


KV_TYPES = {"f32": np.float32, "f16": np.float16, "int8": np.int8}  # the names the API and CLI take
KV_START = 256  # a model cache's first capacity in positions (grown by doubling, up to max_ctx)


def kv_dtype(name: str) -> np.dtype:
    """The cache dtype of a --kv-cache name ("f32", "f16", "int8")."""
    if name not in KV_TYPES:
        raise ValueError(f"unknown KV cache type {name!r}; use one of {', '.join(KV_TYPES)}")
    return np.dtype(KV_TYPES[name])


def kv_kind(dtype) -> int:
    """The native Decoder's code of a cache dtype: 0 float32, 1 float16, 2 int8 (KvType in common.h)."""
    return {np.dtype(np.float32): 0, np.dtype(np.float16): 1, np.dtype(np.int8): 2}[np.dtype(dtype)]


def kv_row(dtype, head_dim: int) -> int:
    """Elements of a cache row: head_dim, or head_dim + 4 for int8 (the values, then the float32 scale)."""
    return head_dim + 4 if np.dtype(dtype) == np.int8 else head_dim


def quantize_kv_rows(x: np.ndarray) -> np.ndarray:
    """float32 [..., hd] -> int8 rows [..., hd + 4]: the scale max|x| / 127, q = rint(x * (1 / scale)), then the
    scale's float32 bytes. A row whose scale is below float32's smallest normal (zeros, tiny values) gets zeros;
    a row with NaN or inf gets zeros and scale NaN. The native cache write (kv_quantize_row in kernels/ops.inc)
    gives the same bytes."""
    x = np.asarray(x, np.float32)
    hd = x.shape[-1]
    amax = np.abs(x).max(axis=-1, keepdims=True) if hd else np.zeros(x.shape[:-1] + (1,), np.float32)
    scale = np.where(np.isfinite(amax), amax / np.float32(127), np.float32(np.nan)).astype(np.float32)
    ok = scale >= np.finfo(np.float32).tiny  # False for zero, subnormal and NaN scales: those rows keep q = 0
    inv = np.float32(1) / np.where(ok, scale, np.float32(1))
    with np.errstate(invalid="ignore"):
        q = np.where(ok, np.rint(x * inv), 0).clip(-127, 127).astype(np.int8)
    out = np.empty(x.shape[:-1] + (hd + 4,), np.int8)
    out[..., :hd] = q
    out[..., hd:] = scale.view(np.int8).reshape(x.shape[:-1] + (4,))
    return out


def dequantize_kv_rows(rows: np.ndarray) -> np.ndarray:
    """int8 rows [..., hd + 4] -> float32 [..., hd] (the values times their scale)."""
    scale = np.ascontiguousarray(rows[..., -4:]).view(np.float32)  # [..., 1]
    return rows[..., :-4].astype(np.float32) * scale


def kv_write(buf: np.ndarray, pos: int, x: np.ndarray) -> None:
    """Writes x [kv_heads, n, hd] at positions pos..pos+n-1 of one layer's cache buf [kv_heads, max_ctx, row]."""
    n = x.shape[1]
    buf[:, pos:pos + n] = quantize_kv_rows(x) if buf.dtype == np.int8 else x


def kv_read(buf: np.ndarray, t0: int, t1: int) -> np.ndarray:
    """Positions t0..t1-1 of one layer's cache buf [kv_heads, max_ctx, row] as float32 [kv_heads, t, hd]."""
    part = buf[:, t0:t1]
    if buf.dtype == np.int8:
        return dequantize_kv_rows(part)
    return part if part.dtype == np.float32 else part.astype(np.float32)


class ContextOverflowError(ValueError):
    """Raised when a sequence would not fit in the context."""


class CacheIndex:
    """Which positions of a static cache are filled and with which token ids (no buffers): the
    bookkeeping KVCache and backends that keep K/V elsewhere (OpenVINO state) share."""

    def __init__(self, max_ctx: int):
        if max_ctx < 1:
            raise ValueError(f"max context must be >= 1, got {max_ctx}")
        self.max_ctx = max_ctx
        self.length = 0
        self.tokens: list[int] = []  # the ids whose K/V are in positions 0..length-1

    def reset(self) -> None:
        """Forgets the content (the buffers stay allocated)."""
        self.length = 0
        self.tokens = []

    def truncate(self, n: int) -> None:
        """Keeps only the first n positions."""
        n = max(0, min(n, self.length))
        self.length = n
        del self.tokens[n:]

    def check_room(self, n_new: int) -> None:
        if self.length + n_new > self.max_ctx:
            raise ContextOverflowError(
                f"{self.length + n_new} tokens do not fit in the context of {self.max_ctx} tokens "
                f"({self.length} cached + {n_new} new); shorten the prompt or raise max_context")

    def common_prefix(self, ids: list[int]) -> int:
        """How many leading ids of `ids` are already cached."""
        n = 0
        for a, b in zip(self.tokens, ids):
            if a != b:
                break
            n += 1
        return n


def lazy_zeros(shape, dtype, huge: bool = False) -> np.ndarray:
    """Zeros in an anonymous mapping whose pages are backed only once written. huge: on transparent huge
    pages (where the kernel has them; a no-op elsewhere), for a buffer that is used whole soon. Else kept off
    them: numpy's np.zeros asks for huge pages on large arrays (madvise), and the first write at position 0 of
    each (layer, kv head) run of max_ctx rows then faulted in 2 MiB: the whole cache was resident after one
    token (SmolLM2-135M at its 8192 positions: RSS 0.41 GB against 0.24 at 512)."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if nbytes == 0:
        return np.zeros(shape, dtype)
    if huge:
        # 2 MiB aligned at both ends: a mapping at mmap's own (4 KiB) alignment got huge pages only in its aligned
        # interior (a bitnet-2b cache of 7.7 MB: 4 MB of its 6.5 MB resident on huge pages)
        return hugepage_buffer(nbytes).view(dtype).reshape(shape)
    # private: mmap(-1)'s default is a shared mapping, shmem, which takes huge pages only where the kernel's
    # shmem_enabled allows (here: never)
    m = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(m, "madvise") and hasattr(mmap, "MADV_NOHUGEPAGE"):
        m.madvise(mmap.MADV_NOHUGEPAGE)
    return np.frombuffer(m, dtype).reshape(shape)


def _check_dtype(dtype) -> np.dtype:
    dtype = np.dtype(dtype)
    if dtype not in (np.dtype(np.float32), np.dtype(np.float16), np.dtype(np.int8)):
        raise ValueError(f"the KV cache is float32, float16 or int8, not {dtype}")
    return dtype


class KVCache(CacheIndex):
    """A model's cache: capacity positions allocated (KV_START, then doubled as needed, up to max_ctx)."""

    def __init__(self, n_layers: int, n_kv_heads: int, head_dim: int, max_ctx: int, dtype=np.float32):
        super().__init__(max_ctx)
        self.dtype = _check_dtype(dtype)
        self._dims = (n_layers, n_kv_heads, kv_row(self.dtype, head_dim))
        self._allocate(min(max_ctx, KV_START))

    def _allocate(self, capacity: int) -> None:
        layers, kv, row = self._dims
        self.k = lazy_zeros((layers, kv, capacity, row), self.dtype, huge=True)  # [layers, kv_heads, capacity, row]
        self.v = lazy_zeros((layers, kv, capacity, row), self.dtype, huge=True)

    @property
    def capacity(self) -> int:
        """Positions allocated: each (layer, kv head) run of rows is this long."""
        return int(self.k.shape[2])

    def grow(self, n: int) -> bool:
        """Makes room for positions 0..n-1 (n <= max_ctx; check_room first): doubles the capacity as often as
        needed (up to max_ctx), the filled positions copied. True when the arrays were replaced: views of the
        old ones (the model's layers, its native step) must be taken again."""
        if n <= self.capacity:
            return False
        if n > self.max_ctx:
            raise ContextOverflowError(f"{n} positions do not fit in the context of {self.max_ctx} tokens")
        cap = self.capacity
        while cap < n:
            cap *= 2
        old_k, old_v, t = self.k, self.v, self.length
        self._allocate(min(cap, self.max_ctx))
        self.k[:, :, :t] = old_k[:, :, :t]
        self.v[:, :, :t] = old_v[:, :, :t]
        return True

    @classmethod
    def over(cls, k: np.ndarray, v: np.ndarray) -> "KVCache":
        """A cache over existing buffers k, v: [layers, kv_heads, max_ctx, head_dim] (e.g. one slot of a
        SlotKVCache), never grown; nothing is allocated."""
        c = cls.__new__(cls)
        c.k, c.v = k, v
        c.dtype = k.dtype
        c.max_ctx = int(k.shape[2])
        c.length = 0
        c.tokens = []
        return c

    @property
    def nbytes(self) -> int:
        """Bytes allocated (the capacity's)."""
        return int(self.k.nbytes + self.v.nbytes)

    @property
    def used_bytes(self) -> int:
        """Bytes of the filled part (what attention reads)."""
        return int(self.nbytes * self.length // self.capacity)


class SlotKVCache:
    """The multi-slot static cache of batched decoding: one slot per sequence, allocated once.

        k, v: [layers, slots, kv_heads, max_ctx, row]; slot(i) is a KVCache over k[:, i], v[:, i]
        (row: head_dim, or head_dim + 4 for int8, as in KVCache)

    Each layer's slice k[l, s] is contiguous, so the native batched step reaches slot s of layer l at a
    fixed stride (k.strides[1]) from slot 0. Allocated whole at max_ctx, on 4 KiB pages: memory grows with
    what is written (lazy_zeros).
    """

    def __init__(self, n_slots: int, n_layers: int, n_kv_heads: int, head_dim: int, max_ctx: int,
                 dtype=np.float32):
        if n_slots < 1:
            raise ValueError(f"the cache needs at least one slot, got {n_slots}")
        if max_ctx < 1:
            raise ValueError(f"max context must be >= 1, got {max_ctx}")
        dtype = _check_dtype(dtype)
        shape = (n_layers, n_slots, n_kv_heads, max_ctx, kv_row(dtype, head_dim))
        self.k = lazy_zeros(shape, dtype)
        self.v = lazy_zeros(shape, dtype)
        self.max_ctx = max_ctx
        self.slots = [KVCache.over(self.k[:, i], self.v[:, i]) for i in range(n_slots)]

    def __len__(self) -> int:
        return len(self.slots)

    def slot(self, i: int) -> KVCache:
        return self.slots[i]

    @property
    def slot_stride(self) -> int:
        """Elements from slot s to slot s+1 within one layer."""
        return self.k.strides[1] // self.k.itemsize

    @property
    def nbytes(self) -> int:
        return int(self.k.nbytes + self.v.nbytes)
