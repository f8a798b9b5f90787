"""What every reader shares: the limits on hostile input, one-line errors, the progress bar,
text cleaning and integer-column checks. (ReadLimits is re-exported by formats.read.)"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace

import numpy as np

from graphmon.model.trace import Trace, TraceError, replay_key

I64_MAX = 2**63 - 1
MAX_DEVICE = 2**15  # Trace keys (device, correlation) as device << 48 ^ correlation
MAX_CORRELATION = 2**48


@dataclass(frozen=True)
class ReadLimits:
    """Bounds that keep a hostile or broken file from exhausting memory or time.

    Every reader applies every limit that has a meaning for its format (docs/trace-format.md).
    """

    max_decompressed_bytes: int = 4 << 30  # JSON text after gunzip / npz payload / SQLite file
    max_event_bytes: int = 16 << 20  # one JSON value (a trace event, one metadata entry)
    max_kernels: int = 200_000_000  # kernel records (and graph launches)
    max_streams: int = 65_536
    max_names: int = 1_000_000  # distinct kernel names + launch labels
    max_graphs: int = 1_000_000
    max_ranges: int = 1_000_000  # record_function ranges (Kineto user annotations)


def one_line(msg: str, width: int = 400) -> str:
    msg = " ".join(msg.split())
    return msg if len(msg) <= width else msg[: width - 3] + "..."


def progress_bar(show: bool | float, total: int, desc: str):
    """show: False never, True at once (even into a log: the explicit opt-in), a float: only after
    that many seconds and only on a terminal (a bar's carriage returns would clutter a log file)."""
    off = show is False or (show is not True and not _isatty(sys.stderr))
    if off:
        return _NoBar()  # tqdm (and the multiprocessing lock it makes) only when a bar may show
    from tqdm import tqdm

    delay = 0.0 if show is True else float(show)
    return tqdm(total=total, unit="B", unit_scale=True, desc=desc, file=sys.stderr, disable=off, delay=delay, leave=False)


class _NoBar:
    """What the readers use of a tqdm bar, doing nothing."""

    n = 0

    def update(self, k: int = 1) -> None:
        self.n += k

    def __enter__(self) -> "_NoBar":
        return self

    def __exit__(self, *exc) -> None:
        return None


def _isatty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # replaced or closed stream
        return False


def clean_text(s: str) -> str:
    """Replace lone surrogates (legal in JSON escapes, not encodable as UTF-8) with U+FFFD."""
    try:
        s.encode("utf-8")
        return s
    except UnicodeEncodeError:
        return s.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def require_int(arrays: dict[str, np.ndarray], key: str, ndim: int = 1) -> np.ndarray:
    """Integer columns only: Trace.build would truncate a float column silently."""
    if key not in arrays:
        raise TraceError(f"missing array {key!r}")
    a = arrays[key]
    if a.ndim != ndim:
        raise TraceError(f"array {key!r} must be {ndim}-D, got shape {a.shape}")
    if a.dtype.kind not in "iu" and a.size:
        raise TraceError(f"array {key!r} must be integer, got {a.dtype}")
    if a.dtype.kind == "u" and a.size and a.max() > I64_MAX:
        raise TraceError(f"array {key!r} has values beyond int64")
    return a


def check_counts(limits: ReadLimits, *, kernels: int = 0, streams: int = 0, names: int = 0, graphs: int = 0) -> None:
    """Raise when a count read from a file is over its limit (the same words for every format)."""
    for what, n, cap in (
        ("kernel records", kernels, limits.max_kernels),
        ("distinct streams", streams, limits.max_streams),
        ("kernel names and labels", names, limits.max_names),
        ("graphs", graphs, limits.max_graphs),
    ):
        if n > cap:
            raise TraceError(f"more than {cap} {what} (limit)")


def fill_launch_graphs(t: Trace) -> Trace:
    """Fill each launch row's graph from its kernels (Kineto and old nsys exports name no graph;
    Trace.build found them by signature), so launches count per graph. Launches without kernels stay -1."""
    lc = t.launches
    if not len(lc["correlation_id"]) or not len(t):
        return t
    kkey = replay_key(t.device, t.correlation_id)  # as Trace keys (device, correlation)
    ukey, first = np.unique(kkey, return_index=True)
    lkey = replay_key(lc["device"], lc["correlation_id"])
    pos = np.clip(np.searchsorted(ukey, lkey), 0, len(ukey) - 1)
    hit = ukey[pos] == lkey
    graph = np.where(hit, t.graph[first[pos]], lc["graph"]).astype(np.int32)
    graph.setflags(write=False)
    return replace(t, launches={**lc, "graph": graph})
