"""int2: general 2-bit, 4 levels per group: asymmetric (a*c + b) by default, or symmetric — ParetoQ's
{-1.5, -0.5, 0.5, 1.5} * a. The scale is chosen by a small search over clipping ratios (least squares)."""
from __future__ import annotations

from lowbit.formats.int4 import _AffineGroupWeight


class Int2Weight(_AffineGroupWeight):
    format = "int2"
    description = "2-bit, 4 levels, per-group scale and offset (symmetric: ParetoQ levels)"
    table_values = "4 levels, asymmetric, or ParetoQ's {-1.5,-0.5,0.5,1.5}"
    table_scales = "per group of 64"
    bits = 2
    default_group = 64
