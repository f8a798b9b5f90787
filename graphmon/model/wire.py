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

Every field a sender controls is checked here, at the boundary, for its type and range
(:func:`decode_identity`, :func:`decode_status`, :func:`decode_window`): counts are integers in
``0..MAX_COUNT``, times finite and plausible, strings bounded. Keys that become label values
(invalid-record reasons, error stages, states) come from closed sets; an unknown one is folded
into ``"other"`` (its count kept), so a sender cannot mint series. A frame that fails is a
:class:`WireError` with a ``reason`` from :data:`WIRE_REASONS`, which the agent counts.
"""

from __future__ import annotations

import base64
import json
import math
import struct
from dataclasses import asdict
from typing import Any, Callable, Mapping, Optional

import numpy as np

from graphmon.model.edges import GraphKernels, assemble
from graphmon.model.invalid import INVALID_REASONS
from graphmon.model.trace import KERNEL_COLUMNS, LAUNCH_COLUMNS, GraphInfo, Trace, TraceError
from graphmon.model.window import UNTRACED_COLUMNS, Window, WindowRecords, no_untraced

WIRE_VERSION = 1
_LEN = struct.Struct("<II")  # frame length (after these 4 bytes), header length
MAX_HEADER_BYTES = 4 * 2**20  # names/labels/graphs of one window: far below this
MAX_FRAME_BYTES = 512 * 2**20  # a 2M-record window (the collector's default cap) is ~130 MiB
# Before its hello a connection is nobody: its frame must fit what a hello needs (64 identity
# keys of 256 characters and a status: ~25 KiB), not a window.
MAX_HELLO_FRAME_BYTES = 64 * 1024
MAX_NAMES = 1 << 20
MAX_STRING = 4096  # kernel names are long (mangled templates); label values are cut later
MESSAGE_TYPES = ("hello", "window", "heartbeat", "capture", "stop", "bye", "refused")  # refused: agent -> a peer it will not serve
# A count a sender reports (per window or cumulative): above 2**53 it is no real count, and it
# would no longer be exact as the float a metric sample is (10**400 made every scrape fail).
MAX_COUNT = 2**53
MAX_ERROR_CHARS = 300  # an error's text (the repr the source keeps is cut there too)
MAX_KEYS = 64  # entries of a sender's identity, status, error and invalid-reason maps
MAX_RANK_CHARS = 64
# Wall-clock seconds a sender reports (window start/end): 1970 .. 2286. Outside is no clock.
MAX_WALL_S = 1e10
OTHER = "other"  # the one value unknown reasons, stages and states are folded into
PROCESS_STATES = ("starting", "running", "degraded", "blocked", "stopped", "error", "lost")
# Every stage a light collector (CUPTI source + link) counts errors in; the export layer's
# zero-initialised stages (export/collector.KNOWN_STAGES) are a subset (tested).
ERROR_STAGES = (
    "activity_disable", "analysis", "assemble", "buffer_completed", "buffers_full", "callback", "capture_hook",
    "capture_request", "capture_subscribe", "collector", "drain_query", "drain_timeout", "dropped_query",
    "event_elapsed", "events_init", "flush", "flush_forced", "health", "http", "launch_cb_enable", "publish",
    "scrape", "setup", "sink", "snapshot", "source", "stop", "stop_timeout", "stream_id", "tap", "unsubscribe",
    "untraced_rows_capped", "warm_up", "window_launches_capped", OTHER,
)
LINK_COUNTERS = ("windows_sent", "windows_dropped", "reconnects", "bad_messages", "connected")
# Why a frame was refused (the agent counts each): a closed set, never the exception text.
WIRE_REASONS = ("framing", "too_large", "stalled", "header", "identity", "status", "window", "protocol")
_COLS = tuple(("k", k, np.dtype(t).newbyteorder("<")) for k, t in KERNEL_COLUMNS.items()) + tuple(
    ("l", k, np.dtype(t).newbyteorder("<")) for k, t in LAUNCH_COLUMNS.items())
# Untraced replay times (window.UNTRACED_COLUMNS) travel in the header, each column's LE bytes in
# base64, not in the payload: an older agent rejects unknown columns and trailing payload bytes
# but ignores an unknown header key, so it still takes a new sender's windows (without the rows);
# a frame without the key decodes to empty columns.
_UNTRACED = tuple((k, np.dtype(t).newbyteorder("<")) for k, t in UNTRACED_COLUMNS.items())
MAX_UNTRACED_ROWS = 1 << 16  # a collector holds at most 4096 (sources/cupti/bursts.MAX_HELD_ROWS)
MAX_UNTRACED_NS = 60 * 10**9  # a graph replay timed longer than 60 s is no replay time
_GRAPH_FIELDS = {"key": str, "graph_id": int, "exec_handle": int, "upload_mode": str, "upload_stream": int,
                 "label": str, "batch_size": int, "upload_stream_is_launch_stream": (bool, type(None))}


class WireError(ValueError):
    """A frame that does not decode: the agent drops it (counted by ``reason``, one of
    :data:`WIRE_REASONS`) and may close the connection."""

    def __init__(self, message: str, reason: str = "window") -> None:
        super().__init__(message)
        self.reason = reason if reason in WIRE_REASONS else "protocol"


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
    u = w.untraced
    if len(u["duration_ns"]):  # (absent when empty: the frame an older sender makes)
        header["untraced"] = {k: base64.b64encode(np.ascontiguousarray(u[k], dtype=dt).tobytes()).decode("ascii")
                              for k, dt in _UNTRACED}
    if status is not None:
        header["status"] = dict(status)
    return frame(header, arrays)


# ---------------------------------------------------------------------- decoding (untrusted input)
def split_frame(body: bytes | memoryview) -> tuple[dict, memoryview]:
    """``body`` = a frame without its 4-byte length. Returns (header, payload)."""
    mv = memoryview(body)
    if len(mv) < 4:
        raise WireError("frame shorter than its header length", "framing")
    (hlen,) = struct.unpack_from("<I", mv, 0)
    if hlen > MAX_HEADER_BYTES or 4 + hlen > len(mv):
        raise WireError(f"bad header length {hlen}", "framing")
    try:
        header = json.loads(bytes(mv[4 : 4 + hlen]).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise WireError(f"header is not JSON: {e}"[:200], "header") from None
    if not isinstance(header, dict) or header.get("type") not in MESSAGE_TYPES:
        raise WireError("header is not a known message", "header")
    if header.get("v") != WIRE_VERSION:
        raise WireError(f"unsupported wire version {header.get('v')!r:.40}", "header")
    return header, mv[4 + hlen :]


# ---------------------------------------------------------------------- identity and status
def _int_in(v: Any, lo: int, hi: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _short(v: str, limit: int) -> str:
    """``v`` cut to ``limit`` characters; a cut value ends in ``~`` + 8 hex digits of its hash,
    so two long values that share a prefix stay apart."""
    if len(v) <= limit:
        return v
    import hashlib

    return v[: limit - 9] + "~" + hashlib.sha1(v.encode("utf-8", "surrogatepass")).hexdigest()[:8]


def fold_counts(v: Any, known: tuple[str, ...], what: str, reason: str) -> dict[str, int]:
    """A sender's ``{key: count}``: at most MAX_KEYS entries, counts integers in 0..MAX_COUNT
    (else WireError); keys outside ``known`` are summed into ``"other"``."""
    if not isinstance(v, dict) or len(v) > MAX_KEYS:
        raise WireError(f"{what} must map at most {MAX_KEYS} names to counts", reason)
    out: dict[str, int] = {}
    for k, n in v.items():
        if not isinstance(k, str) or not _int_in(n, 0, MAX_COUNT):
            raise WireError(f"{what} must map names to integers 0..2**53", reason)
        key = k if k in known else OTHER
        out[key] = min(MAX_COUNT, out.get(key, 0) + n)
    return out


def decode_identity(v: Any) -> dict[str, str]:
    """A hello's (or heartbeat's) identity: at most MAX_KEYS string keys of at most 64
    characters; scalar values as strings of at most 256 characters; ``rank`` at most 64
    characters; ``pid`` digits or dropped. WireError on any other shape."""
    if not isinstance(v, dict) or len(v) > MAX_KEYS:
        raise WireError(f"identity must be an object of at most {MAX_KEYS} entries", "identity")
    out: dict[str, str] = {}
    for k, x in v.items():
        if not isinstance(k, str) or len(k) > 64:
            raise WireError("identity keys must be short strings", "identity")
        if isinstance(x, bool) or x is None:
            x = str(x).lower() if x is not None else ""
        elif isinstance(x, (int, float)):
            x = repr(x) if not (isinstance(x, int) and abs(x) < 10**18) else str(x)
        elif not isinstance(x, str):
            raise WireError(f"identity value {k!r:.40} must be a string or a number", "identity")
        out[k] = x[:256]
    out["rank"] = _short(out.get("rank", ""), MAX_RANK_CHARS)
    if "pid" in out and not (out["pid"].isdigit() and len(out["pid"]) <= 10):
        del out["pid"]
    return out


def decode_status(v: Any) -> dict:
    """A process's status as the agent keeps it: the known fields, each checked; unknown fields
    dropped; WireError when a known field has the wrong type or range (the agent keeps the
    previous status and counts the frame)."""
    if not isinstance(v, dict) or len(v) > MAX_KEYS:
        raise WireError(f"status must be an object of at most {MAX_KEYS} entries", "status")
    out: dict = {}
    state = v.get("state", "starting")
    if not isinstance(state, str):
        raise WireError("status state must be a string", "status")
    out["state"] = state if state in PROCESS_STATES and state != "lost" else "error"  # "lost" is the agent's word
    reason = v.get("reason", "")
    if not isinstance(reason, str):
        raise WireError("status reason must be a string", "status")
    out["reason"] = reason[:200]
    out["errors"] = fold_counts(v.get("errors", {}), ERROR_STAGES, "status errors", "status")
    # the text of each stage's last error: the agent's log line says what failed, not only where
    last = v.get("last_errors", {})
    if not isinstance(last, dict) or len(last) > MAX_KEYS:
        raise WireError(f"status last_errors must map at most {MAX_KEYS} stages to strings", "status")
    out["last_errors"] = {}
    for k, x in last.items():
        if not isinstance(k, str) or not isinstance(x, str):
            raise WireError("status last_errors must map stages to strings", "status")
        out["last_errors"][k if k in ERROR_STAGES else OTHER] = x[:MAX_ERROR_CHARS]
    for k in ("windows", "empty_windows"):
        if k in v:
            if not _int_in(v[k], 0, MAX_COUNT):
                raise WireError(f"status {k} must be an integer 0..2**53", "status")
            out[k] = v[k]
    link = v.get("link", {})
    if not isinstance(link, dict):
        raise WireError("status link must be an object", "status")
    out["link"] = {}
    for k in LINK_COUNTERS:
        if k in link:
            if not _int_in(link[k], 0, MAX_COUNT):
                raise WireError(f"status link {k} must be an integer 0..2**53", "status")
            out["link"][k] = link[k]
    sampling = v.get("sampling", {})
    if not isinstance(sampling, dict):
        raise WireError("status sampling must be an object", "status")
    out["sampling"] = smp = {}
    for k in ("next_interval_s", "last_traced_ms"):
        if k in sampling:
            x = sampling[k]
            if not (_finite(x) and 0 <= x <= 1e9):
                raise WireError(f"status sampling {k} must be a finite number >= 0", "status")
            smp[k] = float(x)
    if "cupti_subscribed" in sampling:  # False between windows with idle_unsubscribe_s
        if not isinstance(sampling["cupti_subscribed"], bool):
            raise WireError("status sampling cupti_subscribed must be true or false", "status")
        smp["cupti_subscribed"] = sampling["cupti_subscribed"]
    if "idle_unsubscribes" in sampling:
        if not _int_in(sampling["idle_unsubscribes"], 0, MAX_COUNT):
            raise WireError("status sampling idle_unsubscribes must be an integer 0..2**53", "status")
        smp["idle_unsubscribes"] = sampling["idle_unsubscribes"]
    return out


def _strings(v: Any, what: str, limit: int = MAX_NAMES) -> list[str]:
    if not isinstance(v, list) or len(v) > limit or not all(isinstance(s, str) and len(s) <= MAX_STRING for s in v):
        raise WireError(f"{what} must be a list of at most {limit} strings")
    return v


def _number(v: Any, what: str, optional: bool = False, lo: float = -math.inf, hi: float = math.inf) -> Optional[float]:
    if v is None and optional:
        return None
    if not _finite(v):
        raise WireError(f"{what} must be a finite number")
    if not lo <= v <= hi:
        raise WireError(f"{what} must be within {lo:g}..{hi:g}")
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
        if typ is int and not -(2**63) <= v < 2**64:  # ids and handles are 64-bit
            raise WireError(f"graph field {k!r} is out of range")
    try:
        return GraphInfo(**d)
    except TraceError as e:
        raise WireError(str(e)) from None


def decode_untraced(v: Any, n_graphs: int) -> dict[str, np.ndarray]:
    """A window's untraced columns (absent: empty). WireError unless each is base64 of whole
    little-endian rows, as many in both (at most MAX_UNTRACED_ROWS), graph in -1..n_graphs-1
    and duration_ns in 1 ns..60 s."""
    if v is None:
        return no_untraced()
    if not isinstance(v, dict) or set(v) != {k for k, _ in _UNTRACED}:
        raise WireError("untraced must hold exactly the columns " + ", ".join(k for k, _ in _UNTRACED))
    out: dict[str, np.ndarray] = {}
    for k, dt in _UNTRACED:
        b64 = v[k]
        if not isinstance(b64, str) or len(b64) > (MAX_UNTRACED_ROWS * dt.itemsize + 2) // 3 * 4:
            raise WireError(f"untraced {k} must be base64 of at most {MAX_UNTRACED_ROWS} rows")
        try:
            raw = base64.b64decode(b64, validate=True)
        except ValueError:  # binascii.Error
            raise WireError(f"untraced {k} is not base64") from None
        if len(raw) % dt.itemsize:
            raise WireError(f"untraced {k} is not whole {dt.itemsize}-byte rows")
        out[k] = np.frombuffer(raw, dt).astype(dt.newbyteorder("="))  # (a copy: writable, native order)
    graph, ns = out["graph"], out["duration_ns"]
    if len(graph) != len(ns):
        raise WireError("untraced columns differ in length")
    if len(ns) and (graph.min() < -1 or graph.max() >= n_graphs or ns.min() <= 0 or ns.max() > MAX_UNTRACED_NS):
        raise WireError("untraced graph or duration_ns out of range (graph -1..graphs-1, 1 ns..60 s)")
    return out


def decode_window(header: Mapping[str, Any], payload: memoryview,
                  graph_kernels: Optional[GraphKernels] = None) -> Window:
    """Rebuild a Window from a decoded frame; WireError on anything unexpected. ``graph_kernels``:
    the sending process's GraphKernels, for its unfiltered windows (model/edges.assemble)."""
    cols = header.get("columns")
    if not isinstance(cols, list) or len(cols) != len(_COLS):
        raise WireError("window columns missing or wrong count")
    arrays: dict[tuple[str, str], np.ndarray] = {}
    raw = np.frombuffer(payload, np.uint8)
    off = 0
    for spec, (part, name, dt) in zip(cols, _COLS):
        # Fixed order and dtypes: the sender names rows only; the agent picks the dtype.
        if (not isinstance(spec, list) or len(spec) != 3 or spec[:2] != [part, name] or not isinstance(spec[2], int)
                or isinstance(spec[2], bool) or spec[2] < 0):
            raise WireError(f"bad column spec {spec!r:.80}")
        nbytes = spec[2] * dt.itemsize
        if off + nbytes > len(payload):
            raise WireError(f"column {part}.{name} runs past the payload")
        # a read-only view, no copy, of one byte view of the payload (np.frombuffer makes a
        # memoryview per call: one per column, kept with the window's trace in the store and the
        # deploy pools, were a third of the objects the agent's cyclic GC scans at 64 ranks)
        a = raw[off : off + nbytes].view(dt)
        arrays[(part, name)] = a if dt.isnative else a.astype(dt.newbyteorder("="))
        off += nbytes
    if off != len(payload):
        raise WireError(f"{len(payload) - off} trailing payload bytes")
    nk = {len(a) for (p, _), a in arrays.items() if p == "k"}
    nl = {len(a) for (p, _), a in arrays.items() if p == "l"}
    if len(nk) != 1 or len(nl) != 1:
        raise WireError("kernel (or launch) columns differ in length")
    invalid = fold_counts(header.get("invalid", {}), INVALID_REASONS, "invalid counts", "window")
    meta = header.get("meta", {})
    if not isinstance(meta, dict) or len(json.dumps(meta)) > 16384:
        raise WireError("meta must be a small object")
    graphs_raw = header.get("graphs")
    if not isinstance(graphs_raw, list) or len(graphs_raw) > 65536:
        raise WireError("graphs must be a list")
    dropped = header.get("dropped")
    if not _int_in(dropped, 0, MAX_COUNT):
        raise WireError("dropped must be an integer 0..2**53")
    cid = header.get("capture_id")
    if cid is not None and (not isinstance(cid, str) or len(cid) > 64):
        raise WireError("capture_id must be a short string")
    filtered = header.get("filtered", True)
    if not isinstance(filtered, bool):
        raise WireError("filtered must be true or false")
    names = _strings(header.get("names"), "names")
    labels = _strings(header.get("labels"), "labels")
    graphs = [_graph(g) for g in graphs_raw]
    untraced = decode_untraced(header.get("untraced"), len(graphs))
    started_s = _number(header.get("started_s"), "started_s", lo=0, hi=MAX_WALL_S)
    ended_s = _number(header.get("ended_s"), "ended_s", lo=0, hi=MAX_WALL_S)
    slowdown = _number(header.get("observer_slowdown"), "observer_slowdown", optional=True, lo=0, hi=1e6)
    traced_s = _number(header.get("traced_s", 0.0), "traced_s")  # absent: a sender from before it existed
    if traced_s < 0:
        raise WireError("traced_s must not be negative")
    if traced_s > 1e6:
        raise WireError("traced_s must be within 0..1e+06")
    kernels = {name: arrays[("k", name)] for name in KERNEL_COLUMNS}
    launches = {name: arrays[("l", name)] for name in LAUNCH_COLUMNS}
    try:
        if not filtered:  # a light collector's records: filtered here, off the serving process
            if labels:
                raise WireError("unfiltered windows carry no labels")
            return assemble(WindowRecords(kernels=kernels, launches=launches, names=names, graphs=graphs,
                                          started_s=started_s, ended_s=ended_s, dropped=dropped,
                                          observer_slowdown=slowdown, capture_id=cid, invalid=invalid, meta=meta,
                                          traced_s=traced_s, untraced=untraced), graph_kernels)
        trace = Trace.build(**kernels, names=names, labels=labels, graphs=graphs, launches=launches,
                            invalid=invalid, meta=meta)
    except (ValueError, IndexError) as e:  # TraceError is a ValueError
        raise WireError(f"window trace rejected: {e}") from None
    return Window(trace=trace, started_s=started_s, ended_s=ended_s, dropped=dropped, observer_slowdown=slowdown,
                  capture_id=cid, traced_s=traced_s, untraced=untraced)


class FrameReader:
    """Incremental frame splitter for a stream socket: feed bytes, get frame bodies back.

    Refuses a frame longer than ``max_frame_bytes`` (an attribute: the agent raises it once a
    connection said hello) before buffering a byte of it, and buffers each frame once, in a
    bytearray of its announced size. ``reserve(n) -> bool`` (optional) asks a budget shared by
    every connection for a frame's bytes when its length arrives: a refused frame is read and
    discarded, never buffered, and counted in ``skipped``; the stream stays in step. A frame
    handed out keeps its reservation: whoever consumes it releases ``len(body)``."""

    def __init__(self, max_frame_bytes: int = MAX_FRAME_BYTES, reserve: Optional[Callable[[int], bool]] = None,
                 one_frame: bool = False) -> None:
        self.max_frame_bytes = int(max_frame_bytes)
        self._reserve = reserve
        # one_frame: hand out one frame and keep the bytes after it unparsed until feed() is called
        # again (a hello and the window after it often arrive in one read: the window must be
        # measured against the bound that holds once the hello was accepted)
        self.one_frame = one_frame
        self._rest = b""
        self._len = bytearray()  # the 4 length bytes of the next frame, as they arrive
        self._body: Optional[bytearray] = None
        self._have = 0
        self._skip = 0  # bytes of a refused frame still to discard
        self.skipped = 0

    @property
    def in_frame(self) -> bool:
        """Part of a frame (its length, body or the bytes of a skipped one) has arrived."""
        return bool(self._len) or self._body is not None or self._skip > 0 or bool(self._rest)

    @property
    def buffered(self) -> int:
        """Bytes held for the frame being received (its whole announced size once started)."""
        return len(self._body) if self._body is not None else 0

    def feed(self, data: bytes | bytearray | memoryview) -> list[bytearray]:
        if self._rest:
            data, self._rest = self._rest + bytes(data), b""
        mv = memoryview(data).cast("B")
        out: list[bytearray] = []
        i, n = 0, len(mv)
        while i < n:
            if out and self.one_frame:
                self._rest = bytes(mv[i:])  # at most one read's worth
                break
            if self._skip:
                k = min(self._skip, n - i)
                self._skip -= k
                i += k
                continue
            if self._body is None:
                k = min(4 - len(self._len), n - i)
                self._len += mv[i : i + k]
                i += k
                if len(self._len) < 4:
                    break
                (size,) = struct.unpack("<I", self._len)
                self._len.clear()
                if size > self.max_frame_bytes:
                    raise WireError(f"frame of {size} bytes exceeds the {self.max_frame_bytes}-byte limit", "too_large")
                if self._reserve is not None and not self._reserve(size):
                    self._skip = size
                    self.skipped += 1
                    continue
                self._body, self._have = bytearray(size), 0
            body = self._body
            k = min(len(body) - self._have, n - i)
            body[self._have : self._have + k] = mv[i : i + k]
            self._have += k
            i += k
            if self._have == len(body):
                out.append(body)
                self._body = None
        return out

    def discard(self) -> int:
        """Drop a partly received frame; returns its reserved size (for the caller to release)."""
        n = self.buffered if self._reserve is not None else 0
        self._body = None
        return n
