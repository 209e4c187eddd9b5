"""binary: 1-bit, w = +-s with s = mean|w| per row (default) or per group; sign(0) = +1.
A group whose |w| are all equal (an already-binary matrix) keeps that s exactly. mean|w| (summed in float64)
is already the s minimizing ||w - s sign(w)||^2.

Stored as code c = (w >= 0) with a = 2s and zc = 0.5, so w = 2s*c - s exactly: the kernel's b term applies
the -s, which makes the 1-bit product exact (paper 000's 1-bit path has no such correction)."""
from __future__ import annotations

import numpy as np

from lowbit.formats.base import check_weight
from lowbit.formats.intcodes import METHOD_BINARY, IntCodeWeight, as_source, group_view, quantize_native, resolve_group


class BinaryWeight(IntCodeWeight):
    format = "binary"
    description = "1-bit +-scale, scale = mean|w| per row or group"
    table_values = "±scale, exact"
    table_scales = "per row or group"
    bits = 1
    zc = 0.5

    @classmethod
    def quantize(cls, w, group_size: int | None = None, **options):
        """w: float32 / float16 [M, K] or SourceRows; native, bit-identical to quantize_reference."""
        src = as_source(w)
        return quantize_native(cls, src, METHOD_BINARY, resolve_group(group_size, src.shape[1]))

    @classmethod
    def quantize_reference(cls, w, group_size: int | None = None, **options):
        w = check_weight(w)
        m, k = w.shape
        group = resolve_group(group_size, k)
        wg = group_view(w, group)
        counts = np.minimum(group, k - np.arange(wg.shape[1]) * group).clip(min=1)
        absw = np.abs(wg)
        s = absw.sum(axis=2, dtype=np.float64) / counts
        real = np.arange(wg.shape[1] * group).reshape(wg.shape[1], group) < k  # [G, group]: not padding
        exact = absw.max(axis=2) == np.where(real, absw, np.inf).min(axis=2)
        s = np.where(exact, absw.max(axis=2), s)
        codes = (w >= 0).astype(np.uint8)
        return cls.from_codes(codes, (2.0 * s).astype(np.float32), group=group)
