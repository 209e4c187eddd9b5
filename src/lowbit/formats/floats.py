"""Float weights: f32 and bf16 (the 16-bit baseline every speedup is measured against).

Layout: row-major [M, K]; bf16 is stored as uint16 (the high half of the float32 bits). The kernel
widens bf16 to f32 in registers (shift left 16) and multiplies with float32 activations, so the
activations are never rounded.
"""
from __future__ import annotations

import numpy as np

from lowbit import _native
from lowbit.formats.base import Activations, PackedWeight, check_weight


def f32_to_bf16_bits(w: np.ndarray) -> np.ndarray:
    """Round-to-nearest-even float32 -> bf16, as uint16 (native, on the thread pool; bit-identical to
    f32_to_bf16_bits_reference)."""
    w = np.ascontiguousarray(w, np.float32)
    out = np.empty(w.shape, np.uint16)
    _native.f32_to_bf16(w, out.reshape(-1))
    return out


def f32_to_bf16_bits_reference(w: np.ndarray) -> np.ndarray:
    """The numpy reference of f32_to_bf16_bits."""
    u = np.ascontiguousarray(w, np.float32).view(np.uint32)
    rounded = u + (np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))
    return (rounded >> np.uint32(16)).astype(np.uint16)


def bf16_bits_to_f32(b: np.ndarray) -> np.ndarray:
    return (b.astype(np.uint32) << np.uint32(16)).view(np.float32)


class _FloatWeight(PackedWeight):
    def __init__(self, w: np.ndarray):
        if w.ndim != 2:
            raise ValueError(f"{self.format}: weight must be [M, K]")
        self.w = w
        self.shape = (int(w.shape[0]), int(w.shape[1]))

    def _matmul(self, acts: Activations) -> np.ndarray:
        y = np.empty((acts.shape[0], self.shape[0]), np.float32)
        _native.gemm_float(self.w, acts.x, y)
        return y

    def state(self):
        return {"format": self.format, "M": self.shape[0], "K": self.shape[1]}, {"weight": self.w}

    @classmethod
    def from_state(cls, meta, tensors):
        w = tensors["weight"]
        if w.shape != (meta["M"], meta["K"]):
            raise ValueError(f"{cls.format}: weight has shape {list(w.shape)}, the metadata says [{meta['M']}, {meta['K']}]")
        return cls(w)


class F32Weight(_FloatWeight):
    format = "f32"
    description = "float32, row-major"
    table_values = "float32"
    table_scales = "—"

    def __init__(self, w):
        if w.dtype != np.float32:
            raise ValueError(f"f32: weight must be float32, got {w.dtype}")
        super().__init__(w)

    @classmethod
    def quantize(cls, w, **options):
        return cls(check_weight(w).copy())

    def dequantize(self):
        return np.asarray(self.w, np.float32)


class BF16Weight(_FloatWeight):
    format = "bf16"
    description = "bfloat16 (stored as uint16), row-major"
    table_values = "bfloat16 (the 16-bit baseline of every speedup)"
    table_scales = "—"

    def __init__(self, w):
        if w.dtype != np.uint16:
            raise ValueError("bf16: weight bits must be uint16")
        super().__init__(w)

    @classmethod
    def quantize(cls, w, **options):
        return cls(f32_to_bf16_bits(check_weight(w)))

    def dequantize(self):
        return bf16_bits_to_f32(self.w)
