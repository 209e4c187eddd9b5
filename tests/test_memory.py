"""lowbit.memory: RSS now, the peak, and resetting the peak (so a conversion's peak is reported apart)."""
import subprocess
import sys

import numpy as np
import pytest

from lowbit.memory import peak_rss_gb, reset_peak_rss, rss_gb


def test_rss_and_peak():
    assert 0 < rss_gb() <= peak_rss_gb() + 1e-3


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/clear_refs is Linux-only")
def test_reset_peak_forgets_a_spike():
    # A fresh interpreter: in the test process, earlier tests leave freed heap that a 200 MB array can
    # reuse without raising the peak (or lowering RSS when freed), which made this check depend on order.
    code = (
        "import numpy as np\n"
        "from lowbit.memory import peak_rss_gb, reset_peak_rss\n"
        "spike = np.ones(300 << 20, np.uint8)\n"
        "high = peak_rss_gb()\n"
        "del spike\n"
        "assert reset_peak_rss()\n"
        "low = peak_rss_gb()\n"
        "assert low < high - 0.2, (low, high)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
