"""The GEMM (N tokens) paths against the GEMV (one token) on every ISA: the same bits row by row, since a
batched decode step must equal its rows run one at a time (tests/model/test_batch.py relies on it), and
against the numpy reference. N covers the GEMV run once per token (N = 2-3; 2-16 for 4-bit codes), the 6/4/2/1
token tiles of the panel kernels (AVX-512: 6 .. 1; AMX: blocks of 16 tokens and a partial one) and their passes, and
AMX's token slices for groups below 256 past 32 tokens (40: two of 20; 70: three; 133: five); M and K are not multiples
of the 64-row blocks or the slices."""
import numpy as np
import pytest

from lowbit.formats import quantize
from tests.formats.test_int_formats import reference

# Groups of 256 or more (and one group a row) take the AVX-512 panel GEMM from 4 tokens, every group of a multiple
# of 32 the AMX one (groups of 288: a 64-step slice, then 8 steps, so the tile shape changes inside a group).
CASES = [("int8", {}), ("int8", {"group_size": None}), ("int8", {"group_size": 96}), ("ternary", {"scale": "row"}),
         ("int2", {}), ("binary", {}), ("int4", {}), ("int2", {"group_size": 256}), ("int4", {"group_size": 512}),
         ("int8", {"group_size": 288})]


@pytest.mark.parametrize("fmt,opts", CASES, ids=lambda c: c if isinstance(c, str) else str(c))
@pytest.mark.parametrize("n", [2, 3, 4, 7, 13, 16, 40, 70, 133])
def test_gemm_rows_equal_gemv_bitwise(isa, fmt, opts, n, rng):
    m, k = 141, 1000  # 3 row blocks (the last of 13 rows), K padded to the format's unit
    w = rng.standard_normal((m, k)).astype(np.float32)
    x = rng.standard_normal((n, k)).astype(np.float32) * 3
    pw = quantize(w, fmt, **opts)
    y = pw.matmul(x)
    for i in range(n):
        np.testing.assert_array_equal(y[i], pw.matmul(x[i:i + 1])[0], err_msg=f"{fmt} {opts} row {i} of {n}")
    ref = reference(pw, x)
    np.testing.assert_allclose(y, ref, rtol=0, atol=1e-5 * np.abs(ref).max())
