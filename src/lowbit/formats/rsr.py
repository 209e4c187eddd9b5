"""rsr: ternary weights multiplied through an RSR++ index (paper 003), with the dense codes kept for
the token counts where the index loses.

Weights are exactly those of ``ternary`` with one scale per row or per tensor (absmean, float16-rounded):
w[m, k] = a[m] * t[m, k], t in {-1, 0, 1}. (Per-group scales cannot go through RSR: a segment sums
inputs from anywhere along K, so one scale must cover the whole row.) Stored:

    perm   uint16/uint32 [ceil(M/k), K]      the direct base-3 index (formats/rsr_index.py, kernels/rsr.h)
    seg    uint16/uint32 [ceil(M/k), 3^k + 1]
    scale  float32 [M]                        a per row
    dense_codes, dense_scale                  a ``ternary`` weight (2-bit codes), unless dense=False

``matmul`` with N tokens runs the dense ternary kernel when N < min_tokens and the dense codes are kept,
else the native RSR++ kernel on int8 activations (per-token absmax over the whole row, the same
quantization the dense kernel uses with one group per row, so both paths compute the same integer sums).
"""
from __future__ import annotations

import os

import numpy as np

from lowbit import _native
from lowbit.formats.base import Activations, PackedWeight, check_weight
from lowbit.formats.intcodes import padded_k
from lowbit.formats.rsr_index import RSRIndex, ternary_terms
from lowbit.formats.rsr_tune import choose_k
from lowbit.formats.ternary import TernaryWeight, ternarize

TERNARY_VALUES = np.array([-1.0, 0.0, 1.0], np.float32)
# Fewest tokens for which RSR++ beats the dense AVX2 ternary kernel on bitnet-2b shapes (2-core AMD EPYC,
# `lowbit bench rsr`); below it a model with dense codes uses them.
DEFAULT_MIN_TOKENS = 32
TUNE_TOKENS = 128  # the prefill size k is tuned for
# k when none is given: fixed (not tuned) so a conversion and its bytes do not depend on the machine;
# LOWBIT_RSR_K=auto|analytic|<int> overrides it (e.g. for `lowbit convert --format rsr`).
DEFAULT_K = 5


def default_k():
    env = os.environ.get("LOWBIT_RSR_K", "").strip()
    if not env:
        return DEFAULT_K
    return int(env) if env.isdigit() else env


class RSRWeight(PackedWeight):
    format = "rsr"
    description = "ternary through an RSR++ index (paper 003) for prefill, dense 2-bit ternary codes for decode"
    table_values = "{-1, 0, +1}: a base-3 RSR++ index (k = 5) for prefill + the 2-bit ternary codes for decode"
    table_scales = "per row or tensor"

    def __init__(self, shape, k: int, perm: np.ndarray, seg: np.ndarray, scale: np.ndarray,
                 dense: TernaryWeight | None = None, min_tokens: int = DEFAULT_MIN_TOKENS, meta_extra=None):
        self.shape = (int(shape[0]), int(shape[1]))
        m, kdim = self.shape
        self.k = int(k)
        if self.k < 1 or 3 ** self.k > 1 << 16:
            raise ValueError(f"rsr: k must be >= 1 with 3^k <= 65536, got {self.k}")
        nblocks = -(-m // self.k)
        if perm.dtype not in (np.uint16, np.uint32) or perm.shape != (nblocks, kdim):
            raise ValueError(f"rsr: perm must be uint16/uint32 [{nblocks}, {kdim}], got {perm.dtype} {perm.shape}")
        if seg.dtype not in (np.uint16, np.uint32) or seg.shape != (nblocks, 3 ** self.k + 1):
            raise ValueError(f"rsr: seg must be uint16/uint32 [{nblocks}, {3 ** self.k + 1}], got {seg.dtype} {seg.shape}")
        if scale.dtype != np.float32 or scale.shape != (m,):
            raise ValueError(f"rsr: scale must be float32 [{m}], got {scale.dtype} {scale.shape}")
        if dense is not None and dense.shape != self.shape:
            raise ValueError(f"rsr: dense codes are {dense.shape}, the index {self.shape}")
        self.index = RSRIndex(self.shape, self.k, 3, TERNARY_VALUES, perm, seg)
        self.scale = scale
        self.dense = dense
        self.min_tokens = int(min_tokens)
        self.meta_extra = dict(meta_extra or {})
        self.kp = padded_k(kdim)

    # --- building ----------------------------------------------------------------------------------

    @classmethod
    def quantize(cls, w, scale: str = "row", k=None, dense: bool = True, min_tokens: int = DEFAULT_MIN_TOKENS,
                 group_size: int | None = None, method: str = "absmean", **options) -> "RSRWeight":
        """Ternarization as ``ternary`` (scale "row" or "tensor"; method "absmean" or "mse"), then the index.
        k: an int, "analytic" (eq. 7), "auto" (autotuned on this machine for 128 tokens, cached) or None
        (DEFAULT_K, or $LOWBIT_RSR_K)."""
        if group_size:
            raise ValueError("rsr: per-group scales cannot go through RSR (a segment sums inputs from the whole "
                             "row); use scale='row' or 'tensor'")
        w = check_weight(w)
        if scale not in ("row", "tensor"):
            raise ValueError(f"rsr: scale must be 'row' or 'tensor', got {scale!r}")
        t, a16, used = ternarize(w, scale, padded_k(w.shape[1]), padded_k(w.shape[1]), method)
        return cls.from_ternary(t, a16[:, 0], k=k, dense=dense, min_tokens=min_tokens, scale_mode=used)

    @classmethod
    def from_ternary(cls, t: np.ndarray, a, k=None, dense: bool = True, min_tokens: int = DEFAULT_MIN_TOKENS,
                     **meta) -> "RSRWeight":
        """t: int8 [M, K] in {-1, 0, 1}; a: one scale per row [M] (or a scalar)."""
        t = np.asarray(t)
        if t.ndim != 2 or t.size == 0:
            raise ValueError(f"rsr: ternary values must be a non-empty [M, K] matrix, got {t.shape}")
        m, kdim = t.shape
        a = np.asarray(a, np.float32).reshape(-1)
        if a.size not in (1, m):
            raise ValueError(f"rsr: one scale per row [M={m}] or a scalar, got {a.size} values")
        a = np.broadcast_to(a, (m,))
        kk = choose_k(m, kdim, 3, default_k() if k is None else k, TUNE_TOKENS)
        idx = ternary_terms(t, kk, "direct")[0][1]
        dense_w = TernaryWeight.from_ternary(t.astype(np.int8), a.reshape(m, 1)) if dense else None
        return cls((m, kdim), kk, idx.perm, idx.seg, np.ascontiguousarray(a, np.float32), dense_w, min_tokens, meta)

    @classmethod
    def from_ternary_weight(cls, w: TernaryWeight, k=None, **kw) -> "RSRWeight":
        """A ``ternary`` weight with one scale per row, re-indexed losslessly (keeps its codes as the dense part)."""
        if w.ngroups != 1:
            raise ValueError("rsr: needs one scale per row; this ternary weight has per-group scales")
        a, _ = w.affine()
        keep = kw.pop("dense", True)
        out = cls.from_ternary(w.unpacked_codes().astype(np.int8) - 1, a[:, 0], k=k, dense=False, **kw)
        if keep:
            out.dense = w
        return out

    # --- the contract ------------------------------------------------------------------------------

    def ternary(self) -> np.ndarray:
        """int8 [M, K] in {-1, 0, 1}, read back from the index (not from the dense codes)."""
        return self.index.digits().astype(np.int8) - 1

    def dequantize(self) -> np.ndarray:
        return self.ternary().astype(np.float32) * self.scale[:, None]

    def uses_index(self, n_tokens: int) -> bool:
        return self.dense is None or n_tokens >= self.min_tokens

    def _matmul(self, acts: Activations) -> np.ndarray:
        n = acts.shape[0]
        if not self.uses_index(n):
            return self.dense._matmul(acts)
        q, sx, _ = acts.int8(self.kp, self.kp)  # one group per row: shared with the dense ternary kernel
        m, kdim = self.shape
        q = q if kdim == self.kp else np.ascontiguousarray(q[:, :kdim])
        y = np.empty((n, m), np.float32)
        ix = self.index
        _native.rsr_gemm_i8(ix.perm, ix.seg, m, kdim, ix.k, 3, TERNARY_VALUES, q, np.ascontiguousarray(sx[:, 0]),
                            self.scale, 1.0, False, True, y)
        return y

    @property
    def index_nbytes(self) -> int:
        return self.index.nbytes

    @property
    def decode_nbytes(self) -> int:
        """Bytes one token (the dense path, when kept) reads; the whole weight's bytes otherwise."""
        return self.dense.nbytes if self.dense is not None and self.min_tokens > 1 else self.nbytes

    def state(self):
        meta = {"format": self.format, "M": self.shape[0], "K": self.shape[1], "k": self.k, "base": 3,
                "min_tokens": self.min_tokens, "dense": self.dense is not None, **self.meta_extra}
        tensors = {"perm": self.index.perm, "seg": self.index.seg, "scale": self.scale}
        if self.dense is not None:
            dmeta, dt = self.dense.state()
            meta["dense_group"] = dmeta["group"]
            tensors.update({f"dense_{name}": arr for name, arr in dt.items()})
        return meta, tensors

    @classmethod
    def from_state(cls, meta, tensors):
        for name in ("perm", "seg", "scale"):
            if name not in tensors:
                raise ValueError(f"rsr: stored weight lacks the {name!r} array")
        if meta.get("base", 3) != 3:
            raise ValueError(f"rsr: only base-3 (direct ternary) indices are stored, got base {meta.get('base')}")
        m, kdim = int(meta["M"]), int(meta["K"])
        perm, seg = tensors["perm"], tensors["seg"]
        check_index(perm, seg, kdim)
        dense = None
        if meta.get("dense"):
            dense = TernaryWeight.from_state({"format": "ternary", "bits": 2, "M": m, "K": kdim,
                                              "group": meta["dense_group"]},
                                             {"codes": tensors["dense_codes"], "scale": tensors["dense_scale"]})
        extra = {key: v for key, v in meta.items()
                 if key not in ("format", "M", "K", "k", "base", "min_tokens", "dense", "dense_group")}
        return cls((m, kdim), meta["k"], perm, seg, tensors["scale"], dense, meta.get("min_tokens", DEFAULT_MIN_TOKENS),
                   extra)


def check_index(perm: np.ndarray, seg: np.ndarray, k_dim: int) -> None:
    """A stored index the kernel can trust: perm < K, seg from 0 to K and non-decreasing (one pass, at load)."""
    if perm.size and int(perm.max()) >= k_dim:
        raise ValueError(f"rsr: a permutation entry is >= K={k_dim} (corrupt index)")
    if seg.size and (int(seg[:, 0].max()) != 0 or int(seg[:, -1].min()) != k_dim or int(seg[:, -1].max()) != k_dim
                     or (np.diff(seg.astype(np.int64), axis=1) < 0).any()):
        raise ValueError(f"rsr: segment bounds must rise from 0 to K={k_dim} (corrupt index)")
