"""int4: 4-bit codes with per-group scales — asymmetric (a, min: llama.cpp's Q4_1 idea) by default,
or symmetric (w = a * (c - 7.5)). 4 bits per weight + 32 (or 16) bits per group of 32 (default)."""
from __future__ import annotations

import numpy as np

from lowbit.formats.base import check_weight
from lowbit.formats.intcodes import (METHOD_AFFINE, IntCodeWeight, as_source, group_view, padded_k, quantize_native,
                                     resolve_group)

DEFAULT_GROUP = 32  # llama.cpp's Q4_0/Q4_1 block: a Q4_1 GGUF converts to int4 without loss of its grid
RATIOS = np.linspace(0.5, 1.0, 11)  # clipping ratios fit_affine tries, in order (the first best wins)


def fit_affine(wg: np.ndarray, levels: int, symmetric: bool, search: bool = True):
    """Per-group (a, b) for codes 0..levels-1 minimizing squared error over a few clipping ratios.

    wg: [M, G, g]. Returns a, b: float32 [M, G] (rounded through float16, as stored) and codes [M, G, g].
    """
    ratios = RATIOS if search else np.array([1.0])
    best_err = best_a = best_b = best_c = None
    # + 0: a zero min / max is +0 whatever order the reduction met -0 and +0 in (the native one agrees)
    lo, hi = wg.min(axis=2) + np.float32(0), wg.max(axis=2) + np.float32(0)
    amax = np.maximum(np.abs(lo), np.abs(hi))
    for r in ratios:
        if symmetric:
            a = amax * r / ((levels - 1) / 2.0)
            b = -a * ((levels - 1) / 2.0)
        else:
            a = (hi - lo) * r / (levels - 1)
            b = lo * r
        a = a.astype(np.float16).astype(np.float32)
        b = b.astype(np.float16).astype(np.float32)
        inv = np.divide(1.0, a, out=np.zeros_like(a), where=a > 0)
        c = np.clip(np.rint((wg - b[:, :, None]) * inv[:, :, None]), 0, levels - 1)
        err = ((c * a[:, :, None] + b[:, :, None] - wg) ** 2).sum(axis=2)
        if best_err is None:
            best_err, best_a, best_b, best_c = err, a, b, c
        else:
            better = err < best_err
            best_err = np.where(better, err, best_err)
            best_a = np.where(better, a, best_a)
            best_b = np.where(better, b, best_b)
            best_c = np.where(better[:, :, None], c, best_c)
    return best_a, best_b, best_c.astype(np.uint8)


class _AffineGroupWeight(IntCodeWeight):
    """Codes 0..2**bits-1 with per-group (a, b), asymmetric by default."""

    default_group = DEFAULT_GROUP

    @classmethod
    def quantize(cls, w, group_size: int | None = -1, symmetric: bool = False, **options):
        """w: float32 / float16 [M, K] or SourceRows; native, bit-identical to quantize_reference."""
        src = as_source(w)
        group = resolve_group(cls.default_group if group_size == -1 else group_size, src.shape[1])
        if symmetric:
            return quantize_native(cls, src, METHOD_AFFINE, group, symmetric=True, ratios=RATIOS,
                                   meta={"symmetric": True})
        return quantize_native(cls, src, METHOD_AFFINE, group, offsets=True, ratios=RATIOS)

    @classmethod
    def quantize_reference(cls, w, group_size: int | None = -1, symmetric: bool = False, **options):
        w = check_weight(w)
        m, k = w.shape
        group = resolve_group(cls.default_group if group_size == -1 else group_size, k)
        a, b, c = fit_affine(group_view(w, group), 1 << cls.bits, symmetric)
        codes = c.reshape(m, -1)[:, :k]
        if symmetric:
            return cls.from_codes(codes, a, None, group=group, symmetric=True)
        return cls.from_codes(codes, a, b, group=group)

    @property
    def zc(self):  # symmetric variants store no offsets: w = a * (c - zc), zc the middle code unless meta says
        if self.offset is not None:
            return None
        return float(self.meta_extra.get("zero_code", ((1 << self.bits) - 1) / 2.0))


class Int4Weight(_AffineGroupWeight):
    format = "int4"
    description = "4-bit, per-group scale and offset (symmetric: scale only)"

    @classmethod
    def from_gguf_q4(cls, qtype: str, blocks: np.ndarray, m: int, k: int, rows=None, where: str = "GGUF tensor"):
        """llama.cpp's Q4_1 (w = d * q + m) or Q4_0 (w = d * (q - 8)) blocks of 32 [M * K / 32 blocks] as int4 with
        the file's own codes and float16 scales, nothing fitted again: Q4_1 with d, m as scale and offset (5 bits a
        weight), Q4_0 symmetric with zero code 8 (4.5 bits, as the file). rows: optional int64 [M], the source row
        of output row m (GGUF's Q/K un-permutation)."""
        head = {"Q4_0": 2, "Q4_1": 4}[qtype]
        b = np.ascontiguousarray(blocks).view(np.uint8).reshape(m, k // 32, head + 16)
        if rows is not None:
            b = b[np.asarray(rows)]
        d = np.ascontiguousarray(b[..., 0:2]).view(np.float16)[..., 0]
        off = np.ascontiguousarray(b[..., 2:4]).view(np.float16)[..., 0] if qtype == "Q4_1" else None
        if not np.isfinite(d).all() or (off is not None and not np.isfinite(off).all()):
            raise ValueError(f"{where} has NaN or Inf block scales")
        qs = b[..., head:]
        codes = np.concatenate([qs & 15, qs >> 4], axis=-1).reshape(m, k)  # x[j] low nibble, x[j + 16] high
        g = -(-padded_k(k) // 32)

        def padded(x):  # groups past K (Kp > K) meet zero activations: any scale holds them
            return np.pad(x.astype(np.float32), ((0, 0), (0, g - x.shape[1])))
        if off is None:
            return cls.from_codes(codes, padded(d), None, group=32, symmetric=True, zero_code=8.0, source=qtype)
        return cls.from_codes(codes, padded(d), padded(off), group=32, source=qtype)
    table_values = "16 levels, asymmetric (scale + offset) or symmetric"
    table_scales = "per group of 32"
    bits = 4
