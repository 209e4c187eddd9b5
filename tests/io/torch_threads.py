"""The torch-based tests run torch on one thread (restored after each test): import `one_thread` into the module."""

import pytest

torch = pytest.importorskip("torch", reason="torch-based tests")


@pytest.fixture(autouse=True)
def one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)
