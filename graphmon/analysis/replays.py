"""Pure, vectorised analysis of a :class:`~graphmon.model.trace.Trace`: replays, gaps, quantiles.

No per-record Python loops: everything is sorting, ``reduceat`` and ``bincount`` over columns.

Definitions (docs/analysis.md):
- replay: the kernels of one graph launch = one (device, correlation id) among graph kernels;
- span: last end - first start of a replay; busy: length of the union of its kernels' intervals
  across all streams; idle = span - busy;
- gap: on one stream of one replay, kernels sorted by start: ``next.start - prev.end``; a negative
  gap is an overlap on one stream and is counted;
- launch latency: CPU launch timestamp -> the replay's first kernel start (when known);
- inter-replay gap: previous replay's last end -> this replay's first start on the same device and
  launch stream (the first kernel's stream when the launch stream is unknown);
- quantiles: exact, linear interpolation between order statistics (numpy's default method).
"""

from __future__ import annotations

from collections import Counter

import numpy as np

# QUANTILES, grouped_minmax and summarize are re-exported for callers written before the split.
from graphmon.analysis.grouped import QUANTILES, grouped_minmax, grouped_quantiles, grouped_sums, summarize  # noqa: F401
from graphmon.analysis.fast import Unordered, analyze_grouped, grouped_runs
from graphmon.analysis.reference import analyze_reference, reference_runs
# The result types are part of this module's API.
from graphmon.analysis.results import NO_VALUE, Analysis, Replays, ReplayStreamGaps, StreamGaps, StreamRuns  # noqa: F401
from graphmon.model.trace import Trace

# How many analyses took the fast path ("grouped"; "grouped_resorted" when some stream's records
# needed a sort within their group) and how many fell back to the reference, by the reason
# ("replays_not_grouped", "keys_too_wide", "empty"). Read by tests and the bench; process-wide.
PATHS: Counter = Counter()


def analyze(trace: Trace) -> Analysis:
    """Segment ``trace`` into replays and compute per-replay figures and per-stream gaps.

    Records in delivery order (grouped by replay) take the fast path (fast.py); anything else the
    general reference path (reference.py), with identical results.
    """
    try:
        out, path = analyze_grouped(trace)
    except Unordered as e:
        PATHS[e.reason] += 1
        return analyze_reference(trace)
    PATHS[path] += 1
    return out


def _runs(trace: Trace) -> StreamRuns | None:
    try:
        return grouped_runs(trace)
    except Unordered:
        return reference_runs(trace)


def replay_stream_gaps(trace: Trace) -> ReplayStreamGaps:
    """Per-replay, per-stream gap figures: the gaps of :func:`analyze`, kept apart per replay."""
    return replay_stream_gaps_with_values(trace)[0]


def replay_stream_gaps_with_values(trace: Trace) -> tuple[ReplayStreamGaps, np.ndarray, np.ndarray]:
    """:func:`replay_stream_gaps` plus every gap value (int64 ns) and its row in the result."""
    runs = _runs(trace)
    if runs is None:
        z = np.zeros(0, np.int64)
        return ReplayStreamGaps(np.zeros(0, np.int32), np.zeros(0, np.int32), z, z, z, z, z, z, z, np.zeros(0)), z, z
    r2, s2 = runs.rid, runs.srank
    new_group = np.r_[True, (r2[1:] != r2[:-1]) | (s2[1:] != s2[:-1])]
    heads = np.flatnonzero(new_group)
    gid = np.cumsum(new_group) - 1
    same = ~new_group[1:]
    gap = (runs.start[1:] - runs.end[:-1])[same]
    ggrp = gid[1:][same]
    rid = r2[heads]
    first = runs.start[heads]  # runs sorted by start
    stream = runs.stream[heads]
    # Rows in (replay, stream) order whatever the order of the runs.
    ro = np.lexsort((s2[heads], rid))
    inv = np.empty(len(ro), np.int64)
    inv[ro] = np.arange(len(ro))
    rid, first, stream = rid[ro], first[ro], stream[ro]
    ggrp = inv[ggrp]
    go = np.lexsort((gap, ggrp))  # gaps sorted within each row for exact medians
    gap, ggrp = gap[go], ggrp[go]
    counts = np.bincount(ggrp, minlength=len(heads)).astype(np.int64)
    offsets = np.r_[0, np.cumsum(counts)].astype(np.int64)
    med = grouped_quantiles(gap, offsets, (0.5,))[:, 0]
    # Rank of each stream within its replay by first start (ties by stream id).
    ro = np.lexsort((stream, first, rid))
    rhead = np.r_[True, rid[ro][1:] != rid[ro][:-1]]
    pos = np.arange(len(ro)) - np.maximum.accumulate(np.where(rhead, np.arange(len(ro)), 0))
    rank = np.empty(len(ro), np.int64)
    rank[ro] = pos
    segs = runs.segs
    rows = ReplayStreamGaps(
        device=segs.rdev[rid], graph=segs.rgraph[rid], correlation_id=segs.rcorr[rid], replay=rid.astype(np.int64),
        stream=stream, rank=rank, first_start_ns=first, gap_count=counts, gap_sum_ns=grouped_sums(gap, offsets),
        median_gap_ns=med,
    )
    return rows, gap, ggrp


def stream_order(rsg: ReplayStreamGaps, rows: np.ndarray) -> list[int]:
    """Stream ids of ``rows`` (one graph) ordered by median per-replay rank of their first kernel
    (ties: id): the stream's role in the graph, stable across captures whose stream ids differ."""
    st = rsg.stream[rows]
    ids = np.unique(st)
    med = [float(np.median(rsg.rank[rows][st == s])) for s in ids]
    return [int(s) for _, s in sorted(zip(med, ids.tolist()))]


def replay_groups(replays: Replays) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Group replays by (device, graph): returns (order, offsets, head rows) for grouped stats."""
    o = np.lexsort((replays.graph, replays.device))
    d, g = replays.device[o], replays.graph[o]
    new = np.r_[True, (d[1:] != d[:-1]) | (g[1:] != g[:-1])] if len(o) else np.zeros(0, bool)
    heads = np.flatnonzero(new)
    return o, np.r_[heads, len(o)].astype(np.int64), o[heads]
