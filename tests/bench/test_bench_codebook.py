"""Codebook settings can be named in `lowbit bench gemv --formats` and run both kernels."""
import json

import numpy as np

from lowbit.bench.gemv import codebook_setting, random_weight
from lowbit.cli import main


def test_codebook_names():
    assert codebook_setting("codebook-m2v8b8g128") == ({"m": 2, "v": 8, "b": 8, "g": 128}, True)
    assert codebook_setting("codebook-m1v4b8g128-dequant") == ({"m": 1, "v": 4, "b": 8, "g": 128}, False)
    assert codebook_setting("ternary") is None
    pw = random_weight("codebook-m1v4b8g128", 256, 1024, np.random.default_rng(0))
    # 2 + 16/128 bits, plus the codebook (256 x 4 float16) amortized over this small tensor: +0.0625
    assert pw.shape == (256, 1024) and pw.bits_per_weight == 2.125 + pw.codebook_bpw == 2.1875
    lut = random_weight("codebook-m4v8b4g128", 100, 1000, np.random.default_rng(0))  # nibble codes, 32-row tiles
    assert lut.tile == 32 and lut.nominal_bpw == 2.125 and lut.codes.nbytes == 128 * 1000 * 4 // 8 // 2
    x = np.random.default_rng(1).standard_normal((1, 1000)).astype(np.float32)
    assert np.all(np.isfinite(lut.matmul(x)))


def test_gemv_rows_for_codebook_kernels(capsys):
    fmts = "ternary,codebook-m1v4b8g128,codebook-m1v4b8g128-dequant"
    assert main(["bench", "gemv", "--models", "mobilellm-1.5b", "--formats", fmts, "-t", "1", "--rotate-mb", "4",
                 "--min-time", "0.01", "--bandwidth-mb", "16", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    rows = [r for r in res["rows"] if r["format"].startswith("codebook")]
    assert len(rows) == 8 and all(r["us"] > 0 and 2.1 < r["bpw"] < 2.2 for r in rows)
    assert {c["format"] for c in res["in_cache"]} == set(fmts.split(","))
