"""PyTorch profiler (Kineto) Chrome trace JSON -> Trace.

Kernel events (``cat`` "kernel"; "Kernel" in torch <= 1.9) give the kernel columns; graph launch
runtime/driver events (``cudaGraphLaunch``...) give the launches; ``record_function`` ranges
(``user_annotation``) give each launch its label. Events are decoded one at a time
(:class:`~graphmon.formats.jsonstream.JsonStream`), so memory holds the columns, not the JSON.

Flow events (``ac2g``: the arrows from a launch to its kernels, half of all events) are passed
over without being decoded when they have the layout Kineto writes (:data:`FLOW_EVENT`; others are
decoded and dropped). Fractional microseconds are converted to integer ns from their text
(``5351128125842.938`` -> ``5351128125842938``), exactly, with Decimal only for the rare literal
with an exponent or more than 3 decimals.
"""

from __future__ import annotations

import decimal
import gzip
import os
import re
from array import array
from decimal import Decimal
from typing import Any, BinaryIO

import numpy as np

from graphmon.formats.common import I64_MAX, MAX_CORRELATION, MAX_DEVICE, ReadLimits, clean_text, fill_launch_graphs, progress_bar
from graphmon.formats.jsonstream import FloatText, JsonStream
from graphmon.model.invalid import InvalidReason
from graphmon.model.trace import Trace, TraceError
from graphmon.model.window import no_untraced

# Plain strings (not the enum members): helpers below return "an int or a reason" and tell the
# two apart by type.
INVALID_MISSING = InvalidReason.MISSING_FIELD.value
INVALID_NON_NUMERIC = InvalidReason.NON_NUMERIC.value
INVALID_NON_INTEGER = InvalidReason.NON_INTEGER.value
INVALID_OUT_OF_RANGE = InvalidReason.OUT_OF_RANGE.value
INVALID_BAD_PHASE = InvalidReason.BAD_PHASE.value
INVALID_BAD_NAME = InvalidReason.BAD_NAME.value

# Kineto's names for a graph launch: runtime (versioned or not) and driver API.
GRAPH_LAUNCH_NAMES = frozenset({"cudaGraphLaunch", "cudaGraphLaunch_v10000", "cuGraphLaunch", "cuGraphLaunch_ptsz"})
# Event categories, current names and those of torch <= 1.9 ("Kernel", "Runtime", ...).
_KERNEL, _LAUNCH, _RANGE, _MEMCPY, _MEMSET = range(5)
_CATS = {
    "kernel": _KERNEL, "Kernel": _KERNEL,
    "cuda_runtime": _LAUNCH, "cuda_driver": _LAUNCH, "Runtime": _LAUNCH, "Driver": _LAUNCH,
    "user_annotation": _RANGE,
    "gpu_memcpy": _MEMCPY, "Memcpy": _MEMCPY,
    "gpu_memset": _MEMSET, "Memset": _MEMSET,
}
_MAX_CATEGORIES_SEEN = 32  # named in the "no kernel events" error

_US_LIMIT = I64_MAX // 1000  # largest |µs| whose ns value fits int64
_NS_LIMIT = _US_LIMIT * 1000
_DEC = decimal.Context(prec=60, traps=[])  # exact for any value that passes the range check

# A flow event exactly as Kineto writes it (libkineto's ChromeTraceLogger::handleLink): these keys
# in this order, its spacing, integer ids, so whatever it matches is valid JSON. Kept this literal
# on purpose: ~0.8 us a match against ~3-6 us to decode the event (a general pattern with optional
# spaces and string ids cost as much as decoding); any other layout is decoded and dropped.
_INT = r"-?(?:0|[1-9][0-9]*)"
_WS = r"[ \t\n\r]*"  # JSON's whitespace (\s would take Unicode spaces too)
FLOW_EVENT = re.compile(
    rf'\{{{_WS}"ph": "[sft]", "id": {_INT}, "pid": {_INT}, "tid": {_INT}, "ts": {_INT}(?:\.[0-9]+)?,'
    rf'{_WS}"cat": "ac2g", "name": "ac2g"(?:, "bp": "e")?{_WS}\}}')


class _KinetoBuilder:
    """Collects kernel columns, graph launches and record_function ranges from trace events."""

    def __init__(self, limits: ReadLimits):
        self.limits = limits
        self.untraced = no_untraced()  # graphmonTrace.untraced (graphmon's own export only)
        self.start, self.end, self.stream, self.corr = array("q"), array("q"), array("q"), array("q")
        self.device, self.name_id = array("i"), array("i")
        self.names: dict[str, int] = {}
        self.streams: set[int] = set()
        self.invalid: dict[str, int] = {}
        self.kernel_events = 0
        # correlation -> (ts ns or -1, pid, tid, graph, stream, known); graph, stream and known are
        # graphmon's own launch args (formats.chrome): -1, -1, True in other files
        self.launches: dict[int, tuple[int, Any, Any, int, int, bool]] = {}
        self.duplicate_launches = 0
        self.ranges: dict[tuple, list[tuple[int, int, str]]] = {}  # (pid, tid) -> (start, end, label)
        self.non_object_events = 0
        self.n_ranges = 0
        self.memops = (array("q"), array("q"), array("q"))  # correlation, duration ns, kind (_MEMCPY/_MEMSET)
        self.categories: dict[str, int] = {}  # other categories seen (a few), for the error message

    def bad(self, reason: str) -> None:
        self.invalid[reason] = self.invalid.get(reason, 0) + 1

    def add(self, e: Any) -> None:
        if type(e) is not dict:
            self.non_object_events += 1
            return
        cat = e.get("cat")
        if type(cat) is not str:
            return  # not a kernel event, whatever it is (a list here would not even hash)
        kind = _CATS.get(cat)
        if kind == _KERNEL:
            self._kernel(e)
        elif kind == _LAUNCH:
            if type(e.get("name")) is str and e["name"] in GRAPH_LAUNCH_NAMES:
                self._launch(e)
        elif kind == _RANGE:
            if e.get("ph") == "X":
                self._range(e)
        elif kind is not None:
            self._memop(e, kind)
        elif cat in self.categories or len(self.categories) < _MAX_CATEGORIES_SEEN:
            self.categories[cat[:40]] = self.categories.get(cat[:40], 0) + 1

    def _memop(self, e: dict, kind: int) -> None:
        """A copy or set on the GPU: kept apart (kernel columns hold kernels only); those of a
        graph launch are counted in meta["graph_memops"]."""
        args = e.get("args")
        c = _as_int(args.get("correlation"), 0, MAX_CORRELATION - 1) if type(args) is dict else INVALID_MISSING
        d = _us_to_ns(e.get("dur"))
        if type(c) is str or type(d) is str or d < 0:
            return
        if len(self.memops[0]) >= self.limits.max_kernels:
            raise TraceError(f"more than {self.limits.max_kernels} memcpy/memset events (limit)")
        self.memops[0].append(c)
        self.memops[1].append(d)
        self.memops[2].append(kind)

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
        if t1 > I64_MAX or t1 < -I64_MAX:
            return self.bad(INVALID_OUT_OF_RANGE)
        s = _as_int(stream, -I64_MAX, I64_MAX)
        c = _as_int(corr, 0, MAX_CORRELATION - 1)
        dv = _as_int(device, 0, MAX_DEVICE - 1)
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
        c = _as_int(args.get("correlation"), 0, MAX_CORRELATION - 1) if type(args) is dict else INVALID_MISSING
        if type(c) is str:
            return  # a launch we cannot match to kernels; its kernels then read as eager
        if c in self.launches:
            self.duplicate_launches += 1
            return
        if len(self.launches) >= self.limits.max_kernels:
            raise TraceError(f"more than {self.limits.max_kernels} graph launches (limit)")
        ts = _us_to_ns(e.get("ts"))
        g, st = args.get("graph", -1), args.get("stream", -1)
        self.launches[c] = (ts if type(ts) is int else -1, _hashable(e.get("pid")), _hashable(e.get("tid")),
                            g if type(g) is int and 0 <= g < MAX_GRAPHMON_GRAPHS else -1,
                            st if type(st) is int and -I64_MAX <= st <= I64_MAX else -1,
                            args.get("launch_time") != UNKNOWN_LAUNCH)

    def _range(self, e: dict) -> None:
        t0, d, label = _us_to_ns(e.get("ts")), _us_to_ns(e.get("dur")), e.get("name")
        if type(t0) is not int or type(d) is not int or d < 0 or type(label) is not str:
            return
        key = (_hashable(e.get("pid")), _hashable(e.get("tid")))
        self.n_ranges += 1
        if self.n_ranges > self.limits.max_ranges:
            raise TraceError(f"more than {self.limits.max_ranges} record_function ranges (limit)")
        if len(self.ranges) >= self.limits.max_streams and key not in self.ranges:
            raise TraceError(f"more than {self.limits.max_streams} threads with record_function ranges (limit)")
        self.ranges.setdefault(key, []).append((t0, t0 + d, label))

    # ------------------------------------------------------------------ to Trace
    def build(self, path: str, meta: dict[str, Any], graphmon: Any = None) -> Trace:
        """``graphmon``: the ``graphmonTrace`` object of graphmon's own Chrome export (its graphs
        and the window's invalid counts), or None."""
        if self.kernel_events == 0:
            seen = sorted(self.categories.items(), key=lambda kv: -kv[1])[:8]
            other = f"; categories seen: {', '.join(f'{c!r} ({n})' for c, n in seen)}" if seen else ""
            raise TraceError(f"no kernel events (cat 'kernel', or 'Kernel' before torch 1.10){other}; was the profiler run with CUDA activities?")
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
        info = [self.launches[c] for c in l_corr.tolist()]
        launches = {
            "correlation_id": l_corr,
            "device": np.array([r[1] for r in rows], np.int32),
            "launch_ns": np.array([r[0] if r[5] else -1 for r in info], np.int64),
            "label": np.array([lab_of.get(c, -1) for c in l_corr.tolist()], np.int32),
            "stream": np.array([r[4] for r in info], np.int64),
        }
        graphs, invalid = [], dict(self.invalid)
        if graphmon is not None:  # graphmon's export: each launch names its graph, with its metadata
            from graphmon.formats.native import graphmon_chrome_metadata

            graphs, excluded, self.untraced = graphmon_chrome_metadata(graphmon, self.limits)
            launches["graph"] = np.array([r[3] if r[3] < len(graphs) else -1 for r in info], np.int32)
            for k, v in excluded.items():
                invalid[k] = invalid.get(k, 0) + v
        meta = dict(meta)
        meta.update(
            format="kineto",
            source=path,
            kernel_events=self.kernel_events,
            graph_launch_events=len(self.launches),
            eager_kernels=int((~is_launch).sum()),
        )
        if len(self.memops[0]):
            mc, md, mk = (np.frombuffer(a, np.int64) for a in self.memops)
            in_graph = np.isin(mc, np.fromiter(self.launches, np.int64, len(self.launches)))
            ops = {}
            for kind, name in ((_MEMCPY, "memcpy"), (_MEMSET, "memset")):
                sel = in_graph & (mk == kind)
                ops[name], ops[f"{name}_ns"] = int(sel.sum()), sum(md[sel].tolist())  # Python ints: no wrap
            meta["graph_memops"] = ops
        if self.duplicate_launches:
            meta["duplicate_launch_events"] = self.duplicate_launches
        if self.non_object_events:
            meta["non_object_events"] = self.non_object_events
        names = [clean_text(s) for s in self.names]
        trace = Trace.build(
            start_ns=start,
            end_ns=np.frombuffer(self.end, np.int64) if len(self.end) else np.zeros(0, np.int64),
            stream=np.frombuffer(self.stream, np.int64) if len(self.stream) else np.zeros(0, np.int64),
            correlation_id=corr,
            device=device,
            name_id=np.frombuffer(self.name_id, np.int32) if len(self.name_id) else np.zeros(0, np.int32),
            names=names,
            launches=launches,
            graphs=graphs,
            labels=[clean_text(s) for s in labels],
            invalid=invalid,
            meta=meta,
        )
        return fill_launch_graphs(trace)

    def _labels(self, labels: dict[str, int]) -> dict[int, int]:
        """Correlation -> label index: the innermost record_function range on the launch's
        thread that contains the launch's CPU timestamp (latest-starting one still open)."""
        by_thread: dict[tuple, list[tuple[int, int]]] = {}
        for c, (ts, pid, tid, *_) in self.launches.items():
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


def _hashable(v: Any) -> Any:
    return v if type(v) in (int, str) else None


def _us_to_ns(v: Any) -> int | str:
    """Microseconds (int or a float's text) -> integer ns, exactly; or the reason it is invalid."""
    t = type(v)
    if t is int:
        if -_US_LIMIT <= v <= _US_LIMIT:
            return v * 1000
        return INVALID_OUT_OF_RANGE
    if t is FloatText:
        if v[-4:-3] == ".":  # Kineto's "5351128125842.938": the digits are the ns (an exponent fails int)
            try:
                ns = int(v[:-4] + v[-3:])
            except ValueError:
                pass
            else:
                return ns if -_NS_LIMIT <= ns <= _NS_LIMIT else INVALID_OUT_OF_RANGE
        whole, _, frac = v.partition(".")
        if len(frac) <= 3 and frac.isdigit() and len(whole) <= 20:  # no exponent, ns resolution
            ns = int(whole + frac + "000"[len(frac):])  # "-0.5" -> "-0500": the sign carries over
            return ns if -_NS_LIMIT <= ns <= _NS_LIMIT else INVALID_OUT_OF_RANGE
        v, t = Decimal(v), Decimal
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
    if t is FloatText or t is Decimal:
        return INVALID_NON_INTEGER
    if v is None:
        return INVALID_MISSING
    return INVALID_NON_NUMERIC


_META_KEYS = ("schemaVersion", "cuda_driver_version", "cuda_runtime_version", "cupti_version", "baseTimeNanoseconds", "trace_id")
TRUNCATED_KEY = "graphmonTruncated"  # graphmon's own Chrome JSON, cut (formats.chrome)
GRAPHMON_KEY = "graphmonTrace"  # graphmon's own Chrome JSON: graph metadata and excluded records
UNKNOWN_LAUNCH = "unknown"  # args.launch_time of a launch event graphmon drew without a launch time
MAX_GRAPHMON_GRAPHS = 1 << 20


def _plain_meta(top: dict[str, Any]) -> dict[str, Any]:
    """Small JSON-safe facts from the top level (Decimals and odd types dropped)."""
    out: dict[str, Any] = {}
    for k in _META_KEYS:
        v = top.get(k)
        if type(v) is int or (type(v) is str and len(v) < 200):
            out[k] = clean_text(v) if type(v) is str else v
    cut = top.get(TRUNCATED_KEY)
    if type(cut) is dict and all(type(cut.get(k)) is int and cut[k] >= 0 for k in ("kernels", "kernels_kept")):
        out["truncated"] = {"kernels": cut["kernels"], "kernels_kept": cut["kernels_kept"]}
    props = top.get("deviceProperties")
    if type(props) is list:
        devs = {}
        for p in props[:1024]:
            if type(p) is dict and type(p.get("id")) is int and type(p.get("name")) is str:
                devs[str(p["id"])] = clean_text(p["name"][:200])
        if devs:
            out["device_names"] = devs
    return out


def read_kineto(path: str, size: int, limits: ReadLimits, show: bool | float,
                gzipped: bool) -> tuple[Trace, dict[str, np.ndarray]]:
    """The trace, and the untraced replay durations of graphmon's own export (empty otherwise)."""
    builder = _KinetoBuilder(limits)
    top: dict[str, Any] = {}
    with open(path, "rb") as raw, progress_bar(show, size, f"reading {os.path.basename(path)}") as bar:
        binary: BinaryIO = gzip.GzipFile(fileobj=raw, mode="rb") if gzipped else raw  # type: ignore[assignment]

        def on_read() -> None:
            bar.update(raw.tell() - bar.n)

        js = JsonStream(raw, binary, limits, on_read)
        found = False
        c = js.expect("{[")
        if c == "[":  # Chrome's "JSON Array Format": the events alone
            found = True
            _events(js, builder)
        else:
            for key in js.members():
                if key == "traceEvents":
                    if js.peek() != "[":
                        raise TraceError("traceEvents is not a list")
                    js.pos += 1
                    found = True
                    _events(js, builder)
                elif key in _META_KEYS or key in ("deviceProperties", TRUNCATED_KEY, GRAPHMON_KEY):
                    top[key] = js.value()
                else:
                    js.value()  # decoded (bounded by max_event_bytes) and dropped
        js.end()
        if gzipped:
            binary.close()
    if not found:
        raise TraceError("no traceEvents list: not a Chrome trace")
    trace = builder.build(path, _plain_meta(top), top.get(GRAPHMON_KEY))
    return trace, builder.untraced


def _events(js: JsonStream, builder: _KinetoBuilder) -> None:
    """Consume the elements of an array whose '[' was just read, through its ']'."""
    flows = js.each(builder.add, skip=FLOW_EVENT)
    if flows:
        builder.categories["ac2g"] = builder.categories.get("ac2g", 0) + flows
