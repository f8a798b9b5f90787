"""Batch processes only (``graphmon analyze`` / ``compare``): keep freed numpy temporaries in the
heap for the next one instead of giving them back to the kernel.

Why: an analysis of 10M records makes ~2 GB of full-length temporaries. glibc serves every
allocation over its mmap threshold (at most 32 MiB) with a fresh mmap, so each temporary is
first-touch page faults (the kernel zeroes every page) and an munmap when freed: on a quiet core
that was 15-45% of the analysis's wall time, and most of its run-to-run spread
(bench/results/analysis-throughput.json measures both settings). Raising the mmap and trim
thresholds lets the heap hand the same pages back out. The cost is a resident heap as large as
the biggest analysis, which is why a serving process or the agent never calls this.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

M_TRIM_THRESHOLD = -1  # mallopt parameters from glibc's malloc.h
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 1 << 30  # allocations up to 1 GiB come from the heap (a 10M-record column is 80 MB)
TRIM_THRESHOLD_BYTES = (1 << 31) - 1  # keep up to 2 GiB of freed heap for the next temporary

_applied: bool | None = None


def reuse_heap_for_batch() -> bool:
    """Apply the setting once (glibc only; elsewhere a no-op). True when it is in effect."""
    global _applied
    if _applied is None:
        _applied = False
        if sys.platform.startswith("linux"):
            try:
                libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
                mallopt = getattr(libc, "mallopt", None)  # musl has none
                if mallopt is not None:
                    _applied = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(
                        mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))
            except OSError:
                pass
    return _applied
