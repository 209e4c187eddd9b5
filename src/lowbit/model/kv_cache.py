"""The static KV cache (NITRO's fixed-size cache): allocated once at the maximum context.

    k, v: [layers, kv_heads, max_ctx, head_dim], float16 (the default for quantized models: half the bytes
          attention reads per token, as llama.cpp and bitnet.cpp keep it) or float32 (the f32 reference path)

Positions 0..length-1 are filled; attention reads only that part (k[l, :, :length]). np.zeros maps
the buffer lazily, so memory grows with the filled length, not with max_ctx. `tokens` remembers which
ids fill the cache, so a new prompt that extends the old one (multi-turn chat) re-uses the prefix.
"""
from __future__ import annotations

import numpy as np


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


class KVCache(CacheIndex):
    def __init__(self, n_layers: int, n_kv_heads: int, head_dim: int, max_ctx: int, dtype=np.float32):
        super().__init__(max_ctx)
        dtype = np.dtype(dtype)
        if dtype not in (np.dtype(np.float32), np.dtype(np.float16)):
            raise ValueError(f"the KV cache is float32 or float16, not {dtype}")
        shape = (n_layers, n_kv_heads, max_ctx, head_dim)
        self.k = np.zeros(shape, dtype)  # k: [layers, kv_heads, max_ctx, head_dim]
        self.v = np.zeros(shape, dtype)  # v: [layers, kv_heads, max_ctx, head_dim]

    @classmethod
    def over(cls, k: np.ndarray, v: np.ndarray) -> "KVCache":
        """A cache over existing buffers k, v: [layers, kv_heads, max_ctx, head_dim] (e.g. one slot of a
        SlotKVCache); nothing is allocated."""
        c = cls.__new__(cls)
        c.k, c.v = k, v
        c.max_ctx = int(k.shape[2])
        c.length = 0
        c.tokens = []
        return c

    @property
    def nbytes(self) -> int:
        return int(self.k.nbytes + self.v.nbytes)

    @property
    def used_bytes(self) -> int:
        """Bytes of the filled part (what attention reads)."""
        return int(self.nbytes * self.length // self.max_ctx)


class SlotKVCache:
    """The multi-slot static cache of batched decoding: one slot per sequence, allocated once.

        k, v: [layers, slots, kv_heads, max_ctx, head_dim]; slot(i) is a KVCache over k[:, i], v[:, i]

    Each layer's slice k[l, s] is contiguous, so the native batched step reaches slot s of layer l at a
    fixed stride (k.strides[1]) from slot 0. Memory grows with what is written (np.zeros maps lazily).
    """

    def __init__(self, n_slots: int, n_layers: int, n_kv_heads: int, head_dim: int, max_ctx: int,
                 dtype=np.float32):
        if n_slots < 1:
            raise ValueError(f"the cache needs at least one slot, got {n_slots}")
        if max_ctx < 1:
            raise ValueError(f"max context must be >= 1, got {max_ctx}")
        dtype = np.dtype(dtype)
        if dtype not in (np.dtype(np.float32), np.dtype(np.float16)):
            raise ValueError(f"the KV cache is float32 or float16, not {dtype}")
        shape = (n_layers, n_slots, n_kv_heads, max_ctx, head_dim)
        self.k = np.zeros(shape, dtype)
        self.v = np.zeros(shape, dtype)
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
