"""CPU dispatch: LOWBIT_ISA forces a level, unsupported or unknown levels fail clearly; threads."""
import os
import subprocess
import sys

import numpy as np
import pytest

import lowbit
from lowbit.formats import quantize
from tests.conftest import ISAS


def run_py(code: str, **env) -> subprocess.CompletedProcess:
    e = dict(os.environ, **env)
    return subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("isa", ISAS)
def test_env_forces_level(isa):
    r = run_py("import lowbit; i = lowbit.cpu_info(); print(i['isa'], i['source'])", LOWBIT_ISA=isa)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [isa, "LOWBIT_ISA"]


def test_unknown_level_is_a_clear_error():
    r = run_py("import lowbit", LOWBIT_ISA="sse9")
    assert r.returncode != 0
    assert "unknown ISA 'sse9'" in r.stderr


def test_unsupported_level_is_a_clear_error():
    missing = [i for i in ("amx", "avx512", "avxvnni", "avx2") if i not in ISAS]
    if not missing:
        # this CPU runs every level: check set_isa's error path with a level name that cannot exist
        with pytest.raises(ValueError, match="unknown ISA"):
            lowbit.set_isa("avx1024")
        return
    with pytest.raises(ValueError, match="this CPU lacks"):
        lowbit.set_isa(missing[0])


def test_cpu_info_explains_choice():
    info = lowbit.cpu_info()
    assert info["isa"] in info["available"]
    assert info["reason"]
    assert info["threads"] >= 1 and info["physical_cores"] >= 1


_STREAM_KERNELS = """
import sys, numpy as np, lowbit
from lowbit.bench.gemv import random_weight
from lowbit.formats.rsr_lut import LUTMatrix
rng = np.random.default_rng(5)
outs = {}
for spec, n in (("codebook-m2v4b4g128", 1), ("codebook-m2v4b4g128", 3), ("codebook-m1v4b8g128", 1), ("ternary", 40)):
    w = random_weight(spec, 300, 520, rng)
    outs[f"{spec}/{n}"] = w.matmul(rng.standard_normal((n, 520)).astype(np.float32))
lut = LUTMatrix.ternary(rng.integers(-1, 2, (200, 384)))
y = np.empty((1, 200), np.float32)
lut.matmul_i8(rng.integers(-127, 128, (1, 384), dtype=np.int8), out=y)
outs["rsr-lut"] = y
np.savez(sys.argv[1], **outs)
print(lowbit.cpu_info()["stream_prefetch"])
"""


@pytest.mark.parametrize("threads", ["1", "2"])
def test_stream_prefetch_level_changes_no_result(tmp_path, threads):
    """LOWBIT_STREAM_PREFETCH moves the compute-heavy kernels' weight-stream prefetch between L1 and L2 (codebook
    b = 4 and b = 8, rsr-lut, the prefill GEMM's panels): a hint, so every output is the same bits either way."""
    got = {}
    for level in ("l1", "l2", "bogus"):
        f = tmp_path / f"{level}.npz"
        r = subprocess.run([sys.executable, "-c", _STREAM_KERNELS, str(f)], capture_output=True, text=True, timeout=120,
                           env=dict(os.environ, LOWBIT_STREAM_PREFETCH=level, LOWBIT_THREADS=threads))
        assert r.returncode == 0, r.stderr
        reason = r.stdout.strip()
        if level == "bogus":
            assert "'bogus' is not l1 or l2, ignored" in reason and reason[:2] in ("l1", "l2")
        else:
            assert reason == f"{level} (LOWBIT_STREAM_PREFETCH)"
        got[level] = dict(np.load(f))
    assert set(got["l1"]) == {"codebook-m2v4b4g128/1", "codebook-m2v4b4g128/3", "codebook-m1v4b8g128/1", "ternary/40",
                              "rsr-lut"}
    for k, v in got["l1"].items():
        assert np.isfinite(v).all() and np.abs(v).max() > 0, k
        np.testing.assert_array_equal(v, got["l2"][k], err_msg=k)
        np.testing.assert_array_equal(v, got["bogus"][k], err_msg=k)


def test_threads_env_and_results_independent_of_thread_count(rng):
    r = run_py("import lowbit; print(lowbit.get_threads())", LOWBIT_THREADS="3")
    assert r.stdout.strip() == "3"
    r = run_py("import lowbit", LOWBIT_THREADS="zero")
    assert r.returncode != 0 and "LOWBIT_THREADS" in r.stderr
    w = rng.standard_normal((1000, 576)).astype(np.float32)
    x = rng.standard_normal((3, 576)).astype(np.float32)
    before = lowbit.get_threads()
    try:
        outs = []
        for n in (1, 2, 3):
            lowbit.set_threads(n)
            outs.append([quantize(w, f).matmul(x) for f in ("ternary", "bf16")])
        for o in outs[1:]:
            for a, b in zip(outs[0], o):
                np.testing.assert_array_equal(a, b)
    finally:
        lowbit.set_threads(before)
    with pytest.raises(ValueError):
        lowbit.set_threads(0)


def test_f16_conversion_matches_numpy(isa, rng):
    """The native decoder writes its float16 KV cache with this converter; numpy writes it in prefill."""
    from lowbit import _native

    x = np.concatenate([rng.standard_normal(1000).astype(np.float32) * 10.0 ** rng.integers(-8, 5, 1000),
                        np.array([0.0, -0.0, 65504.0, 65519.0, 65520.0, 1e9, -1e9, 6e-8, 3e-8, 2.98e-8,
                                  1.0 + 2.0**-11, 1.0 + 3 * 2.0**-11, np.inf, -np.inf], np.float32)]).astype(np.float32)
    out = np.empty(x.size, np.uint16)
    _native.f32_to_f16(x, out)
    with np.errstate(over="ignore"):  # values past 65504 round to inf on purpose
        want = x.astype(np.float16).view(np.uint16)
    np.testing.assert_array_equal(out, want)
