"""Memory for a window's records: arrays in mappings of their own, in small pages.

Why not np.empty: a capture's store chunks freed back to the heap were given back to the kernel
a dozen at a time by glibc's trim (2.3 ms of GIL at once, while the store was emptied), and
numpy madvises transparent huge pages from 4 MB on, whose first touches cost the C pass (eight
columns written at once) 150-200 ms of kernel time on a 2M-record window, in pieces of 5-10 ms
(bench/collector/decode_buffers.py). In a mapping of its own, an array gives back just its pages when it
is freed, and its first touches fault in 4 KB at a time, evenly over the pieces of work.
"""

from __future__ import annotations

import mmap

import numpy as np

HUGE_PAGE_BYTES = 4 << 20  # numpy asks the kernel for transparent huge pages from this size on


def _in_pages(shape: tuple, dtype) -> np.ndarray:
    """An uninitialised array in an anonymous mapping of its own, small pages."""
    dt = np.dtype(dtype)
    n = int(np.prod(shape))
    m = mmap.mmap(-1, max(1, n * dt.itemsize))
    if hasattr(mmap, "MADV_NOHUGEPAGE"):  # Linux
        m.madvise(mmap.MADV_NOHUGEPAGE)
    return np.frombuffer(m, dt, count=n).reshape(shape)


def _fresh(n: int, dtype) -> np.ndarray:
    """A window's column: from HUGE_PAGE_BYTES on, in a mapping of its own (np.empty below)."""
    return np.empty(n, dtype) if n * np.dtype(dtype).itemsize < HUGE_PAGE_BYTES else _in_pages((n,), dtype)
