"""The weight-format contract.

A format is a ``PackedWeight`` subclass registered by name. Each one can

* ``quantize(w, **options)`` — float32 [M, K] -> packed (offline, numpy);
* ``dequantize()`` — packed -> float32 [M, K], the numpy reference every kernel is tested against;
* ``matmul(x)`` — float32 [N, K] (or an ``Activations``) -> float32 [N, M], on the packed bytes, natively;
* ``state()`` / ``from_state(meta, tensors)`` — a flat dict of metadata and named arrays, which is what
  a model directory stores in safetensors; ``from_state`` must not copy the arrays (they may be mmapped).

Callers (the runtime's Linear, the benchmarks) use only this surface, so new formats (RSR, codebooks)
plug in without changing them.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

import numpy as np

from lowbit import _native


def empty_aligned(shape: tuple[int, ...], dtype, align: int = 64) -> np.ndarray:
    """np.empty whose data starts on an `align`-byte boundary (numpy gives 16): the AMX GEMM reads the int8
    activations as tile rows of 64 bytes, and a row that straddles two cache lines costs two."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape)) * dtype.itemsize
    buf = np.empty(nbytes + align, np.uint8)
    off = (-buf.ctypes.data) % align
    return buf[off:off + nbytes].view(dtype).reshape(shape)


class Activations:
    """An input block x: float32 [N, K], with its int8 quantizations cached per (Kp, group).

    Projections that read the same input (Q/K/V, gate/up) share one object, so the input rows are
    quantized once.
    """

    __slots__ = ("x", "_int8")

    def __init__(self, x: np.ndarray):
        x = np.asarray(x, dtype=np.float32)
        if x.ndim == 1:
            x = x[None, :]
        if x.ndim != 2:
            raise ValueError(f"activations must be [N, K], got shape {x.shape}")
        self.x = np.ascontiguousarray(x)
        self._int8: dict[tuple[int, int], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

    @property
    def shape(self) -> tuple[int, int]:
        return self.x.shape

    def int8(self, kp: int, group: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(q int8 [N, Kp], scale f32 [N, G], sum int32 [N, G]): per-token, per-group absmax int8."""
        key = (kp, group)
        got = self._int8.get(key)
        if got is None:
            n = self.x.shape[0]
            g = -(-kp // group)
            got = (empty_aligned((n, kp), np.int8), np.empty((n, g), np.float32), np.empty((n, g), np.int32))
            _native.quantize_act(self.x, *got, group)
            self._int8[key] = got
        return got


def as_activations(x, k: int) -> tuple[Activations, bool]:
    """Wraps x (float32 [N, K] or [K], or Activations); returns it and whether x was 1-D."""
    if isinstance(x, Activations):
        acts, vec = x, False
    else:
        arr = np.asarray(x)
        vec = arr.ndim == 1
        acts = Activations(arr)
    if acts.shape[1] != k:
        raise ValueError(f"input has K={acts.shape[1]} but the weight has K={k}")
    return acts, vec


class PackedWeight(ABC):
    """A weight matrix W: [M, K] in one storage format. y = x @ W.T."""

    format: ClassVar[str] = ""
    description: ClassVar[str] = ""
    # the README's weight-format table is generated from these (python -m lowbit.formats --markdown)
    table_values: ClassVar[str] = ""  # what a weight can be, e.g. "symmetric int8"
    table_scales: ClassVar[str] = ""  # what the scales cover, e.g. "per block of 32"

    shape: tuple[int, int]

    @classmethod
    @abstractmethod
    def quantize(cls, w: np.ndarray, **options) -> "PackedWeight":
        """Packs float32 w [M, K]."""

    @abstractmethod
    def dequantize(self) -> np.ndarray:
        """float32 [M, K]: the numpy reference of what matmul computes with."""

    @abstractmethod
    def _matmul(self, acts: Activations) -> np.ndarray:
        """float32 [N, M] from the native kernel."""

    @abstractmethod
    def state(self) -> tuple[dict, dict[str, np.ndarray]]:
        """(metadata of JSON scalars, named arrays) — enough for from_state to rebuild this object."""

    @classmethod
    @abstractmethod
    def from_state(cls, meta: dict, tensors: dict[str, np.ndarray]) -> "PackedWeight":
        """Rebuilds from state() without copying the arrays."""

    def matmul(self, x) -> np.ndarray:
        """x: float32 [N, K] or [K] or Activations -> float32 [N, M] (or [M])."""
        acts, vec = as_activations(x, self.shape[1])
        y = self._matmul(acts)
        return y[0] if vec else y

    @property
    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in self.state()[1].values())

    @property
    def bits_per_weight(self) -> float:
        m, k = self.shape
        return self.nbytes * 8.0 / (m * k)

    def __repr__(self) -> str:
        m, k = self.shape
        return f"<{type(self).__name__} {self.format} [{m}, {k}] {self.bits_per_weight:.3f} bpw>"


class SourceRows:
    """A float matrix as a checkpoint stores it, for the native quantizers to read without a float32 copy.

    data: [R, K] float32, float16, or bf16 bits as uint16 (kind "bf16"); rows: optional int64 [M], the
    source row of each output row (GGUF's Q/K un-permutation), else the M = R rows in order.
    """

    KINDS = {"f32": 0, "f16": 1, "bf16": 2}

    def __init__(self, data: np.ndarray, kind: str | None = None, rows: np.ndarray | None = None):
        data = np.asarray(data)
        if kind is None:
            kind = {np.dtype(np.float32): "f32", np.dtype(np.float16): "f16"}.get(data.dtype)
        if kind not in self.KINDS or data.dtype.itemsize != (4 if kind == "f32" else 2):
            raise ValueError(f"source rows must be float32, float16 or bf16 (uint16 bits), got {data.dtype} as {kind}")
        if data.ndim != 2 or data.shape[0] < 1 or data.shape[1] < 1:
            raise ValueError(f"a weight must be 2-D [M, K] and non-empty, got shape {data.shape}")
        self.data = np.ascontiguousarray(data)
        self.kind = kind
        self.rows = None if rows is None else np.ascontiguousarray(rows, np.int64)
        m = data.shape[0] if rows is None else len(self.rows)
        self.shape = (int(m), int(data.shape[1]))

    @property
    def kind_id(self) -> int:
        return self.KINDS[self.kind]

    def float32(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """float32 [stop - start, K] of output rows start..stop (all by default)."""
        sel = slice(start, stop)
        src = self.data[sel] if self.rows is None else self.data[self.rows[sel]]
        if self.kind == "bf16":
            return (src.astype(np.uint32) << np.uint32(16)).view(np.float32)
        return np.ascontiguousarray(src, np.float32)


def check_weight(w: np.ndarray) -> np.ndarray:
    w = np.asarray(w)
    if w.ndim != 2:
        raise ValueError(f"a weight must be 2-D [M, K], got shape {w.shape}")
    if w.shape[0] < 1 or w.shape[1] < 1:
        raise ValueError(f"a weight must be non-empty, got shape {w.shape}")
    w = np.ascontiguousarray(w, dtype=np.float32)
    if not np.isfinite(w).all():
        raise ValueError("weight has NaN or Inf values")
    return w
