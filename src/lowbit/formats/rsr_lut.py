"""rsr-lut: the transposed form of RSR's idea (T-MAC-style table lookup) — NOT the paper's RSR.

RSR (rsr_index.py) blocks k *output rows*, sorts the K inputs by their k-digit pattern (a permutation
and a segment list per block) and sums each pattern's inputs once: O(n^2 / log n) adds, but through
irregular gathers. rsr-lut blocks g = 4 *inputs*: per token, chunk c gets the table of its 16 partial
sums T_c[p] = sum_{i: bit i of p} x[4c + i], and each output row looks up its 4-bit pattern of the
chunk: M K / 4 lookups, no permutation, regular access, and on AVX2 32 lookups per vpshufb
(kernels/rsr_lut.h). It reuses the same redundancy (one partial sum serves every row with that
pattern) from the other side; the asymptotic count is O(n^2 / g) with a fixed g, not O(n^2 / log n).

A matrix is a sum of binary planes A = sum_i sign_i 2^shift_i B_i: binary one plane, ternary
B(t > 0) - B(t < 0), q-bit codes sum_i 2^i B_i (the paper's §4.4 decomposition). Activations are int8
(per-token scale), so results are exact integer sums for integer inputs.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lowbit import _native

TILE_ROWS = 64
GROUP = 4


def pack_plane(b: np.ndarray) -> np.ndarray:
    """b: {0,1} [M, K] -> uint8 [ceil(M/64), ceil(K/4), 32] (byte j: row j low nibble, row 32 + j high)."""
    b = np.asarray(b)
    if b.ndim != 2 or b.size == 0:
        raise ValueError(f"rsr_lut: a plane must be a non-empty [M, K] matrix, got shape {b.shape}")
    if b.min() < 0 or b.max() > 1:
        raise ValueError("rsr_lut: a plane must hold only 0 and 1")
    m, k = b.shape
    tiles, k4 = -(-m // TILE_ROWS), -(-k // GROUP)
    full = np.zeros((tiles * TILE_ROWS, k4 * GROUP), np.uint8)
    full[:m, :k] = b
    nib = (full.reshape(tiles * TILE_ROWS, k4, GROUP) << np.arange(GROUP, dtype=np.uint8)).sum(2, dtype=np.uint8)
    nib = nib.reshape(tiles, 2, 32, k4)
    return np.ascontiguousarray((nib[:, 0] | (nib[:, 1] << 4)).transpose(0, 2, 1))


@dataclass
class LUTMatrix:
    """A = sum_i (-1 if negs[i]) 2^shifts[i] B_i, packed: w uint8 [ceil(M/64), ceil(K/4), planes, 32]."""

    shape: tuple[int, int]
    w: np.ndarray
    shifts: list[int]
    negs: list[bool]

    @classmethod
    def from_planes(cls, planes, shifts, negs) -> "LUTMatrix":
        planes = [np.asarray(p) for p in planes]
        if not 1 <= len(planes) <= 4 or len(shifts) != len(planes) or len(negs) != len(planes):
            raise ValueError("rsr_lut: 1..4 planes, one shift and one sign each")
        if any(p.shape != planes[0].shape for p in planes):
            raise ValueError("rsr_lut: all planes must have one shape")
        if any(not 0 <= s <= 3 for s in shifts):
            raise ValueError("rsr_lut: plane shifts must be 0..3")
        w = np.ascontiguousarray(np.stack([pack_plane(p) for p in planes], axis=2))
        return cls(tuple(planes[0].shape), w, [int(s) for s in shifts], [bool(n) for n in negs])

    @classmethod
    def binary(cls, b) -> "LUTMatrix":
        return cls.from_planes([b], [0], [False])

    @classmethod
    def ternary(cls, t) -> "LUTMatrix":
        t = np.asarray(t)
        if t.size and (t.min() < -1 or t.max() > 1):
            raise ValueError("rsr_lut: ternary values must be in {-1, 0, 1}")
        return cls.from_planes([(t > 0).astype(np.uint8), (t < 0).astype(np.uint8)], [0, 0], [False, True])

    @classmethod
    def codes(cls, c, bits: int) -> "LUTMatrix":
        """Unsigned codes [M, K] < 2^bits (1..4 bits) as sum_i 2^i B_i."""
        c = np.asarray(c)
        if not 1 <= bits <= 4:
            raise ValueError(f"rsr_lut: code width must be 1..4 bits, got {bits}")
        if c.size and (c.min() < 0 or c.max() >= 1 << bits):
            raise ValueError(f"rsr_lut: codes must be in 0..{(1 << bits) - 1}")
        return cls.from_planes([((c >> i) & 1).astype(np.uint8) for i in range(bits)], list(range(bits)),
                               [False] * bits)

    @property
    def nbytes(self) -> int:
        return int(self.w.nbytes)

    def matmul_i8(self, q: np.ndarray, sx: np.ndarray | None = None, rowscale: np.ndarray | None = None,
                  coef: float = 1.0, out: np.ndarray | None = None, accumulate: bool = False,
                  iters: int = 1) -> tuple[np.ndarray, float]:
        """q int8 [N, K] in [-127, 127] -> (y float32 [N, M] = coef sx[n] rowscale[m] (q . A^T), seconds
        for `iters` runs)."""
        m, k = self.shape
        q = np.ascontiguousarray(q, np.int8)
        n = q.shape[0]
        sx = np.ones(n, np.float32) if sx is None else np.ascontiguousarray(sx, np.float32)
        y = np.empty((n, m), np.float32) if out is None else out
        _, s = _native.rsr_lut_gemm(self.w, m, k, self.shifts, self.negs, q, sx, rowscale, coef, accumulate, y,
                                    iters=iters)
        return y, s

    def dense(self) -> np.ndarray:
        """A as int32 [M, K], unpacked from w (the test that packing is lossless)."""
        m, k = self.shape
        tiles, k4, planes, _ = self.w.shape
        a = np.zeros((tiles * TILE_ROWS, k4 * GROUP), np.int32)
        for pl in range(planes):
            byte = self.w[:, :, pl, :].transpose(0, 2, 1)                 # [tiles, 32, k4]
            nib = np.stack([byte & 15, byte >> 4], axis=1).reshape(tiles * TILE_ROWS, k4)
            bits = (nib[:, :, None] >> np.arange(GROUP, dtype=np.uint8)) & 1  # [Mp, k4, 4]
            a += (-1 if self.negs[pl] else 1) * (1 << self.shifts[pl]) * bits.reshape(tiles * TILE_ROWS, -1).astype(np.int32)
        return a[:m, :k]
