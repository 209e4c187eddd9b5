"""The int8 compute-roof probe (`lowbit bench roof`): it counts the MACs of the instructions it runs,
on every ISA level this CPU has, on one thread and on the pool."""
import pytest

import lowbit
from lowbit import _native
from lowbit.bench import roof

# MACs per probe iteration: 12 dot-product instructions of 32 (ymm) or 64 (zmm) u8 x s8 products; AMX: 4
# tdpbsud of 16 x 16 x 64; the scalar probe's loop does 64.
MACS_PER_ITER = {"avx2": 12 * 32, "avxvnni": None, "avx512": 12 * 64, "amx": 4 * 16 * 16 * 64, "scalar": 64}


def test_probe_counts_its_macs(isa):
    s, macs, what = _native.int8_roof(1000, 1)
    assert s > 0 and what
    per = MACS_PER_ITER[isa]
    if per is None:  # ymm (VEX) or zmm (EVEX-only CPU): either width
        assert macs in (1000 * 12 * 32, 1000 * 12 * 64)
    else:
        assert macs == 1000 * per


def test_pool_runs_one_probe_per_thread(isa):
    lowbit.set_threads(2)
    _, one, _ = _native.int8_roof(500, 1)
    _, two, _ = _native.int8_roof(500, 2)
    assert two == 2 * one


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="iters"):
        _native.int8_roof(0, 1)
    with pytest.raises(ValueError, match="threads"):
        _native.int8_roof(10, lowbit.get_threads() + 1)
    with pytest.raises(ValueError, match="threads"):
        roof.measure(0)


def test_measure_reports_rate():
    r = roof.measure(1, min_time=0.01, repeats=2)
    assert r["gmacs"] > 0 and len(r["gmacs_runs"]) == 2 and r["gmacs"] == max(r["gmacs_runs"])
