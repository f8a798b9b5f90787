"""Today's (first) implementation of the analysis, kept as the reference: it handles records in
any order with general sorts. graphmon.analysis.replays.analyze uses it where the data breaks the
ordering that the fast path (fast.py) relies on; tests and bench/analysis/throughput.py compare the
two for bit-identical results."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from graphmon.analysis.results import (Analysis, ReplaySegments, StreamGaps, StreamRuns, dense_ranks, empty_gaps,
                                       empty_replays, replay_rows)
from graphmon.model.trace import Trace, replay_key


def analyze_reference(trace: Trace) -> Analysis:
    """graphmon's first implementation of :func:`graphmon.analysis.replays.analyze`, for any
    record order; the fast path must give bit-identical results.

    Speed: CUPTI and profilers deliver records nearly in time order, so every ordering here is a
    stable argsort of one packed int64 key (timsort runs in near-linear time on such input; radix
    sort for small group ids). ``np.lexsort`` is the fallback when keys do not pack into 63 bits.
    """
    seg = _segment(trace)
    if seg is None:
        return Analysis(trace, empty_replays(), empty_gaps())
    busy, first_stream = _busy(seg)
    o2 = _stream_order(seg)
    r2, s2 = seg.rid[o2], seg.srank[o2]
    same = (r2[1:] == r2[:-1]) & (s2[1:] == s2[:-1])
    pair = np.flatnonzero(same)  # position (in o2 order) of the earlier kernel of each pair
    gap = seg.start[o2[pair + 1]] - seg.end[o2[pair]]
    # Group id per gap from its replay's (device, graph) rank and its stream rank: small ints, so
    # device/graph/stream are looked up only for each group's first gap.
    dg_rank, ndg = dense_ranks((seg.segs.rdev.astype(np.int64) << 32) | seg.segs.rgraph)
    rp = r2[pair]
    gid = dg_rank[rp].astype(np.int64) * seg.nstreams + s2[pair]
    order, heads = _group_order(gid, ndg * seg.nstreams)
    h = order[heads]
    gaps = StreamGaps(
        device=seg.segs.rdev[rp[h]],
        graph=seg.segs.rgraph[rp[h]],
        stream=seg.stream[o2[pair[h]]],
        offsets=np.r_[heads, len(gap)].astype(np.int64),
        values=gap[order],
    ) if len(gap) else empty_gaps()
    return Analysis(trace, replay_rows(trace, seg.segs, busy, first_stream), gaps)


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
    segs: ReplaySegments


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
    srank, nstreams = dense_ranks(stream)
    segs = ReplaySegments(len(start), rstart, dev[head], corr[head], col(trace.graph)[head], first, last)
    return _Segments(rid, start, end, stream, srank, nstreams, start - first[rid], end - first[rid], segs)


def _busy(seg: _Segments) -> tuple[np.ndarray, np.ndarray]:
    """Union busy time per replay and the stream of each replay's first kernel (by start)."""
    nrep = len(seg.segs.rstart)
    tb = int(seg.rel_e.max()).bit_length()
    rb = max(1, int(nrep - 1).bit_length())
    # order by (replay, start)
    if rb + tb <= 62:
        o3 = np.argsort((seg.rid << tb) | seg.rel_s, kind="stable")
    else:
        o3 = np.lexsort((seg.rel_s, seg.rid))
    # o3 only reorders kernels inside each replay's block, so rid and the block starts are unchanged.
    busy = _union_busy_sorted(seg.rid, seg.rel_s[o3], seg.rel_e[o3], nrep, seg.segs.rstart)
    return busy, seg.stream[o3[seg.segs.rstart]]


def _stream_order(seg: _Segments) -> np.ndarray:
    """Order of the kernels by (replay, stream, start, end): each (replay, stream) one sorted run."""
    nrep = len(seg.segs.rstart)
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


def reference_runs(trace: Trace) -> StreamRuns | None:
    """The kernels in (replay, stream, start, end) order (None without graph kernels)."""
    seg = _segment(trace)
    if seg is None:
        return None
    o2 = _stream_order(seg)
    return StreamRuns(seg.rid[o2], seg.srank[o2], seg.start[o2], seg.end[o2], seg.stream[o2], seg.segs)


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
