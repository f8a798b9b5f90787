"""Trace file readers: graphmon's native npz, PyTorch profiler (Kineto) Chrome JSON, raw CUPTI npz.

:func:`read_trace` picks the reader from the file's content (magic bytes), not its name:

- ``PK..`` (zip): an npz. With ``meta_json`` it is graphmon's native format
  (:meth:`Trace.save`, see docs/trace-format.md); with ``start`` + ``launch_correlation`` it is the
  raw CUPTI probe npz (shared/traces/h200-cupti-decode-v1.npz).
- ``\\x1f\\x8b`` (gzip) or a first character ``{`` / ``[``: a Chrome trace JSON (Kineto).

Every problem with a file raises :class:`~graphmon.model.trace.TraceError` with one line naming the
file and the problem. Individual kernel records with bad values are excluded and counted by
reason in ``Trace.invalid`` (never silently dropped). Hostile input is bounded by
:class:`ReadLimits`: decompressed size, size of one JSON event, number of kernels, streams and
kernel names.
"""

from __future__ import annotations

import codecs
import decimal
import gzip
import json
import os
import re
import stat
import struct
import sys
import zipfile
import zlib
from array import array
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import Any, BinaryIO, Callable

import numpy as np

from graphmon.model.trace import GraphInfo, Trace, TraceError, replay_key

__all__ = ["ReadLimits", "read_trace", "write_trace", "RAW_CUPTI_OFFSET_NS"]

# Reasons a record is excluded by a reader (stable strings: metric label values), on top of
# the ones Trace.build counts (negative_timestamp, zero_start, end_before_start, duplicate).
INVALID_MISSING = "missing_field"  # a kernel event lacks ts, dur, args.stream/correlation/device
INVALID_NON_NUMERIC = "non_numeric"  # a number field holds a string, bool, null, NaN, Infinity...
INVALID_NON_INTEGER = "non_integer"  # stream/correlation/device with a fraction
INVALID_OUT_OF_RANGE = "out_of_range"  # does not fit int64 ns (or device/correlation bounds)
INVALID_BAD_PHASE = "bad_phase"  # a kernel event that is not a complete event (ph != "X")
INVALID_BAD_NAME = "bad_name"  # kernel name present but not a string

# The raw CUPTI npz was shifted so its earliest start is 0; Trace.build excludes start == 0 as
# "no timestamp". Adding 1 s to every kernel time keeps all records valid and all gaps unchanged.
RAW_CUPTI_OFFSET_NS = 1_000_000_000

# Kineto's names for a graph launch: runtime (versioned or not) and driver API.
GRAPH_LAUNCH_NAMES = frozenset({"cudaGraphLaunch", "cudaGraphLaunch_v10000", "cuGraphLaunch", "cuGraphLaunch_ptsz"})
_LAUNCH_CATS = frozenset({"cuda_runtime", "cuda_driver"})

_I64_MAX = 2**63 - 1
_US_LIMIT = _I64_MAX // 1000  # largest |µs| whose ns value fits int64
_MAX_DEVICE = 2**15  # Trace keys (device, correlation) as device << 48 ^ correlation
_MAX_CORRELATION = 2**48
_CHUNK_BYTES = 1 << 20
_PROGRESS_MIN_BYTES = 1_000_000  # smaller files read in well under 1 s (gzip JSON: ~0.7 MB/s)
_PROGRESS_DELAY_S = 1.0
_DEC = decimal.Context(prec=60, traps=[])  # exact for any value that passes the range check


@dataclass(frozen=True)
class ReadLimits:
    """Bounds that keep a hostile or broken file from exhausting memory or time."""

    max_decompressed_bytes: int = 4 << 30  # JSON text after gunzip / npz payload
    max_event_bytes: int = 16 << 20  # one JSON trace event (Kineto events are < 10 kB)
    max_kernels: int = 200_000_000
    max_streams: int = 65_536
    max_names: int = 1_000_000  # distinct kernel names + range labels


def write_trace(trace: Trace, path: str | os.PathLike) -> None:
    """Write ``trace`` in graphmon's native format (the inverse of :func:`read_trace`)."""
    trace.save(path)


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
    name = os.fspath(path)
    limits = limits or ReadLimits()
    try:
        st = os.stat(name)
        if not stat.S_ISREG(st.st_mode):  # a FIFO or device would block or never end
            raise TraceError(f"{name}: not a regular file")
        size = st.st_size
        with open(name, "rb") as fh:
            head = fh.read(4)
    except OSError as e:
        raise TraceError(f"{name}: cannot read file: {e.strerror or e}") from None
    # None: a bar that appears only once reading has taken 1 s (tqdm's delay), so small and fast
    # files print nothing; the size test skips even creating it for files that cannot take 1 s.
    show: bool | float = progress if progress is not None else (_PROGRESS_DELAY_S if size > _PROGRESS_MIN_BYTES else False)
    try:
        if not head:
            raise TraceError("empty file")
        if head.startswith(b"PK"):
            return _read_npz(name, limits, show)
        if head.startswith(b"\x1f\x8b"):
            return _read_kineto(name, size, limits, show, gzipped=True)
        if head.startswith(b"\xef\xbb\xbf") or head.lstrip()[:1] in (b"{", b"["):
            return _read_kineto(name, size, limits, show, gzipped=False)
        if head.strip() == b"" and size > 4:
            return _read_kineto(name, size, limits, show, gzipped=False)  # leading whitespace
        if head.startswith(b"\x28\xb5\x2f\xfd"):
            raise TraceError("zstd-compressed files are not supported; decompress first")
        raise TraceError(f"unrecognized format (starts with {head!r}); expected a graphmon npz, a raw CUPTI npz or a Chrome trace JSON")
    except TraceError as e:
        raise TraceError(_one_line(f"{name}: {e}")) from None
    except MemoryError:
        raise TraceError(f"{name}: out of memory while reading (lower the trace size or limits)") from None
    except RecursionError:
        raise TraceError(f"{name}: JSON nested too deeply") from None


def _one_line(msg: str, width: int = 400) -> str:
    msg = " ".join(msg.split())
    return msg if len(msg) <= width else msg[: width - 3] + "..."


def _progress_bar(show: bool | float, total: int, desc: str):
    """show: False never, True at once, a float: only after that many seconds."""
    from tqdm import tqdm  # only when a file is read, so `import graphmon` stays light

    delay = 0.0 if show is True else float(show)
    return tqdm(total=total, unit="B", unit_scale=True, desc=desc, file=sys.stderr, disable=show is False, delay=delay, leave=False)


def _clean_text(s: str) -> str:
    """Replace lone surrogates (legal in JSON escapes, not encodable as UTF-8) with U+FFFD."""
    try:
        s.encode("utf-8")
        return s
    except UnicodeEncodeError:
        return s.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


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
            with _progress_bar(show, total, "reading npz") as bar:
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


def _read_npz(path: str, limits: ReadLimits, show: bool | float) -> Trace:
    arrays = _read_npz_arrays(path, limits, show)
    if "meta_json" in arrays:
        return _read_native(path, arrays)
    if "start" in arrays and "launch_correlation" in arrays:
        return _read_raw_cupti(path, arrays)
    raise TraceError(f"npz is neither a graphmon trace (no meta_json) nor a raw CUPTI trace (keys: {sorted(arrays)[:12]})")


def _require_int(arrays: dict[str, np.ndarray], key: str, ndim: int = 1) -> np.ndarray:
    """Integer columns only: Trace.build would truncate a float column silently."""
    if key not in arrays:
        raise TraceError(f"missing array {key!r}")
    a = arrays[key]
    if a.ndim != ndim:
        raise TraceError(f"array {key!r} must be {ndim}-D, got shape {a.shape}")
    if a.dtype.kind not in "iu" and a.size:
        raise TraceError(f"array {key!r} must be integer, got {a.dtype}")
    if a.dtype.kind == "u" and a.size and a.max() > _I64_MAX:
        raise TraceError(f"array {key!r} has values beyond int64")
    return a


def _read_native(path: str, arrays: dict[str, np.ndarray]) -> Trace:
    from graphmon.model.trace import KERNEL_COLUMNS, LAUNCH_COLUMNS

    for k in KERNEL_COLUMNS:
        _require_int(arrays, f"k_{k}")
    for k in LAUNCH_COLUMNS:
        _require_int(arrays, f"l_{k}")
    if arrays["meta_json"].dtype != np.uint8:
        raise TraceError("meta_json must be uint8 bytes")
    try:
        return Trace.from_native(arrays, source=path)
    except TraceError:
        raise
    except (TypeError, ValueError, AttributeError, KeyError, OverflowError) as e:
        # from_native trusts meta_json's shape (a dict of lists); a hostile one may be anything.
        raise TraceError(f"bad graphmon trace metadata: {type(e).__name__}: {e}") from None


def _read_raw_cupti(path: str, arrays: dict[str, np.ndarray]) -> Trace:
    """The CUPTI probe npz (shared/README.md): kernel columns + launch correlation -> graph key."""
    cols = {k: _require_int(arrays, k) for k in ("start", "end", "stream_id", "graph_id", "graph_node_id", "correlation_id", "name_id")}
    n = len(cols["start"])
    for k, v in cols.items():
        if len(v) != n:
            raise TraceError(f"array {k!r} has {len(v)} rows, expected {n}")
    if n == 0:
        raise TraceError("no kernel records")
    lc = _require_int(arrays, "launch_correlation", ndim=2)
    if lc.shape[1] != 2:
        raise TraceError(f"launch_correlation must be N x 2, got {lc.shape}")
    keys_arr = arrays.get("graph_keys")
    names_arr = arrays.get("names")
    if keys_arr is None or keys_arr.dtype.kind != "U" or keys_arr.ndim != 1:
        raise TraceError("graph_keys must be a 1-D string array")
    if names_arr is None or names_arr.dtype.kind != "U" or names_arr.ndim != 1:
        raise TraceError("names must be a 1-D string array")
    keys = [_clean_text(str(s)) for s in keys_arr.tolist()]
    exec_handles = _require_int(arrays, "exec_handles")
    if len(exec_handles) != len(keys):
        raise TraceError(f"exec_handles has {len(exec_handles)} entries for {len(keys)} graph keys")
    if len(lc) and (lc[:, 1].min() < 0 or lc[:, 1].max() >= len(keys)):
        raise TraceError("launch_correlation names a graph key out of range")

    start = cols["start"].astype(np.int64)
    end = cols["end"].astype(np.int64)
    if start.max() > _I64_MAX - RAW_CUPTI_OFFSET_NS or end.max() > _I64_MAX - RAW_CUPTI_OFFSET_NS:
        raise TraceError("timestamps too large to add the fixed offset")
    corr = cols["correlation_id"].astype(np.int64)
    gid = cols["graph_id"].astype(np.int64)

    # The launch callback ran through several phases; kernel tracing only during "traced".
    # Launches outside the traced correlation range have no kernels by design, so they are
    # summarized in meta rather than listed as launches whose kernels went missing.
    lo, hi = int(corr.min()), int(corr.max())
    in_window = (lc[:, 0] >= lo) & (lc[:, 0] <= hi)
    lcw = lc[in_window]

    graphs: list[GraphInfo] = []
    for i, key in enumerate(keys):
        launch_corr = lcw[lcw[:, 1] == i, 0]
        ids = np.unique(gid[np.isin(corr, launch_corr)])
        if len(ids) > 1:
            raise TraceError(f"graph key {key!r} has kernels of several CUPTI graph ids {ids[:8].tolist()}")
        g = int(ids[0]) if len(ids) else -1
        bs = re.search(r"_bs(\d+)", key)
        graphs.append(
            GraphInfo(
                key=f"g{g}" if g > 0 else key,
                graph_id=g,
                exec_handle=int(exec_handles[i]),
                # "/upload": the probe called cuGraphUpload right after instantiation. The other
                # capture was launched without an upload, so the driver uploaded it lazily on
                # its first launch.
                upload_mode="uploaded" if key.endswith("/upload") else "lazy" if key.endswith("/no_upload") else "unknown",
                label=key,
                batch_size=int(bs.group(1)) if bs else -1,
            )
        )
    if len({g.key for g in graphs}) != len(graphs):
        raise TraceError("two graph keys share one CUPTI graph id")

    meta: dict[str, Any] = {
        "format": "cupti-npz",
        "source": path,
        "time_offset_ns": RAW_CUPTI_OFFSET_NS,
        "launches_outside_kernel_trace": int((~in_window).sum()),
    }
    # CUDA-event time per replay: ground truth for observer-effect work. Summaries only.
    event_ms: dict[str, dict[str, float]] = {}
    event_n: dict[str, int] = {}
    for k, v in arrays.items():
        if k.startswith("event_ms_") and v.ndim == 2 and v.shape[0] == len(keys) and v.dtype.kind == "f":
            phase = k[len("event_ms_") :]
            if not v.shape[1]:
                continue
            event_ms[phase] = {key: float(np.median(v[i])) for i, key in enumerate(keys)}
            event_n[phase] = int(v.shape[1])
    if event_ms:
        meta["event_ms_median"] = event_ms
        meta["event_ms_replays"] = event_n
    gt = arrays.get("graph_trace")
    if gt is not None:
        meta["graph_trace_records"] = int(len(gt))

    return Trace.build(
        start_ns=start + RAW_CUPTI_OFFSET_NS,
        end_ns=end + RAW_CUPTI_OFFSET_NS,
        stream=cols["stream_id"],
        correlation_id=corr,
        device=np.zeros(n, np.int32),  # the probe traced one GPU
        graph_id=gid,
        graph_node_id=cols["graph_node_id"],
        name_id=cols["name_id"],
        names=[_clean_text(str(s)) for s in names_arr.tolist()],
        launches={
            "correlation_id": lcw[:, 0].astype(np.int64),
            "device": np.zeros(len(lcw), np.int32),
            "graph": lcw[:, 1].astype(np.int32),
        },
        graphs=graphs,
        meta=meta,
    )


# ====================================================================== Kineto / Chrome JSON
class _NonFinite:
    """parse_constant result for NaN / Infinity (legal for Python's json, not for us)."""


_NON_FINITE = _NonFinite()


class _JsonStream:
    """Incremental reader of one JSON document: walks the top level and the traceEvents array
    by hand and decodes each event with the stdlib decoder, so memory holds one event at a time.
    """

    def __init__(self, raw: BinaryIO, binary: BinaryIO, limits: ReadLimits, on_read: Callable[[], None]):
        self._raw = raw  # the file (for progress), binary = what yields JSON bytes
        self._bin = binary
        self._limits = limits
        self._on_read = on_read
        self._dec = codecs.getincrementaldecoder("utf-8-sig")("strict")
        # Decimal keeps Kineto's µs with 3 decimals exact: 5351128125842.938 -> ...842938 ns.
        # Integers stay the C parser's int: fast, and it refuses > 4300 digits (a ValueError).
        dec = json.JSONDecoder(parse_float=Decimal, parse_constant=lambda s: _NON_FINITE)
        self._scan = dec.scan_once  # raw_decode minus a Python frame per event
        self.buf = ""
        self.pos = 0
        self.eof = False
        self.bytes_in = 0
        self._dropped_chars = 0

    def _fill(self, want_chars: int = _CHUNK_BYTES) -> None:
        if self.pos > (1 << 20) and self.pos > len(self.buf) // 2:
            self._dropped_chars += self.pos
            self.buf, self.pos = self.buf[self.pos :], 0
        got = 0
        while got < want_chars and not self.eof:
            try:
                data = self._bin.read(max(_CHUNK_BYTES, want_chars - got))
            except EOFError:
                raise TraceError("truncated gzip stream") from None
            except (OSError, zlib.error) as e:
                raise TraceError(f"corrupt compressed data: {e}") from None
            self.bytes_in += len(data)
            if self.bytes_in > self._limits.max_decompressed_bytes:
                raise TraceError(f"more than {self._limits.max_decompressed_bytes} bytes of JSON (decompressed), over the limit")
            try:
                text = self._dec.decode(data, final=not data)
            except UnicodeDecodeError as e:
                raise TraceError(f"not UTF-8 text near byte {self.bytes_in - len(data) + e.start}") from None
            if not data:
                self.eof = True
            self.buf += text
            got += len(text)
            self._on_read()

    def where(self) -> str:
        return f"character {self._dropped_chars + self.pos}"

    def peek(self) -> str:
        """Next non-whitespace character ('' at end of input), without consuming it."""
        while True:
            m = _WS.match(self.buf, self.pos)
            self.pos = m.end()
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if self.eof:
                return ""
            self._fill()

    def expect(self, chars: str) -> str:
        c = self.peek()
        if not c or c not in chars:
            raise TraceError(f"invalid JSON at {self.where()}: expected {' or '.join(map(repr, chars))}, found {c or 'end of file'!r}")
        self.pos += 1
        return c

    def value(self) -> Any:
        """Decode the next JSON value, reading more input until it is complete."""
        self.peek()
        msg = ""
        while True:
            try:
                v, end = self._scan(self.buf, self.pos)
            except (json.JSONDecodeError, StopIteration) as e:
                msg = e.msg if isinstance(e, json.JSONDecodeError) else "expecting a value"
                if self.eof:
                    raise TraceError(f"invalid JSON at {self.where()}: {msg}") from None
                v, end = None, -1
            except ValueError as e:  # an integer literal of thousands of digits
                raise TraceError(f"bad JSON number at {self.where()}: {e}") from None
            if end == -1 or (end == len(self.buf) and not self.eof):
                # Incomplete (or a number that may go on): read more, doubling, up to one event's cap.
                pending = len(self.buf) - self.pos
                if pending > self._limits.max_event_bytes:
                    raise TraceError(
                        f"a JSON value at {self.where()} is larger than {self._limits.max_event_bytes} bytes (limit)"
                        + (f" or invalid ({msg})" if msg else "")
                    )
                self._fill(max(_CHUNK_BYTES, pending))
                continue
            self.pos = end
            return v


_WS = re.compile(r"[ \t\n\r]*")


class _KinetoBuilder:
    """Collects kernel columns, graph launches and record_function ranges from trace events."""

    def __init__(self, limits: ReadLimits):
        self.limits = limits
        self.start, self.end, self.stream, self.corr = array("q"), array("q"), array("q"), array("q")
        self.device, self.name_id = array("i"), array("i")
        self.names: dict[str, int] = {}
        self.streams: set[int] = set()
        self.invalid: dict[str, int] = {}
        self.kernel_events = 0
        self.launches: dict[int, tuple[int, Any, Any]] = {}  # correlation -> (ts ns or -1, pid, tid)
        self.duplicate_launches = 0
        self.ranges: dict[tuple, list[tuple[int, int, str]]] = {}  # (pid, tid) -> (start, end, label)
        self.non_object_events = 0

    def bad(self, reason: str) -> None:
        self.invalid[reason] = self.invalid.get(reason, 0) + 1

    def add(self, e: Any) -> None:
        if type(e) is not dict:
            self.non_object_events += 1
            return
        cat = e.get("cat")
        if type(cat) is not str:
            return  # not a kernel event, whatever it is (a list here would not even hash)
        if cat == "kernel":
            self._kernel(e)
        elif cat in _LAUNCH_CATS and type(e.get("name")) is str and e["name"] in GRAPH_LAUNCH_NAMES:
            self._launch(e)
        elif cat == "user_annotation" and e.get("ph") == "X":
            self._range(e)

    def _kernel(self, e: dict) -> None:
        self.kernel_events += 1
        if self.kernel_events > self.limits.max_kernels:
            raise TraceError(f"more than {self.limits.max_kernels} kernel events (limit)")
        if e.get("ph", "X") != "X":
            return self.bad(INVALID_BAD_PHASE)
        args = e.get("args")
        if type(args) is not dict:
            return self.bad(INVALID_MISSING)
        ts, dur = e.get("ts"), e.get("dur")
        stream, corr, device = args.get("stream"), args.get("correlation"), args.get("device", e.get("pid"))
        if ts is None or dur is None or stream is None or corr is None or device is None:
            return self.bad(INVALID_MISSING)
        t0 = _us_to_ns(ts)
        if type(t0) is str:
            return self.bad(t0)
        d = _us_to_ns(dur)
        if type(d) is str:
            return self.bad(d)
        t1 = t0 + d
        if t1 > _I64_MAX or t1 < -_I64_MAX:
            return self.bad(INVALID_OUT_OF_RANGE)
        s = _as_int(stream, -_I64_MAX, _I64_MAX)
        c = _as_int(corr, 0, _MAX_CORRELATION - 1)
        dv = _as_int(device, 0, _MAX_DEVICE - 1)
        for v in (s, c, dv):
            if type(v) is str:
                return self.bad(v)
        name = e.get("name")
        if name is None:
            nid = -1
        elif type(name) is not str:
            return self.bad(INVALID_BAD_NAME)
        else:
            nid = self._name(name)
        if s not in self.streams:
            if len(self.streams) >= self.limits.max_streams:
                raise TraceError(f"more than {self.limits.max_streams} distinct streams (limit)")
            self.streams.add(s)
        self.start.append(t0)
        self.end.append(t1)
        self.stream.append(s)
        self.corr.append(c)
        self.device.append(dv)
        self.name_id.append(nid)

    def _name(self, name: str) -> int:
        nid = self.names.get(name)
        if nid is None:
            if len(self.names) >= self.limits.max_names:
                raise TraceError(f"more than {self.limits.max_names} distinct kernel names (limit)")
            nid = self.names[name] = len(self.names)
        return nid

    def _launch(self, e: dict) -> None:
        args = e.get("args")
        c = _as_int(args.get("correlation"), 0, _MAX_CORRELATION - 1) if type(args) is dict else INVALID_MISSING
        if type(c) is str:
            return  # a launch we cannot match to kernels; its kernels then read as eager
        if c in self.launches:
            self.duplicate_launches += 1
            return
        if len(self.launches) >= self.limits.max_kernels:
            raise TraceError(f"more than {self.limits.max_kernels} graph launches (limit)")
        ts = _us_to_ns(e.get("ts"))
        self.launches[c] = (ts if type(ts) is int else -1, _hashable(e.get("pid")), _hashable(e.get("tid")))

    def _range(self, e: dict) -> None:
        t0, d, label = _us_to_ns(e.get("ts")), _us_to_ns(e.get("dur")), e.get("name")
        if type(t0) is not int or type(d) is not int or d < 0 or type(label) is not str:
            return
        key = (_hashable(e.get("pid")), _hashable(e.get("tid")))
        if len(self.ranges) >= self.limits.max_streams and key not in self.ranges:
            raise TraceError(f"more than {self.limits.max_streams} threads with record_function ranges (limit)")
        self.ranges.setdefault(key, []).append((t0, t0 + d, label))

    # ------------------------------------------------------------------ to Trace
    def build(self, path: str, meta: dict[str, Any]) -> Trace:
        if self.kernel_events == 0:
            raise TraceError("no kernel events (cat 'kernel'); was the profiler run with CUDA activities?")
        start = np.frombuffer(self.start, np.int64) if len(self.start) else np.zeros(0, np.int64)
        corr = np.frombuffer(self.corr, np.int64) if len(self.corr) else np.zeros(0, np.int64)
        device = np.frombuffer(self.device, np.int32) if len(self.device) else np.zeros(0, np.int32)

        # One launch row per (device, correlation) of a graph launch; device from its kernels.
        labels: dict[str, int] = {}
        lab_of = self._labels(labels)
        is_launch = np.isin(corr, np.fromiter(self.launches, np.int64, len(self.launches)))
        pairs = np.unique(np.stack([corr[is_launch], device[is_launch].astype(np.int64)], axis=1), axis=0) if is_launch.any() else np.zeros((0, 2), np.int64)
        seen = set(pairs[:, 0].tolist())
        rows = [(c, d) for c, d in pairs.tolist()] + [(c, -1) for c in self.launches if c not in seen]  # -1: no kernel says which
        l_corr = np.array([r[0] for r in rows], np.int64)
        launches = {
            "correlation_id": l_corr,
            "device": np.array([r[1] for r in rows], np.int32),
            "launch_ns": np.array([self.launches[c][0] for c in l_corr.tolist()], np.int64),
            "label": np.array([lab_of.get(c, -1) for c in l_corr.tolist()], np.int32),
        }
        meta = dict(meta)
        meta.update(
            format="kineto",
            source=path,
            kernel_events=self.kernel_events,
            graph_launch_events=len(self.launches),
            eager_kernels=int((~is_launch).sum()),
        )
        if self.duplicate_launches:
            meta["duplicate_launch_events"] = self.duplicate_launches
        if self.non_object_events:
            meta["non_object_events"] = self.non_object_events
        names = [_clean_text(s) for s in self.names]
        trace = Trace.build(
            start_ns=start,
            end_ns=np.frombuffer(self.end, np.int64) if len(self.end) else np.zeros(0, np.int64),
            stream=np.frombuffer(self.stream, np.int64) if len(self.stream) else np.zeros(0, np.int64),
            correlation_id=corr,
            device=device,
            name_id=np.frombuffer(self.name_id, np.int32) if len(self.name_id) else np.zeros(0, np.int32),
            names=names,
            launches=launches,
            labels=[_clean_text(s) for s in labels],
            invalid=self.invalid,
            meta=meta,
        )
        return _with_launch_graphs(trace)

    def _labels(self, labels: dict[str, int]) -> dict[int, int]:
        """Correlation -> label index: the innermost record_function range on the launch's
        thread that contains the launch's CPU timestamp (latest-starting one still open)."""
        by_thread: dict[tuple, list[tuple[int, int]]] = {}
        for c, (ts, pid, tid) in self.launches.items():
            if ts >= 0 and (pid, tid) in self.ranges:
                by_thread.setdefault((pid, tid), []).append((ts, c))
        out: dict[int, int] = {}
        for key, launches in by_thread.items():
            ranges = sorted(self.ranges[key], key=lambda r: (r[0], -r[1]))
            launches.sort()
            stack: list[tuple[int, int, str]] = []
            i = 0
            for ts, c in launches:
                while i < len(ranges) and ranges[i][0] <= ts:
                    stack.append(ranges[i])
                    i += 1
                while stack and stack[-1][1] < ts:
                    stack.pop()  # ended before this launch, and so before every later one
                if stack:
                    label = stack[-1][2]
                    if label not in labels:
                        if len(labels) + len(self.names) >= self.limits.max_names:
                            raise TraceError(f"more than {self.limits.max_names} distinct labels (limit)")
                        labels[label] = len(labels)
                    out[c] = labels[label]
        return out


def _with_launch_graphs(t: Trace) -> Trace:
    """Fill each launch row's graph from its kernels (Kineto names no graph; Trace.build found
    them by signature), so launches count per graph. Launches without kernels stay -1."""
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


def _hashable(v: Any) -> Any:
    return v if type(v) in (int, str) else None


def _us_to_ns(v: Any) -> int | str:
    """Microseconds (int or Decimal) -> integer ns, exactly; or the reason it is invalid."""
    t = type(v)
    if t is int:
        if -_US_LIMIT <= v <= _US_LIMIT:
            return v * 1000
        return INVALID_OUT_OF_RANGE
    if t is Decimal:
        if not -_US_LIMIT <= v <= _US_LIMIT:
            return INVALID_OUT_OF_RANGE
        # Kineto prints ns resolution (3 decimals): exact. Finer digits round to the nearest ns.
        return int(_DEC.to_integral_value(_DEC.scaleb(v, 3)))
    if v is None:
        return INVALID_MISSING
    return INVALID_NON_NUMERIC  # str, bool, list, dict, NaN/Infinity


def _as_int(v: Any, lo: int, hi: int) -> int | str:
    t = type(v)
    if t is int:
        return v if lo <= v <= hi else INVALID_OUT_OF_RANGE
    if t is Decimal:
        return INVALID_NON_INTEGER
    if v is None:
        return INVALID_MISSING
    return INVALID_NON_NUMERIC


_META_KEYS = ("schemaVersion", "cuda_driver_version", "cuda_runtime_version", "cupti_version", "baseTimeNanoseconds", "trace_id")


def _plain_meta(top: dict[str, Any]) -> dict[str, Any]:
    """Small JSON-safe facts from the top level (Decimals and odd types dropped)."""
    out: dict[str, Any] = {}
    for k in _META_KEYS:
        v = top.get(k)
        if type(v) is int or (type(v) is str and len(v) < 200):
            out[k] = _clean_text(v) if type(v) is str else v
    props = top.get("deviceProperties")
    if type(props) is list:
        devs = {}
        for p in props[:1024]:
            if type(p) is dict and type(p.get("id")) is int and type(p.get("name")) is str:
                devs[str(p["id"])] = _clean_text(p["name"][:200])
        if devs:
            out["device_names"] = devs
    return out


def _read_kineto(path: str, size: int, limits: ReadLimits, show: bool | float, gzipped: bool) -> Trace:
    builder = _KinetoBuilder(limits)
    top: dict[str, Any] = {}
    with open(path, "rb") as raw, _progress_bar(show, size, f"reading {os.path.basename(path)}") as bar:
        binary: BinaryIO = gzip.GzipFile(fileobj=raw, mode="rb") if gzipped else raw  # type: ignore[assignment]

        def on_read() -> None:
            bar.update(raw.tell() - bar.n)

        js = _JsonStream(raw, binary, limits, on_read)
        found = False
        c = js.expect("{[")
        if c == "[":  # Chrome's "JSON Array Format": the events alone
            found = True
            _events(js, builder)
        else:
            if js.peek() == "}":
                js.pos += 1
            else:
                while True:
                    key = js.value()
                    if type(key) is not str:
                        raise TraceError(f"invalid JSON at {js.where()}: object key is not a string")
                    js.expect(":")
                    if key == "traceEvents":
                        if js.peek() != "[":
                            raise TraceError("traceEvents is not a list")
                        js.pos += 1
                        found = True
                        _events(js, builder)
                    elif key in _META_KEYS or key == "deviceProperties":
                        top[key] = js.value()
                    else:
                        js.value()  # decoded (bounded by max_event_bytes) and dropped
                    if js.expect(",}") == "}":
                        break
        if js.peek() != "":
            raise TraceError(f"invalid JSON at {js.where()}: extra data after the document")
        if gzipped:
            binary.close()
    if not found:
        raise TraceError("no traceEvents list: not a Chrome trace")
    return builder.build(path, _plain_meta(top))


def _events(js: _JsonStream, builder: _KinetoBuilder) -> None:
    """Consume the elements of an array whose '[' was just read, through its ']'."""
    if js.peek() == "]":
        js.pos += 1
        return
    while True:
        builder.add(js.value())
        if js.expect(",]") == "]":
            return
