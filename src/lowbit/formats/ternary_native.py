"""Native ternarization (kernels/quantize.cpp) for ternary and tq1: the same scales and codes as
ternary.ternarize (the numpy reference, method "absmean"), bit for bit, without a float32 copy of the source.

Pass 1 (C++, on the pool): per row and scale unit, sum|w| (float64), max|w| and the smallest nonzero |w|.
Here: the scale per unit from those, exactly as ternarize decides it (ternary-valued units keep s; a
"tensor" request on a matrix that is ternary-valued per row keeps each row's s).
Pass 2 (C++): t = clip(rint(w / a), -1, 1), packed as 2-bit codes or 5 trits per byte, and the scales.
"""
from __future__ import annotations

import numpy as np

from lowbit import _native
from lowbit.formats.base import SourceRows
from lowbit.formats.intcodes import ROW_BLOCK

EPS = 1e-5  # ternary.EPS
F16_TINY = np.float32(2.0 ** -24)  # ternary.F16_TINY


def _unit_scales(sums: np.ndarray, mx: np.ndarray, mnz: np.ndarray, counts) -> np.ndarray:
    """ternary._unit_scales (absmean) from the statistics: float32, s kept on ternary-valued units."""
    a = np.maximum(sums / counts, EPS).astype(np.float32)
    exact = (mx > 0) & (mnz == mx)
    return np.where(exact, mx, a).astype(np.float32)


def ternary_scales(src: SourceRows, scale: str, group: int, kp: int) -> tuple[np.ndarray, str]:
    """(a16 float32 [M, G] as stored, the scope used): ternarize's scales for method absmean."""
    m, k = src.shape
    if scale not in ("tensor", "row", "group"):
        raise ValueError(f"ternary scale must be 'tensor', 'row' or 'group', got {scale!r}")
    g = -(-kp // group) if scale == "group" else 1
    unit = group if scale == "group" else k
    sums, mx, mnz = np.empty(m * g, np.float64), np.empty(m * g, np.float32), np.empty(m * g, np.float32)
    _native.ternary_stats(src.data, src.kind_id, m, k, src.rows, unit, sums, mx, mnz)
    sums, mx, mnz = sums.reshape(m, g), mx.reshape(m, g), mnz.reshape(m, g)
    if scale == "tensor":
        a = np.full((m, 1), _unit_scales(sums.sum(), mx.max(), mnz.min(), m * k), np.float32)
        if not (mx.max() > 0 and mnz.min() == mx.max()):
            row_exact = (mx[:, 0] > 0) & (mnz[:, 0] == mx[:, 0])
            nonzero = mx[:, 0] > 0
            if nonzero.any() and np.all(row_exact | ~nonzero):  # ternary per row: keep each row's s
                a = np.where(nonzero, mx[:, 0], mx[:, 0].max())[:, None].astype(np.float32)
                scale = "row"
    elif scale == "row":
        a = _unit_scales(sums, mx, mnz, k)
    else:
        counts = np.minimum(group, k - np.arange(g) * group).clip(min=1)
        a = _unit_scales(sums, mx, mnz, counts)
    with np.errstate(over="ignore"):
        a16 = a.astype(np.float16).astype(np.float32)
    if not np.isfinite(a16).all():
        raise ValueError("ternary: a scale exceeds float16's range (|w| up to 65504 is supported)")
    return np.ascontiguousarray(np.maximum(a16, F16_TINY)), scale  # as ternary.ternarize: never 0


def ternary_pack(src: SourceRows, a16: np.ndarray, group: int, kp: int, tq1: bool) -> tuple[np.ndarray, np.ndarray]:
    """(codes uint8 flat, scale float16 flat) of src with scales a16 [M, G] (G = ceil(kp / group))."""
    m, k = src.shape
    mb, g = -(-m // ROW_BLOCK), a16.shape[1]
    codes = np.empty(mb * (kp // 20) * 256 if tq1 else mb * kp * ROW_BLOCK // 4, np.uint8)
    scale = np.empty(mb * g * ROW_BLOCK, np.float16)
    _native.ternary_pack(src.data, src.kind_id, m, k, src.rows, a16.reshape(-1), group, tq1, codes,
                         scale.view(np.uint16))
    return codes, scale


def quantize_absmean(src: SourceRows, scale: str, group_size, padded_k, resolve_group, tq1: bool):
    """The native absmean path shared by TernaryWeight and TQ1Weight (each passes its own K padding and
    group rule): -> (group, codes, scales, scale_mode)."""
    if group_size:
        scale = "group"
    kp = padded_k(src.shape[1])
    group = resolve_group(group_size if scale == "group" else None, src.shape[1])
    a16, scale = ternary_scales(src, scale, group, kp)
    codes, scales = ternary_pack(src, a16, group, kp, tq1=tq1)
    return group, codes, scales, scale
