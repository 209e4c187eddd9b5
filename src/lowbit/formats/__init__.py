"""Weight formats: a table of name -> PackedWeight class (see base.py for the contract).

    from lowbit.formats import quantize
    pw = quantize(w, "ternary")   # float32 [M, K] -> packed
    y = pw.matmul(x)              # float32 [N, K] -> [N, M] on the packed bytes
"""
from __future__ import annotations

import numpy as np

from lowbit import _native
from lowbit.formats.base import Activations, PackedWeight, as_activations
from lowbit.formats.binary import BinaryWeight
from lowbit.formats.codebook import CodebookWeight
from lowbit.formats.floats import BF16Weight, F32Weight
from lowbit.formats.int2 import Int2Weight
from lowbit.formats.int4 import Int4Weight
from lowbit.formats.int6 import Int6Weight
from lowbit.formats.int8 import Int8Weight
from lowbit.formats.rsr import RSRWeight
from lowbit.formats.intcodes import IntCodeWeight
from lowbit.formats.ternary import TernaryWeight
from lowbit.formats.tq1 import TQ1Weight

FORMATS: dict[str, type[PackedWeight]] = {
    cls.format: cls
    for cls in (F32Weight, BF16Weight, Int8Weight, Int6Weight, Int4Weight, Int2Weight, TernaryWeight, TQ1Weight, BinaryWeight, RSRWeight,
                CodebookWeight)
}


def get_format(name: str) -> type[PackedWeight]:
    try:
        return FORMATS[name]
    except KeyError:
        raise ValueError(f"unknown weight format {name!r}; known: {', '.join(FORMATS)}") from None


def parse_format(name: str) -> tuple[str, dict]:
    """A format name or a parameterized one -> (registered name, options):
    'codebook-m2v8b8g128' -> ('codebook', {'m': 2, 'v': 8, 'b': 8, 'g': 128}); 'int4' -> ('int4', {})."""
    from lowbit.formats.codebook import parse_spec

    spec = parse_spec(name) if name.startswith("codebook-") else None
    if spec is not None:
        return "codebook", spec
    get_format(name)
    return name, {}


def quantize(w: np.ndarray, format: str, **options) -> PackedWeight:
    """Packs float32 w [M, K] into `format` (options: group_size=, scale=, symmetric= per format)."""
    return get_format(format).quantize(w, **options)


def matmul_many(weights: list[PackedWeight], x) -> list[np.ndarray]:
    """[w.matmul(x) for w in weights], with the input quantized once and, when every weight is an
    integer-code format with the same padded K and group, one native call (one thread fork/join)."""
    if not weights:
        return []
    acts, vec = as_activations(x, weights[0].shape[1])
    first = weights[0]
    if all(isinstance(w, IntCodeWeight) and w.kp == first.kp and w.group == first.group and w.shape[1] == first.shape[1]
           for w in weights):
        q, sx, sq = acts.int8(first.kp, first.group)
        ys = [np.empty((q.shape[0], w.shape[0]), np.float32) for w in weights]
        _native.gemm_int_multi([w.native_args() for w in weights], first.kp, first.group, q, sx, sq, ys)
    else:
        ys = [w.matmul(acts) for w in weights]
    return [y[0] for y in ys] if vec else ys


def from_state(meta: dict, tensors: dict[str, np.ndarray]) -> PackedWeight:
    """Rebuilds a packed weight from its stored metadata and arrays (no copy)."""
    return get_format(meta["format"]).from_state(meta, tensors)


__all__ = ["Activations", "FORMATS", "PackedWeight", "from_state", "get_format", "matmul_many", "parse_format", "quantize"]
