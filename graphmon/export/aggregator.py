"""Windows -> immutable snapshots: cumulative histograms/counters + the last window's quantiles.

The :class:`Aggregator` is the sink sources deliver windows to. It analyses each window, folds it
into cumulative state and publishes a new frozen :class:`Snapshot` by a single reference swap,
so a scrape reads the latest snapshot without taking any lock a source or ingest thread holds.
It formats nothing: report.summary turns a snapshot into /status dicts, off the ingest lock.

Series are bounded: devices, graphs per device and streams per graph are capped (the excess folds
into "other", counted), label values are capped in length (a hash suffix keeps them distinct,
counted), and graphs not sampled for ``stale_after_s`` are dropped. Each snapshot names the
rank's detail graphs (graphmon.export.detail): the ones with series of their own by default.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import OrderedDict
from typing import Callable, Mapping, Optional

import numpy as np

from graphmon.analysis.replays import NO_VALUE, Analysis, analyze, grouped_quantiles
from graphmon.export.detail import DetailGraphs, Signatures, cap_label
from graphmon.export.buckets import GAP_BUCKETS_NS, GAP_QUANTILES, MAX_VALUE_NS, REPLAY_KINDS, REPLAY_QUANTILES, bucket_counts, hist_add
from graphmon.export.snapshot import GraphSeries, Hist, Snapshot, freeze
from graphmon.export.tracestore import TraceStore
from graphmon.export.untraced import UNKNOWN, UNKNOWN_SERIES, UntracedTimes, untraced_devices, untraced_rows
from graphmon.model.window import SourceHealth, Window

log = logging.getLogger("graphmon")

OTHER = "other"
ERROR_LOG_INTERVAL_S = 60.0  # contained errors: at most one log line per stage per this many seconds
# Folded identities remembered so each counts once in series_folded_total. Bounded: in a host that
# creates graphs for days the set would grow forever; an identity evicted and seen again counts again.
FOLDED_MEMORY = 4096


def _yield_gil() -> None:
    # Between ingest stages: let the host's threads and the HTTP loop take the GIL now rather
    # than after a whole window's Python work (it lowers scrape-latency tails).
    time.sleep(0)


class Aggregator:
    """The sink: analyse windows, fold them into cumulative state, publish snapshots."""

    @property
    def backend_info(self) -> dict[str, str]:
        return dict(self._backend_info())

    def __init__(
        self,
        rank: str = "0", max_graphs: int = 64, max_streams: int = 16,
        trace_store: Optional[TraceStore] = None,
        health: Callable[[], SourceHealth] = lambda: SourceHealth(up=True, state="running"),
        backend_info: Optional[Mapping[str, str] | Callable[[], Mapping[str, str]]] = None,
        *,
        max_devices: int = 16,
        max_label_length: int = 128,
        stale_after_s: float = 600.0,
        process: Optional[Mapping[str, str]] = None,
        detail_graphs: int = 2,
    ):
        self.rank = rank
        self.max_graphs, self.max_streams, self.max_devices = max_graphs, max_streams, max_devices
        self.max_label_length, self.stale_after_s = max_label_length, stale_after_s
        self.process = dict(process or {})
        self.store = trace_store if trace_store is not None else TraceStore(16, 256 * 2**20)
        self._health = health
        # a callable is asked at every snapshot: a source learns some facts (which libcupti)
        # only once it runs
        self._backend_info = backend_info if callable(backend_info) else (lambda b=dict(backend_info or {"backend": "none"}): b)
        self._lock = threading.Lock()  # serialises ingest; never taken by scrapes
        self._last_key: Optional[tuple] = None
        self._seq = self._windows = self._records = self._dropped = 0
        self._invalid: dict[str, int] = {}
        self._errors: dict[str, int] = {}
        self._error_logged: dict[str, float] = {}
        self._source_errors_logged: dict[str, int] = {}
        self._last_window_s: Optional[float] = None
        self._slowdown: Optional[float] = None
        self._traced_total_s = 0.0  # kernel tracing on, summed over windows
        self._gap_hist: dict[tuple, Hist] = {}
        self._gap_neg: dict[tuple, int] = {}
        self._gap_q: dict[tuple, tuple] = {}
        self._rep_hist: dict[tuple, dict[str, Hist]] = {}
        self._rep_q: dict[tuple, dict[str, tuple]] = {}
        self._kpr: dict[tuple, float] = {}
        self._replays: dict[tuple, int] = {}
        self._graphs: dict[tuple, GraphSeries] = {}
        self._last_sampled: dict[tuple, float] = {}  # (device, graph, upload_mode) -> wall s
        self._device_slots: dict[str, None] = {}  # devices with own series (insertion ordered)
        self._graph_slots: dict[str, dict[str, tuple[str, str, str]]] = {}  # device -> identity -> (name, key, label)
        self._stream_slots: dict[tuple, set] = {}  # (device, graph) -> streams with own series
        self._folded: OrderedDict = OrderedDict()
        self._folded_total = self._truncated = 0
        self._oor: dict[str, int] = {}
        self._detail = DetailGraphs(detail_graphs)
        self._untraced = UntracedTimes()
        self._last_analysis: Optional[Analysis] = None
        self._last_gq: Optional[np.ndarray] = None  # its gap quantiles
        self._waiters: dict[str, threading.Event] = {}
        # Called with each newly published snapshot, outside the ingest lock (e.g. to pre-render
        # /metrics off the scrape path). Exceptions are counted, never raised.
        self.on_publish: list[Callable[[Snapshot], None]] = []
        self._snapshot = self._build_snapshot()

    @property
    def process(self) -> dict:
        return self._process

    @process.setter
    def process(self, value: Mapping[str, str]) -> None:
        # another process (a successor on the rank) may run changed graphs under the same keys
        self._process, self._signatures = dict(value), Signatures()

    # ------------------------------------------------------------------ public
    def snapshot(self) -> Snapshot:
        """The latest snapshot (a plain attribute read: no lock)."""
        return self._snapshot

    def snapshots(self) -> tuple[Snapshot, ...]:
        """The in-process case of the collector's ``get_snapshots``: a sequence of one."""
        return (self._snapshot,)

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
            log.warning("graphmon %s error (counted in graphmon_collector_errors_total): %s", stage, detail[:500])

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

    def _any_stale(self) -> bool:
        seen = (*self._last_sampled.values(), *self._untraced.seen.values())
        return bool(seen) and min(seen) < time.time() - self.stale_after_s

    def refresh_if_changed(self) -> bool:
        """Refresh only when something a snapshot shows between windows changed (or a series went
        stale). A no-op rebuild and /metrics render hold the GIL for several ms (6-9 ms for 1,650
        series on a CI-class core), every second: a serving loop that launches from Python waits."""
        if self._change_key() == self._last_key and not self._any_stale():
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
        traced_s = float(window.traced_s)
        if not (traced_s >= 0 and math.isfinite(traced_s)):
            raise ValueError("traced_s must be a non-negative finite number")  # a counter must never decrease
        invalid = {str(r): int(c) for r, c in t.invalid.items()}
        if any(c < 0 for c in invalid.values()):
            raise ValueError("negative invalid-record count")  # a counter must never decrease
        ugraph, udur, ubad = untraced_rows(window.untraced, len(t.graphs))
        _yield_gil()
        # One quantile pass serves /status's summary and the quantile metrics.
        gq = grouped_quantiles(a.gaps.values, a.gaps.offsets, GAP_QUANTILES)
        _yield_gil()
        gseries = self._graph_series(t, set(zip(a.replays.device.tolist(), a.replays.graph.tolist())))
        self._fold_gaps(a, gseries, gq)
        _yield_gil()
        self._fold_replays(a, gseries, ended_s)
        if len(ugraph):
            _yield_gil()
            self._fold_untraced(a, ugraph, udur, ended_s)
        self._out_of_range("untraced", ubad)
        self._seq += 1
        wid = window.capture_id or f"w{self._seq}"
        self._windows += 1
        self._records += len(t)
        self._dropped += dropped
        for r, c in invalid.items():
            self._invalid[r] = self._invalid.get(r, 0) + c
        self._last_window_s = ended_s
        self._traced_total_s += traced_s
        if slowdown is not None:
            self._slowdown = slowdown
        self._last_analysis, self._last_gq = a, gq
        self.store.put(wid, t, {"graph": ugraph, "duration_ns": udur})  # rows as /metrics counts them
        return wid

    def _fold(self, ident: tuple) -> None:
        if ident in self._folded:
            self._folded.move_to_end(ident)
            return
        self._folded[ident] = None
        self._folded_total += 1
        while len(self._folded) > FOLDED_MEMORY:
            self._folded.popitem(last=False)

    def _cap(self, value: str) -> str:
        v = cap_label(value, self.max_label_length)
        if v is not value:
            self._truncated += 1
        return v

    def _device(self, dev: int) -> str:
        d = str(dev)
        if d in self._device_slots:
            return d
        if len(self._device_slots) < self.max_devices:
            self._device_slots[d] = None
            return d
        self._fold(("device", d))
        return OTHER

    def _graph_series(self, t, pairs: set, traced: bool = True) -> dict[tuple, tuple[str, GraphSeries]]:
        """(device, graph index) -> (device label, series), applying the device and graph caps;
        untraced rows (``traced`` False: no kernels, no signature) never replace a known series."""
        names = t.graph_names()
        out: dict[tuple, tuple[str, GraphSeries]] = {}
        sigs = self._signatures.of(t, {gi for _, gi in pairs}) if traced else {}
        for dev, gi in sorted(pairs):
            info = t.graphs[gi]
            d = self._device(dev)
            slots = self._graph_slots.setdefault(d, {})
            ident = f"{info.key}|{info.label}"
            slot = slots.get(ident)
            if slot is None:
                if len(slots) < self.max_graphs and d != OTHER:
                    # capped once, when the slot is made: each long value counts once
                    slot = slots[ident] = (self._cap(names[gi]), self._cap(info.key), self._cap(info.label))
                else:
                    slot = (OTHER, OTHER, "")
                    if d != OTHER:  # a folded device's graphs are counted with the device
                        self._fold(("graph", d, ident))
            ul = info.upload_stream_is_launch_stream
            bs = getattr(info, "batch_size", -1)
            gs = GraphSeries(slot[0], slot[1], slot[2], info.upload_mode,
                             "unknown" if ul is None else str(bool(ul)).lower(),
                             str(bs) if isinstance(bs, int) and bs >= 0 and slot[0] != OTHER else "",
                             sigs.get(gi, "") if slot[0] != OTHER else "")
            out[(dev, gi)] = (d, gs)
            if traced or (d, gs.graph) not in self._graphs:
                self._graphs[(d, gs.graph)] = gs
        return out

    def _stream_name(self, d: str, graph: str, stream: int) -> str:
        slots = self._stream_slots.setdefault((d, graph), set())
        s = str(stream)
        if s in slots:
            return s
        if len(slots) < self.max_streams:
            slots.add(s)
            return s
        self._fold(("stream", d, graph, s))
        return OTHER

    def _out_of_range(self, kind: str, n: int) -> None:
        if n:
            self._oor[kind] = self._oor.get(kind, 0) + int(n)

    def _fold_gaps(self, a: Analysis, gseries, q: np.ndarray) -> None:
        g = a.gaps
        if len(g) == 0:
            return
        grp = g.group_of_values()
        # Overlaps (negative gaps) have their own counter and never enter the histogram, so _sum
        # never decreases; gaps beyond MAX_VALUE_NS are counted and left out (int64-safe sums).
        ok = (g.values >= 0) & (g.values <= MAX_VALUE_NS)
        self._out_of_range("gap", int((g.values > MAX_VALUE_NS).sum()))
        counts = bucket_counts(g.values[ok], grp[ok], len(g), GAP_BUCKETS_NS)
        starts = g.offsets[:-1]  # groups are never empty
        sums = np.add.reduceat(np.where(ok, g.values, 0), starts)
        ns = np.add.reduceat(ok.astype(np.int64), starts)
        neg = np.add.reduceat((g.values < 0).astype(np.int64), starts)
        # The summary's quantiles are of the same gaps as its _count and _sum (and the histogram):
        # a negative quantile made prometheus_client's OpenMetrics parser refuse the whole scrape.
        if ok.all():
            kept, kept_offsets = g.values, g.offsets
        else:
            kept, kept_offsets = g.values[ok], np.r_[0, np.cumsum(ns)]
            q = grouped_quantiles(kept, kept_offsets, GAP_QUANTILES)  # NaN (not exported) for a group with none
        by_key: dict[tuple, list[int]] = {}
        for j in range(len(g)):
            d, gs = gseries[(int(g.device[j]), int(g.graph[j]))]
            key = (d, gs.graph, self._stream_name(d, gs.graph, int(g.stream[j])), gs.upload_mode)
            self._gap_hist[key] = hist_add(self._gap_hist.get(key), counts[j], sums[j], ns[j])
            self._gap_neg[key] = self._gap_neg.get(key, 0) + int(neg[j])
            by_key.setdefault(key, []).append(j)
        for key, js in by_key.items():
            if len(js) == 1:
                self._gap_q[key] = tuple(float(x) for x in q[js[0]])
            else:  # several groups folded into one series: quantiles of their union
                vals = np.sort(np.concatenate([kept[kept_offsets[j] : kept_offsets[j + 1]] for j in js]))
                self._gap_q[key] = tuple(float(x) for x in grouped_quantiles(vals, np.array([0, len(vals)]), GAP_QUANTILES)[0])

    def _fold_replays(self, a: Analysis, gseries, ended_s: float) -> None:
        r = a.replays
        if len(r) == 0:
            return
        keys = [(gseries[(d, gi)][0], gseries[(d, gi)][1].graph, gseries[(d, gi)][1].upload_mode)
                for d, gi in zip(r.device.tolist(), r.graph.tolist())]
        uniq = sorted(set(keys))
        index = {k: i for i, k in enumerate(uniq)}
        kid = np.array([index[k] for k in keys], dtype=np.int64)
        o = np.argsort(kid, kind="stable")
        ks = kid[o]
        offs = np.r_[np.flatnonzero(np.r_[True, ks[1:] != ks[:-1]]), len(ks)]
        quantiles: dict[tuple, dict] = {key: {} for key in uniq}
        for kind, (fld, bounds) in REPLAY_KINDS.items():
            vals = getattr(r, fld)[o]
            present = vals != NO_VALUE  # no launch record / no previous replay
            valid = present & (vals >= 0) & (vals <= MAX_VALUE_NS)
            if kind == "launch_latency":  # < 0: CPU and GPU clocks disagree; counted apart from absurd values
                negative = int((present & (vals < 0)).sum())
                self._out_of_range("negative_launch_latency", negative)
                self._out_of_range(kind, int((present & ~valid).sum()) - negative)
            else:
                self._out_of_range(kind, int((present & ~valid).sum()))
            if not valid.any():
                continue
            v, grp = vals[valid], ks[valid]  # grouped by key (ks is sorted)
            counts = bucket_counts(v, grp, len(uniq), bounds)
            sums = np.zeros(len(uniq), np.int64)
            np.add.at(sums, grp, v)  # int64: exact; values <= MAX_VALUE_NS cannot overflow in a window
            ns = np.bincount(grp, minlength=len(uniq))
            # the last window's quantiles, of the histogram's values (one definition), every key at once
            qs = grouped_quantiles(v[np.lexsort((v, grp))], np.r_[0, np.cumsum(ns)], REPLAY_QUANTILES, presorted=True)
            for i, key in enumerate(uniq):
                if ns[i]:
                    self._rep_hist.setdefault(key, {})[kind] = hist_add(
                        self._rep_hist.get(key, {}).get(kind), counts[i], sums[i], ns[i])
                    quantiles[key][kind] = tuple(qs[i].tolist())
        for i, key in enumerate(uniq):
            rows = o[offs[i] : offs[i + 1]]
            self._replays[key] = self._replays.get(key, 0) + len(rows)
            self._kpr[key] = float(np.median(r.kernels[rows]))
            self._last_sampled[key] = ended_s
            # a kind without a value in this window (no launch record; one replay: no gap between
            # replays) keeps its last window's quantiles: its series would flap otherwise
            self._rep_q[key] = {**self._rep_q.get(key, {}), **quantiles[key]}
            span = r.span_ns[rows]
            self._detail.replayed((key[0], key[1]), int(span[(span >= 0) & (span <= MAX_VALUE_NS)].sum()), ended_s)

    def _fold_untraced(self, a: Analysis, graph: np.ndarray, dur_ns: np.ndarray, ended_s: float) -> None:
        """Untraced replay times under the traced families' series keys; graph -1 under UNKNOWN."""
        gis = np.unique(graph)
        dev = untraced_devices(a.trace, a.replays, gis, self._graph_slots, self.process.get("device", ""))
        gseries = self._graph_series(a.trace, {(dev[gi], gi) for gi in gis.tolist() if gi >= 0}, traced=False)
        key_of = {gi: (d, gs.graph, gs.upload_mode) for (_, gi), (d, gs) in gseries.items()}
        if gis[0] < 0:
            d = self._device(dev[-1])
            self._graphs[(d, UNKNOWN)] = UNKNOWN_SERIES
            key_of[-1] = (d, UNKNOWN, UNKNOWN_SERIES.upload_mode)
        self._untraced.fold(key_of, graph, dur_ns, ended_s)

    def _expire(self) -> None:
        """Drop the series of graphs not sampled (traced, or untraced) for stale_after_s, and free
        the slots of graphs with neither left."""
        limit = time.time() - self.stale_after_s
        stale = [k for k, ts in self._last_sampled.items() if ts < limit]
        for key in stale:
            del self._last_sampled[key]
            for m in (self._rep_hist, self._rep_q, self._kpr, self._replays):
                m.pop(key, None)
            for gk in [k for k in self._gap_hist if (k[0], k[1], k[3]) == key]:
                for m in (self._gap_hist, self._gap_neg, self._gap_q):
                    m.pop(gk, None)
        for d, graph, _ in {*stale, *self._untraced.expire(limit)}:
            if not any(k[0] == d and k[1] == graph for k in (*self._last_sampled, *self._untraced.seen)):
                self._graphs.pop((d, graph), None)
                self._stream_slots.pop((d, graph), None)
                slots = self._graph_slots.get(d, {})
                for ident in [i for i, s in slots.items() if s[0] == graph]:
                    del slots[ident]

    # ------------------------------------------------------------------ snapshot
    def _build_snapshot(self) -> Snapshot:
        self._last_key = self._change_key()  # what this snapshot shows (refresh_if_changed)
        self._expire()
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
                self._log_error(stage, f"{health.last_errors.get(stage) or 'no detail'} ({c} so far)")
        return Snapshot(
            created_s=time.time(),
            rank=self.rank,
            backend_info=freeze(self.backend_info),
            health=health,
            windows_total=self._windows,
            records_total=self._records,
            records_dropped_total=self._dropped,
            records_invalid_total=freeze(self._invalid),
            series_folded_total=self._folded_total,
            errors_total=freeze(errors),
            last_window_s=self._last_window_s,
            observer_slowdown=self._slowdown,
            kernel_tracing_s_total=self._traced_total_s,
            gap_hist=freeze(self._gap_hist),
            gap_negative_total=freeze(self._gap_neg),
            gap_quantiles=freeze(self._gap_q),
            replay_hist=freeze({k: freeze(v) for k, v in self._rep_hist.items()}),
            replay_quantiles=freeze({k: freeze(v) for k, v in self._rep_q.items()}),
            kernels_per_replay=freeze(self._kpr),
            replays_total=freeze(self._replays),
            graphs=freeze(self._graphs),
            windows=tuple(self.store.ids()),
            last_analysis=self._last_analysis,
            last_gap_quantiles=self._last_gq,
            process=freeze(self.process),
            graph_last_sampled_s=freeze(self._last_sampled),
            values_out_of_range_total=freeze(self._oor),
            label_values_truncated_total=self._truncated,
            devices=tuple(self._device_slots),
            detail_graphs=self._detail.pick(self._graphs, self._last_window_s or 0.0),
            untraced_hist=freeze(self._untraced.hist),
            untraced_summary=freeze(self._untraced.summary),
        )
