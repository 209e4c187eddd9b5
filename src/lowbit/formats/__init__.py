"""Weight formats: a table of name -> PackedWeight class (see base.py for the contract).

    from lowbit.formats import quantize
    pw = quantize(w, "ternary")   # float32 [M, K] -> packed
    y = pw.matmul(x)              # float32 [N, K] -> [N, M] on the packed bytes
"""
from __future__ import annotations

import numpy as np

from lowbit.formats.base import Activations, PackedWeight
from lowbit.formats.binary import BinaryWeight
from lowbit.formats.floats import BF16Weight, F32Weight
from lowbit.formats.int2 import Int2Weight
from lowbit.formats.int4 import Int4Weight
from lowbit.formats.int8 import Int8Weight
from lowbit.formats.ternary import TernaryWeight

FORMATS: dict[str, type[PackedWeight]] = {
    cls.format: cls
    for cls in (F32Weight, BF16Weight, Int8Weight, Int4Weight, Int2Weight, TernaryWeight, BinaryWeight)
}


def get_format(name: str) -> type[PackedWeight]:
    try:
        return FORMATS[name]
    except KeyError:
        raise ValueError(f"unknown weight format {name!r}; known: {', '.join(FORMATS)}") from None


def quantize(w: np.ndarray, format: str, **options) -> PackedWeight:
    """Packs float32 w [M, K] into `format` (options: group_size=, scale=, symmetric= per format)."""
    return get_format(format).quantize(w, **options)


def from_state(meta: dict, tensors: dict[str, np.ndarray]) -> PackedWeight:
    """Rebuilds a packed weight from its stored metadata and arrays (no copy)."""
    return get_format(meta["format"]).from_state(meta, tensors)


__all__ = ["Activations", "FORMATS", "PackedWeight", "from_state", "get_format", "quantize"]
