"""lowbit.memory: RSS now, the peak, and resetting the peak (so a conversion's peak is reported apart)."""
import sys

import numpy as np
import pytest

from lowbit.memory import peak_rss_gb, reset_peak_rss, rss_gb


def test_rss_and_peak():
    assert 0 < rss_gb() <= peak_rss_gb() + 1e-3


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/clear_refs is Linux-only")
def test_reset_peak_forgets_a_spike():
    spike = np.ones(200 << 20, np.uint8)  # 200 MB touched
    high = peak_rss_gb()
    del spike
    assert reset_peak_rss()
    assert peak_rss_gb() < high - 0.1
