"""The integer-code family: int8, int4, int2, ternary, binary share one layout and one kernel.

Each weight is an unsigned code c of ``bits`` bits with an affine map per (row, group):
    w[m, k] = a[m, g] * c[m, k] + b[m, g]          (b = -a * zc when no offsets are stored)
The kernel multiplies codes (u8) with int8 activations in the dot-product instructions and applies
a and b once per group: sum_k w x = sx * (a * sum_k c q + b * sum_k q).

Layout (see kernels/common.h for the same description next to the kernels):
    codes  uint8   [Mb][nch][4][64]    Mb = ceil(M/64), Kp = ceil(K/64)*64, nch = Kp/KC, KC = 4*(8/bits)
           tile t, byte p, bit field j  <->  row 64*blk + 16*t + p//4,  k = KC*chunk + 4*j + p%4
    scale  float16 [Mb][G][64]         G = ceil(Kp/group); row 64*blk + i at [blk, g, i]
    offset float16 [Mb][G][64] or absent
"""
from __future__ import annotations

from typing import ClassVar

import numpy as np

from lowbit import _native
from lowbit.formats.base import Activations, PackedWeight, SourceRows

ROW_BLOCK = 64
K_ALIGN = 64
GROUP_ALIGN = 32  # a whole number of k-chunks at every code width (llama.cpp's Q4 block size)


def padded_k(k: int) -> int:
    return -(-k // K_ALIGN) * K_ALIGN


# The kernels' int32 accumulators sum up to group * max code * 127 per group, which must stay below 2^31:
# 65536 * 255 * 127 < 2^31, so "one group per row" means rows of at most 65536 k; longer rows get groups
# of 65536, and no format's default group can overflow for any K.
MAX_ROW_GROUP = 65536


def max_group(bits: int) -> int:
    """The largest group whose int32 accumulator cannot overflow with `bits`-bit codes and int8 activations."""
    return ((1 << 31) - 1) // (((1 << bits) - 1) * 127)


def resolve_group(group_size: int | None, k: int) -> int:
    """None -> one group per row (Kp, at most MAX_ROW_GROUP); else a positive multiple of 32 (clamped to Kp)."""
    kp = padded_k(k)
    if group_size is None or group_size <= 0 or group_size >= kp:
        return min(kp, MAX_ROW_GROUP)
    if group_size % GROUP_ALIGN:
        raise ValueError(f"group size must be a multiple of {GROUP_ALIGN} (or omitted for one scale per row), got {group_size}")
    return int(group_size)


def pack_codes(codes: np.ndarray, bits: int) -> np.ndarray:
    """uint8 codes [M, K] (each < 2**bits) -> packed uint8, flat [Mb*nch*256] (native, on the thread pool;
    bit-identical to pack_codes_reference)."""
    m, k = codes.shape
    out = np.empty(-(-m // ROW_BLOCK) * padded_k(k) * ROW_BLOCK * bits // 8, np.uint8)
    if m and k:
        _native.pack_codes(np.ascontiguousarray(codes, np.uint8), m, k, bits, out)
    return out


def pack_codes_reference(codes: np.ndarray, bits: int) -> np.ndarray:
    """The numpy reference of pack_codes."""
    m, k = codes.shape
    per = 8 // bits
    kc = 4 * per
    mb, kp = -(-m // ROW_BLOCK), padded_k(k)
    full = np.zeros((mb * ROW_BLOCK, kp), np.uint8)
    full[:m, :k] = codes
    # [blk, t, r, chunk, j, kk] -> [blk, chunk, t, r, kk, j]
    v = full.reshape(mb, 4, 16, kp // kc, per, 4).transpose(0, 3, 1, 2, 5, 4)
    out = np.zeros(v.shape[:-1], np.uint8)
    for j in range(per):
        out |= v[..., j] << np.uint8(j * bits)
    return out.reshape(-1)


def unpack_codes(packed: np.ndarray, bits: int, m: int, k: int) -> np.ndarray:
    """The inverse of pack_codes: uint8 [M, K]."""
    per = 8 // bits
    kc = 4 * per
    mb, kp = -(-m // ROW_BLOCK), padded_k(k)
    v = packed.reshape(mb, kp // kc, 4, 16, 4)
    mask = np.uint8((1 << bits) - 1)
    planes = np.stack([(v >> np.uint8(j * bits)) & mask for j in range(per)], axis=-1)  # [blk,ch,t,r,kk,j]
    full = planes.transpose(0, 2, 3, 1, 5, 4).reshape(mb * ROW_BLOCK, kp)
    return full[:m, :k]


def pack_groups(a: np.ndarray) -> np.ndarray:
    """float [M, G] per-(row, group) values -> float16 flat [Mb*G*64]."""
    m, g = a.shape
    mb = -(-m // ROW_BLOCK)
    full = np.zeros((mb * ROW_BLOCK, g), np.float16)
    full[:m] = a.astype(np.float16)
    return np.ascontiguousarray(full.reshape(mb, ROW_BLOCK, g).transpose(0, 2, 1)).reshape(-1)


def unpack_groups(packed: np.ndarray, m: int, g: int) -> np.ndarray:
    mb = -(-m // ROW_BLOCK)
    return packed.reshape(mb, g, ROW_BLOCK).transpose(0, 2, 1).reshape(mb * ROW_BLOCK, g)[:m].astype(np.float32)


def group_view(w: np.ndarray, group: int) -> np.ndarray:
    """float32 [M, K] -> [M, G, group], zero-padded to G*group columns."""
    m, k = w.shape
    g = -(-padded_k(k) // group)
    full = np.zeros((m, g * group), np.float32)
    full[:, :k] = w
    return full.reshape(m, g, group)


METHOD_INT8, METHOD_AFFINE, METHOD_BINARY = 0, 1, 2  # kernels/quantize.h QuantMethod
NO_RATIOS = np.zeros(1, np.float64)


def as_source(w) -> SourceRows:
    """w (SourceRows, or an array: float32 / float16 pass as they are, others become float32) -> SourceRows."""
    if isinstance(w, SourceRows):
        return w
    w = np.asarray(w)
    if w.ndim != 2:
        raise ValueError(f"a weight must be 2-D [M, K], got shape {w.shape}")
    if w.shape[0] < 1 or w.shape[1] < 1:
        raise ValueError(f"a weight must be non-empty, got shape {w.shape}")
    if w.dtype not in (np.float32, np.float16):
        w = w.astype(np.float32)
    return SourceRows(w)


def quantize_native(cls, src: SourceRows, method: int, group: int, offsets: bool = False, symmetric: bool = False,
                    ratios: np.ndarray = NO_RATIOS, meta: dict | None = None) -> "IntCodeWeight":
    """Packs src into cls's layout with the native quantizer (kernels/quantize.cpp, on the thread pool);
    bit-identical to the format's numpy quantize_reference."""
    m, k = src.shape
    kp, mb = padded_k(k), -(-m // ROW_BLOCK)
    g = -(-kp // group)
    codes = np.empty(mb * kp * ROW_BLOCK * cls.bits // 8, np.uint8)
    scale = np.empty(mb * g * ROW_BLOCK, np.float16)
    offset = np.empty_like(scale) if offsets else None
    _native.quantize_int(src.data, src.kind_id, m, k, src.rows, method, cls.bits, group, symmetric,
                         np.ascontiguousarray(ratios, np.float64), codes, scale.view(np.uint16),
                         None if offset is None else offset.view(np.uint16))
    return cls((m, k), group, codes, scale, offset, meta)


class IntCodeWeight(PackedWeight):
    """Base of the integer-code formats; subclasses choose bits, codes and the affine map."""

    bits: ClassVar[int] = 0
    zc: ClassVar[float | None] = None  # constant zero code when offsets are not stored

    def __init__(self, shape, group, codes, scale, offset=None, meta_extra=None):
        self.shape = (int(shape[0]), int(shape[1]))
        self.kp = padded_k(self.shape[1])
        self.group = int(group)
        if self.group <= 0 or (self.group != self.kp and (self.group % GROUP_ALIGN or self.group > self.kp)):
            raise ValueError(f"{self.format}: group must be a multiple of {GROUP_ALIGN} below Kp={self.kp}, or Kp; "
                             f"got {self.group}")
        self.ngroups = -(-self.kp // self.group)
        self.codes = codes
        self.scale = scale
        self.offset = offset
        self.meta_extra = dict(meta_extra or {})
        mb = -(-self.shape[0] // ROW_BLOCK)
        if codes.dtype != np.uint8 or codes.size != mb * self.kp * ROW_BLOCK * self.bits // 8:
            raise ValueError(f"{self.format}: packed codes have {codes.size} bytes, expected {mb * self.kp * ROW_BLOCK * self.bits // 8}")
        if scale.dtype != np.float16 or scale.size != mb * self.ngroups * ROW_BLOCK:
            raise ValueError(f"{self.format}: scales must be float16 of {mb * self.ngroups * ROW_BLOCK} values")
        if min(self.group, self.kp) > max_group(self.bits):
            raise ValueError(f"{self.format}: group {self.group} overflows the int32 accumulators of {self.bits}-bit codes "
                             f"(group * {(1 << self.bits) - 1} * 127 must stay below 2^31): use groups of at most "
                             f"{max_group(self.bits)}")
        if offset is None and self.zc is None:
            raise ValueError(f"{self.format}: offsets are required")
        if offset is not None and (offset.dtype != np.float16 or offset.size != scale.size):
            raise ValueError(f"{self.format}: offsets must be float16 shaped like the scales")
        self._scale_u16 = scale.view(np.uint16)
        self._offset_u16 = None if offset is None else offset.view(np.uint16)

    @classmethod
    def from_codes(cls, codes: np.ndarray, a: np.ndarray, b: np.ndarray | None = None, group: int | None = None,
                   **meta_extra) -> "IntCodeWeight":
        """Builds from unsigned codes [M, K] and per-(row, group) a [M, G] (and b [M, G], or the format's zc)."""
        m, k = codes.shape
        group = resolve_group(group, k)
        g = -(-padded_k(k) // group)
        if a.shape != (m, g) or (b is not None and b.shape != (m, g)):
            raise ValueError(f"{cls.format}: scales must be [M={m}, G={g}], got {a.shape}")
        if codes.size and int(codes.max()) >= (1 << cls.bits):
            raise ValueError(f"{cls.format}: codes must be < {1 << cls.bits}")
        return cls((m, k), group, pack_codes(codes.astype(np.uint8), cls.bits), pack_groups(a),
                   None if b is None else pack_groups(b), meta_extra)

    def affine(self) -> tuple[np.ndarray, np.ndarray]:
        """(a, b): float32 [M, G] each, as the kernel applies them (after float16 rounding)."""
        m = self.shape[0]
        a = unpack_groups(self.scale, m, self.ngroups)
        b = -a * np.float32(self.zc) if self.offset is None else unpack_groups(self.offset, m, self.ngroups)
        return a, b

    def unpacked_codes(self) -> np.ndarray:
        return unpack_codes(self.codes, self.bits, *self.shape)

    def dequantize(self) -> np.ndarray:
        m, k = self.shape
        a, b = self.affine()
        codes = self.unpacked_codes().astype(np.float32)
        cols = np.arange(k) // self.group
        return codes * a[:, cols] + b[:, cols]

    def _matmul(self, acts: Activations) -> np.ndarray:
        q, sx, sq = acts.int8(self.kp, self.group)
        y = np.empty((q.shape[0], self.shape[0]), np.float32)
        _native.gemm_int(self.codes, self._scale_u16, self._offset_u16, float(self.zc or 0.0), self.bits,
                         self.shape[0], self.kp, self.group, q, sx, sq, y)
        return y

    def native_args(self) -> tuple:
        """(codes, scale, offset, zc, bits, M): this weight as gemm_int_multi takes it."""
        return (self.codes, self._scale_u16, self._offset_u16, float(self.zc or 0.0), self.bits, self.shape[0])

    def state(self):
        meta = {"format": self.format, "bits": self.bits, "M": self.shape[0], "K": self.shape[1],
                "group": self.group, **self.meta_extra}
        tensors = {"codes": self.codes, "scale": self.scale}
        if self.offset is not None:
            tensors["offset"] = self.offset
        return meta, tensors

    @classmethod
    def from_state(cls, meta, tensors):
        extra = {k: v for k, v in meta.items() if k not in ("format", "bits", "M", "K", "group")}
        return cls((meta["M"], meta["K"]), meta["group"], tensors["codes"], tensors["scale"], tensors.get("offset"), extra)
