import pytest

pytest.importorskip("openvino", reason="the openvino package is not installed (pip install 'lowbit[openvino]')")


@pytest.fixture(autouse=True)
def private_cache(tmp_path_factory, monkeypatch):
    """Exports made by lowbit.load go to a per-session temporary cache, never to ~/.cache/lowbit."""
    monkeypatch.setenv("LOWBIT_CACHE", str(tmp_path_factory.getbasetemp() / "lowbit-cache"))
