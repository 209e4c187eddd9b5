"""codebook: additive vector quantization (AQLM) multiplied through a Psumbook (CodeGEMM), on the CPU.

Parameters m (codebooks), v (vector length), b (bits per code), g (inputs per scale group):
    w[r, k] = s[r, k // g] * sum_i C_i[code_i[r, k // v], k % v]
bits per weight = m*b/v (codes) + 16/g (float16 scales) + the codebooks, m * 2^b * v float16 per tensor
(``codebook_bpw`` reports them apart). b <= 8: each code is one byte, so b < 8 stores 8 bits per code.

Layout (kernels/codebook.h has the same description next to the kernels):
    b != 4:   codes uint8 [G][Mb][S_g][m][64]  Mb = ceil(M/64) blocks of 64 rows (Mt = 8 Mb tiles of 8 rows),
                                               Kp = ceil(K/v)*v, G = ceil(Kp/g), S_g = segments (of v inputs) in
                                               group g: a pair's 64 codes are one vector (one vpermi2b lookup)
    b == 4:   codes uint8 [G][Mt][P_g/2][32]   Mt = ceil(M/32) tiles of 32 rows; the P_g = S_g*m (segment,
              codebook) pairs of a group (q = s*m + i), padded to even with code 0: byte [p][j] holds row j's
              code of pair 2p in its low nibble and of pair 2p+1 in its high nibble (one vpshufb = 32 rows)
    scale     float16 [G][Mt*TILE]             TILE = 8 or 32 rows; rows past M have scale 0 (and code 0)
A b != 4 state written before the 64-row blocks (config without "code_block") is repacked at load.
On a CPU with AVX-512 VBMI a b == 4 weight also holds its codes in a second layout, made at first use (not stored):
    codes16   uint8 [G][2*Mt][P8_g/8][64]      blocks of 16 rows, pairs padded to P8_g (a multiple of 8) with code 0:
              slice s, byte 4j + t holds row j's code of pair 8s+t (low nibble) and 8s+4+t (high nibble), so one
              vpermb looks up 16 rows x 4 pairs and one vpdpbusd adds each row's 4 lookups (kernels/codebook.h)
    codebooks float16 [m][2^b][v]
Two kernels: the Psumbook one (per token and group, the inner products of each input segment with every
centroid, then one lookup per code) and dequantize-then-multiply (the usual kernel, the paper's baseline).
For b == 4 the Psumbook tables are int8 (16 entries: one register, looked up with vpshufb).
``matmul`` uses the Psumbook for up to PSUM_MAX_TOKENS tokens and dequantize-then-multiply above (b == 4: always
the Psumbook).
"""
from __future__ import annotations

import re

import numpy as np

from lowbit import _native
from lowbit.formats.base import Activations, PackedWeight, check_weight

TILE = 8
BLOCK = 64  # b != 4: rows per block of the code layout (Mt is a multiple of 8 tiles)
LUT_TILE = 32  # b == 4: rows per tile of the nibble (register-table) layout
PSUM_MAX_TOKENS = 16  # kernels/codebook.h codebook_use_psum: the native decoder makes the same choice
DEFAULTS = {"m": 1, "v": 4, "b": 8, "g": 128}
_SPEC = re.compile(r"^codebook(?:-m(\d+)v(\d+)b(\d+)g(\d+))?$")


def parse_spec(name: str) -> dict | None:
    """'codebook-m2v8b8g128' -> {'m': 2, 'v': 8, 'b': 8, 'g': 128}; 'codebook' -> the defaults; else None."""
    hit = _SPEC.match(name)
    if not hit:
        return None
    if hit.group(1) is None:
        return dict(DEFAULTS)
    return dict(zip("mvbg", (int(p) for p in hit.groups())))


def spec_name(m: int, v: int, b: int, g: int) -> str:
    return f"codebook-m{m}v{v}b{b}g{g}"


def check_params(m: int, v: int, b: int, g: int) -> None:
    if not (1 <= m <= 8):
        raise ValueError(f"codebook: m (codebooks) must be in 1..8, got {m}")
    if not (1 <= v <= 32):
        raise ValueError(f"codebook: v (vector length) must be in 1..32, got {v}")
    if not (1 <= b <= 8):
        raise ValueError(f"codebook: b (bits per code) must be in 1..8, got {b}")
    if g < v or g % v:
        raise ValueError(f"codebook: g (group) must be a positive multiple of v={v}, got {g}")


def row_tile(b: int) -> int:
    return LUT_TILE if b == 4 else TILE


def padded_rows(rows: int, b: int) -> int:
    """Rows of the packed layout: whole tiles of 32 (b == 4), else whole blocks of 64."""
    unit = LUT_TILE if b == 4 else BLOCK
    return -(-rows // unit) * unit


def codes_bytes(rows: int, kp: int, m: int, v: int, b: int, group: int) -> int:
    """Bytes of the packed codes of an [rows, kp] weight."""
    nseg = kp // v
    if b != 4:
        return padded_rows(rows, b) * nseg * m
    S = group // v
    nfull, rem = nseg // S, nseg % S
    pairs = nfull * (S * m + (S * m) % 2) + (rem * m + (rem * m) % 2)
    return -(-rows // LUT_TILE) * LUT_TILE * pairs // 2


def _pack_nibbles(idx: np.ndarray) -> np.ndarray:
    """codes [Mt*32, P] (one group) -> uint8 [Mt][ceil(P/2)][32]: pair 2p low nibble, 2p+1 high."""
    rows, p = idx.shape
    if p % 2:
        idx = np.concatenate([idx, np.zeros((rows, 1), np.uint8)], axis=1)
    t = idx.reshape(rows // LUT_TILE, LUT_TILE, -1, 2)
    return (t[..., 0] | (t[..., 1] << 4)).transpose(0, 2, 1).reshape(-1)


def _unpack_nibbles(packed: np.ndarray, rows: int, p: int) -> np.ndarray:
    """The inverse of _pack_nibbles: [rows (a multiple of 32), p]."""
    t = packed.reshape(rows // LUT_TILE, -1, LUT_TILE).transpose(0, 2, 1)
    out = np.stack([t & 15, t >> 4], axis=-1).reshape(rows, -1)
    return out[:, :p]


def pack_codes16(idx: np.ndarray, group: int, v: int) -> np.ndarray:
    """b == 4 codes uint8 [M, nseg, m] -> flat uint8 in the AVX-512 layout [G][2*Mt][P8_g/8][64] (see above)."""
    rows, nseg, m = idx.shape
    mb, S = -(-rows // LUT_TILE) * 2, group // v
    full = np.zeros((mb * 16, nseg, m), np.uint8)
    full[:rows] = idx
    parts = []
    for s0 in range(0, nseg, S):
        p = min(S, nseg - s0) * m
        p8 = -(-p // 8) * 8
        g = np.zeros((mb * 16, p8), np.uint8)
        g[:, :p] = full[:, s0:s0 + S].reshape(mb * 16, p)
        t = g.reshape(mb, 16, p8 // 8, 2, 4)  # [block][row][slice][nibble][pair in the dword]
        parts.append((t[:, :, :, 0] | (t[:, :, :, 1] << 4)).transpose(0, 2, 1, 3).reshape(-1))
    return np.ascontiguousarray(np.concatenate(parts))


def codes16_bytes(rows: int, kp: int, m: int, v: int, group: int) -> int:
    """Bytes of pack_codes16's layout of an [rows, kp] weight."""
    nseg, S = kp // v, group // v
    p8 = [-(-min(S, nseg - s0) * m // 8) * 8 for s0 in range(0, nseg, S)]
    return -(-rows // LUT_TILE) * 2 * 16 * sum(p8) // 2


def unpack_codes16(packed: np.ndarray, rows: int, nseg: int, m: int, group: int, v: int) -> np.ndarray:
    """The inverse of pack_codes16: uint8 [M, nseg, m]."""
    mb, S = -(-rows // LUT_TILE) * 2, group // v
    out, at = [], 0
    for s0 in range(0, nseg, S):
        p = min(S, nseg - s0) * m
        p8 = -(-p // 8) * 8
        t = packed[at:at + mb * 16 * p8 // 2].reshape(mb, p8 // 8, 16, 4).transpose(0, 2, 1, 3)
        g = np.stack([t & 15, t >> 4], axis=3).reshape(mb * 16, p8)
        out.append(g[:, :p].reshape(mb * 16, -1, m))
        at += mb * 16 * p8 // 2
    return np.concatenate(out, axis=1)[:rows]


_VBMI: bool | None = None


def _cpu_has_vbmi() -> bool:
    """Whether this CPU runs the AVX-512 VBMI kernels (at some ISA level: the level can change at run time)."""
    global _VBMI
    if _VBMI is None:
        f = _native.cpu_info()["features"]
        _VBMI = bool(f.get("avx512f") and f.get("avx512bw") and f.get("avx512_vbmi") and f.get("avx512_vnni"))
    return _VBMI


def pack_codes(idx: np.ndarray, group: int, v: int, b: int = 8) -> np.ndarray:
    """codes uint8 [M, nseg, m] -> flat uint8 in the [G][Mt][S_g][m][8] layout (b == 4: the nibble layout)."""
    rows, nseg, m = idx.shape
    if b == 4:
        mt, S = -(-rows // LUT_TILE), group // v
        full = np.zeros((mt * LUT_TILE, nseg, m), np.uint8)
        full[:rows] = idx
        parts = [_pack_nibbles(full[:, s0:s0 + S].reshape(mt * LUT_TILE, -1)) for s0 in range(0, nseg, S)]
        return np.ascontiguousarray(np.concatenate(parts))
    return _pack_rows(idx, group, v, BLOCK)


def _pack_rows(idx: np.ndarray, group: int, v: int, unit: int) -> np.ndarray:
    """codes [M, nseg, m] -> [G][ceil(M/unit)][S_g][m][unit] (unit 64; 8: the layout before the 64-row blocks)."""
    rows, nseg, m = idx.shape
    mt, S = -(-rows // unit), group // v
    full = np.zeros((mt * unit, nseg, m), np.uint8)
    full[:rows] = idx
    nfull = nseg // S
    parts = [full[:, :nfull * S].reshape(mt, unit, nfull, S, m).transpose(2, 0, 3, 4, 1).reshape(-1)]
    if nseg > nfull * S:
        parts.append(full[:, nfull * S:].reshape(mt, unit, nseg - nfull * S, m).transpose(0, 2, 3, 1).reshape(-1))
    return np.ascontiguousarray(np.concatenate(parts))


def unpack_codes(packed: np.ndarray, rows: int, nseg: int, m: int, group: int, v: int, b: int = 8) -> np.ndarray:
    """The inverse of pack_codes: uint8 [M, nseg, m]."""
    if b == 4:
        mt, S = -(-rows // LUT_TILE), group // v
        out, at = [], 0
        for s0 in range(0, nseg, S):
            p = min(S, nseg - s0) * m
            n = mt * LUT_TILE * (p + p % 2) // 2
            out.append(_unpack_nibbles(packed[at:at + n], mt * LUT_TILE, p).reshape(mt * LUT_TILE, -1, m))
            at += n
        return np.concatenate(out, axis=1)[:rows]
    return _unpack_rows(packed, rows, nseg, m, group, v, BLOCK)


def _unpack_rows(packed: np.ndarray, rows: int, nseg: int, m: int, group: int, v: int, unit: int) -> np.ndarray:
    """The inverse of _pack_rows."""
    mt, S = -(-rows // unit), group // v
    nfull = nseg // S
    out = np.empty((mt * unit, nseg, m), np.uint8)
    n_a = nfull * mt * S * m * unit
    out[:, :nfull * S] = packed[:n_a].reshape(nfull, mt, S, m, unit).transpose(1, 4, 0, 2, 3).reshape(mt * unit, nfull * S, m)
    if nseg > nfull * S:
        rem = nseg - nfull * S
        out[:, nfull * S:] = packed[n_a:].reshape(mt, rem, m, unit).transpose(0, 3, 1, 2).reshape(mt * unit, rem, m)
    return out[:rows]


class CodebookWeight(PackedWeight):
    format = "codebook"
    description = "additive vector codebooks (AQLM) with a Psumbook kernel (CodeGEMM): m*b/v + 16/g bits"
    table_values = "m codebooks of 2^b vectors of v weights (AQLM; default m1 v4 b8), Psumbook kernel"
    table_scales = "per row and group of g (default 128) + codebooks per tensor"

    def __init__(self, shape, m: int, v: int, b: int, group: int, codes, scale, codebooks, meta_extra=None):
        self.shape = (int(shape[0]), int(shape[1]))
        self.m, self.v, self.b = int(m), int(v), int(b)
        self.kp = -(-self.shape[1] // self.v) * self.v
        self.group = min(int(group), self.kp)
        check_params(self.m, self.v, self.b, self.group)
        self.nc = 1 << self.b
        self.ngroups = -(-self.kp // self.group)
        self.tile = row_tile(self.b)
        self.mt = padded_rows(self.shape[0], self.b) // self.tile
        n_codes = codes_bytes(self.shape[0], self.kp, self.m, self.v, self.b, self.group)
        if codes.dtype != np.uint8 or codes.ndim != 1 or codes.size != n_codes:
            raise ValueError(f"codebook: packed codes must be flat uint8 of {n_codes} bytes, got {codes.dtype} {codes.shape}")
        if scale.dtype != np.float16 or scale.ndim != 1 or scale.size != self.ngroups * self.mt * self.tile:
            raise ValueError(f"codebook: scales must be flat float16 of {self.ngroups * self.mt * self.tile} values")
        if codebooks.dtype != np.float16 or codebooks.shape != (self.m, self.nc, self.v):
            raise ValueError(f"codebook: codebooks must be float16 [{self.m}, {self.nc}, {self.v}], "
                             f"got {codebooks.dtype} {codebooks.shape}")
        if not np.isfinite(codebooks).all():  # the int8 table kernels would round a NaN away without a trace
            raise ValueError("codebook: the codebooks hold NaN or Inf values")
        self.codes, self.scale, self.codebooks = codes, scale, codebooks
        self.meta_extra = dict(meta_extra or {})
        self._scale_u16 = scale.view(np.uint16)
        self._codes16 = None
        self._cb = np.ascontiguousarray(codebooks, np.float32)         # [m][nc][v] (a few KiB)
        self._cbT = np.ascontiguousarray(self._cb.transpose(0, 2, 1))  # [m][v][nc]

    @classmethod
    def quantize(cls, w, m: int = 1, v: int = 4, b: int = 8, g: int | None = None, group_size: int | None = None,
                 seed: int = 0, iters: int = 4, importance=None, beam: int = 8, hessian=None, damp: float = 0.01,
                 refine: int = 0, act_order: bool = True, **options) -> "CodebookWeight":
        """Fits m codebooks of 2^b centroids of v inputs to w (float32 [M, K]); g (or group_size) inputs per
        scale (default 128). importance: float [K] per-input weights (calibration mean x^2) or None; beam:
        the code search's beam width for m > 1 (codebook_beam); hessian: float [K, K] = X^T X / n of the
        layer's inputs: codes chosen with error feedback (codebook_gptq; damp: its dampening; act_order: the
        most important inputs first), then `refine`
        conjugate-gradient steps on the codebooks for the output error."""
        from lowbit.formats.codebook_quant import fit_codebooks

        w = check_weight(w)
        group = int(g or group_size or DEFAULTS["g"])
        check_params(m, v, b, group)
        kp = -(-w.shape[1] // v) * v
        group = min(group, kp)
        if beam < 1:
            raise ValueError(f"codebook: beam must be >= 1, got {beam}")
        idx, s, books = fit_codebooks(w, m, v, b, group, seed=seed, iters=iters, importance=importance, beam=beam,
                                      hessian=hessian, damp=damp, refine=refine,
                                      act_order=act_order)
        return cls.from_parts(idx, s, books, group, k=w.shape[1], seed=seed,
                              weighted=importance is not None or hessian is not None)

    @classmethod
    def from_parts(cls, idx: np.ndarray, s: np.ndarray, books: np.ndarray, group: int, k: int, **meta) -> "CodebookWeight":
        """codes uint8 [M, Kp/v, m], scales [M, G], codebooks [m, 2^b, v] -> packed."""
        rows, nseg, m = idx.shape
        v = books.shape[2]
        b = int(np.log2(books.shape[1]))
        sp = np.zeros((padded_rows(rows, b), s.shape[1]), np.float16)
        sp[:rows] = s
        return cls((rows, k), m, v, b, group, pack_codes(idx, group, v, b), np.ascontiguousarray(sp.T).reshape(-1),
                   np.ascontiguousarray(books, np.float16), meta)

    def unpacked_codes(self) -> np.ndarray:
        """uint8 [M, Kp/v, m]."""
        return unpack_codes(self.codes, self.shape[0], self.kp // self.v, self.m, self.group, self.v, self.b)

    def scales(self) -> np.ndarray:
        """float32 [M, G]."""
        return self.scale.reshape(self.ngroups, self.mt * self.tile).T[:self.shape[0]].astype(np.float32)

    def dequantize(self) -> np.ndarray:
        idx = self.unpacked_codes()  # [M, nseg, m]
        vec = self._cb[0][idx[..., 0]]
        for i in range(1, self.m):
            vec = vec + self._cb[i][idx[..., i]]
        w = vec.reshape(self.shape[0], self.kp)
        cols = np.arange(self.kp) // self.group
        return (w * self.scales()[:, cols])[:, :self.shape[1]]

    @property
    def codebook_bpw(self) -> float:
        """Bits per weight of the codebooks alone (amortized over this tensor)."""
        return self.codebooks.nbytes * 8.0 / (self.shape[0] * self.shape[1])

    @property
    def nominal_bpw(self) -> float:
        """m*b/v + 16/g: the bits per weight without codebooks and padding."""
        return self.m * self.b / self.v + 16.0 / self.group

    @property
    def codes16(self) -> np.ndarray | None:
        """b == 4 on a CPU with AVX-512 VBMI: the codes in the AVX-512 kernel's layout (made once and kept beside
        ``codes``; the native decoder's arena keeps only this copy resident, model/hugepages.py); else None."""
        if self.b != 4 or not _cpu_has_vbmi():
            return None
        if self._codes16 is None:
            n = codes16_bytes(self.shape[0], self.kp, self.m, self.v, self.group)
            out = np.empty(n, np.uint8)
            _native.codebook_codes16(self.codes, self.shape[0], self.kp, self.group, self.m, self.v, out)
            self._codes16 = out
        return self._codes16

    def native_args(self) -> tuple:
        return (self.codes, self._scale_u16, self.codes16)

    def padded_input(self, x: np.ndarray) -> np.ndarray:
        if x.shape[1] == self.kp:
            return x
        xp = np.zeros((x.shape[0], self.kp), np.float32)
        xp[:, :x.shape[1]] = x
        return xp

    def matmul_kernel(self, x, psum: bool) -> np.ndarray:
        """float32 [N, K] -> [N, M] with a chosen kernel: the Psumbook (psum=True) or dequantize-then-multiply."""
        x = self.padded_input(np.ascontiguousarray(x, np.float32))
        y = np.empty((x.shape[0], self.shape[0]), np.float32)
        _native.gemm_codebook([self.native_args()], self._cbT, self._cb, self.shape[0], self.kp, self.group, x, y, psum)
        return y

    def _matmul(self, acts: Activations) -> np.ndarray:
        return self.matmul_kernel(acts.x, self.use_psum(acts.shape[0]))

    def use_psum(self, n_tokens: int) -> bool:
        """The Psumbook up to PSUM_MAX_TOKENS tokens, dequantize-then-multiply above; b == 4, and b == 8 on the
        AVX-512 VBMI kernel, always the Psumbook (register tables: cheaper per token than decoding m vectors per
        weight; kernels/codebook.h codebook_use_psum)."""
        return self.b == 4 or n_tokens <= PSUM_MAX_TOKENS or (self.b == 8 and _native.codebook_vbmi_active())

    def state(self):
        meta = {"format": self.format, "M": self.shape[0], "K": self.shape[1], "m": self.m, "v": self.v, "b": self.b,
                "group": self.group, **self.meta_extra}
        if self.b != 4:
            meta["code_block"] = BLOCK
        return meta, {"codes": self.codes, "scale": self.scale, "codebooks": self.codebooks}

    @classmethod
    def from_state(cls, meta, tensors):
        extra = {k: v for k, v in meta.items() if k not in ("format", "M", "K", "m", "v", "b", "group", "code_block")}
        codes, scale = tensors["codes"], tensors["scale"]
        if meta["b"] != 4 and meta.get("code_block", TILE) != BLOCK:
            codes, scale = _repack_tiles8(meta, codes, scale)
        return cls((meta["M"], meta["K"]), meta["m"], meta["v"], meta["b"], meta["group"], codes, scale,
                   tensors["codebooks"], extra)


def _repack_tiles8(meta, codes, scale):
    """A b != 4 state from before the 64-row blocks ([G][ceil(M/8)][S_g][m][8], scales [G][ceil(M/8)*8]) ->
    the current layout."""
    rows, v, m = int(meta["M"]), int(meta["v"]), int(meta["m"])
    kp = -(-int(meta["K"]) // v) * v
    group = min(int(meta["group"]), kp)
    old_rows = -(-rows // TILE) * TILE
    if codes.size != old_rows * (kp // v) * m or scale.size % old_rows:
        raise ValueError(f"codebook: packed codes of {codes.size} bytes fit neither layout of a [{rows}, {kp}] weight")
    idx = _unpack_rows(np.asarray(codes), rows, kp // v, m, group, v, TILE)
    s = np.asarray(scale).reshape(-1, old_rows)
    sp = np.zeros((s.shape[0], padded_rows(rows, int(meta["b"]))), np.float16)
    sp[:, :rows] = s[:, :rows]
    return pack_codes(idx, group, v, int(meta["b"])), sp.reshape(-1)
