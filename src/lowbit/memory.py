"""This process's memory, as the CLI and benchmarks report it (Linux /proc, with getrusage as fallback).

    rss_gb()            resident memory now
    peak_rss_gb()       the high-water mark (VmHWM) since start or since reset_peak_rss()
    reset_peak_rss()    restarts the high-water mark (so generation's peak is not a conversion's)
"""
from __future__ import annotations

import os
import resource
import sys


def _status_kb(key: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def rss_gb() -> float:
    """Resident set size now, GB."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e9
    except (OSError, ValueError):
        return peak_rss_gb()


def peak_rss_gb() -> float:
    """Peak resident set size, GB (since the last reset_peak_rss where the OS supports it)."""
    kb = _status_kb("VmHWM")
    if kb is not None:
        return kb * 1024 / 1e9
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 1e9 if sys.platform == "darwin" else rss * 1024 / 1e9


def reset_peak_rss() -> bool:
    """Resets the peak RSS to the current RSS (Linux: /proc/self/clear_refs); False where unsupported."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False
