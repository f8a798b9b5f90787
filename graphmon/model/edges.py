"""A window's records -> a Trace: window-edge filtering, then Trace.build.

Window edges cut replays: kernels of a launch made before tracing was enabled, and kernels of
the launch still running when it was disabled, are missing. Such replays are excluded and
counted (InvalidReason), never merged into a window's replays; so is a replay whose timing no
single launch has (kernels of several launches under one id, overlaps on one stream, a span far
beyond its graph's usual one).

Why in the model and not in the CUPTI source: a light collector ships its window's records
unfiltered (WindowRecords) and the agent filters and validates them (model/wire.py), so that a
serving process never spends its GIL on it (1.7 ms for a 11,705-record H200 window).
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from graphmon.model.invalid import InvalidReason
from graphmon.model.trace import KERNEL_COLUMNS, Trace
from graphmon.model.window import Window, WindowRecords

# A replay no single launch could have made is never averaged in (excluded, counted as
# overfull_replay): on the H200, HF static-cache generate (torch.compile cudagraph trees, one
# stream) showed one replay a window with span = busy = 2.1 ms against a median of 0.88 ms and
# gaps down to -2.09 ms on its one stream (issue 29); quantiles survived, spans and means did not.
# The bounds, against the shared H200 capture (tests/data/h200-cupti-decode-v1.npz, 480 replays
# of 6 graphs on 4 streams): its largest span over its graph's median is 1.13, its deepest overlap
# of two kernels on one stream -384 ns (20 of them; timestamps tick at 32 ns, and programmatic
# dependent launch lets a kernel start in the tail of the one before it on its stream).
MAX_SPAN_OVER_MEDIAN = 1.5  # a replay's span beyond this factor of its graph's median span in the window
MIN_REPLAYS_FOR_MEDIAN = 3  # with fewer replays of a graph the median cannot tell the odd one: no span test
MIN_STREAM_GAP_NS = -1000  # kernels of one stream serialize: a deeper overlap is not a replay's timing


def merged_correlations(corr: np.ndarray, node: Optional[np.ndarray], launch_corr: np.ndarray,
                        pairs: Optional[tuple] = None) -> np.ndarray:
    """Correlation ids under which several launches came back: one given to two window launches,
    or one whose kernels hold every graph node more than once (one replay runs each node once:
    true of every window of the H200 recordings in tests/data). Seen on the H200 when CUPTI's
    ids stopped advancing: all 40 launches of a window under one id, which a most-common-count
    rule then kept as one 6,400-kernel replay (tests/gpu/test_live_cupti.py). ``pairs``:
    _pair_runs of the records with a node id, when the caller has it already."""
    u, c = np.unique(launch_corr, return_counts=True)
    out = [u[c > 1]]
    m = node > 0 if node is not None and pairs is None else np.zeros(len(corr), bool)
    if pairs is not None or m.any():
        pair_corr, _, mult = pairs if pairs is not None else _pair_runs(corr[m], node[m])
        first = np.flatnonzero(np.r_[True, pair_corr[1:] != pair_corr[:-1]])  # pairs sorted by correlation id
        out.append(pair_corr[first][np.minimum.reduceat(mult, first) >= 2])
    return np.unique(np.concatenate(out))


def _pair_runs(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The distinct (a, b) pairs sorted, as (their a, their b, how many times each occurs).

    Why not ``np.unique(np.stack([a, b], 1), axis=0)``: it sorts rows with a generic comparison
    (3.9 ms of a 4,360-record window's 6 ms in the serving process). A window's correlation ids
    and node ids span small ranges (node ids are graph id << 32 | index), so one int64 key
    sorted by radix does it; lexsort when the ranges do not fit."""
    a = a.astype(np.int64, copy=False)
    b = b.astype(np.int64, copy=False)
    a0, b0 = int(a.min()), int(b.min())
    span_a, span_b = int(a.max()) - a0 + 1, int(b.max()) - b0 + 1
    if span_a * span_b < 2**62:
        key = (a - a0) * span_b + (b - b0)
        key.sort(kind="stable")
        edge = np.flatnonzero(np.r_[True, key[1:] != key[:-1], True])
        k = key[edge[:-1]]
        return k // span_b + a0, k % span_b + b0, np.diff(edge)
    o = np.lexsort((b, a))
    sa, sb = a[o], b[o]
    edge = np.flatnonzero(np.r_[True, (sa[1:] != sa[:-1]) | (sb[1:] != sb[:-1]), True])
    return sa[edge[:-1]], sb[edge[:-1]], np.diff(edge)


def mistimed_replays(start: np.ndarray, end: np.ndarray, stream: np.ndarray, corr: np.ndarray,
                     graph_id: np.ndarray) -> np.ndarray:
    """Correlation ids of replays whose timing no single replay has: a gap below
    ``MIN_STREAM_GAP_NS`` between consecutive kernels of one stream, or a span beyond
    ``MAX_SPAN_OVER_MEDIAN`` times its graph's median span (graphs with at least
    ``MIN_REPLAYS_FOR_MEDIAN`` replays). The columns hold one window's complete graph replays."""
    if not len(corr):
        return np.zeros(0, np.int64)
    o = np.lexsort((start, stream, corr))
    c, s, e, st = corr[o], start[o], end[o], stream[o]
    same = (c[1:] == c[:-1]) & (st[1:] == st[:-1])
    bad = [np.unique(c[1:][same & (s[1:] - e[:-1] < MIN_STREAM_GAP_NS)])]
    heads = np.flatnonzero(np.r_[True, c[1:] != c[:-1]])  # replays, in correlation order
    span = np.maximum.reduceat(e, heads) - np.minimum.reduceat(s, heads)
    rg = graph_id[o][heads]
    for g in np.unique(rg).tolist():
        m = rg == g
        if m.sum() >= MIN_REPLAYS_FOR_MEDIAN:
            bad.append(c[heads][m][span[m] > MAX_SPAN_OVER_MEDIAN * np.median(span[m])])
    return np.unique(np.concatenate(bad))


class GraphKernels:
    """What one process's graphs hold: graph id -> kernel nodes per replay, as learned from its
    windows (the most distinct graph nodes one replay of the graph brought back whole: every
    record there, every one with its times). One per process (graph ids are CUPTI's, process-
    local): the in-process collector keeps one, the agent one per connection. Why learned and
    not asked of the graph: torch destroys a captured CUgraph right after instantiating it, so
    its nodes could only be counted inside the instantiate callback, on the host's thread."""

    MAX_GRAPHS = 1 << 16  # a process that makes more graphs than this starts learning afresh

    def __init__(self) -> None:
        self.nodes: dict[int, int] = {}

    def get(self, graph_id: int) -> int:
        return self.nodes.get(graph_id, 0)

    def learn(self, graph_ids: np.ndarray, sizes: np.ndarray) -> None:
        """Each graph's largest whole replay in ``sizes`` (distinct nodes), kept if larger."""
        if not len(graph_ids):
            return
        if len(self.nodes) > self.MAX_GRAPHS:
            self.nodes.clear()
        o = np.lexsort((sizes, graph_ids))
        last = np.flatnonzero(np.r_[graph_ids[o][1:] != graph_ids[o][:-1], True])
        for g, n in zip(graph_ids[o][last].tolist(), sizes[o][last].tolist()):
            if n > self.nodes.get(g, 0):
                self.nodes[g] = n


def complete_replays(graph_id: np.ndarray, corr: np.ndarray, launch_corr: np.ndarray, valid=None, node=None,
                     start=None, end=None, stream=None, graph_kernels: Optional[GraphKernels] = None):
    """Mask of kernels to keep + counts of excluded ones by reason. Graph kernels are kept when
    their launch was seen inside the window and their replay is whole: it has every kernel its
    graph has, and each of them has its times (``valid``; the invalid ones are left for
    Trace.build to exclude under their own reason, the rest of their replay is counted as
    ``partial_replay``: no gap is ever computed across a kernel that is missing or untimed).

    What a graph has, with graph node ids (CUPTI): as many distinct nodes as the process's
    memory (``graph_kernels``: GraphKernels, which learns from each window's whole replays) or
    this window's records of the graph hold between them, whichever is more; a replay's size is
    its distinct nodes (a loop body that runs twice repeats nodes). Without node ids (the
    documented fallback): the most common record count among the graph's replays in the window
    (ties to the larger). Given the times (``start``, ``end``, ``stream``), a whole replay that
    is mistimed (:func:`mistimed_replays`) is excluded as overfull.

    Why not the most common count when node ids exist: a kernel that is invalid in every replay
    (or a graph launched once per window, like each piece of a vLLM piecewise tree) makes that
    count the cut one, so no replay looked partial and the gap across the missing kernel was
    kept (issue 37). Correlation id 0 means "not correlated" in CUPTI and never identifies a
    launch."""
    n = len(corr)
    keep = np.ones(n, dtype=bool)
    invalid: dict[str, int] = {}
    g = graph_id > 0
    if not g.any():
        return keep, invalid
    nocorr = g & (corr == 0)
    if nocorr.any():
        invalid[InvalidReason.NO_CORRELATION.value] = int(nocorr.sum())
        keep &= ~nocorr
    launch_corr = launch_corr[launch_corr != 0]
    before = keep & g & ~np.isin(corr, launch_corr)  # launched before the window opened or after it closed
    if before.any():
        invalid[InvalidReason.LAUNCHED_OUTSIDE_WINDOW.value] = int(before.sum())
        keep &= ~before
    has_node = g & (node > 0) if node is not None else np.zeros(n, bool)
    pairs = _pair_runs(corr[has_node], node[has_node]) if has_node.any() else None  # (corr, node, times) once
    merged = keep & g & np.isin(corr, merged_correlations(corr[g], None, launch_corr, pairs))
    if merged.any():
        invalid[InvalidReason.OVERFULL_REPLAY.value] = int(merged.sum())
        keep &= ~merged
    ok = np.ones(n, bool) if valid is None else np.asarray(valid, bool)
    sel = np.flatnonzero(keep & g)
    if len(sel):
        inv, size, want, untimed, rgid, by_node = _replay_sizes(graph_id, corr, has_node, pairs, ok, sel, graph_kernels)
        for reason, bad in ((InvalidReason.PARTIAL_REPLAY, (size < want) | untimed),
                            (InvalidReason.OVERFULL_REPLAY, size > want)):
            drop = bad[inv] & ok[sel]  # (an untimed kernel itself: Trace.build's, under its reason)
            if drop.any():
                invalid[reason.value] = invalid.get(reason.value, 0) + int(drop.sum())
                keep[sel[drop]] = False
        if graph_kernels is not None:
            whole = (size == want) & ~untimed & by_node
            graph_kernels.learn(rgid[whole], size[whole])
    if start is not None and end is not None and stream is not None:
        sel = np.flatnonzero(keep & g & ok)
        odd = mistimed_replays(start[sel], end[sel], stream[sel], corr[sel], graph_id[sel])
        if len(odd):
            drop = keep & g & np.isin(corr, odd)  # (its invalid kernels too: Trace.build would count them apart)
            invalid[InvalidReason.OVERFULL_REPLAY.value] = (invalid.get(InvalidReason.OVERFULL_REPLAY.value, 0)
                                                           + int(drop.sum()))
            keep &= ~drop
    return keep, invalid


def _replay_sizes(graph_id, corr, has_node, pairs, ok, sel, graph_kernels):
    """Each record's replay (an index into the distinct correlation ids of ``sel``, sorted), and
    per replay: its size, the size its graph has, whether it holds an untimed kernel (not
    ``ok``), its graph id, and whether it was sized by node ids. Sizes count distinct graph nodes (``pairs``: the distinct
    (correlation, node) pairs of the records that have a node id) where every record of the
    graph has one, else records."""
    c = corr[sel]
    u = np.unique(c)  # (a sort, then a search of the few replays: faster than unique's inverse)
    inv = np.searchsorted(u, c)
    cnt = np.bincount(inv, minlength=len(u))
    rgid = np.zeros(len(u), np.int64)
    rgid[inv] = graph_id[sel]
    untimed = np.bincount(inv, weights=~ok[sel], minlength=len(u)) > 0
    graphs = np.unique(rgid)
    rg = np.searchsorted(graphs, rgid)  # each replay's graph, as an index into graphs
    by_node = np.bincount(rg[inv], weights=~has_node[sel], minlength=len(graphs)) == 0
    size = cnt.astype(np.int64)
    gwant = np.zeros(len(graphs), np.int64)
    if by_node.any():  # distinct nodes per replay, and per graph in the window
        pc, pn, _ = pairs
        at = np.minimum(np.searchsorted(u, pc), len(u) - 1)
        mine = (u[at] == pc) & by_node[rg[at]]  # pairs of this selection's replays
        size = np.where(by_node[rg], np.bincount(at[mine], minlength=len(u)), size)
        gwant = _graph_nodes(rg[at[mine]], pn[mine], size, rg, len(graphs))
        if graph_kernels is not None:
            gwant = np.maximum(gwant, [graph_kernels.get(x) for x in graphs.tolist()])
    for j in np.flatnonzero(~by_node).tolist():  # the fallback without node ids: the most common count
        vals, freq = np.unique(size[rg == j], return_counts=True)
        gwant[j] = int(vals[np.flatnonzero(freq == freq.max())[-1]])  # ties go to the larger (a whole replay beats a cut one)
    return inv, size, gwant[rg], untimed, rgid, by_node[rg]


def _graph_nodes(pair_graph, pair_node, size, rg, n_graphs) -> np.ndarray:
    """Distinct nodes per graph over the window's replays (``pair_graph``, ``pair_node``: each
    replay's distinct nodes, in replay order). Replays of one graph usually hold the same nodes:
    rows of equal length compared with the first row need no sort (a sort of every pair was half
    of complete_replays' time on an 11,705-record window); else the graph's nodes are sorted."""
    out = np.zeros(n_graphs, np.int64)
    key = pair_graph.astype(np.int16) if n_graphs < 2**15 else pair_graph  # 16-bit: numpy's stable sort is a radix sort
    o = np.argsort(key, kind="stable")  # pairs grouped by graph, replay order kept
    bounds = np.searchsorted(pair_graph[o], np.arange(n_graphs + 1))
    nodes = pair_node[o]
    for j in np.flatnonzero(np.diff(bounds) > 0).tolist():
        part, sz = nodes[bounds[j]:bounds[j + 1]], size[rg == j]
        if (sz == sz[0]).all():
            rows = part.reshape(len(sz), int(sz[0]))
            if (rows == rows[0]).all():
                out[j] = sz[0]
                continue
        out[j] = len(np.unique(part))
    return out


def assemble(r: WindowRecords, graph_kernels: Optional[GraphKernels] = None) -> Window:
    """The Window of a collector's records: window-edge replays excluded (counted), then
    Trace.build's validation (TraceError on bad columns). ``graph_kernels``: the sending
    process's GraphKernels (what its graphs hold, learned window after window); None: this window only.

    A record with end 0 is CUPTI's "unknown" (CUPTI_TIMESTAMP_UNKNOWN): returned by a forced
    flush before its kernel's times were in, or given by the collector to a record whose end a
    forced flush made up (sources/cupti/closing.unknown_late_ends). It is counted as
    ``incomplete_record``, not as a time that went backwards, and its replay is excluded."""
    k = r.kernels
    valid = (k["start_ns"] > 0) & (k["end_ns"] >= k["start_ns"])
    keep, invalid = complete_replays(k["graph_id"], k["correlation_id"], r.launches["correlation_id"], valid=valid,
                                     node=k["graph_node_id"], start=k["start_ns"], end=k["end_ns"], stream=k["stream"],
                                     graph_kernels=graph_kernels)
    incomplete = keep & (k["end_ns"] == 0)
    if incomplete.any():
        invalid[InvalidReason.INCOMPLETE_RECORD.value] = int(incomplete.sum())
        keep &= ~incomplete
    cols = {name: k[name] if keep.all() else k[name][keep] for name in KERNEL_COLUMNS}
    for reason, n in r.invalid.items():
        invalid[reason] = invalid.get(reason, 0) + int(n)
    trace = Trace.build(**cols, names=r.names, launches=r.launches, graphs=r.graphs, invalid=invalid, meta=r.meta)
    return Window(trace=trace, started_s=r.started_s, ended_s=r.ended_s, dropped=r.dropped,
                  observer_slowdown=r.observer_slowdown, capture_id=r.capture_id, traced_s=r.traced_s,
                  untraced=r.untraced)
