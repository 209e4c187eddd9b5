"""Native decoding of GGUF's quantized block types (kernels/gguf_decode.cpp), bit-identical to gguf-py.

    dequantize(data, qtype, M, K, rows)  -> float32 [M, K]   (Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K..Q6_K TQ1_0 TQ2_0)
    decode_ternary(data, qtype, M, K, rows) -> (t int8 [M, K] in {-1, 0, 1}, d float32 [M, K / 256])

rows: optional int64 [M], the source row of output row m (GGUF's Q/K un-permutation happens in the decode,
without a copy). Types the kernels do not know fall back to gguf.quants (then reordered by rows).
"""
from __future__ import annotations

import numpy as np

from lowbit import _native

NATIVE_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "TQ1_0", "TQ2_0")


def _index(rows) -> np.ndarray | None:
    return None if rows is None else np.ascontiguousarray(rows, np.int64)


def dequantize(data: np.ndarray, qtype, m: int, k: int, rows=None, where: str = "GGUF tensor") -> np.ndarray:
    """Blocks [R, ...] (any dtype, read as bytes) -> float32 [M, K]; ValueError when a value is NaN or Inf."""
    data = np.ascontiguousarray(data)
    if qtype.name in NATIVE_TYPES:
        out = np.empty(m * k, np.float32)
        finite = _native.gguf_dequantize(data, int(qtype), k, _index(rows), m, out)
        out = out.reshape(m, k)
    else:
        from gguf import quants
        try:
            out = np.asarray(quants.dequantize(data, qtype), np.float32).reshape(-1, k)
        except NotImplementedError:
            raise ValueError(f"{where} has GGUF type {qtype.name}, which the gguf package cannot dequantize") from None
        out = np.ascontiguousarray(out[:m] if rows is None else out[_index(rows)])
        finite = bool(np.isfinite(out).all())
    if not finite:
        raise ValueError(f"{where} has NaN or Inf values")
    return out


def decode_ternary(data: np.ndarray, qtype, m: int, k: int, rows=None, where: str = "GGUF tensor"):
    """TQ1_0/TQ2_0 blocks -> (t int8 [M, K] in {-1, 0, 1}, d float32 [M, K / 256]): exactly dequantize's x / d
    (t = 0 in blocks whose d is 0 or not finite); ValueError for a TQ2_0 code 3 (the value 2)."""
    t = np.empty(m * k, np.int8)
    d = np.empty(m * (k // 256), np.float32)
    if not _native.gguf_ternary(np.ascontiguousarray(data), int(qtype), k, _index(rows), m, t, d):
        raise ValueError(f"{where}: {qtype.name} block decoded to values outside {{-1, 0, 1}}")
    return t.reshape(m, k), d.reshape(m, k // 256)
