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

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

# QUANTILES, grouped_minmax and summarize are re-exported for callers written before the split.
from graphmon.analysis.grouped import QUANTILES, grouped_minmax, grouped_quantiles, grouped_sums, summarize  # noqa: F401
from graphmon.model.trace import Trace, replay_key


@dataclass(frozen=True)
class Replays:
    """One row per replay (graph launch), sorted by (device, first_start_ns)."""

    device: np.ndarray  # int32
    graph: np.ndarray  # int32 index into trace.graphs
    correlation_id: np.ndarray  # int64
    first_start_ns: np.ndarray  # int64
    last_end_ns: np.ndarray  # int64
    span_ns: np.ndarray  # int64
    busy_ns: np.ndarray  # int64
    idle_ns: np.ndarray  # int64
    kernels: np.ndarray  # int64
    launch_latency_ns: np.ndarray  # int64, -1 where unknown
    inter_replay_gap_ns: np.ndarray  # int64, INT64_MIN where there is no previous replay

    def __len__(self) -> int:
        return len(self.span_ns)


NO_VALUE = np.iinfo(np.int64).min


@dataclass(frozen=True)
class StreamGaps:
    """Gaps grouped per (device, graph, stream); ``values`` sorted ascending within each group."""

    device: np.ndarray  # per group
    graph: np.ndarray
    stream: np.ndarray
    offsets: np.ndarray  # group g's values are values[offsets[g]:offsets[g+1]]
    values: np.ndarray  # int64 gap ns, grouped and sorted

    def __len__(self) -> int:
        return len(self.device)

    @property
    def counts(self) -> np.ndarray:
        return np.diff(self.offsets)

    def group_of_values(self) -> np.ndarray:
        return np.repeat(np.arange(len(self), dtype=np.int64), self.counts)


@dataclass(frozen=True)
class Analysis:
    trace: Trace
    replays: Replays
    gaps: StreamGaps


def analyze(trace: Trace) -> Analysis:
    """Segment ``trace`` into replays and compute per-replay figures and per-stream gaps.

    Speed: CUPTI and profilers deliver records nearly in time order, so every ordering here is a
    stable argsort of one packed int64 key (timsort runs in near-linear time on such input; radix
    sort for small group ids). ``np.lexsort`` is the fallback when keys do not pack into 63 bits.
    """
    seg = _segment(trace)
    if seg is None:
        return Analysis(trace, _empty_replays(), _empty_gaps())
    busy, first_stream = _busy(seg)
    o2 = _stream_order(seg)
    r2, s2 = seg.rid[o2], seg.srank[o2]
    same = (r2[1:] == r2[:-1]) & (s2[1:] == s2[:-1])
    pair = np.flatnonzero(same)  # position (in o2 order) of the earlier kernel of each pair
    gap = seg.start[o2[pair + 1]] - seg.end[o2[pair]]
    # Group id per gap from its replay's (device, graph) rank and its stream rank: small ints, so
    # device/graph/stream are looked up only for each group's first gap.
    dg_rank, ndg = _dense_ranks((seg.rdev.astype(np.int64) << 32) | seg.rgraph)
    rp = r2[pair]
    gid = dg_rank[rp].astype(np.int64) * seg.nstreams + s2[pair]
    order, heads = _group_order(gid, ndg * seg.nstreams)
    h = order[heads]
    gaps = StreamGaps(
        device=seg.rdev[rp[h]],
        graph=seg.rgraph[rp[h]],
        stream=seg.stream[o2[pair[h]]],
        offsets=np.r_[heads, len(gap)].astype(np.int64),
        values=gap[order],
    ) if len(gap) else _empty_gaps()
    return Analysis(trace, _replay_rows(trace, seg, busy, first_stream), gaps)


class _Segments(NamedTuple):
    """Graph kernels in replay order (stable sort by replay key) and one row per replay."""

    rid: np.ndarray  # replay row of each kernel
    start: np.ndarray
    end: np.ndarray
    stream: np.ndarray
    srank: np.ndarray  # dense rank of the stream id (int32)
    nstreams: int
    rel_s: np.ndarray  # start - the replay's first start
    rel_e: np.ndarray
    rstart: np.ndarray  # first kernel of each replay
    rdev: np.ndarray  # per replay, in replay-key order
    rcorr: np.ndarray
    rgraph: np.ndarray
    first: np.ndarray
    last: np.ndarray


def _segment(trace: Trace) -> _Segments | None:
    """Replays of the graph kernels of ``trace`` (None when it has none)."""
    gmask = trace.graph >= 0
    idx = None if gmask.all() else np.flatnonzero(gmask)

    def col(a):
        return a if idx is None else a[idx]

    dev, corr = col(trace.device), col(trace.correlation_id)
    if len(dev) == 0:
        return None
    # stable sort by (device, correlation id)
    dc = replay_key(dev, corr)
    o1 = np.argsort(dc, kind="stable")
    dcs = dc[o1]
    new = np.empty(len(dcs), dtype=bool)
    new[0] = True
    np.not_equal(dcs[1:], dcs[:-1], out=new[1:])
    rstart = np.flatnonzero(new)
    rid = np.cumsum(new) - 1
    start = col(trace.start_ns)[o1]
    end = col(trace.end_ns)[o1]
    stream = col(trace.stream)[o1]
    head = o1[rstart]
    first = np.minimum.reduceat(start, rstart)
    last = np.maximum.reduceat(end, rstart)
    srank, nstreams = _dense_ranks(stream)
    return _Segments(rid, start, end, stream, srank, nstreams, start - first[rid], end - first[rid], rstart,
                     dev[head], corr[head], col(trace.graph)[head], first, last)


def _busy(seg: _Segments) -> tuple[np.ndarray, np.ndarray]:
    """Union busy time per replay and the stream of each replay's first kernel (by start)."""
    nrep = len(seg.rstart)
    tb = int(seg.rel_e.max()).bit_length()
    rb = max(1, int(nrep - 1).bit_length())
    # order by (replay, start)
    if rb + tb <= 62:
        o3 = np.argsort((seg.rid << tb) | seg.rel_s, kind="stable")
    else:
        o3 = np.lexsort((seg.rel_s, seg.rid))
    # o3 only reorders kernels inside each replay's block, so rid and the block starts are unchanged.
    busy = _union_busy_sorted(seg.rid, seg.rel_s[o3], seg.rel_e[o3], nrep, seg.rstart)
    return busy, seg.stream[o3[seg.rstart]]


def _stream_order(seg: _Segments) -> np.ndarray:
    """Order of the kernels by (replay, stream, start, end): each (replay, stream) one sorted run."""
    nrep = len(seg.rstart)
    tb = int(seg.rel_e.max()).bit_length()
    rb = max(1, int(nrep - 1).bit_length())
    sb = max(1, int(seg.nstreams - 1).bit_length())
    if rb + sb + tb <= 62:
        key = (seg.rid << (sb + tb)) | (seg.srank.astype(np.int64) << tb) | seg.rel_s
        o2 = np.argsort(key, kind="stable")
        ks = key[o2]
        if not (ks[1:] == ks[:-1]).any():
            return o2
    # keys do not pack, or equal starts on one stream: order those by end, exactly
    return np.lexsort((seg.rel_e, seg.rel_s, seg.srank, seg.rid))


def _replay_rows(trace: Trace, seg: _Segments, busy: np.ndarray, first_stream: np.ndarray) -> Replays:
    """The per-replay table, sorted by (device, first start)."""
    rdev, first, last = seg.rdev, seg.first, seg.last
    span = last - first
    kernels = np.diff(np.r_[seg.rstart, len(seg.start)]).astype(np.int64)
    # First kernel's stream stands in for an unknown launch stream.
    latency, lstream = _launch_info(trace, rdev, seg.rcorr, first)
    rstream = np.where(lstream >= 0, lstream, first_stream)
    inter = _inter_replay(rdev, rstream, first, last)
    o = np.lexsort((first, rdev))  # one row per replay: small
    return Replays(
        device=rdev[o],
        graph=seg.rgraph[o],
        correlation_id=seg.rcorr[o],
        first_start_ns=first[o],
        last_end_ns=last[o],
        span_ns=span[o],
        busy_ns=busy[o],
        idle_ns=(span - busy)[o],
        kernels=kernels[o],
        launch_latency_ns=latency[o],
        inter_replay_gap_ns=inter[o],
    )


@dataclass(frozen=True)
class ReplayStreamGaps:
    """One row per (replay, stream) of the graph kernels of a trace, in (replay, stream id) order."""

    device: np.ndarray  # int32
    graph: np.ndarray  # int32 index into trace.graphs
    correlation_id: np.ndarray  # int64, identifies the replay with device
    replay: np.ndarray  # int64 replay number (0..R-1, in replay-key = (device, correlation) order)
    stream: np.ndarray  # int64
    rank: np.ndarray  # int64 rank of the stream's first kernel start within its replay (ties: stream id)
    first_start_ns: np.ndarray  # int64 first kernel start on this stream in this replay
    gap_count: np.ndarray  # int64
    gap_sum_ns: np.ndarray  # int64
    median_gap_ns: np.ndarray  # float64, NaN when the stream ran one kernel in that replay

    def __len__(self) -> int:
        return len(self.stream)


def replay_stream_gaps(trace: Trace) -> ReplayStreamGaps:
    """Per-replay, per-stream gap figures: the gaps of :func:`analyze`, kept apart per replay."""
    return replay_stream_gaps_with_values(trace)[0]


def replay_stream_gaps_with_values(trace: Trace) -> tuple[ReplayStreamGaps, np.ndarray, np.ndarray]:
    """:func:`replay_stream_gaps` plus every gap value (int64 ns) and its row in the result."""
    seg = _segment(trace)
    if seg is None:
        z = np.zeros(0, np.int64)
        return ReplayStreamGaps(np.zeros(0, np.int32), np.zeros(0, np.int32), z, z, z, z, z, z, z, np.zeros(0)), z, z
    o2 = _stream_order(seg)
    r2, s2 = seg.rid[o2], seg.srank[o2]
    new_group = np.r_[True, (r2[1:] != r2[:-1]) | (s2[1:] != s2[:-1])]
    heads = np.flatnonzero(new_group)
    gid = np.cumsum(new_group) - 1
    same = ~new_group[1:]
    gap = (seg.start[o2[1:]] - seg.end[o2[:-1]])[same]
    ggrp = gid[1:][same]
    # Sort gaps within each group for exact medians (numpy's linear interpolation).
    go = np.lexsort((gap, ggrp))
    gap, ggrp = gap[go], ggrp[go]
    counts = np.bincount(ggrp, minlength=len(heads)).astype(np.int64)
    offsets = np.r_[0, np.cumsum(counts)].astype(np.int64)
    med = grouped_quantiles(gap, offsets, (0.5,))[:, 0]
    rid = r2[heads]
    first = seg.start[o2[heads]]  # rows sorted by start within the group
    stream = seg.stream[o2[heads]]
    # Rank of each stream within its replay by first start (ties by stream id).
    ro = np.lexsort((stream, first, rid))
    rhead = np.r_[True, rid[ro][1:] != rid[ro][:-1]]
    pos = np.arange(len(ro)) - np.maximum.accumulate(np.where(rhead, np.arange(len(ro)), 0))
    rank = np.empty(len(ro), np.int64)
    rank[ro] = pos
    rows = ReplayStreamGaps(
        device=seg.rdev[rid], graph=seg.rgraph[rid], correlation_id=seg.rcorr[rid], replay=rid.astype(np.int64),
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


def _dense_ranks(values: np.ndarray) -> tuple[np.ndarray, int]:
    """Dense rank of each value (0..k-1) and k. O(n) by table lookup for small non-negative ids."""
    lo, hi = int(values.min()), int(values.max())
    if hi - lo < 1 << 22:
        present = np.zeros(hi - lo + 1, dtype=bool)
        present[values - lo] = True
        rank = np.cumsum(present) - 1
        return rank[values - lo].astype(np.int32), int(present.sum())
    uniq, inv = np.unique(values, return_inverse=True)
    return inv.reshape(-1).astype(np.int32), len(uniq)


def _empty_replays() -> Replays:
    z = np.zeros(0, np.int64)
    return Replays(np.zeros(0, np.int32), np.zeros(0, np.int32), z, z, z, z, z, z, z, z, z)


def _empty_gaps() -> StreamGaps:
    z = np.zeros(0, np.int64)
    return StreamGaps(np.zeros(0, np.int32), np.zeros(0, np.int32), z, np.zeros(1, np.int64), z)


def _union_busy_sorted(r, rel_s, rel_e, nrep, heads) -> np.ndarray:
    """Length of the union of [start, end) per replay, across streams; input sorted by (replay, start).

    An interval adds ``max(0, end - max(start, M))`` where M is the largest end seen earlier in the
    same replay: a segmented running maximum, done with one global ``maximum.accumulate`` over
    times relative to the replay's first start, offset per replay so that replays never mix.
    """
    width = int(rel_e.max()) + 1
    if width * nrep < 2**62:
        # In-place steps: each 8-byte-per-record temporary costs as much as the arithmetic.
        off = r * width
        cm = np.add(rel_e, off)
        np.maximum.accumulate(cm, out=cm)
        prev = np.empty_like(cm)
        np.subtract(cm[:-1], off[1:], out=prev[1:])
        prev[heads] = -1
    else:  # huge spans: per-replay running max (rare; only for absurd timestamps)
        prev = np.full(len(r), -1, dtype=np.int64)
        for lo, hi in zip(heads, np.r_[heads[1:], len(r)]):
            prev[lo + 1 : hi] = np.maximum.accumulate(rel_e[lo : hi - 1])
    add = np.maximum(prev, rel_s, out=prev)
    np.subtract(rel_e, add, out=add)
    np.maximum(add, 0, out=add)
    # r is sorted, so reduceat gives exact int64 sums (bincount's float weights round above 2^53).
    out = np.zeros(nrep, dtype=np.int64)
    out[r[heads]] = np.add.reduceat(add, heads)
    return out


def _launch_info(trace: Trace, rdev, rcorr, first):
    """Launch latency and launch stream per replay, from the trace's launch rows."""
    nrep = len(rdev)
    latency = np.full(nrep, -1, dtype=np.int64)
    lstream = np.full(nrep, -1, dtype=np.int64)
    L = trace.launches
    if len(L["correlation_id"]) == 0:
        return latency, lstream
    lkey = replay_key(L["device"], L["correlation_id"])
    order = np.argsort(lkey, kind="stable")
    skey = lkey[order]
    rkey = replay_key(rdev, rcorr)
    pos = np.clip(np.searchsorted(skey, rkey), 0, len(skey) - 1)
    hit = skey[pos] == rkey
    row = order[pos]
    lns = np.where(hit, L["launch_ns"][row], -1)
    ok = lns > 0
    latency[ok] = first[ok] - lns[ok]
    lstream[hit] = L["stream"][row][hit]
    return latency, lstream


def _inter_replay(rdev, rstream, first, last) -> np.ndarray:
    o = np.lexsort((first, rstream, rdev))
    d, s, f, l = rdev[o], rstream[o], first[o], last[o]
    same = np.r_[False, (d[1:] == d[:-1]) & (s[1:] == s[:-1])]
    prev_end = np.r_[np.int64(0), l[:-1]]
    vals = np.where(same, f - prev_end, NO_VALUE)
    out = np.empty_like(vals)
    out[o] = vals
    return out


def _group_order(gid: np.ndarray, ngid: int) -> tuple[np.ndarray, np.ndarray]:
    """Stable order that groups equal ``gid`` (0 <= gid < ngid) and the start of each group."""
    if len(gid) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    # Few groups: int16 keys make numpy's stable argsort a radix sort (linear time).
    key = gid.astype(np.int16) if ngid < 2**15 else gid
    o = np.argsort(key, kind="stable")
    counts = np.bincount(gid, minlength=ngid)
    heads = (np.cumsum(counts) - counts)[counts > 0]
    return o, heads


def replay_groups(replays: Replays) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Group replays by (device, graph): returns (order, offsets, head rows) for grouped stats."""
    o = np.lexsort((replays.graph, replays.device))
    d, g = replays.device[o], replays.graph[o]
    new = np.r_[True, (d[1:] != d[:-1]) | (g[1:] != g[:-1])] if len(o) else np.zeros(0, bool)
    heads = np.flatnonzero(new)
    return o, np.r_[heads, len(o)].astype(np.int64), o[heads]
