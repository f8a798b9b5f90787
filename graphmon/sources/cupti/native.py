"""The native decode pass (_decode.c) through ctypes, when it was built; else None.

Built by ``pip install`` (setup.py: an optional extension, so an install without a C compiler
still works) and loaded here with ctypes, which releases the GIL for each call. records.py
uses it when present and falls back to its numpy path otherwise; ``GRAPHMON_NATIVE_DECODE=0``
turns it off (to compare, or to rule it out). ``status()`` says which path runs and why.
"""

from __future__ import annotations

import ctypes
import glob
import os
from typing import Optional

import numpy as np

_HERE = os.path.dirname(os.path.abspath(__file__))
_P = ctypes.c_void_p
_I64 = ctypes.c_int64


class NativeDecode:
    """The two functions of _decode.c, with numpy arrays passed by address."""

    def __init__(self, lib: ctypes.CDLL, path: str) -> None:
        self.path = path
        self._gather = lib.gm_gather
        self._gather.restype = _I64
        self._gather.argtypes = (_P, _I64, _I64, _P, _I64, _P, ctypes.c_uint32)
        self._columns = lib.gm_columns
        self._columns.restype = _I64
        self._columns.argtypes = (_P, _I64, _I64, _P, _P) + (_P,) * 11 + (_I64, _P, _I64, _P, _P)

    def gather(self, rows: np.ndarray, words: np.ndarray, out: np.ndarray, kind: int) -> int:
        """``rows``: (n, stride_words) uint64 view of a buffer; ``words``: int64 word indices, ascending;
        ``out``: (n, len(words)) uint64, C-contiguous. Returns n, or -1 - i at the first record
        i of another kind (``out`` then holds garbage from i on)."""
        n, stride = rows.shape
        # real checks, not asserts (python -O strips those): a bad pointer here would be the host's fault
        if (rows.dtype != np.uint64 or rows.strides != (stride * 8, 8) or out.dtype != np.uint64
                or not out.flags.c_contiguous or out.shape != (n, len(words)) or not len(words)
                or int(words[-1]) >= stride or int(words[0]) < 0):  # words: ascending (records._WORDS)
            raise ValueError("gm_gather: rows, words or out do not match")
        return self._gather(_addr(rows), n, stride, _addr(words), len(words), _addr(out), kind)

    def columns(self, chunk: np.ndarray, at64: np.ndarray, at32: np.ndarray, cols: tuple,
                name_id: Optional[np.ndarray], names) -> int:
        """``chunk``: (n, row_words) uint64 rows; ``cols``: the 8 column arrays (records.COLUMNS
        order, length n, contiguous); ``name_id``: int32 (or None: no name ids) from ``names``
        (a records.NameTable: its hash table, and its window's names, extended here). Returns
        how many name ids are -1 (pointers the table missed: the caller resolves them)."""
        n, row_words = chunk.shape
        if (chunk.dtype != np.uint64 or not chunk.flags.c_contiguous or len(cols) != 8
                or any(len(c) != n or not c.flags.c_contiguous or c.itemsize != (4 if i == 3 else 8)
                       for i, c in enumerate(cols))
                or (name_id is not None and (len(name_id) != n or name_id.dtype != np.int32
                                             or not name_id.flags.c_contiguous))
                or int(max(at64.max(), at32.max() // 2)) >= row_words):
            raise ValueError("gm_columns: chunk, columns or name ids do not match")
        if name_id is None:
            self._columns(_addr(chunk), n, row_words, _addr(at64), _addr(at32), *(_addr(c) for c in cols), None,
                          None, None, 0, None, 0, None, None)
            return 0
        hptr, hgid, shift, win_of = names.table()
        if (hptr.dtype != np.uint64 or hgid.dtype != np.int64 or win_of.dtype != np.int32 or not 0 < shift < 64
                or len(hptr) != 1 << (64 - shift) or len(hgid) != len(hptr) or not win_of.flags.c_contiguous):
            raise ValueError("gm_columns: the name table does not match its shift")
        new_gids = np.empty(len(win_of), np.int64)
        counts = np.array([len(names.names), 0], np.int64)  # in: the window's names so far; out: after, and how many are new
        misses = self._columns(_addr(chunk), n, row_words, _addr(at64), _addr(at32), *(_addr(c) for c in cols),
                               _addr(name_id), _addr(hptr), _addr(hgid), int(shift), _addr(win_of), len(win_of),
                               _addr(new_gids), _addr(counts))
        if counts[1]:
            names.add_window_names(new_gids[:counts[1]])
        return int(misses)


def _addr(a: Optional[np.ndarray]) -> Optional[int]:
    """The array's data address: through a ctypes view of its buffer (0.3 us; 1-1.4 us through
    .ctypes or __array_interface__, which were most of a small buffer's decode); read-only or
    empty arrays take the slower way."""
    if a is None:
        return None
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(a))
    except (TypeError, ValueError):
        return a.ctypes.data


_STATE: dict = {}


def load() -> Optional[NativeDecode]:
    """The native pass, loaded once per process; None when it is off, not built or fails to load."""
    if "lib" in _STATE:
        return _STATE["lib"]
    lib, why = None, ""
    if os.environ.get("GRAPHMON_NATIVE_DECODE", "1").strip().lower() in ("0", "false", "no", "off"):
        why = "off (GRAPHMON_NATIVE_DECODE=0)"
    else:
        paths = sorted(glob.glob(os.path.join(_HERE, "_decode*.so")))
        if not paths:
            why = "not built (no C compiler at install?): numpy path"
        else:
            try:
                lib = NativeDecode(ctypes.CDLL(paths[0]), paths[0])
                why = "native"
            except (OSError, AttributeError) as e:
                why = f"failed to load {os.path.basename(paths[0])}: {e}"
    _STATE["lib"], _STATE["why"] = lib, why
    return lib


def status() -> str:
    """'native', or why the numpy path runs."""
    load()
    return _STATE["why"]
