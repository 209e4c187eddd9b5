"""int8: symmetric per-output-channel (or per-group) weights, w = a * (c - 128), c = round(w/a) + 128.

The default lm_head format: 8.0 bits per weight plus one float16 scale per row (or per group)."""
from __future__ import annotations

import numpy as np

from lowbit.formats.base import check_weight
from lowbit.formats.intcodes import IntCodeWeight, group_view, resolve_group


class Int8Weight(IntCodeWeight):
    format = "int8"
    description = "8-bit symmetric, one scale per row (or per group)"
    bits = 8
    zc = 128.0

    @classmethod
    def quantize(cls, w, group_size: int | None = None, **options):
        w = check_weight(w)
        m, k = w.shape
        group = resolve_group(group_size, k)
        wg = group_view(w, group)
        a = (np.abs(wg).max(axis=2) / 127.0).astype(np.float16).astype(np.float32)
        inv = np.divide(1.0, a, out=np.zeros_like(a), where=a > 0)
        c = np.clip(np.rint(wg * inv[:, :, None]), -127, 127) + 128
        codes = c.reshape(m, -1)[:, :k].astype(np.uint8)
        return cls.from_codes(codes, a, group=group)
