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
