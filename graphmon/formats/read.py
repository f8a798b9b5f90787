"""Trace file readers: graphmon's native npz, PyTorch profiler (Kineto) Chrome JSON, raw CUPTI npz.

:func:`read_trace` picks the reader from the file's content (magic bytes), not its name:

- ``PK..`` (zip): an npz. With ``meta_json`` it is graphmon's native format
  (formats.native, see docs/trace-format.md); with ``start`` + ``launch_correlation`` it is the
  raw CUPTI probe npz (shared/traces/h200-cupti-decode-v1.npz).
- ``\\x1f\\x8b`` (gzip) or a first character ``{`` / ``[``: a Chrome trace JSON (Kineto).
- ``SQLite format 3``: an Nsight Systems export (``nsys export --type sqlite``, formats.nsys).

Every problem with a file raises :class:`~graphmon.model.trace.TraceError` with one line naming the
file and the problem. Individual kernel records with bad values are excluded and counted by
reason in ``Trace.invalid`` (never silently dropped). Hostile input is bounded by
:class:`ReadLimits`: decompressed size, size of one JSON event, number of kernels, streams and
kernel names.
"""

from __future__ import annotations

import os
import stat
import struct
import zipfile
import zlib
from typing import Mapping

import numpy as np

from graphmon.formats.common import ReadLimits, one_line, progress_bar
from graphmon.formats.cupti_npz import RAW_CUPTI_OFFSET_NS, is_cupti_npz, read_cupti_npz
from graphmon.formats.kineto import read_kineto
from graphmon.formats.native import is_native, read_native, read_native_untraced, write_trace
from graphmon.formats.nsys import SQLITE_MAGIC, read_nsys
from graphmon.model.trace import Trace, TraceError
from graphmon.model.window import no_untraced

# ReadLimits lives in formats.common so that every reader can take it without importing this
# dispatcher (which imports them); it is re-exported here, where callers look for it.
__all__ = ["ReadLimits", "read_trace", "read_trace_untraced", "write_trace", "RAW_CUPTI_OFFSET_NS"]

_PROGRESS_MIN_BYTES = 1_000_000  # smaller files read in well under 1 s (gzip JSON: ~0.7 MB/s)
_PROGRESS_DELAY_S = 1.0


def read_trace(
    path: str | os.PathLike,
    progress: bool | None = None,
    *,
    limits: ReadLimits | None = None,
) -> Trace:
    """Read a trace file of any supported format, chosen by its content.

    ``progress``: None shows a bar on stderr only once reading has taken over 1 s, True at
    once, False never. Raises :class:`TraceError` (one line, naming the file) for any
    unreadable file.
    """
    return read_trace_untraced(path, progress, limits=limits)[0]


def read_trace_untraced(
    path: str | os.PathLike,
    progress: bool | None = None,
    *,
    limits: ReadLimits | None = None,
) -> tuple[Trace, Mapping[str, np.ndarray]]:
    """:func:`read_trace`, and the untraced replay durations the file carries
    (model.window.UNTRACED_COLUMNS; graphmon's native format and its Chrome export carry them, empty
    otherwise)."""
    name = os.fspath(path)
    limits = limits or ReadLimits()
    try:
        st = os.stat(name)
        if not stat.S_ISREG(st.st_mode):  # a FIFO or device would block or never end
            raise TraceError(f"{name}: not a regular file")
        size = st.st_size
        with open(name, "rb") as fh:
            head = fh.read(16)
    except OSError as e:
        raise TraceError(f"{name}: cannot read file: {e.strerror or e}") from None
    # None: a bar that appears only once reading has taken 1 s (tqdm's delay), so small and fast
    # files print nothing; the size test skips even creating it for files that cannot take 1 s.
    show: bool | float = progress if progress is not None else (_PROGRESS_DELAY_S if size > _PROGRESS_MIN_BYTES else False)
    try:
        if not head:
            raise TraceError("empty file")
        if head.startswith(SQLITE_MAGIC):
            if size > limits.max_decompressed_bytes:
                raise TraceError(f"SQLite file of {size} bytes, over the limit of {limits.max_decompressed_bytes}")
            return read_nsys(name, limits), no_untraced()
        if head.startswith(b"PK"):
            return _read_npz(name, limits, show)
        if head.startswith(b"\x1f\x8b"):
            return read_kineto(name, size, limits, show, gzipped=True)
        if head.startswith(b"\xef\xbb\xbf") or head.lstrip()[:1] in (b"{", b"["):
            return read_kineto(name, size, limits, show, gzipped=False)
        if head.strip() == b"" and size > len(head):
            return read_kineto(name, size, limits, show, gzipped=False)  # leading whitespace
        if head.startswith(b"\x28\xb5\x2f\xfd"):
            raise TraceError("zstd-compressed files are not supported; decompress first")
        raise TraceError(f"unrecognized format (starts with {head!r}); expected a graphmon npz, a raw CUPTI npz, a Chrome trace JSON or an Nsight Systems SQLite export")
    except TraceError as e:
        raise TraceError(one_line(f"{name}: {e}")) from None
    except MemoryError:
        raise TraceError(f"{name}: out of memory while reading (lower the trace size or limits)") from None
    except RecursionError:
        raise TraceError(f"{name}: JSON nested too deeply") from None


# ====================================================================== npz (native + raw CUPTI)
def _read_npz_arrays(path: str, limits: ReadLimits, show: bool | float) -> dict[str, np.ndarray]:
    """Load every array of an npz, checking each header before allocating anything.

    np.load would allocate what a member's header claims; a hostile header could claim
    terabytes. Each claimed size must fit the member's stored uncompressed size (zipfile never
    inflates a member past that), and their sum must fit the limit.
    """
    out: dict[str, np.ndarray] = {}
    try:
        with zipfile.ZipFile(path) as zf:
            infos = [i for i in zf.infolist() if not i.is_dir()]
            total = sum(i.file_size for i in infos)
            if total > limits.max_decompressed_bytes:
                raise TraceError(f"npz holds {total} bytes uncompressed, over the limit of {limits.max_decompressed_bytes}")
            with progress_bar(show, total, "reading npz") as bar:
                for info in infos:
                    key = info.filename[:-4] if info.filename.endswith(".npy") else info.filename
                    with zf.open(info) as fp:
                        version = np.lib.format.read_magic(fp)
                        if version == (1, 0):
                            shape, fortran, dtype = np.lib.format.read_array_header_1_0(fp)
                        elif version in ((2, 0), (3, 0)):
                            shape, fortran, dtype = np.lib.format.read_array_header_2_0(fp)
                        else:
                            raise TraceError(f"npz member {key!r} has unsupported npy version {version}")
                        if dtype.hasobject:
                            raise TraceError(f"npz member {key!r} holds Python objects (refused: pickle)")
                        nbytes = int(np.prod(shape, dtype=object)) * dtype.itemsize
                        if nbytes > info.file_size:
                            raise TraceError(f"npz member {key!r} claims {nbytes} bytes but stores {info.file_size}")
                    with zf.open(info) as fp:
                        out[key] = np.lib.format.read_array(fp, allow_pickle=False)
                    bar.update(info.file_size)
    except TraceError:
        raise
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError, struct.error) as e:
        raise TraceError(f"corrupt or truncated npz: {e}") from None
    except (NotImplementedError, RuntimeError) as e:  # zipfile: unknown compression, encryption
        raise TraceError(f"unsupported npz member: {e}") from None
    except Exception as e:  # noqa: BLE001 - numpy's header parser on hostile bytes raises
        # ValueError, SyntaxError, tokenize.TokenError, ...: all mean "not a valid array" here.
        raise TraceError(f"bad npz array: {type(e).__name__}: {e}") from None
    return out


def _read_npz(path: str, limits: ReadLimits, show: bool | float) -> tuple[Trace, Mapping[str, np.ndarray]]:
    arrays = _read_npz_arrays(path, limits, show)
    if is_native(arrays):
        trace = read_native(arrays, source=path, limits=limits)
        return trace, read_native_untraced(arrays, len(trace.graphs), limits)
    if is_cupti_npz(arrays):
        return read_cupti_npz(path, arrays, limits), no_untraced()
    raise TraceError(f"npz is neither a graphmon trace (no meta_json) nor a raw CUPTI trace (keys: {sorted(arrays)[:12]})")
