"""int6: 64 levels per group of 32, asymmetric (a*c + b, float16 a and b), stored as two planes that the
integer-code kernels already read: the codes' low 4 bits in int4's layout (with a, b) and their high 2 bits in
int2's (with 16a and no offset). One quantization of the input feeds both, and

    y = sum_g sx_g (a_g * lo.q + b_g * sum(q)) + sum_g sx_g (16 a_g * hi.q) = sum_g sx_g (a_g * (lo + 16 hi).q + b_g * sum(q))

is the 6-bit product. 7.5 bits per weight are read (6 of codes, 1.5 of scales: 16a is its own float16 array),
against int8's 8.5: the lm_head format that stays within 1 % of bf16's perplexity (docs/lm_head.md)."""
from __future__ import annotations

import numpy as np

from lowbit import _native
from lowbit.formats.base import Activations, PackedWeight, check_weight
from lowbit.formats.int2 import Int2Weight
from lowbit.formats.int4 import RATIOS, Int4Weight, fit_affine
from lowbit.formats.intcodes import (METHOD_AFFINE, ROW_BLOCK, as_source, group_view, pack_codes, pack_groups,
                                     padded_k, resolve_group)

HI_SCALE = 16.0  # the high plane's weight: code = lo + 16 hi


class _LowPlane(Int4Weight):
    format = "int6"


class _HighPlane(Int2Weight):
    format = "int6"
    zc = 0.0  # no offset: the low plane carries b


def high_scales(scale: np.ndarray) -> np.ndarray:
    """float16 16 * a, exact (a power of two times a float16) unless it overflows, which is refused."""
    with np.errstate(over="ignore"):
        s16 = (scale.astype(np.float32) * np.float32(HI_SCALE)).astype(np.float16)
    if not np.all(np.isfinite(s16[np.isfinite(scale)])):
        raise ValueError("int6: a group scale is too large for float16 once multiplied by 16 (|a| > 4094)")
    return s16


class Int6Weight(PackedWeight):
    format = "int6"
    description = "6-bit, per-group scale and offset, as a 4-bit and a 2-bit plane"
    table_values = "64 levels, asymmetric (scale + offset)"
    table_scales = "per group of 32"
    bits = 6
    default_group = 32

    def __init__(self, shape, group, codes, codes_hi, scale, offset, scale_hi=None, meta_extra=None):
        if offset is None:
            raise ValueError("int6: offsets are required")
        self.lo = _LowPlane(shape, group, codes, scale, offset)
        self.hi = _HighPlane(shape, group, codes_hi, high_scales(scale) if scale_hi is None else scale_hi)
        if self.hi.scale.shape != scale.shape or self.hi.scale.dtype != np.float16:
            raise ValueError("int6: scale_hi must be float16 shaped like the scales")
        self.shape, self.group, self.kp = self.lo.shape, self.lo.group, self.lo.kp
        self.meta_extra = dict(meta_extra or {})

    @classmethod
    def quantize(cls, w, group_size: int | None = -1, **options) -> "Int6Weight":
        """w: float32 / float16 [M, K] or SourceRows; native (kernels/quantize.cpp), bit-identical to
        quantize_reference."""
        src = as_source(w)
        m, k = src.shape
        group = resolve_group(cls.default_group if group_size == -1 else group_size, k)
        kp, mb = padded_k(k), -(-m // ROW_BLOCK)
        g = -(-kp // group)
        codes = np.empty(mb * kp * ROW_BLOCK * 4 // 8, np.uint8)
        codes_hi = np.empty(mb * kp * ROW_BLOCK * 2 // 8, np.uint8)
        scale = np.empty(mb * g * ROW_BLOCK, np.float16)
        offset = np.empty_like(scale)
        _native.quantize_int(src.data, src.kind_id, m, k, src.rows, METHOD_AFFINE, 6, group, False,
                             np.ascontiguousarray(RATIOS, np.float64), codes, scale.view(np.uint16),
                             offset.view(np.uint16), codes_hi)
        return cls((m, k), group, codes, codes_hi, scale, offset)

    @classmethod
    def quantize_reference(cls, w, group_size: int | None = -1, **options) -> "Int6Weight":
        w = check_weight(w)
        m, k = w.shape
        group = resolve_group(cls.default_group if group_size == -1 else group_size, k)
        a, b, c = fit_affine(group_view(w, group), 64, False)
        return cls.from_codes(c.reshape(m, -1)[:, :k], a, b, group)

    @classmethod
    def from_codes(cls, codes: np.ndarray, a: np.ndarray, b: np.ndarray, group: int | None = None) -> "Int6Weight":
        """Codes 0..63 [M, K] and per-(row, group) a, b [M, G]."""
        m, k = codes.shape
        group = resolve_group(group, k)
        g = -(-padded_k(k) // group)
        if a.shape != (m, g) or b.shape != (m, g):
            raise ValueError(f"int6: scales and offsets must be [M={m}, G={g}], got {a.shape} and {b.shape}")
        if codes.size and int(codes.max()) >= 64:
            raise ValueError("int6: codes must be < 64")
        c = codes.astype(np.uint8)
        return cls((m, k), group, pack_codes(c & 15, 4), pack_codes(c >> 4, 2), pack_groups(a), pack_groups(b))

    def affine(self) -> tuple[np.ndarray, np.ndarray]:
        return self.lo.affine()

    def unpacked_codes(self) -> np.ndarray:
        return self.lo.unpacked_codes() + np.uint8(HI_SCALE) * self.hi.unpacked_codes()

    def dequantize(self) -> np.ndarray:
        a, b = self.affine()
        cols = np.arange(self.shape[1]) // self.group
        return self.unpacked_codes().astype(np.float32) * a[:, cols] + b[:, cols]

    def _matmul(self, acts: Activations) -> np.ndarray:
        q, sx, sq = acts.int8(self.kp, self.group)
        ys = [np.empty((q.shape[0], self.shape[0]), np.float32) for _ in range(2)]
        _native.gemm_int_multi([self.lo.native_args(), self.hi.native_args()], self.kp, self.group, q, sx, sq, ys)
        return ys[0] + ys[1]

    def state(self):
        meta = {"format": self.format, "bits": 6, "M": self.shape[0], "K": self.shape[1], "group": self.group,
                **self.meta_extra}
        return meta, {"codes": self.lo.codes, "codes_hi": self.hi.codes, "scale": self.lo.scale,
                      "offset": self.lo.offset, "scale_hi": self.hi.scale}

    @classmethod
    def from_state(cls, meta, tensors):
        extra = {k: v for k, v in meta.items() if k not in ("format", "bits", "M", "K", "group")}
        return cls((meta["M"], meta["K"]), meta["group"], tensors["codes"], tensors["codes_hi"], tensors["scale"],
                   tensors["offset"], tensors.get("scale_hi"), extra)
