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


def merged_correlations(corr: np.ndarray, node: Optional[np.ndarray], launch_corr: np.ndarray) -> np.ndarray:
    """Correlation ids under which several launches came back: one given to two window launches,
    or one whose kernels hold every graph node more than once (one replay runs each node once:
    true of every window of the H200 recordings in tests/data). Seen on the H200 when CUPTI's
    ids stopped advancing: all 40 launches of a window under one id, which a most-common-count
    rule then kept as one 6,400-kernel replay (tests/gpu/test_live_cupti.py)."""
    u, c = np.unique(launch_corr, return_counts=True)
    out = [u[c > 1]]
    m = node > 0 if node is not None else np.zeros(len(corr), bool)
    if m.any():
        pair_corr, mult = _pair_runs(corr[m], node[m])
        first = np.flatnonzero(np.r_[True, pair_corr[1:] != pair_corr[:-1]])  # pairs sorted by correlation id
        out.append(pair_corr[first][np.minimum.reduceat(mult, first) >= 2])
    return np.unique(np.concatenate(out))


def _pair_runs(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct (a, b) pairs sorted, as (their a, how many times each occurs).

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
        return key[edge[:-1]] // span_b + a0, np.diff(edge)
    o = np.lexsort((b, a))
    sa, sb = a[o], b[o]
    edge = np.flatnonzero(np.r_[True, (sa[1:] != sa[:-1]) | (sb[1:] != sb[:-1]), True])
    return sa[edge[:-1]], np.diff(edge)


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


def complete_replays(graph_id: np.ndarray, corr: np.ndarray, launch_corr: np.ndarray, valid=None, node=None,
                     start=None, end=None, stream=None):
    """Mask of kernels to keep + counts of excluded ones by reason. Graph kernels are kept when
    their launch was seen inside the window and their replay has the graph's usual kernel count
    in the window (the most common count among its replays). Kernels that are not ``valid``
    (e.g. zero timestamps: launched but not run before tracing stopped) do not count towards a
    replay's kernels; they are left for Trace.build to exclude under their reason. Given the
    times (``start``, ``end``, ``stream``), a complete replay that is mistimed
    (:func:`mistimed_replays`) is excluded as overfull too.

    Why the most common count and not the largest: on the H200, with a loop running far ahead of
    the GPU, one correlation id once carried ~10 launches' kernels (9,924 on 19 streams); taking
    the largest count as "complete" then dropped every real replay. Correlation id 0 means "not
    correlated" in CUPTI and never identifies a launch."""
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
    merged = keep & g & np.isin(corr, merged_correlations(corr[g], None if node is None else node[g], launch_corr))
    if merged.any():
        invalid[InvalidReason.OVERFULL_REPLAY.value] = int(merged.sum())
        keep &= ~merged
    sel = np.flatnonzero(keep & g & (True if valid is None else valid))
    if len(sel):
        u, inv, cnt = np.unique(corr[sel], return_inverse=True, return_counts=True)
        inv = inv.reshape(-1)
        gid_of = np.zeros(len(u), np.int64)
        gid_of[inv] = graph_id[sel]
        usual = {}
        for gi in np.unique(gid_of).tolist():
            c = cnt[gid_of == gi]
            vals, freq = np.unique(c, return_counts=True)
            # most common count; ties go to the larger count (a complete replay beats a cut one)
            usual[gi] = int(vals[np.flatnonzero(freq == freq.max())[-1]])
        want = np.array([usual[gi] for gi in gid_of.tolist()])
        for reason, bad in ((InvalidReason.PARTIAL_REPLAY, cnt < want), (InvalidReason.OVERFULL_REPLAY, cnt > want)):
            drop = bad[inv]
            if drop.any():
                invalid[reason.value] = invalid.get(reason.value, 0) + int(drop.sum())
                keep[sel[drop]] = False
    if start is not None and end is not None and stream is not None:
        sel = np.flatnonzero(keep & g & (True if valid is None else valid))
        odd = mistimed_replays(start[sel], end[sel], stream[sel], corr[sel], graph_id[sel])
        if len(odd):
            drop = keep & g & np.isin(corr, odd)  # (its invalid kernels too: Trace.build would count them apart)
            invalid[InvalidReason.OVERFULL_REPLAY.value] = (invalid.get(InvalidReason.OVERFULL_REPLAY.value, 0)
                                                           + int(drop.sum()))
            keep &= ~drop
    return keep, invalid


def assemble(r: WindowRecords) -> Window:
    """The Window of a collector's records: window-edge replays excluded (counted), then
    Trace.build's validation (TraceError on bad columns)."""
    k = r.kernels
    valid = (k["start_ns"] > 0) & (k["end_ns"] >= k["start_ns"])
    keep, invalid = complete_replays(k["graph_id"], k["correlation_id"], r.launches["correlation_id"], valid=valid,
                                     node=k["graph_node_id"], start=k["start_ns"], end=k["end_ns"], stream=k["stream"])
    cols = {name: k[name] if keep.all() else k[name][keep] for name in KERNEL_COLUMNS}
    for reason, n in r.invalid.items():
        invalid[reason] = invalid.get(reason, 0) + int(n)
    trace = Trace.build(**cols, names=r.names, launches=r.launches, graphs=r.graphs, invalid=invalid, meta=r.meta)
    return Window(trace=trace, started_s=r.started_s, ended_s=r.ended_s, dropped=r.dropped,
                  observer_slowdown=r.observer_slowdown, capture_id=r.capture_id, traced_s=r.traced_s)
