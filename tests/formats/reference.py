"""Independent numpy references for the integer-code formats."""
import numpy as np


def quantize_activations(x: np.ndarray, kp: int, group: int):
    """Per-token, per-group absmax int8 — the same float32 operations as the native quantizer. A group with a NaN
    or an infinity gets scale NaN, one whose 127 / absmax overflows (zeros, or tiny values) scale 0; both codes 0."""
    n, k = x.shape
    g = -(-kp // group)
    q = np.zeros((n, kp), np.int8)
    scale = np.zeros((n, g), np.float32)
    total = np.zeros((n, g), np.int32)
    for gi in range(g):
        lo, hi = gi * group, min((gi + 1) * group, k)
        if lo >= k:
            continue
        xs = x[:, lo:hi].astype(np.float32)
        finite = np.isfinite(xs).all(axis=1)
        amax = np.abs(xs).max(axis=1)
        for r in range(n):
            if not finite[r]:
                scale[r, gi] = np.nan
                continue
            with np.errstate(divide="ignore", over="ignore"):
                inv = np.float32(127.0) / amax[r]
            if np.isfinite(inv):
                qq = np.clip(np.rint(xs[r] * inv), -127, 127)
                q[r, lo:hi] = qq.astype(np.int8)
                scale[r, gi] = amax[r] / np.float32(127.0)
                total[r, gi] = int(qq.sum())
    return q, scale, total


def int_matmul(codes: np.ndarray, a: np.ndarray, b: np.ndarray, group: int, q, sx, sq) -> np.ndarray:
    """float64 [N, M]: sum over groups of sx * (a * (codes . q) + b * sum q), integer dots exact in int64."""
    m, k = codes.shape
    n = q.shape[0]
    y = np.zeros((n, m))
    c = codes.astype(np.int64)
    qq = q[:, :k].astype(np.int64)
    for g in range(a.shape[1]):
        sl = slice(g * group, min((g + 1) * group, k))
        if sl.start >= k:
            continue
        dot = qq[:, sl] @ c[:, sl].T
        y += sx[:, g:g + 1].astype(np.float64) * (a[:, g].astype(np.float64) * dot + b[:, g].astype(np.float64) * sq[:, g:g + 1])
    return y
