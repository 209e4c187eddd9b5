"""int8: symmetric weights in blocks of 32 input channels (llama.cpp's Q8_0), w = a * (c - 128),
c = round(w/a) + 128, a = absmax/127 per (row, block); group_size=None keeps one scale per row.

The default lm_head format: 8 bits per weight plus one float16 scale per block (8.5 bits at blocks of 32).
Per-row scales cost SmolLM2-135M +5 % perplexity on real text; blocks of 32 keep int8 "no loss"."""
from __future__ import annotations

import numpy as np

from lowbit.formats.base import check_weight
from lowbit.formats.intcodes import (METHOD_INT8, IntCodeWeight, as_source, group_view, padded_k, quantize_native,
                                     resolve_group)

DEFAULT_GROUP = 32  # Q8_0's block


class Int8Weight(IntCodeWeight):
    format = "int8"
    description = "8-bit symmetric, one scale per block of 32 (Q8_0-like; or per row)"
    table_values = "symmetric int8"
    table_scales = "per block of 32 (or per row)"
    bits = 8
    zc = 128.0

    @classmethod
    def from_gguf_q8_0(cls, blocks: np.ndarray, m: int, k: int, rows=None, where: str = "GGUF tensor"):
        """llama.cpp's Q8_0 blocks of 32 (a float16 d, 32 int8 q: w = d * q) as int8 with the file's own codes
        (c = q + 128) and scales, nothing fitted again. rows: optional int64 [M], the source row of output row m."""
        b = np.ascontiguousarray(blocks).view(np.uint8).reshape(m, k // 32, 34)
        if rows is not None:
            b = b[np.asarray(rows)]
        d = np.ascontiguousarray(b[..., 0:2]).view(np.float16)[..., 0]
        if not np.isfinite(d).all():
            raise ValueError(f"{where} has NaN or Inf block scales")
        codes = (b[..., 2:].view(np.int8).astype(np.int16) + 128).astype(np.uint8).reshape(m, k)
        g = -(-padded_k(k) // 32)
        a = np.pad(d.astype(np.float32), ((0, 0), (0, g - d.shape[1])))  # groups past K meet zero activations
        return cls.from_codes(codes, a, None, group=32, source="Q8_0")

    @classmethod
    def quantize(cls, w, group_size: int | None = -1, **options):
        """group_size: -1 = blocks of 32 (default), None = one scale per row, else a multiple of 32.
        w: float32 / float16 [M, K] or SourceRows; native (quantize_reference is the numpy twin)."""
        src = as_source(w)
        group = resolve_group(DEFAULT_GROUP if group_size == -1 else group_size, src.shape[1])
        return quantize_native(cls, src, METHOD_INT8, group)

    @classmethod
    def quantize_reference(cls, w, group_size: int | None = -1, **options):
        w = check_weight(w)
        m, k = w.shape
        group = resolve_group(DEFAULT_GROUP if group_size == -1 else group_size, k)
        wg = group_view(w, group)
        a = (np.abs(wg).max(axis=2) / 127.0).astype(np.float16).astype(np.float32)
        inv = np.divide(1.0, a, out=np.zeros_like(a), where=a > 0)
        c = np.clip(np.rint(wg * inv[:, :, None]), -127, 127) + 128
        codes = c.reshape(m, -1)[:, :k].astype(np.uint8)
        return cls.from_codes(codes, a, group=group)
