import numpy as np
import pytest

import lowbit
from lowbit import _native

ISAS = _native.cpu_info()["available"]  # every kernel path this machine can run


@pytest.fixture(params=ISAS)
def isa(request):
    """Runs the test once per kernel path this CPU has, then restores the automatic choice."""
    lowbit.set_isa(request.param)
    yield request.param
    lowbit.set_isa("auto")


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


@pytest.fixture(autouse=True)
def _restore_threads():
    """Benchmarks and CLI runs under test set the pool size (e.g. -t 1); later tests get the default back."""
    before = lowbit.get_threads()
    yield
    if lowbit.get_threads() != before:
        lowbit.set_threads(before)
