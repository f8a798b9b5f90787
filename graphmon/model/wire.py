"""Wire format between a light collector (in a serving process) and the graphmon agent.

One message = one frame on a local stream socket::

    u32 frame_len | u32 header_len | header (UTF-8 JSON) | payload (raw column bytes)

The header says what the message is; for a window it lists the Trace's columns (name, dtype,
rows) whose little-endian bytes follow back to back. No pickle: the agent only ever parses JSON
and copies bytes into numpy arrays of dtypes it chose itself, so a sender cannot make the agent
execute anything. :func:`decode_window` checks every size, shape and dtype and rebuilds the
Trace through ``Trace.build`` (which validates records and indices again): the agent never
trusts a sender. A light collector sends its records unfiltered (``"filtered": false``): the
window-edge filtering runs here, in the agent, not on the serving process's GIL.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import asdict
from typing import Any, Mapping, Optional

import numpy as np

from graphmon.model.edges import assemble
from graphmon.model.trace import KERNEL_COLUMNS, LAUNCH_COLUMNS, GraphInfo, Trace, TraceError
from graphmon.model.window import Window, WindowRecords

WIRE_VERSION = 1
_LEN = struct.Struct("<II")  # frame length (after these 4 bytes), header length
MAX_HEADER_BYTES = 4 * 2**20  # names/labels/graphs of one window: far below this
MAX_FRAME_BYTES = 512 * 2**20  # a 2M-record window (the collector's default cap) is ~130 MiB
MAX_NAMES = 1 << 20
MAX_STRING = 4096  # kernel names are long (mangled templates); label values are cut later
MESSAGE_TYPES = ("hello", "window", "heartbeat", "capture", "stop", "bye", "refused")  # refused: agent -> a peer it will not serve
_COLS = tuple(("k", k, np.dtype(t).newbyteorder("<")) for k, t in KERNEL_COLUMNS.items()) + tuple(
    ("l", k, np.dtype(t).newbyteorder("<")) for k, t in LAUNCH_COLUMNS.items())
_GRAPH_FIELDS = {"key": str, "graph_id": int, "exec_handle": int, "upload_mode": str, "upload_stream": int,
                 "label": str, "batch_size": int, "upload_stream_is_launch_stream": (bool, type(None))}


class WireError(ValueError):
    """A frame that does not decode: the agent drops it (counted) and may close the connection."""


def frame(header: Mapping[str, Any], payload: bytes | memoryview | np.ndarray | list = b"") -> bytearray:
    """One frame: the header, then each payload part's bytes (contiguous arrays included), written
    once into one allocation (a window's columns: tobytes() then a join copied each twice more,
    into fresh memory whose page faults cost more than the copies)."""
    h = json.dumps(header, separators=(",", ":"), default=str).encode()
    views = [memoryview(p).cast("B") for p in (payload if isinstance(payload, list) else [payload])]
    body_len = sum(len(v) for v in views)
    out = bytearray(_LEN.size + len(h) + body_len)
    _LEN.pack_into(out, 0, 4 + len(h) + body_len, len(h))
    at = _LEN.size + len(h)
    out[_LEN.size:at] = h
    for v in views:
        out[at:at + len(v)] = v
        at += len(v)
    return out


def encode_message(kind: str, **fields: Any) -> bytearray:
    if kind not in MESSAGE_TYPES:
        raise ValueError(f"unknown message type {kind!r}")
    return frame({"type": kind, "v": WIRE_VERSION, **fields})


def encode_window(w: Window | WindowRecords, status: Optional[Mapping[str, Any]] = None) -> bytearray:
    """A window as one frame. Copies each column once; no Python object per record.
    ``status``: the sender's state at this window (small JSON), so the two arrive together.
    WindowRecords (a light collector's unfiltered records) travel as they are, marked
    ``"filtered": false``: the receiver runs the window-edge filtering (model/edges.assemble)."""
    if isinstance(w, WindowRecords):
        kernels, launches, filtered = w.kernels, w.launches, False
        names, labels, graphs, invalid, meta = w.names, (), w.graphs, w.invalid, w.meta
    else:
        t = w.trace
        kernels, launches, filtered = {k: getattr(t, k) for k in KERNEL_COLUMNS}, t.launches, True
        names, labels, graphs, invalid, meta = t.names, t.labels, t.graphs, t.invalid, t.meta
    # each column as its wire dtype: no copy when it already is one (the collector's columns are)
    arrays = [np.ascontiguousarray((kernels if part == "k" else launches)[name], dtype=dt) for part, name, dt in _COLS]
    cols = [[part, name, len(a)] for (part, name, _), a in zip(_COLS, arrays)]
    header = {
        "type": "window", "v": WIRE_VERSION, "columns": cols, "filtered": filtered,
        "names": list(names), "labels": list(labels), "graphs": [asdict(g) for g in graphs],
        "invalid": {str(k): int(v) for k, v in invalid.items()},
        "meta": {str(k): v for k, v in meta.items() if isinstance(v, (str, int, float, bool, type(None)))},
        "started_s": float(w.started_s), "ended_s": float(w.ended_s), "dropped": int(w.dropped),
        "observer_slowdown": w.observer_slowdown, "capture_id": w.capture_id, "traced_s": float(w.traced_s),
    }
    if status is not None:
        header["status"] = dict(status)
    return frame(header, arrays)


# ---------------------------------------------------------------------- decoding (untrusted input)
def split_frame(body: bytes | memoryview) -> tuple[dict, memoryview]:
    """``body`` = a frame without its 4-byte length. Returns (header, payload)."""
    mv = memoryview(body)
    if len(mv) < 4:
        raise WireError("frame shorter than its header length")
    (hlen,) = struct.unpack_from("<I", mv, 0)
    if hlen > MAX_HEADER_BYTES or 4 + hlen > len(mv):
        raise WireError(f"bad header length {hlen}")
    try:
        header = json.loads(bytes(mv[4 : 4 + hlen]).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise WireError(f"header is not JSON: {e}") from None
    if not isinstance(header, dict) or header.get("type") not in MESSAGE_TYPES:
        raise WireError("header is not a known message")
    if header.get("v") != WIRE_VERSION:
        raise WireError(f"unsupported wire version {header.get('v')!r}")
    return header, mv[4 + hlen :]


def _strings(v: Any, what: str, limit: int = MAX_NAMES) -> list[str]:
    if not isinstance(v, list) or len(v) > limit or not all(isinstance(s, str) and len(s) <= MAX_STRING for s in v):
        raise WireError(f"{what} must be a list of at most {limit} strings")
    return v


def _number(v: Any, what: str, optional: bool = False) -> Optional[float]:
    if v is None and optional:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise WireError(f"{what} must be a finite number")
    return float(v)


def _graph(d: Any) -> GraphInfo:
    if not isinstance(d, dict) or set(d) != set(_GRAPH_FIELDS):
        raise WireError("graph metadata has the wrong fields")
    for k, typ in _GRAPH_FIELDS.items():
        v = d[k]
        if not isinstance(v, typ) or (typ is int and isinstance(v, bool)):
            raise WireError(f"graph field {k!r} has the wrong type")
        if isinstance(v, str) and len(v) > MAX_STRING:
            raise WireError(f"graph field {k!r} is too long")
    try:
        return GraphInfo(**d)
    except TraceError as e:
        raise WireError(str(e)) from None


def decode_window(header: Mapping[str, Any], payload: memoryview) -> Window:
    """Rebuild a Window from a decoded frame; WireError on anything unexpected."""
    cols = header.get("columns")
    if not isinstance(cols, list) or len(cols) != len(_COLS):
        raise WireError("window columns missing or wrong count")
    arrays: dict[tuple[str, str], np.ndarray] = {}
    off = 0
    for spec, (part, name, dt) in zip(cols, _COLS):
        # Fixed order and dtypes: the sender names rows only; the agent picks the dtype.
        if (not isinstance(spec, list) or len(spec) != 3 or spec[:2] != [part, name] or not isinstance(spec[2], int)
                or isinstance(spec[2], bool) or spec[2] < 0):
            raise WireError(f"bad column spec {spec!r:.80}")
        nbytes = spec[2] * dt.itemsize
        if off + nbytes > len(payload):
            raise WireError(f"column {part}.{name} runs past the payload")
        a = np.frombuffer(payload[off : off + nbytes], dtype=dt)  # a read-only view: no copy
        arrays[(part, name)] = a if dt.isnative else a.astype(dt.newbyteorder("="))
        off += nbytes
    if off != len(payload):
        raise WireError(f"{len(payload) - off} trailing payload bytes")
    nk = {len(a) for (p, _), a in arrays.items() if p == "k"}
    nl = {len(a) for (p, _), a in arrays.items() if p == "l"}
    if len(nk) != 1 or len(nl) != 1:
        raise WireError("kernel (or launch) columns differ in length")
    invalid = header.get("invalid", {})
    if not isinstance(invalid, dict) or len(invalid) > 64 or not all(
            isinstance(k, str) and len(k) <= 64 and isinstance(v, int) and not isinstance(v, bool) and v >= 0
            for k, v in invalid.items()):
        raise WireError("invalid counts must map short reasons to non-negative integers")
    meta = header.get("meta", {})
    if not isinstance(meta, dict) or len(json.dumps(meta)) > 16384:
        raise WireError("meta must be a small object")
    graphs_raw = header.get("graphs")
    if not isinstance(graphs_raw, list) or len(graphs_raw) > 65536:
        raise WireError("graphs must be a list")
    dropped = header.get("dropped")
    if not isinstance(dropped, int) or isinstance(dropped, bool) or dropped < 0:
        raise WireError("dropped must be a non-negative integer")
    cid = header.get("capture_id")
    if cid is not None and (not isinstance(cid, str) or len(cid) > 64):
        raise WireError("capture_id must be a short string")
    filtered = header.get("filtered", True)
    if not isinstance(filtered, bool):
        raise WireError("filtered must be true or false")
    names = _strings(header.get("names"), "names")
    labels = _strings(header.get("labels"), "labels")
    graphs = [_graph(g) for g in graphs_raw]
    started_s = _number(header.get("started_s"), "started_s")
    ended_s = _number(header.get("ended_s"), "ended_s")
    slowdown = _number(header.get("observer_slowdown"), "observer_slowdown", optional=True)
    traced_s = _number(header.get("traced_s", 0.0), "traced_s")  # absent: a sender from before it existed
    if traced_s < 0:
        raise WireError("traced_s must not be negative")
    kernels = {name: arrays[("k", name)] for name in KERNEL_COLUMNS}
    launches = {name: arrays[("l", name)] for name in LAUNCH_COLUMNS}
    try:
        if not filtered:  # a light collector's records: filtered here, off the serving process
            if labels:
                raise WireError("unfiltered windows carry no labels")
            return assemble(WindowRecords(kernels=kernels, launches=launches, names=names, graphs=graphs,
                                          started_s=started_s, ended_s=ended_s, dropped=dropped,
                                          observer_slowdown=slowdown, capture_id=cid, invalid=invalid, meta=meta,
                                          traced_s=traced_s))
        trace = Trace.build(**kernels, names=names, labels=labels, graphs=graphs, launches=launches,
                            invalid=invalid, meta=meta)
    except (ValueError, IndexError) as e:  # TraceError is a ValueError
        raise WireError(f"window trace rejected: {e}") from None
    return Window(trace=trace, started_s=started_s, ended_s=ended_s, dropped=dropped, observer_slowdown=slowdown,
                  capture_id=cid, traced_s=traced_s)


class FrameReader:
    """Incremental frame splitter for a stream socket: feed bytes, get frame bodies back.

    Refuses a frame longer than ``max_frame_bytes`` before buffering it (bounded memory)."""

    def __init__(self, max_frame_bytes: int = MAX_FRAME_BYTES) -> None:
        self.max_frame_bytes = int(max_frame_bytes)
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        self._buf += data
        out = []
        while len(self._buf) >= 4:
            (n,) = struct.unpack_from("<I", self._buf, 0)
            if n > self.max_frame_bytes:
                raise WireError(f"frame of {n} bytes exceeds the {self.max_frame_bytes}-byte limit")
            if len(self._buf) < 4 + n:
                break
            out.append(bytes(self._buf[4 : 4 + n]))
            del self._buf[: 4 + n]
        return out
