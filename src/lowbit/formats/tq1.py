"""tq1: ternary {-1, 0, +1} x scale at 5 trits per byte (1.6 bits/weight), decoded in the kernel.

Same weights as ``ternary`` (absmean scale per tensor, row or group; codes c = t + 1, w = a * (c - 1)),
stored in base 3 like GGUF TQ1_0 instead of 2-bit fields: 20% fewer bytes for the decode to read.

Layout (kernels/tq1.h has the same description next to the kernels):
    codes  uint8   [Mb][nch][4][64]    Mb = ceil(M/64), Kp = ceil(K/20)*20, nch = Kp/20
           tile t, byte p  <->  the 5 codes of row 64*blk + 16*t + p//4 at k = 20*chunk + 4*j + p%4,
           j = 0..4, as v = sum_j c_j * 3**(4-j), stored as byte = ceil(v * 256 / 243);
           digit j = ((byte * 3**j) % 256 * 3) >> 8. Each digit plane of a tile is a [16 rows][4 k] u8
           VNNI operand, as a bit field of the integer-code layout.
    scale  float16 [Mb][G][64]         G = ceil(Kp/group), group a multiple of 20 or Kp
"""
from __future__ import annotations

import numpy as np

from lowbit import _native
from lowbit.formats.base import Activations, PackedWeight, check_weight
from lowbit.formats.intcodes import ROW_BLOCK, pack_groups, unpack_groups
from lowbit.formats.ternary import ternarize

KC = 20  # k per chunk: 5 trits x 4 consecutive k
CHUNK_BYTES = 4 * 64
_PLACE = np.array([81, 27, 9, 3, 1], np.uint16)   # weight of digit j in v
_SCALE3 = np.array([1, 3, 9, 27, 81], np.uint32)  # digit j is the top trit of byte * 3**j (mod 256)
VALID_BYTES = ((np.arange(243) * 256 + 242) // 243).astype(np.uint8)  # the byte of each v = 0..242


def padded_k(k: int) -> int:
    return -(-k // KC) * KC


def resolve_group(group_size: int | None, k: int) -> int:
    """None -> one group per row (Kp); else a positive multiple of 20 (clamped to Kp)."""
    kp = padded_k(k)
    if group_size is None or group_size <= 0 or group_size >= kp:
        return kp
    if group_size % KC:
        raise ValueError(f"tq1 group size must be a multiple of {KC} (or omitted for one scale per row), got {group_size}")
    return int(group_size)


def decode_bytes(b: np.ndarray) -> np.ndarray:
    """uint8 [...] -> uint8 [..., 5]: the five base-3 digits of each stored byte (most significant first)."""
    x = (np.asarray(b, np.uint32)[..., None] * _SCALE3) & 0xFF
    return ((x * 3) >> 8).astype(np.uint8)


def pack_tq1(codes: np.ndarray) -> np.ndarray:
    """uint8 codes [M, K] in {0, 1, 2} -> packed uint8, flat [Mb*nch*256]."""
    m, k = codes.shape
    mb, kp = -(-m // ROW_BLOCK), padded_k(k)
    full = np.zeros((mb * ROW_BLOCK, kp), np.uint8)
    full[:m, :k] = codes
    # [blk, t, r, chunk, j, kk] -> [blk, chunk, t, r, kk, j]
    v = full.reshape(mb, 4, 16, kp // KC, 5, 4).transpose(0, 3, 1, 2, 5, 4)
    val = (v.astype(np.uint16) * _PLACE).sum(axis=-1, dtype=np.uint32)
    return ((val * 256 + 242) // 243).astype(np.uint8).reshape(-1)


def unpack_tq1(packed: np.ndarray, m: int, k: int) -> np.ndarray:
    """The inverse of pack_tq1: uint8 codes [M, K]."""
    mb, kp = -(-m // ROW_BLOCK), padded_k(k)
    digits = decode_bytes(packed.reshape(mb, kp // KC, 4, 16, 4))  # [blk, chunk, t, r, kk, j]
    return digits.transpose(0, 2, 3, 1, 5, 4).reshape(mb * ROW_BLOCK, kp)[:m, :k]


class TQ1Weight(PackedWeight):
    format = "tq1"
    description = "1.6-bit ternary, 5 trits per byte (base 3, TQ1_0 scaling) x absmean scale per tensor, row or group"
    table_values = "{-1, 0, +1}, 5 trits per byte (base 3, like TQ1_0)"
    table_scales = "per tensor, row or group"

    def __init__(self, shape, group, codes, scale, meta_extra=None):
        self.shape = (int(shape[0]), int(shape[1]))
        self.kp = padded_k(self.shape[1])
        self.group = int(group)
        if self.group <= 0 or (self.group % KC and self.group != self.kp):
            raise ValueError(f"tq1: group must be a multiple of {KC} or Kp={self.kp}, got {self.group}")
        self.ngroups = -(-self.kp // self.group)
        mb = -(-self.shape[0] // ROW_BLOCK)
        if codes.dtype != np.uint8 or codes.ndim != 1 or codes.size != mb * (self.kp // KC) * CHUNK_BYTES:
            raise ValueError(f"tq1: packed codes must be flat uint8 of {mb * (self.kp // KC) * CHUNK_BYTES} bytes, got {codes.size}")
        if scale.dtype != np.float16 or scale.ndim != 1 or scale.size != mb * self.ngroups * ROW_BLOCK:
            raise ValueError(f"tq1: scales must be flat float16 of {mb * self.ngroups * ROW_BLOCK} values")
        self.codes = codes
        self.scale = scale
        self.meta_extra = dict(meta_extra or {})
        self._scale_u16 = scale.view(np.uint16)

    @classmethod
    def quantize(cls, w, scale: str = "tensor", group_size: int | None = None, method: str = "absmean",
                 **options) -> "TQ1Weight":
        """As quantize_reference; w: float32 / float16 [M, K] or SourceRows; absmean runs natively
        (ternary_native.py), bit-identical to it."""
        from lowbit.formats.intcodes import as_source

        src = as_source(w)
        if method != "absmean":
            return cls.quantize_reference(src.float32(), scale, group_size, method)
        from lowbit.formats.ternary_native import quantize_absmean

        group, codes, scales, mode = quantize_absmean(src, scale, group_size, padded_k, resolve_group, tq1=True)
        return cls(src.shape, group, codes, scales, {"scale_mode": mode})

    @classmethod
    def quantize_reference(cls, w, scale: str = "tensor", group_size: int | None = None, method: str = "absmean",
                 **options) -> "TQ1Weight":
        """Ternarization exactly as TernaryWeight (scale "tensor" | "row", or group_size= a multiple of 20;
        method "absmean" | "mse"; ternary-valued input keeps its scale), packed 5 trits per byte."""
        w = check_weight(w)
        if group_size:
            scale = "group"
        group = resolve_group(group_size if scale == "group" else None, w.shape[1])
        t, a16, scale = ternarize(w, scale, group, padded_k(w.shape[1]), method)
        return cls.from_ternary(t, a16, group=group, scale_mode=scale)

    @classmethod
    def from_ternary(cls, t: np.ndarray, a, group: int | None = None, **meta) -> "TQ1Weight":
        """t: int8 [M, K] in {-1, 0, 1}; a: scales [M, G] (or [M, 1] / scalar for one per row / tensor)."""
        t = np.asarray(t)
        m, k = t.shape
        group = resolve_group(group, k)
        g = -(-padded_k(k) // group)
        a = np.asarray(a, np.float32)
        a = np.broadcast_to(a.reshape(-1, 1) if a.ndim < 2 else a, (m, g))
        if t.size and (t.min() < -1 or t.max() > 1):
            raise ValueError("ternary values must be in {-1, 0, 1}")
        meta.setdefault("scale_mode", "tensor" if np.all(a == a.flat[0]) else ("row" if g == 1 else "group"))
        return cls((m, k), group, pack_tq1((t + 1).astype(np.uint8)), pack_groups(np.ascontiguousarray(a)), meta)

    def scales(self) -> np.ndarray:
        """float32 [M, G] as the kernel applies them (after float16 rounding)."""
        return unpack_groups(self.scale, self.shape[0], self.ngroups)

    def unpacked_codes(self) -> np.ndarray:
        return unpack_tq1(self.codes, *self.shape)

    def ternary(self) -> np.ndarray:
        return self.unpacked_codes().astype(np.int8) - 1

    def dequantize(self) -> np.ndarray:
        cols = np.arange(self.shape[1]) // self.group
        return (self.unpacked_codes().astype(np.float32) - 1.0) * self.scales()[:, cols]

    def native_args(self) -> tuple:
        """(codes, scale as uint16): one entry of gemm_tq1's weight list."""
        return (self.codes, self._scale_u16)

    def _matmul(self, acts: Activations) -> np.ndarray:
        q, sx, sq = acts.int8(self.kp, self.group)
        y = np.empty((q.shape[0], self.shape[0]), np.float32)
        _native.gemm_tq1([self.native_args()], self.shape[0], self.kp, self.group, q, sx, sq, y)
        return y

    def state(self):
        meta = {"format": self.format, "M": self.shape[0], "K": self.shape[1], "group": self.group, **self.meta_extra}
        return meta, {"codes": self.codes, "scale": self.scale}

    @classmethod
    def from_state(cls, meta, tensors):
        extra = {k: v for k, v in meta.items() if k not in ("format", "M", "K", "group")}
        return cls((meta["M"], meta["K"]), meta["group"], tensors["codes"], tensors["scale"], extra)
