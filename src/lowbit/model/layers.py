"""The decoder's building blocks in numpy float32: Linear, Embedding, RMSNorm, RoPE, activations.

Every projection is a `Linear` holding one PackedWeight; its input is an `Activations` so that
projections reading the same rows (Q/K/V, gate/up) quantize them once.
"""
from __future__ import annotations

import math
import warnings

import numpy as np

from lowbit.formats import Activations, PackedWeight, quantize
from lowbit.formats.floats import BF16Weight, F32Weight, bf16_bits_to_f32


def as_packed(w, format: str | None = None, **options) -> PackedWeight:
    """A PackedWeight from a PackedWeight (as is) or a float array [M, K] (f32 without a copy, or `format`)."""
    if isinstance(w, PackedWeight):
        return w
    w = np.asarray(w)
    if w.ndim != 2:
        raise ValueError(f"a linear weight must be 2-D [M, K], got shape {w.shape}")
    if format is None or format == "f32":
        return F32Weight(np.ascontiguousarray(w, np.float32))
    return quantize(np.ascontiguousarray(w, np.float32), format, **options)


class Linear:
    """y = x @ W.T (+ b). W: PackedWeight [out, in]; b: float32 [out] or None."""

    __slots__ = ("weight", "bias", "_mm")

    def __init__(self, weight: PackedWeight, bias: np.ndarray | None = None):
        self.weight = weight
        self.bias = None if bias is None else np.ascontiguousarray(bias, np.float32)
        self._mm = weight.matmul

    def __call__(self, x) -> np.ndarray:
        """x: float32 [N, in] or Activations -> float32 [N, out]."""
        y = self._mm(x)
        if self.bias is not None:
            y += self.bias
        return y

    @property
    def shape(self) -> tuple[int, int]:
        return self.weight.shape


def token_ids(ids, vocab_size: int | None = None) -> np.ndarray:
    """Token ids as int64 [n]: a list / tuple of Python ints or numpy integers, or a 1-D numpy integer array,
    each in [0, vocab_size) when vocab_size is given.

    Floats (even integral ones such as 2.0) and bools are refused rather than truncated to an id: a float
    array is almost always logits, embeddings or probabilities passed by mistake.
    """
    if isinstance(ids, np.ndarray):
        if ids.dtype.kind not in "iu":
            raise TypeError(f"token ids must be integers, got an array of dtype {ids.dtype} "
                            "(ids are never rounded; pass an integer array, e.g. ids.astype(np.int64))")
        if ids.ndim != 1:
            raise ValueError(f"token ids must be a 1-D sequence, got an array of shape {ids.shape}")
        arr = ids
    else:
        if isinstance(ids, (str, bytes)) or not hasattr(ids, "__iter__"):
            raise TypeError(f"token ids must be a list or 1-D array of integers, got {type(ids).__name__}")
        items = list(ids)
        for i, t in enumerate(items):
            if isinstance(t, (bool, np.bool_)) or not isinstance(t, (int, np.integer)):
                at = f" at index {i}" if len(items) > 1 else ""
                raise TypeError(f"token ids must be integers (Python int or a numpy integer), got "
                                f"{t!r} ({type(t).__name__}){at}")
        try:
            arr = np.array(items, np.int64)
        except OverflowError:
            bad = next(t for t in items if not -2**63 <= t < 2**63)
            raise ValueError(f"token id {bad} is out of range"
                             + (f": the vocabulary has {vocab_size} tokens" if vocab_size is not None else "")) from None
    if vocab_size is not None and arr.size and (arr.min() < 0 or arr.max() >= vocab_size):
        bad = int(arr[(arr < 0) | (arr >= vocab_size)][0])  # numpy would take -1 as the last row
        raise ValueError(f"token id {bad} is out of range: the vocabulary has {vocab_size} tokens")
    return np.ascontiguousarray(arr, np.int64)


class Embedding:
    """Token embedding table [vocab, hidden]: a float array or a PackedWeight (bf16 rows are gathered as is)."""

    def __init__(self, table):
        self.table = table
        if isinstance(table, BF16Weight):
            bits = self.rows_source = table.w
            self._rows = lambda ids: bf16_bits_to_f32(bits[ids])
        elif isinstance(table, F32Weight):
            t = self.rows_source = table.w
            self._rows = lambda ids: t[ids]
        elif isinstance(table, PackedWeight):
            warnings.warn(f"embedding stored as {table.format}: dequantizing the whole table once "
                          "(store it as bf16 or f32 to gather rows directly)", stacklevel=3)
            t = self.rows_source = table.dequantize()
            self._rows = lambda ids: t[ids]
        else:
            t = self.rows_source = np.ascontiguousarray(table, np.float32)
            self.table = t
            self._rows = lambda ids: t[ids]
        self.shape = tuple(int(s) for s in self.table.shape)

    def __call__(self, ids) -> np.ndarray:
        """ids: int [N] -> float32 [N, hidden] (a fresh array)."""
        return np.array(self._rows(token_ids(ids, self.shape[0])), np.float32)

    def as_linear(self) -> Linear:
        """The same table as an output projection (tied embeddings)."""
        return Linear(as_packed(self.table))


def soft_cap_(x: np.ndarray, cap: float | None) -> np.ndarray:
    """Soft-capping in place (Gemma 2's attention scores and final logits): x -> cap * tanh(x / cap); None: x."""
    if cap is not None:
        x *= np.float32(1.0 / cap)
        np.tanh(x, out=x)
        x *= np.float32(cap)
    return x


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """x: float32 [N, D], w: float32 [D] -> x / sqrt(mean(x^2) + eps) * w (a new array)."""
    if x.shape[0] == 1:  # decode: one row, fewest numpy calls
        r = 1.0 / math.sqrt(float(np.dot(x[0], x[0])) / x.shape[1] + eps)
        return x * (w * np.float32(r))
    ms = np.einsum("nd,nd->n", x, x)[:, None]
    ms *= 1.0 / x.shape[1]
    ms += eps
    return x * (w / np.sqrt(ms))


def silu(x: np.ndarray) -> np.ndarray:
    """x * sigmoid(x), with sigmoid(x) = (1 + tanh(x/2)) / 2 (no overflow for large |x|)."""
    t = np.tanh(x * 0.5)
    t += 1.0
    t *= 0.5
    t *= x
    return t


def relu2(x: np.ndarray) -> np.ndarray:
    """relu(x)^2 (BitNet b1.58)."""
    np.maximum(x, 0.0, out=x)
    return np.square(x, out=x)


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """GELU, tanh approximation (Gemma's gelu_pytorch_tanh): x/2 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))."""
    t = x * x
    t *= np.float32(0.044715)
    t += 1.0
    t *= x
    t *= np.float32(math.sqrt(2.0 / math.pi))
    np.tanh(t, out=t)
    t += 1.0
    t *= x
    t *= 0.5
    return t


ACTIVATIONS = {"silu": silu, "swish": silu, "relu2": relu2, "gelu_pytorch_tanh": gelu_tanh, "gelu_tanh": gelu_tanh}


def rope_inv_freq(head_dim: int, theta: float, scaling: dict | None, freq_factors=None) -> np.ndarray:
    """float32 [head_dim/2] inverse frequencies, as Hugging Face computes them (default, linear, llama3),
    then divided by `freq_factors` [head_dim/2] when given (llama.cpp's rope_freqs.weight: how a Llama 3.1/3.2
    GGUF carries its llama3 scaling)."""
    inv = 1.0 / (np.float32(theta) ** (np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / head_dim))
    inv = inv.astype(np.float32)
    if freq_factors is not None:
        f = np.asarray(freq_factors, np.float32).reshape(-1)
        if f.shape != inv.shape or not np.all(np.isfinite(f)) or not np.all(f > 0):
            raise ValueError(f"rope_freq_factors must be {inv.size} positive finite numbers (head_dim/2), got shape {f.shape}")
        inv = (inv / f).astype(np.float32)
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if kind in (None, "default"):
        return inv
    if kind == "linear":
        return (inv / np.float32(scaling["factor"])).astype(np.float32)
    if kind == "llama3":
        factor = scaling["factor"]
        lo, hi = scaling.get("low_freq_factor", 1.0), scaling.get("high_freq_factor", 4.0)
        old = scaling["original_max_position_embeddings"]
        lo_wl, hi_wl = old / lo, old / hi
        wavelen = 2 * math.pi / inv
        out = np.where(wavelen > lo_wl, inv / factor, inv)
        smooth = (old / wavelen - lo) / (hi - lo)
        smoothed = (1 - smooth) * out / factor + smooth * out
        medium = ~(wavelen < hi_wl) & ~(wavelen > lo_wl)
        return np.where(medium, smoothed, out).astype(np.float32)
    if kind in ("longrope", "su"):  # Phi-3: per-frequency divisors; the caller picks short or long factors
        factors = np.asarray(scaling["factors"], np.float32)
        if factors.shape != inv.shape:
            raise ValueError(f"longrope factors have {factors.size} values; head_dim {head_dim} needs {inv.size}")
        base = np.float32(theta) ** (np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / head_dim)
        return (1.0 / (factors * base)).astype(np.float32)
    raise ValueError(f"rope scaling type {kind!r} is not supported (default, linear, llama3, longrope are)")


class Rope:
    """Rotary embeddings, HF's rotate_half convention: x*cos + rotate_half(x)*sin on [.., head_dim].

    With rotate_half(x) = [-x2, x1] for halves x1, x2 this is x*C + swap(x)*S, where swap(x) = [x2, x1],
    C = [cos, cos] and S = [-sin, sin]; C, S: float32 [max_ctx, head_dim], precomputed once.
    """

    def __init__(self, head_dim: int, max_ctx: int, theta: float, scaling: dict | None = None, freq_factors=None,
                 attention_factor: float = 1.0):
        inv = rope_inv_freq(head_dim, theta, scaling, freq_factors)
        freqs = np.outer(np.arange(max_ctx, dtype=np.float32), inv).astype(np.float32)  # [max_ctx, hd/2]
        cos, sin = np.cos(freqs).astype(np.float32), np.sin(freqs).astype(np.float32)
        if attention_factor != 1.0:  # longrope scales cos and sin (HF's attention_scaling)
            cos, sin = cos * np.float32(attention_factor), sin * np.float32(attention_factor)
        self.C = np.concatenate([cos, cos], axis=1)  # [max_ctx, hd]
        self.S = np.concatenate([-sin, sin], axis=1)  # [max_ctx, hd]
        self.half = head_dim // 2

    def tables(self, pos: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        """C, S for positions pos..pos+n-1, shaped [n, 1, head_dim] to broadcast over heads."""
        return self.C[pos:pos + n, None, :], self.S[pos:pos + n, None, :]

    def apply(self, x: np.ndarray, C: np.ndarray, S: np.ndarray) -> np.ndarray:
        """x: float32 [n, heads, head_dim] -> rotated copy, same shape."""
        h = self.half
        sw = np.concatenate((x[..., h:], x[..., :h]), axis=-1)  # swap halves
        sw *= S
        out = x * C
        out += sw
        return out


__all__ = ["ACTIVATIONS", "Activations", "Embedding", "Linear", "Rope", "as_packed", "gelu_tanh", "relu2", "rms_norm",
           "silu", "token_ids"]
