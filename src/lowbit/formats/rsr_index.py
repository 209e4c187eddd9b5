"""RSR / RSR++ (paper 003): a fixed low-bit matrix preprocessed into an index, multiplied in O(n^2/log n).

lowbit's weights are W [M, K] with y = x @ W.T; the paper multiplies v . B with B = W.T, so the paper's
"columns" are lowbit's output rows and its "rows" are the K inputs. For one index:

* digits D [M, K] in 0..b-1 (b = 2: a binary plane; b = 3: ternary digits t + 1; b = 4: int2 codes), each
  digit standing for the value ``values[d]``;
* column blocking: output rows in blocks of k (M padded to a multiple of k with the digit of value 0);
* binary row order: for block i, the key of input j is the k digits D[ik .. ik+k-1, j] read as a base-b
  number (first row most significant); perm[i] sorts the K inputs by key (stable, a counting sort);
* full segmentation: seg[i] has S + 1 = b^k + 1 entries, seg[i][p] the first position in perm[i] whose
  key is p (empty keys get the next start), seg[i][S] = K.

Inference, per block: step 1, segmented sums through the permutation u[p] = sum_{l in seg[p]..seg[p+1]}
x[perm[l]]; step 2, the block's k outputs r = u . Bin_k with Bin_k[p, c] = values[digit c of p] (RSR,
O(k b^k)) or by folding (RSR++, O(b^k)): the last digit's output is sum_p values[p % b] u[p]; then
u'[p'] = sum_d u[b p' + d] and repeat for the digit before. With b = 2, values = (0, 1) this is the
paper's Algorithm 3 (sum of the odd-indexed entries, then pairwise sums).

A matrix is a list of (coef, index) terms, y = sum coef * index(x):
* "planes" (the paper): ternary A = B1 - B2 (Prop. 2.1), q-bit codes A = sum_i 2^i B_i, binary one plane;
* "direct" (ours): one base-b index over all values of A (ternary b = 3, int2 b = 4). Per output row it
  reads each input once instead of once per plane: for the same step-2 budget (b^k segments) a ternary
  block of k3 = k2 log_3 2 rows costs K / k3 = 1.58 K / k2 adds per row against 2 K / k2 for B1 - B2, and
  stores one permutation per k3 rows instead of two per k2 (1.26x fewer index bytes).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MAX_SEGMENTS = 1 << 16  # b^k above this makes step 2 cost more than any real K saves


def _index_dtype(limit: int) -> np.dtype:
    """The narrowest unsigned type that holds 0..limit."""
    return np.dtype(np.uint16) if limit <= 0xFFFF else np.dtype(np.uint32)


@dataclass
class RSRIndex:
    """One base-b index of a digit matrix [M, K]: perm [nblocks, K], seg [nblocks, b^k + 1]."""

    shape: tuple[int, int]
    k: int
    base: int
    values: np.ndarray  # float32 [base]: the value each digit stands for
    perm: np.ndarray    # uint16/uint32 [nblocks, K]
    seg: np.ndarray     # uint16/uint32 [nblocks, S + 1]

    @property
    def segments(self) -> int:
        return self.base ** self.k

    @property
    def nblocks(self) -> int:
        return self.perm.shape[0]

    @property
    def nbytes(self) -> int:
        return int(self.perm.nbytes + self.seg.nbytes)

    @classmethod
    def build(cls, digits: np.ndarray, k: int, base: int, values) -> "RSRIndex":
        """digits: uint8 [M, K] in 0..base-1 -> the index with blocks of k output rows."""
        digits = np.asarray(digits)
        if digits.ndim != 2 or digits.shape[0] < 1 or digits.shape[1] < 1:
            raise ValueError(f"rsr: digits must be a non-empty [M, K] matrix, got shape {digits.shape}")
        values = np.asarray(values, np.float32)
        if base < 2 or values.shape != (base,):
            raise ValueError(f"rsr: base {base} needs {base} digit values, got {values.shape}")
        if k < 1 or base ** k > MAX_SEGMENTS:
            raise ValueError(f"rsr: block width k={k} must be >= 1 with {base}^k <= {MAX_SEGMENTS}")
        if digits.size and int(digits.max()) >= base:
            raise ValueError(f"rsr: a digit is >= the base {base}")
        m, kdim = digits.shape
        nblocks = -(-m // k)
        s = base ** k
        zero_digit = int(np.argmin(np.abs(values)))
        perm = np.empty((nblocks, kdim), _index_dtype(kdim - 1))
        seg = np.empty((nblocks, s + 1), _index_dtype(kdim))
        chunk = max(1, (16 << 20) // (4 * kdim))  # blocks per pass: ~16 MiB of keys
        for b0 in range(0, nblocks, chunk):
            b1 = min(nblocks, b0 + chunk)
            rows = np.full(((b1 - b0) * k, kdim), zero_digit, np.uint8)
            part = digits[b0 * k:b1 * k]
            rows[:part.shape[0]] = part
            rows = rows.reshape(b1 - b0, k, kdim)
            keys = np.zeros((b1 - b0, kdim), np.uint16)  # < base^k <= 2^16; first row most significant
            for c in range(k):
                keys = keys * np.uint16(base) + rows[:, c]
            perm[b0:b1] = np.argsort(keys, axis=1, kind="stable")  # 16-bit keys: numpy radix-sorts them
            flat = keys.astype(np.int64) + np.arange(b1 - b0, dtype=np.int64)[:, None] * s
            counts = np.bincount(flat.ravel(), minlength=(b1 - b0) * s).reshape(b1 - b0, s)  # rows per key
            seg[b0:b1, 0] = 0
            seg[b0:b1, 1:] = np.cumsum(counts, axis=1)  # full segmentation: first position of each key
        return cls((m, kdim), k, base, values, perm, seg)

    def bin_matrix(self) -> np.ndarray:
        """Bin_k: float64 [S, k], row p = the values of the k digits of p (first digit first)."""
        p = np.arange(self.segments)
        cols = [(p // self.base ** (self.k - 1 - c)) % self.base for c in range(self.k)]
        return self.values.astype(np.float64)[np.stack(cols, axis=1)]

    def digits(self) -> np.ndarray:
        """The digit matrix [M, K] back from perm and seg (the test that the index is lossless)."""
        m, kdim = self.shape
        out = np.empty((self.nblocks * self.k, kdim), np.uint8)
        for i in range(self.nblocks):
            keys = np.repeat(np.arange(self.segments), np.diff(self.seg[i].astype(np.int64)))
            key_of_input = np.empty(kdim, np.int64)
            key_of_input[self.perm[i]] = keys
            for c in range(self.k):
                out[i * self.k + c] = (key_of_input // self.base ** (self.k - 1 - c)) % self.base
        return out[:m]

    def segmented_sums(self, x: np.ndarray, blocks: slice = slice(None)) -> np.ndarray:
        """Step 1 for x [N, K]: u [N, nb, S] over the given blocks, through cumulative sums of x[perm]
        (exact for integer x held in int64 or float64 below 2^53)."""
        perm, seg = self.perm[blocks], self.seg[blocks].astype(np.intp)
        xp = x[:, perm]  # [N, nb, K]
        c = np.zeros(xp.shape[:2] + (xp.shape[2] + 1,), xp.dtype)
        np.cumsum(xp, axis=2, out=c[:, :, 1:])
        return np.take_along_axis(c, seg[None, :, 1:], 2) - np.take_along_axis(c, seg[None, :, :-1], 2)

    def block_product(self, u: np.ndarray, plus: bool) -> np.ndarray:
        """Step 2: u [..., S] -> r [..., k]. plus=False: RSR (u . Bin_k); plus=True: RSR++ (folding)."""
        if not plus:
            return u @ self.bin_matrix().astype(u.dtype)
        vals = self.values.astype(u.dtype)
        r = np.empty(u.shape[:-1] + (self.k,), u.dtype)
        for c in range(self.k - 1, -1, -1):
            folded = u.reshape(u.shape[:-1] + (-1, self.base))  # [..., S'/b, b]
            r[..., c] = (folded @ vals).sum(axis=-1)
            u = folded.sum(axis=-1)
        return r

    def matmul(self, x: np.ndarray, plus: bool = True, block_chunk: int | None = None) -> np.ndarray:
        """x [N, K] -> y [N, M] = x @ values[D].T, the paper's NumPy method (blocks vectorized in chunks
        that keep the gathered x[perm] near 32 MiB)."""
        x = np.asarray(x)
        if x.ndim != 2 or x.shape[1] != self.shape[1]:
            raise ValueError(f"rsr: input must be [N, {self.shape[1]}], got {x.shape}")
        n = x.shape[0]
        if block_chunk is None:
            block_chunk = max(1, (32 << 20) // max(1, n * self.shape[1] * x.dtype.itemsize))
        y = np.empty((n, self.nblocks * self.k), x.dtype)
        for b0 in range(0, self.nblocks, block_chunk):
            b1 = min(self.nblocks, b0 + block_chunk)
            u = self.segmented_sums(x, slice(b0, b1))                     # [N, nb, S]
            y[:, b0 * self.k:b1 * self.k] = self.block_product(u, plus).reshape(n, -1)
        return y[:, :self.shape[0]]


# --- matrices as terms of indices -------------------------------------------------------------------

def ternary_terms(t: np.ndarray, k: int, method: str = "direct") -> list[tuple[float, RSRIndex]]:
    """t: int [M, K] in {-1, 0, 1}. direct: one base-3 index; planes: B1 - B2 (the paper)."""
    t = np.asarray(t)
    if t.size and (t.min() < -1 or t.max() > 1):
        raise ValueError("rsr: ternary values must be in {-1, 0, 1}")
    if method == "direct":
        return [(1.0, RSRIndex.build((t + 1).astype(np.uint8), k, 3, (-1.0, 0.0, 1.0)))]
    if method == "planes":
        return [(1.0, RSRIndex.build((t > 0).astype(np.uint8), k, 2, (0.0, 1.0))),
                (-1.0, RSRIndex.build((t < 0).astype(np.uint8), k, 2, (0.0, 1.0)))]
    raise ValueError(f"rsr: method must be 'direct' or 'planes', got {method!r}")


def code_terms(codes: np.ndarray, bits: int, k: int, method: str = "planes") -> list[tuple[float, RSRIndex]]:
    """codes: unsigned int [M, K] < 2^bits. planes: A = sum_i 2^i B_i (paper §4.4); direct: one base-2^bits index."""
    codes = np.asarray(codes)
    if bits < 1 or bits > 4:
        raise ValueError(f"rsr: code width must be 1..4 bits, got {bits}")
    if codes.size and (codes.min() < 0 or codes.max() >= 1 << bits):
        raise ValueError(f"rsr: codes must be in 0..{(1 << bits) - 1}")
    if method == "direct" or bits == 1:
        return [(1.0, RSRIndex.build(codes.astype(np.uint8), k, 1 << bits, np.arange(1 << bits, dtype=np.float32)))]
    if method == "planes":
        return [(float(1 << i), RSRIndex.build(((codes >> i) & 1).astype(np.uint8), k, 2, (0.0, 1.0)))
                for i in range(bits)]
    raise ValueError(f"rsr: method must be 'direct' or 'planes', got {method!r}")


def terms_matmul(terms: list[tuple[float, RSRIndex]], x: np.ndarray, plus: bool = True) -> np.ndarray:
    """y [N, M] = sum coef * index.matmul(x)."""
    y = None
    for coef, idx in terms:
        part = idx.matmul(x, plus=plus)
        y = coef * part if y is None else y + coef * part
    return y
