"""ternary: {-1, 0, +1} x scale (BitNet b1.58), 2-bit codes c = t + 1, w = a * (c - 1).

Scale scope: "tensor" (BitNet's absmean over the whole matrix, the default), "row", or a group of
``group_size`` input channels. Quantizing: a = mean|W| over the scope, t = clamp(round(W / a), -1, 1).
Already-ternary checkpoints (BitNet packed, TQ1_0/TQ2_0) enter losslessly through ``from_ternary``.
"""
from __future__ import annotations

import numpy as np

from lowbit.formats.base import check_weight
from lowbit.formats.intcodes import IntCodeWeight, padded_k, resolve_group

EPS = 1e-5


def ternarize(w: np.ndarray, scale: str, group: int, kp: int) -> tuple[np.ndarray, np.ndarray]:
    """Absmean ternarization of a checked float32 w [M, K] (shared by ternary and tq1).

    scale: "tensor" | "row" | "group" (groups of `group` columns over K padded to kp). Returns t int8 [M, K]
    in {-1, 0, 1} and the scales a as stored (float16-rounded float32): [M, 1] for tensor/row, [M, G]
    (G = ceil(kp / group); groups past K get EPS) for group. t = clamp(round(w / a), -1, 1)."""
    m, k = w.shape
    if scale == "tensor":
        a = np.full((m, 1), max(float(np.abs(w).mean()), EPS), np.float32)
    elif scale == "row":
        a = np.maximum(np.abs(w).mean(axis=1, keepdims=True), EPS)
    elif scale == "group":
        g = -(-kp // group)
        wg = np.zeros((m, g * group), np.float32)
        wg[:, :k] = w
        wg = wg.reshape(m, g, group)
        counts = np.minimum(group, k - np.arange(g) * group).clip(min=1)
        a = np.maximum(np.abs(wg).sum(axis=2) / counts, EPS)
    else:
        raise ValueError(f"ternary scale must be 'tensor', 'row' or 'group', got {scale!r}")
    a16 = a.astype(np.float16).astype(np.float32)
    cols = np.arange(k) // group
    t = np.clip(np.rint(w / a16[:, cols if a16.shape[1] > 1 else [0] * k]), -1, 1)
    return t.astype(np.int8), a16


class TernaryWeight(IntCodeWeight):
    format = "ternary"
    description = "1.58-bit {-1,0,+1} x absmean scale per tensor, row or group; 2-bit codes"
    table_values = "{-1, 0, +1} (BitNet b1.58), absmean scale"
    table_scales = "per tensor, row or group"
    bits = 2
    zc = 1.0

    @classmethod
    def quantize(cls, w, scale: str = "tensor", group_size: int | None = None, **options):
        w = check_weight(w)
        if group_size:
            scale = "group"
        group = resolve_group(group_size if scale == "group" else None, w.shape[1])
        t, a16 = ternarize(w, scale, group, padded_k(w.shape[1]))
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
