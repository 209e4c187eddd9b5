"""ternary: {-1, 0, +1} x scale (BitNet b1.58), 2-bit codes c = t + 1, w = a * (c - 1).

Scale scope ("scale unit"): "tensor" (one scale for the whole matrix, the default), "row", or a group of
``group_size`` input channels. Per unit:
  * already ternary-valued input (every nonzero |w| equal: an F16/F32 export of a ternary model, a
    dequantized TQ2_0/I2_S tensor) keeps its s exactly: a = s, t = sign(w). In "tensor" scope a matrix
    that is ternary-valued per row (but not as a whole) keeps its per-row s (same layout, lossless).
  * otherwise method "absmean" (BitNet b1.58, the default): a = mean|W|; or "mse": the a minimizing
    ||W - a t||^2 (exact: over supports of the k largest |w|, a = mean of those k, best k).
  Then a is rounded to float16 (as stored) and t = clamp(round(W / a), -1, 1).
Already-ternary checkpoints (BitNet packed, TQ1_0/TQ2_0) enter losslessly through ``from_ternary``.
"""
from __future__ import annotations

import numpy as np

from lowbit.formats.base import check_weight
from lowbit.formats.intcodes import IntCodeWeight, as_source, padded_k, resolve_group

EPS = 1e-5
F16_TINY = np.float32(2.0 ** -24)  # the smallest positive float16: a stored scale is never 0 (w / a stays finite)
METHODS = ("absmean", "mse")


def exact_levels(absw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """absw: |w| [..., n] per unit (zero padding allowed) -> (is_ternary bool [...], s float32 [...]).

    A unit is ternary-valued when it has a nonzero and all its nonzero magnitudes are equal; s = that value."""
    mx = absw.max(axis=-1)
    mn = np.where(absw > 0, absw, np.inf).min(axis=-1)
    return (mx > 0) & (mn == mx), mx.astype(np.float32)


def mse_scale(absw: np.ndarray) -> np.ndarray:
    """absw: |w| [..., n] -> float32 [...]: the scale a minimizing ||w - a t||^2 over a and t in {-1,0,1}.

    For the support of the k largest |w| the best a is their mean and the error is ||w||^2 - S_k^2 / k
    (S_k their sum), so the best k maximizes S_k^2 / k. Zero padding never wins (it only lowers S_k^2/k)."""
    srt = -np.sort(-absw.astype(np.float64), axis=-1)
    s = np.cumsum(srt, axis=-1)
    k = np.arange(1, srt.shape[-1] + 1, dtype=np.float64)
    best = np.argmax(s * s / k, axis=-1)
    a = np.take_along_axis(s, best[..., None], axis=-1)[..., 0] / (best + 1)
    return np.maximum(a, EPS).astype(np.float32)


def _unit_scales(absw: np.ndarray, counts, method: str) -> np.ndarray:
    """absw [..., n] (zero-padded, `counts` real entries per unit) -> a float32 [...] by method, s kept exactly
    on ternary-valued units."""
    if method == "absmean":  # summed in float64, so any summation order gives the same float16 scale
        a = np.maximum(absw.sum(axis=-1, dtype=np.float64) / counts, EPS).astype(np.float32)
    elif method == "mse":
        a = mse_scale(absw)
    else:
        raise ValueError(f"ternary method must be one of {', '.join(METHODS)}, got {method!r}")
    exact, s = exact_levels(absw)
    return np.where(exact, s, a).astype(np.float32)


def ternarize(w: np.ndarray, scale: str, group: int, kp: int, method: str = "absmean") -> tuple[np.ndarray, np.ndarray, str]:
    """Ternarizes a checked float32 w [M, K] (shared by ternary and tq1); see the module docstring.

    scale: "tensor" | "row" | "group" (groups of `group` columns over K padded to kp). Returns t int8 [M, K]
    in {-1, 0, 1}, the scales a as stored (float16-rounded float32): [M, 1] for tensor/row, [M, G]
    (G = ceil(kp / group); groups past K get EPS) for group, and the scope actually used ("row" when a
    "tensor" request met a matrix that is ternary-valued per row only; its all-zero rows take the largest s)."""
    m, k = w.shape
    absw = np.abs(w)
    if scale == "tensor":
        a = np.full((m, 1), _unit_scales(absw.reshape(1, -1), m * k, method)[0], np.float32)
        exact, _ = exact_levels(absw.reshape(1, -1))
        if not exact[0]:
            row_exact, row_s = exact_levels(absw)
            nonzero = absw.max(axis=1) > 0
            if nonzero.any() and np.all(row_exact | ~nonzero):  # ternary per row: keep each row's s
                a = np.where(nonzero, row_s, row_s.max())[:, None].astype(np.float32)  # zero rows: largest s
                scale = "row"
    elif scale == "row":
        a = _unit_scales(absw, k, method)[:, None]
    elif scale == "group":
        g = -(-kp // group)
        wg = np.zeros((m, g * group), np.float32)
        wg[:, :k] = absw
        counts = np.minimum(group, k - np.arange(g) * group).clip(min=1)
        a = _unit_scales(wg.reshape(m, g, group), counts, method)
    else:
        raise ValueError(f"ternary scale must be 'tensor', 'row' or 'group', got {scale!r}")
    with np.errstate(over="ignore"):
        a16 = a.astype(np.float16).astype(np.float32)
    if not np.isfinite(a16).all():
        raise ValueError("ternary: a scale exceeds float16's range (|w| up to 65504 is supported)")
    a16 = np.maximum(a16, F16_TINY)  # a ternary-valued unit's own s below float16's range
    cols = np.arange(k) // group if a16.shape[1] > 1 else np.zeros(k, np.intp)
    t = np.clip(np.rint(w / a16[:, cols]), -1, 1)
    return t.astype(np.int8), a16, scale


def is_ternary_valued(w: np.ndarray) -> bool:
    """True when w [M, K] is exactly {-s, 0, +s}, with one s for the whole matrix or one per row."""
    absw = np.abs(w)
    exact, _ = exact_levels(absw.reshape(1, -1))
    if exact[0]:
        return True
    row_exact, _ = exact_levels(absw)
    return bool(np.all(row_exact | (absw.max(axis=1) == 0)))


def row_scales_if_uniform(t: np.ndarray, a: np.ndarray, group: int) -> np.ndarray | None:
    """t int8 [M, K], a [M, G] per group of `group` columns -> a [M, 1] when each row has one scale on every
    group where it has a nonzero (a TQ2_0 export of a per-tensor or per-row ternary model), else None."""
    m, k = t.shape
    g = a.shape[1]
    used = np.zeros((m, g), bool)
    nz = np.nonzero(t)
    used[nz[0], nz[1] // group] = True
    hi = np.where(used, a, -np.inf).max(axis=1)
    lo = np.where(used, a, np.inf).min(axis=1)
    empty = ~used.any(axis=1)
    if not np.all(empty | (hi == lo)):
        return None
    fill = hi.max() if not empty.all() else a.max()  # an all-zero row takes the largest s, as ternarize does
    return np.where(empty, fill, hi)[:, None].astype(np.float32)


class TernaryWeight(IntCodeWeight):
    format = "ternary"
    description = "1.58-bit {-1,0,+1} x absmean scale per tensor, row or group; 2-bit codes"
    table_values = "{-1, 0, +1} (BitNet b1.58), absmean scale"
    table_scales = "per tensor, row or group"
    bits = 2
    zc = 1.0

    @classmethod
    def quantize(cls, w, scale: str = "tensor", group_size: int | None = None, method: str = "absmean", **options):
        """scale: "tensor" | "row" (or group_size= a multiple of 32); method: "absmean" (BitNet) | "mse".
        w: float32 / float16 [M, K] or SourceRows; absmean runs natively (ternary_native.py), bit-identical
        to quantize_reference."""
        src = as_source(w)
        if method != "absmean":
            return cls.quantize_reference(src.float32(), scale, group_size, method)
        from lowbit.formats.ternary_native import quantize_absmean

        group, codes, scales, mode = quantize_absmean(src, scale, group_size, padded_k, resolve_group, tq1=False)
        return cls(src.shape, group, codes, scales, None, {"scale_mode": mode})

    @classmethod
    def quantize_reference(cls, w, scale: str = "tensor", group_size: int | None = None, method: str = "absmean",
                           **options):
        w = check_weight(w)
        if group_size:
            scale = "group"
        group = resolve_group(group_size if scale == "group" else None, w.shape[1])
        t, a16, scale = ternarize(w, scale, group, padded_k(w.shape[1]), method)
        return cls.from_ternary(t, a16, group=group, scale_mode=scale)

    @classmethod
    def from_ternary(cls, t: np.ndarray, a: np.ndarray, group: int | None = None, **meta) -> "TernaryWeight":
        """t: int8 [M, K] in {-1, 0, 1}; a: scales [M, G] (or [M, 1] / scalar for one per row / tensor)."""
        m, k = t.shape
        group = resolve_group(group, k)
        g = -(-padded_k(k) // group)
        a = np.broadcast_to(np.asarray(a, np.float32).reshape(-1, 1) if np.ndim(a) < 2 else np.asarray(a, np.float32), (m, g))
        if t.size and (t.min() < -1 or t.max() > 1):
            raise ValueError("ternary values must be in {-1, 0, 1}")
        meta.setdefault("scale_mode", "tensor" if np.all(a == a.flat[0]) else ("row" if g == 1 else "group"))
        return cls.from_codes((t + 1).astype(np.uint8), np.ascontiguousarray(a), group=group, **meta)
