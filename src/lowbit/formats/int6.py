"""int6: 64 levels per group of 32, asymmetric (a*c + b, float16 a and b), stored as two planes that the
integer-code kernels already read: the codes' low 4 bits in int4's layout (with a, b) and their high 2 bits in
int2's (with the same a and no offset). One quantization of the input feeds both, the high plane with its
activation scales times 16 (exact), and

    y = sum_g sx_g (a_g * lo.q + b_g * sum(q)) + sum_g 16 sx_g (a_g * hi.q) = sum_g sx_g (a_g * (lo + 16 hi).q + b_g * sum(q))

is the 6-bit product. 7 bits per weight (6 of codes, 1 of scales and offsets) against int8's 8.5: the lm_head format
that stays within 1 % of bf16's perplexity (docs/lm_head.md). The native step runs the planes a few row blocks at a
time (linear.cpp, IntJob::has_hi), so the high plane finds the shared scales in cache."""
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


class Int6Weight(PackedWeight):
    format = "int6"
    description = "6-bit, per-group scale and offset, as a 4-bit and a 2-bit plane"
    table_values = "64 levels, asymmetric (scale + offset)"
    table_scales = "per group of 32"
    bits = 6
    default_group = 32

    def __init__(self, shape, group, codes, codes_hi, scale, offset, meta_extra=None):
        if offset is None:
            raise ValueError("int6: offsets are required")
        self.lo = _LowPlane(shape, group, codes, scale, offset)
        self.hi = _HighPlane(shape, group, codes_hi, scale)  # the same scales (16 x on the activations' side)
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
        y, yh = (np.empty((q.shape[0], self.shape[0]), np.float32) for _ in range(2))
        _native.gemm_int(*self.lo.native_args()[:5], self.shape[0], self.kp, self.group, q, sx, sq, y)
        _native.gemm_int(*self.hi.native_args()[:5], self.shape[0], self.kp, self.group, q, sx * np.float32(HI_SCALE), sq, yh)
        return y + yh

    def state(self):
        meta = {"format": self.format, "bits": 6, "M": self.shape[0], "K": self.shape[1], "group": self.group,
                **self.meta_extra}
        return meta, {"codes": self.lo.codes, "codes_hi": self.hi.codes, "scale": self.lo.scale,
                      "offset": self.lo.offset}

    @classmethod
    def from_state(cls, meta, tensors):
        extra = {k: v for k, v in meta.items() if k not in ("format", "bits", "M", "K", "group")}
        return cls((meta["M"], meta["K"]), meta["group"], tensors["codes"], tensors["codes_hi"], tensors["scale"],
                   tensors["offset"], extra)
