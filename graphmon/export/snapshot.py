"""Windows -> immutable snapshots: cumulative histograms/counters + the last window's quantiles.

The :class:`Aggregator` is the sink sources deliver windows to. It analyses each window, folds it
into cumulative state and publishes a new frozen :class:`Snapshot` by a single reference swap,
so a scrape reads the latest snapshot without taking any lock a source or ingest thread holds.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from types import MappingProxyType
from typing import Callable, Mapping, Optional

import numpy as np

from graphmon.analysis.replays import NO_VALUE, QUANTILES, Analysis, analyze, grouped_quantiles
from graphmon.model.window import SourceHealth, Window
from graphmon.model.trace import Trace

log = logging.getLogger("graphmon")

# Histogram upper bounds in ns. Gaps: from the 32 ns GPU timer tick to 10 ms, dense in 0.1-2 µs so
# that a 0.19 µs -> 0.51 µs median shift moves counts across several buckets.
GAP_BUCKETS_NS = (
    32, 64, 96, 128, 160, 192, 224, 256, 320, 384, 448, 512, 640, 768,
    1_000, 1_250, 1_500, 2_000, 3_000, 5_000, 10_000, 20_000, 50_000, 100_000, 1_000_000, 10_000_000,
)
# Replay GPU time / busy: 10 µs .. 1 s, dense around decode step times (0.5-5 ms).
REPLAY_BUCKETS_NS = (
    10_000, 50_000, 100_000, 250_000, 500_000, 750_000, 1_000_000, 1_250_000, 1_500_000, 1_750_000,
    2_000_000, 2_500_000, 3_000_000, 4_000_000, 5_000_000, 7_500_000, 10_000_000, 25_000_000,
    50_000_000, 100_000_000, 1_000_000_000,
)
# Idle per replay, launch latency, inter-replay gap: 1 µs .. 100 ms.
IDLE_BUCKETS_NS = (
    1_000, 5_000, 10_000, 25_000, 50_000, 100_000, 150_000, 200_000, 250_000, 300_000, 400_000,
    500_000, 750_000, 1_000_000, 2_500_000, 5_000_000, 10_000_000, 100_000_000,
)
REPLAY_KINDS = {  # metric kind -> (Replays field, buckets)
    "gpu": ("span_ns", REPLAY_BUCKETS_NS),
    "busy": ("busy_ns", REPLAY_BUCKETS_NS),
    "idle": ("idle_ns", IDLE_BUCKETS_NS),
    "launch_latency": ("launch_latency_ns", IDLE_BUCKETS_NS),
    "inter_replay_gap": ("inter_replay_gap_ns", IDLE_BUCKETS_NS),
}
GAP_QUANTILES = QUANTILES  # the same four as the analyze/status summary: one pass serves both
REPLAY_QUANTILES = (0.5, 0.9, 0.99)
OTHER = "other"
ERROR_LOG_INTERVAL_S = 60.0  # contained errors: at most one log line per stage per this many seconds


@dataclass(frozen=True)
class Hist:
    """Cumulative histogram: per-bucket (non-cumulative) counts incl. +Inf, exact ns sum."""

    counts: tuple[int, ...]
    sum_ns: int
    count: int


@dataclass(frozen=True)
class GraphSeries:
    graph: str  # display name (after folding)
    graph_key: str
    label: str
    upload_mode: str
    upload_stream_is_launch_stream: str  # "true" | "false" | "unknown"


@dataclass(frozen=True)
class Snapshot:
    """Everything a scrape or /status needs; immutable (tuples and read-only mappings)."""

    created_s: float
    rank: str
    backend_info: Mapping[str, str]
    health: SourceHealth
    windows_total: int
    records_total: int
    records_dropped_total: int
    records_invalid_total: Mapping[str, int]
    series_folded_total: int
    errors_total: Mapping[str, int]  # stage -> count (aggregator + source)
    last_window_s: Optional[float]
    observer_slowdown: Optional[float]
    # key (device, graph, stream, upload_mode)
    gap_hist: Mapping[tuple, Hist]
    gap_negative_total: Mapping[tuple, int]
    gap_quantiles: Mapping[tuple, tuple[float, ...]]  # last window
    # key (device, graph, upload_mode)
    replay_hist: Mapping[tuple, Mapping[str, Hist]]  # kind -> Hist
    replay_quantiles: Mapping[tuple, Mapping[str, tuple[float, ...]]]  # last window, kind -> qs
    kernels_per_replay: Mapping[tuple, float]
    replays_total: Mapping[tuple, int]
    graphs: Mapping[tuple, GraphSeries]  # (device, graph) -> info
    last_window_summary: tuple = ()  # per graph dicts from report.graphs_summary (for /status)
    windows: tuple = ()  # recent window ids, newest last

    @property
    def up(self) -> bool:
        return self.health.up


def _yield_gil() -> None:
    # Between ingest stages: let the host's threads and the HTTP loop take the GIL now rather
    # than after a whole window's Python work (it lowers scrape-latency tails).
    time.sleep(0)


def _freeze(d: dict) -> Mapping:
    return MappingProxyType(dict(d))


def _hist_add(old: Optional[Hist], counts: np.ndarray, sum_ns: int, count: int) -> Hist:
    if old is None:
        return Hist(tuple(int(x) for x in counts), int(sum_ns), int(count))
    return Hist(tuple(int(a) + int(b) for a, b in zip(old.counts, counts)), old.sum_ns + int(sum_ns), old.count + int(count))


def bucket_counts(values: np.ndarray, group: np.ndarray, ngroups: int, bounds_ns) -> np.ndarray:
    """Per-group bucket counts (ngroups x (len(bounds)+1)); bucket i holds v <= bounds[i]."""
    nb = len(bounds_ns) + 1
    idx = np.searchsorted(np.asarray(bounds_ns, dtype=np.int64), values, side="left")
    return np.bincount(group * nb + idx, minlength=ngroups * nb).reshape(ngroups, nb)


class TraceStore:
    """Recent windows for GET /trace/{id}, bounded by count and bytes (oldest evicted)."""

    def __init__(self, max_count: int, max_bytes: int):
        self.max_count, self.max_bytes = max_count, max_bytes
        self._items: OrderedDict[str, tuple[Trace, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.evicted = 0

    @staticmethod
    def size_of(trace: Trace) -> int:
        return int(sum(getattr(trace, k).nbytes for k in ("start_ns", "end_ns", "device", "stream", "graph_id",
                                                           "graph_node_id", "correlation_id", "name_id", "graph")))

    def put(self, wid: str, trace: Trace) -> None:
        size = self.size_of(trace)
        with self._lock:
            if self.max_count == 0 or size > self.max_bytes:
                self.evicted += 1
                return
            self._items[wid] = (trace, size)
            self._bytes += size
            while len(self._items) > self.max_count or self._bytes > self.max_bytes:
                _, (_, s) = self._items.popitem(last=False)
                self._bytes -= s
                self.evicted += 1

    def get(self, wid: str) -> Optional[Trace]:
        with self._lock:
            item = self._items.get(wid)
        return item[0] if item else None

    def ids(self) -> list[str]:
        with self._lock:
            return list(self._items)

    @property
    def nbytes(self) -> int:
        return self._bytes


class Aggregator:
    """The sink: analyse windows, fold them into cumulative state, publish snapshots."""

    @property
    def backend_info(self) -> dict[str, str]:
        return dict(self._backend_info())

    def __init__(
        self,
        rank: str = "0",
        max_graphs: int = 64,
        max_streams: int = 16,
        trace_store: Optional[TraceStore] = None,
        health: Callable[[], SourceHealth] = lambda: SourceHealth(up=True, state="running"),
        backend_info: Optional[Mapping[str, str] | Callable[[], Mapping[str, str]]] = None,
    ):
        self.rank = rank
        self.max_graphs, self.max_streams = max_graphs, max_streams
        self.store = trace_store if trace_store is not None else TraceStore(16, 256 * 2**20)
        self._health = health
        # a callable is asked at every snapshot: a source learns some facts (which libcupti)
        # only once it runs
        self._backend_info = backend_info if callable(backend_info) else (lambda b=dict(backend_info or {"backend": "none"}): b)
        self._lock = threading.Lock()  # serialises ingest; never taken by scrapes
        self._last_key: Optional[tuple] = None
        self._seq = 0
        self._windows = 0
        self._records = 0
        self._dropped = 0
        self._invalid: dict[str, int] = {}
        self._errors: dict[str, int] = {}
        self._error_logged: dict[str, float] = {}
        self._source_errors_logged: dict[str, int] = {}
        self._last_window_s: Optional[float] = None
        self._slowdown: Optional[float] = None
        self._gap_hist: dict[tuple, Hist] = {}
        self._gap_neg: dict[tuple, int] = {}
        self._gap_q: dict[tuple, tuple] = {}
        self._rep_hist: dict[tuple, dict[str, Hist]] = {}
        self._rep_q: dict[tuple, dict[str, tuple]] = {}
        self._kpr: dict[tuple, float] = {}
        self._replays: dict[tuple, int] = {}
        self._graphs: dict[tuple, GraphSeries] = {}
        self._graph_slots: dict[str, dict[str, str]] = {}  # device -> graph identity -> series name
        self._stream_slots: dict[tuple, set] = {}  # (device, graph) -> streams with own series
        self._folded: set = set()
        self._last_summary: tuple = ()
        self._waiters: dict[str, threading.Event] = {}
        # Called with each newly published snapshot, outside the ingest lock (e.g. to pre-render
        # /metrics off the scrape path). Exceptions are counted, never raised.
        self.on_publish: list[Callable[[Snapshot], None]] = []
        self._snapshot = self._build_snapshot()

    # ------------------------------------------------------------------ public
    def snapshot(self) -> Snapshot:
        """The latest snapshot (a plain attribute read: no lock)."""
        return self._snapshot

    def __call__(self, window: Window) -> None:
        self.ingest(window)

    def ingest(self, window: Window) -> Optional[str]:
        """Analyse and fold one window. Never raises: failures are counted by stage."""
        with self._lock:
            try:
                wid: Optional[str] = self._ingest_locked(window)
            except Exception as e:  # contained: a bad window must not kill the collecting thread
                self.count_error("analysis", e)
                wid = None
            try:  # a failed build keeps the previous snapshot; the folded window shows in the next
                self._snapshot = self._build_snapshot()
            except Exception as e:
                self.count_error("snapshot", e)
            snap = self._snapshot
        self._published(snap)
        ev = self._waiters.pop(wid, None) if wid else None
        if ev is not None:
            ev.set()
        return wid

    def count_error(self, stage: str, exc: Optional[BaseException] = None) -> None:
        self._errors[stage] = self._errors.get(stage, 0) + 1
        if exc is not None:
            self._log_error(stage, repr(exc))

    def _log_error(self, stage: str, detail: str) -> None:
        now = time.monotonic()
        if now - self._error_logged.get(stage, -1e9) > ERROR_LOG_INTERVAL_S:
            self._error_logged[stage] = now  # rate limit: one log line per stage per interval
            log.warning("graphmon %s error (counted in graphmon_collector_errors_total): %s", stage, detail)

    def _change_key(self) -> tuple:
        """What a refresh between windows could change: health, counted errors, backend facts."""
        try:
            h = self._health()
            health = (h.up, h.state, h.reason, tuple(sorted(h.errors.items())))
        except Exception as e:
            health = ("health failed", repr(e))
        try:
            info = tuple(sorted(self._backend_info().items()))
        except Exception as e:
            info = ("info failed", repr(e))
        return health, tuple(sorted(self._errors.items())), info

    def refresh_if_changed(self) -> bool:
        """Refresh only when something a snapshot shows between windows changed. A no-op rebuild
        and /metrics render hold the GIL for several ms (6-9 ms for 1,650 series on a CI-class
        core), every second: a serving loop that launches from Python waits for it."""
        if self._change_key() == self._last_key:
            return False
        return self.refresh()

    def refresh(self, timeout_s: float = -1) -> bool:
        """Rebuild the snapshot (e.g. after the source's health changed). False if the ingest
        lock was not free within ``timeout_s`` (-1: wait)."""
        # Under the ingest lock: a snapshot built from older state must not be published after
        # a newer one (counters would go backwards, which Prometheus reads as a reset).
        if not self._lock.acquire(timeout=timeout_s):
            return False
        try:
            self._snapshot = self._build_snapshot()
        except Exception as e:
            self.count_error("snapshot", e)
        finally:
            snap = self._snapshot
            self._lock.release()
        self._published(snap)
        return True

    def _published(self, snap: Snapshot) -> None:
        for fn in list(self.on_publish):
            try:
                fn(snap)
            except Exception as e:
                self.count_error("publish", e)

    def wait_for(self, wid: str, timeout_s: float) -> bool:
        """Block until a window with this id has been ingested (used by captures)."""
        if self.store.get(wid) is not None:
            return True
        ev = self._waiters.setdefault(wid, threading.Event())
        try:  # re-check: the window may have landed between the first check and setdefault
            return self.store.get(wid) is not None or ev.wait(timeout_s)
        finally:
            self._waiters.pop(wid, None)  # no waiter outlives its request (bounded memory)

    # ------------------------------------------------------------------ ingest
    def _ingest_locked(self, window: Window) -> str:
        t = window.trace
        # Analyse, and convert the window's own fields, before touching any counter, so a window
        # that fails leaves no partial trace (and a malformed field cannot break every scrape).
        a = analyze(t)
        dropped = int(window.dropped)
        ended_s = float(window.ended_s)
        slowdown = None if window.observer_slowdown is None else float(window.observer_slowdown)
        invalid = {str(r): int(c) for r, c in t.invalid.items()}
        from graphmon.report.summary import graphs_summary  # local: report imports analysis only

        _yield_gil()
        # One quantile pass serves /status's summary and the quantile metrics.
        gq = grouped_quantiles(a.gaps.values, a.gaps.offsets, GAP_QUANTILES)
        summary = tuple(graphs_summary(a, gq))
        _yield_gil()
        gseries = self._graph_series(a)
        self._fold_gaps(a, gseries, gq)
        _yield_gil()
        self._fold_replays(a, gseries)
        self._seq += 1
        wid = window.capture_id or f"w{self._seq}"
        self._windows += 1
        self._records += len(t)
        self._dropped += dropped
        for r, c in invalid.items():
            self._invalid[r] = self._invalid.get(r, 0) + c
        self._last_window_s = ended_s
        if slowdown is not None:
            self._slowdown = slowdown
        self._last_summary = summary
        self.store.put(wid, t)
        return wid

    def _graph_series(self, a: Analysis) -> dict[tuple, GraphSeries]:
        """(device, graph index) -> series, applying the graph cap (excess folds into 'other')."""
        t = a.trace
        names = t.graph_names()
        out: dict[tuple, GraphSeries] = {}
        pairs = set(zip(a.replays.device.tolist(), a.replays.graph.tolist()))
        for dev, gi in sorted(pairs):
            info = t.graphs[gi]
            d = str(dev)
            slots = self._graph_slots.setdefault(d, {})
            ident = f"{info.key}|{info.label}"
            name = slots.get(ident)
            if name is None:
                if len(slots) < self.max_graphs:
                    name = slots[ident] = names[gi]
                else:
                    name = OTHER
                    self._folded.add(("graph", d, ident))
            ul = info.upload_stream_is_launch_stream
            gs = GraphSeries(
                graph=name,
                graph_key=info.key if name != OTHER else OTHER,
                label=info.label if name != OTHER else "",
                upload_mode=info.upload_mode,
                upload_stream_is_launch_stream="unknown" if ul is None else str(bool(ul)).lower(),
            )
            out[(dev, gi)] = gs
            self._graphs[(d, name)] = gs
        return out

    def _stream_name(self, d: str, graph: str, stream: int) -> str:
        slots = self._stream_slots.setdefault((d, graph), set())
        s = str(stream)
        if s in slots:
            return s
        if len(slots) < self.max_streams:
            slots.add(s)
            return s
        self._folded.add(("stream", d, graph, s))
        return OTHER

    def _fold_gaps(self, a: Analysis, gseries, q: np.ndarray) -> None:
        g = a.gaps
        if len(g) == 0:
            return
        counts = bucket_counts(g.values, g.group_of_values(), len(g), GAP_BUCKETS_NS)
        sums = np.add.reduceat(g.values, g.offsets[:-1])  # groups are never empty
        neg = np.add.reduceat((g.values < 0).astype(np.int64), g.offsets[:-1])
        by_key: dict[tuple, list[int]] = {}
        for j in range(len(g)):
            gs = gseries[(int(g.device[j]), int(g.graph[j]))]
            d = str(int(g.device[j]))
            key = (d, gs.graph, self._stream_name(d, gs.graph, int(g.stream[j])), gs.upload_mode)
            self._gap_hist[key] = _hist_add(self._gap_hist.get(key), counts[j], sums[j], g.counts[j])
            self._gap_neg[key] = self._gap_neg.get(key, 0) + int(neg[j])
            by_key.setdefault(key, []).append(j)
        for key, js in by_key.items():
            if len(js) == 1:
                self._gap_q[key] = tuple(float(x) for x in q[js[0]])
            else:  # several groups folded into one series: quantiles of their union
                vals = np.sort(np.concatenate([g.values[g.offsets[j] : g.offsets[j + 1]] for j in js]))
                self._gap_q[key] = tuple(float(x) for x in grouped_quantiles(vals, np.array([0, len(vals)]), GAP_QUANTILES)[0])

    def _fold_replays(self, a: Analysis, gseries) -> None:
        r = a.replays
        if len(r) == 0:
            return
        keys = [(str(d), gseries[(d, gi)].graph, gseries[(d, gi)].upload_mode)
                for d, gi in zip(r.device.tolist(), r.graph.tolist())]
        uniq = sorted(set(keys))
        kid = np.array([uniq.index(k) for k in keys], dtype=np.int64) if len(uniq) < 64 else \
            np.array([{k: i for i, k in enumerate(uniq)}[k] for k in keys], dtype=np.int64)
        o = np.argsort(kid, kind="stable")
        ks = kid[o]
        offs = np.r_[np.flatnonzero(np.r_[True, ks[1:] != ks[:-1]]), len(ks)]
        for kind, (fld, bounds) in REPLAY_KINDS.items():
            vals = getattr(r, fld)[o]
            valid = vals >= 0 if kind == "launch_latency" else vals != NO_VALUE
            if not valid.any():
                continue
            v, grp = vals[valid], ks[valid]
            counts = bucket_counts(v, grp, len(uniq), bounds)
            sums = np.zeros(len(uniq), dtype=np.int64)
            np.add.at(sums, grp, v)
            ns = np.bincount(grp, minlength=len(uniq))
            for i, key in enumerate(uniq):
                if ns[i]:
                    self._rep_hist.setdefault(key, {})[kind] = _hist_add(
                        self._rep_hist.get(key, {}).get(kind), counts[i], sums[i], ns[i])
        for i, key in enumerate(uniq):
            rows = o[offs[i] : offs[i + 1]]
            self._replays[key] = self._replays.get(key, 0) + len(rows)
            self._kpr[key] = float(np.median(r.kernels[rows]))
            qd = {}
            for kind in ("gpu", "busy", "idle"):
                v = np.sort(getattr(r, REPLAY_KINDS[kind][0])[rows])
                qd[kind] = tuple(float(x) for x in grouped_quantiles(v, np.array([0, len(v)]), REPLAY_QUANTILES)[0])
            self._rep_q[key] = qd

    # ------------------------------------------------------------------ snapshot
    def _build_snapshot(self) -> Snapshot:
        self._last_key = self._change_key()  # what this snapshot shows (refresh_if_changed)
        try:
            health = self._health()
        except Exception as e:
            self.count_error("health", e)
            health = SourceHealth(up=False, state="error", reason=f"health check failed: {e!r}")
        errors = dict(self._errors)
        for stage, c in health.errors.items():
            errors[stage] = errors.get(stage, 0) + c
            if c > self._source_errors_logged.get(stage, 0):  # the source counts without I/O; log here
                self._source_errors_logged[stage] = c
                self._log_error(stage, f"{health.last_errors.get(stage, '')} ({c} so far)")
        return Snapshot(
            created_s=time.time(),
            rank=self.rank,
            backend_info=_freeze(self.backend_info),
            health=health,
            windows_total=self._windows,
            records_total=self._records,
            records_dropped_total=self._dropped,
            records_invalid_total=_freeze(self._invalid),
            series_folded_total=len(self._folded),
            errors_total=_freeze(errors),
            last_window_s=self._last_window_s,
            observer_slowdown=self._slowdown,
            gap_hist=_freeze(self._gap_hist),
            gap_negative_total=_freeze(self._gap_neg),
            gap_quantiles=_freeze(self._gap_q),
            replay_hist=_freeze({k: _freeze(v) for k, v in self._rep_hist.items()}),
            replay_quantiles=_freeze({k: _freeze(v) for k, v in self._rep_q.items()}),
            kernels_per_replay=_freeze(self._kpr),
            replays_total=_freeze(self._replays),
            graphs=_freeze(self._graphs),
            last_window_summary=self._last_summary,
            windows=tuple(self.store.ids()),
        )
