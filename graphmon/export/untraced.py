"""Graph replays timed untraced, per graph: the cumulative histogram the
``graphmon_replay_untraced_seconds`` family exports, and exact quantiles over a bounded recent
sample for /status and /graphs.

The rows (graphmon.model.window.UNTRACED_COLUMNS) are CUDA-event times around graph launches taken
with kernel tracing off: they keep the event records and the launch latency from the enter
callback's record to the graph's first kernel, not tracing's cost. Everything is computed at
ingest, per graph that got rows; a scrape or /status reads the frozen result.
"""

from __future__ import annotations

from typing import Mapping, Optional

import numpy as np

from graphmon.export.buckets import MAX_VALUE_NS, UNTRACED_BUCKETS_NS, bucket_counts, hist_add
from graphmon.export.detail import cap_label
from graphmon.export.snapshot import GraphSeries, Hist, freeze
from graphmon.model.trace import Trace
from graphmon.model.window import UNTRACED_COLUMNS
from graphmon.report.summary import snapshot_graphs

UNKNOWN = "unknown"  # the graph (and, where nothing says, the device) of a row whose graph is not known
UNKNOWN_SERIES = GraphSeries(UNKNOWN, "", "", "unknown", "unknown")  # its /graphs entry (no key, label, mode)
# Untraced replays kept per graph for /status's quantiles: the newest ones (a burst or two). Bounded
# so a graph timed for days costs 32 KiB, and the quantiles describe now, not the process's life.
UNTRACED_SAMPLE = 4096
UNTRACED_QUANTILES = (0.1, 0.5, 0.9, 0.99)


def untraced_rows(window_untraced: Mapping[str, np.ndarray], n_graphs: int) -> tuple[np.ndarray, np.ndarray, int]:
    """(graph, duration_ns, left out) of a window's untraced rows: a graph index outside the
    window's graphs is -1 (unknown); a duration <= 0 or beyond MAX_VALUE_NS is not a replay time,
    left out and counted. Raises ValueError for a malformed table."""
    cols = [np.asarray(window_untraced.get(k, np.zeros(0, t))) for k, t in UNTRACED_COLUMNS.items()]
    if any(c.ndim != 1 for c in cols) or len(cols[0]) != len(cols[1]):
        raise ValueError("untraced columns must be 1-D and of one length")
    if any(len(c) and not np.issubdtype(c.dtype, np.integer) for c in cols):
        raise ValueError("untraced columns must be integers")
    graph, dur = cols[0].astype(np.int64), cols[1].astype(np.int64)
    ok = (dur > 0) & (dur <= MAX_VALUE_NS)
    graph = np.where((graph >= 0) & (graph < n_graphs), graph, -1)
    return graph[ok], dur[ok], int((~ok).sum())


def untraced_devices(t: Trace, replays, graphs: np.ndarray, graph_slots: Mapping[str, Mapping[str, tuple]],
                     process_device: str) -> dict[int, str]:
    """graph index (-1 included) -> the device label of its untraced rows, for ``graphs``. A graph
    exec belongs to one device: the one its replays or launch records of this window ran on, else
    the device whose series already hold the graph (graph_slots: device -> identities), else the
    rank's device (its only device with series, or its process's), else UNKNOWN."""
    lg, ld = t.launches["graph"].astype(np.int64), t.launches["device"].astype(np.int64)
    g = np.concatenate([replays.graph.astype(np.int64), lg])
    d = np.concatenate([replays.device.astype(np.int64), ld])
    keep = np.isin(g, graphs) & (g >= 0)
    g, first = np.unique(g[keep], return_index=True)
    out = {gi: str(dev) for gi, dev in zip(g.tolist(), d[keep][first].tolist())}
    rank_device = next(iter(graph_slots)) if len(graph_slots) == 1 else (process_device or UNKNOWN)
    for gi in graphs.tolist():
        if gi not in out:
            ident = f"{t.graphs[gi].key}|{t.graphs[gi].label}" if gi >= 0 else None
            out[gi] = next((dev for dev, slots in graph_slots.items() if ident in slots), rank_device)
    return out


class UntracedTimes:
    """Per series key (device, graph, upload_mode): the cumulative histogram (UNTRACED_BUCKETS_NS),
    the newest UNTRACED_SAMPLE durations in a ring, and their summary (seconds) for /status."""

    def __init__(self, sample: int = UNTRACED_SAMPLE) -> None:
        self.sample = sample
        self.hist: dict[tuple, Hist] = {}
        self.summary: dict[tuple, Mapping[str, float]] = {}
        self._ring: dict[tuple, np.ndarray] = {}
        self._written: dict[tuple, int] = {}  # durations ever written to the key's ring
        # wall s of the last window with untraced rows, per key: apart from the traced families'
        # last-sampled time, which the alert rules read to leave out stale traced quantiles
        self.seen: dict[tuple, float] = {}

    def fold(self, key_of: Mapping[int, tuple], graph: np.ndarray, dur_ns: np.ndarray, ended_s: float) -> None:
        """Add untraced_rows' ``dur_ns``, row i to the series key ``key_of[graph[i]]`` (several
        graph indices may share a key: graphs folded into "other"), in the window that ended at
        ``ended_s`` (wall s)."""
        gis = np.unique(graph)
        keys = sorted(set(key_of.values()))
        index = {k: i for i, k in enumerate(keys)}
        kid = np.array([index[key_of[gi]] for gi in gis.tolist()], np.int64)[np.searchsorted(gis, graph)]
        if len(dur_ns):
            o = np.argsort(kid, kind="stable")  # arrival order kept within a key: the ring's newest last
            kid, dur_ns = kid[o], dur_ns[o]
            counts = bucket_counts(dur_ns, kid, len(keys), UNTRACED_BUCKETS_NS)
            ns = np.bincount(kid, minlength=len(keys))
            sums = np.zeros(len(keys), np.int64)
            np.add.at(sums, kid, dur_ns)  # int64: exact (values <= MAX_VALUE_NS)
            offs = np.r_[0, np.cumsum(ns)]
            changed = [keys[i] for i in np.flatnonzero(ns).tolist()]
            for i, key in zip(np.flatnonzero(ns).tolist(), changed):
                self.hist[key] = hist_add(self.hist.get(key), counts[i], sums[i], ns[i])
                self._keep(key, dur_ns[offs[i] : offs[i + 1]])
                self.seen[key] = ended_s
            self._summarize(changed)

    def _keep(self, key: tuple, new: np.ndarray) -> None:
        ring = self._ring.get(key)
        if ring is None:
            ring = self._ring[key] = np.zeros(self.sample, np.int64)
        at = self._written.get(key, 0)
        new = new[-self.sample :]
        ring[(at + np.arange(len(new))) % self.sample] = new
        self._written[key] = at + len(new)

    def _summarize(self, keys: list) -> None:
        """count, mean, p10/p50/p90/p99 (s) of the kept durations of ``keys``: numpy's quantiles
        (linear), one call per sample size (once the rings are full, one for every key), since a
        call per key cost ~0.2 ms: 13 ms a window with 64 graphs timed."""
        by_n: dict[int, list] = {}
        for key in keys:
            by_n.setdefault(min(self._written[key], self.sample), []).append(key)
        for n, ks in by_n.items():
            kept = np.stack([self._ring[k][:n] for k in ks])
            q = np.quantile(kept, UNTRACED_QUANTILES, axis=1).T.tolist()
            for k, mean, qk in zip(ks, kept.mean(axis=1).tolist(), q):
                self.summary[k] = freeze({"count": n, "mean": mean * 1e-9,
                                          **{f"p{round(p * 100)}": v * 1e-9 for p, v in zip(UNTRACED_QUANTILES, qk)}})

    def expire(self, limit_s: float) -> list[tuple]:
        """Forget the keys with no untraced rows since wall time ``limit_s``; returns them."""
        stale = [k for k, ts in self.seen.items() if ts < limit_s]
        for key in stale:
            for m in (self.hist, self.summary, self._ring, self._written, self.seen):
                del m[key]
        return stale


def summary_of(summaries: Mapping[tuple, Mapping[str, float]], device: str, graph: str, mode: str) -> Optional[dict]:
    """The untraced summary of a graph named as the last window's analysis names it (``graph``
    uncut: a series key holds the label-length-capped name, graphmon.export.detail.cap_label);
    None when the graph has none yet."""
    got = summaries.get((device, graph, mode))
    if got is None:
        got = next((v for (d, g, m), v in summaries.items()
                    if d == device and m == mode and len(g) < len(graph) and cap_label(graph, len(g)) == g), None)
    return None if got is None else dict(got)


def status_graphs(snap) -> list[dict]:
    """/status's per-graph summary of the snapshot's last window (graphmon.report.summary), each
    graph with its ``untraced_replay_seconds`` (None before its first untraced replay)."""
    out = snapshot_graphs(snap)
    for e in out:
        e["untraced_replay_seconds"] = summary_of(snap.untraced_summary, e["device"], e["graph"], e["upload_mode"])
    return out
