"""The fast path of :func:`graphmon.analysis.replays.analyze`, for records in the order that CUPTI
and profilers deliver them: bit-identical to reference.py, at memory speed.

What the data guarantees, checked here in O(n) (the caller falls back to reference.py where a
check fails):
- replays arrive grouped: the kernels of one (device, correlation id) are contiguous, and the
  blocks come in increasing replay-key order (a graph launch's records arrive together, and
  correlation ids grow with launches);
- each stream's kernels of a replay arrive in (start, end) order (one stream runs its kernels in
  order).
Then no general sort is needed:
- per-stream gaps: ONE stable radix sort of a small group id (the replay's (device, graph) rank
  and the stream rank, int16) puts every (device, graph, stream) group together, replays in order
  inside it, each replay's kernels on that stream in start order. Consecutive kernels of one
  replay in that order are the pairs that make gaps, and the gaps come out already in the order of
  StreamGaps: no second grouping sort, no double gather.
- busy time (union of a replay's intervals over all streams) needs start order across streams:
  one sort of packed int64 *values* (replay, start, duration), not an argsort, so no gathers; the
  input is nearly sorted, so timsort (``kind="stable"``) runs in near-linear time.
Why not numba (issue 16 measured a numba single pass at 23-36M records/s): it costs ~200 MB
installed and a ~2 s first compile that holds the GIL, in a serving process too, while this numpy
formulation reaches the target (bench/results/analysis-throughput.json).
"""

from __future__ import annotations

import numpy as np

from graphmon.analysis.results import (Analysis, ReplaySegments, StreamGaps, StreamRuns, empty_gaps, replay_rows)
from graphmon.model.trace import Trace, replay_key

INT16_GROUPS = 1 << 15  # below this many (device, graph, stream) groups the sort key is int16: radix sort
ARGMIN_LOOP_MAX = 1024  # replays whose first record is not the earliest: up to this many, one argmin each


class Unordered(Exception):
    """The records break an ordering the fast path relies on; ``reason`` names which."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def _columns(trace: Trace):
    gmask = trace.graph >= 0
    cols = (trace.start_ns, trace.end_ns, trace.stream, trace.device, trace.correlation_id, trace.graph)
    if gmask.all():
        return cols
    idx = np.flatnonzero(gmask)
    return tuple(c[idx] for c in cols)


def _segments(start, end, dev, corr, graph) -> tuple[ReplaySegments, np.ndarray]:
    """Replay blocks of input already grouped by replay (raises Unordered otherwise)."""
    n = len(start)
    one_device = n == 0 or dev[0] == dev[-1] and int(dev.min()) == int(dev.max())
    bnd = np.not_equal(corr[1:], corr[:-1])
    if not one_device:
        bnd |= dev[1:] != dev[:-1]
    rstart = np.flatnonzero(bnd)
    rstart += 1
    rstart = np.r_[np.int64(0), rstart]
    key = replay_key(dev[rstart], corr[rstart])
    if not (key[1:] > key[:-1]).all():  # a replay split in two blocks, or blocks out of key order
        raise Unordered("replays_not_grouped")
    counts = np.diff(np.r_[rstart, n])
    segs = ReplaySegments(n, rstart, dev[rstart], corr[rstart], graph[rstart],
                          np.minimum.reduceat(start, rstart), np.maximum.reduceat(end, rstart))
    return segs, counts


def _stream_table(stream: np.ndarray):
    """(rank of each stream id, int16/int32) via a lookup table, and the ids by rank."""
    lo, hi = int(stream.min()), int(stream.max())
    if hi - lo >= 1 << 22:
        ids, inv = np.unique(stream, return_inverse=True)
        return inv.reshape(-1).astype(np.int32), ids.astype(stream.dtype)
    present = np.zeros(hi - lo + 1, dtype=bool)
    shifted = stream if lo == 0 else stream - lo
    present[shifted] = True
    ids = np.flatnonzero(present)
    table = np.cumsum(present, dtype=np.int32) - 1
    if len(ids) < INT16_GROUPS:
        table = table.astype(np.int16)
    return table[shifted], (ids + lo).astype(stream.dtype)


def _stream_sorted(start, end, stream, segs: ReplaySegments, counts):
    """Kernels in (device-graph, stream, replay, start) order and what the gaps need."""
    nrep = len(segs.rstart)
    srank, stream_ids = _stream_table(stream)
    nstreams = len(stream_ids)
    # (device, graph) rank per replay, in the order of the reference: by (device << 32) | graph
    dgkey = (segs.rdev.astype(np.int64) << 32) | segs.rgraph
    dg_ids, dg_first, dg_rank = np.unique(dgkey, return_index=True, return_inverse=True)
    ngroups = len(dg_ids) * nstreams
    if len(dg_ids) == 1:
        gid = srank
    else:
        dtype = np.int16 if ngroups < INT16_GROUPS else np.int32
        gid = np.repeat((dg_rank.reshape(-1) * nstreams).astype(dtype), counts)
        gid += srank
    o = np.argsort(gid, kind="stable")  # radix sort for int16 keys
    gcount = np.bincount(gid, minlength=ngroups)
    rid = np.repeat(np.arange(nrep, dtype=np.int32 if nrep < 2**31 else np.int64), counts)
    return o, rid[o], start[o], end[o], gcount, stream_ids, dg_first


def _pairs(rid_o, start_o, end_o, gcount) -> tuple[np.ndarray, np.ndarray]:
    """Which consecutive kernels (in stream-sorted order) are consecutive on one stream of one
    replay (length n, last False), and start[k+1] - start[k] (raises Unordered where a stream's
    starts go back)."""
    n = len(rid_o)
    same = np.empty(n, dtype=bool)  # same[k]: kernels k and k+1 are a pair; the last slot is padding
    np.equal(rid_o[1:], rid_o[:-1], out=same[:-1])
    same[-1] = False
    cuts = np.cumsum(gcount)[:-1]
    cuts = cuts[(cuts > 0) & (cuts < n)]
    same[cuts - 1] = False  # same replay, next (device, graph, stream) group: not a pair
    d = np.subtract(start_o[1:], start_o[:-1])
    back = d < 0
    back &= same[:-1]
    if back.any():
        raise Unordered("stream_not_in_start_order")
    tie = d == 0
    tie &= same[:-1]
    if tie.any():  # equal starts on one stream: the reference orders those by end
        k = np.flatnonzero(tie)
        if (end_o[k + 1] < end_o[k]).any():
            raise Unordered("stream_not_in_start_order")
    return same, d


def _busy(start, end, segs: ReplaySegments, counts) -> tuple[np.ndarray, np.ndarray]:
    """Union busy time per replay, and the row of each replay's first kernel (by start; first in
    input order among equal starts, as the reference)."""
    nrep = len(segs.rstart)
    tb = max(1, int((segs.last - segs.first).max()).bit_length())  # any end - first start fits
    rb = max(1, int(nrep - 1).bit_length())
    dur = np.subtract(end, start)
    db = max(1, int(dur.max()).bit_length())
    if rb + tb + db > 62:
        raise Unordered("keys_too_wide")
    first_row = _first_rows(start, segs)
    # key = replay << (tb + db) | (start - first start) << db | duration: sorting these values
    # orders each replay's kernels by start and keeps replays apart. Built as
    # (start << db) + duration + ((replay << (tb + db)) - (first << db)) in uint64, whose wrap-around
    # is exact modulo 2**64: the intermediate terms overflow, the sum (< 2**62) does not.
    u = np.uint64
    key = np.left_shift(start.view(u), u(db))
    key += dur.view(u)
    key += np.repeat((np.arange(nrep, dtype=u) << u(tb + db)) - (segs.first.view(u) << u(db)), counts)
    key.sort(kind="stable")  # timsort: the input is nearly sorted
    # In "offset time" t' = replay << tb | relative time, replays never overlap, so one running
    # maximum of ends serves all replays. A kernel adds cm_i - max(s'_i, cm_{i-1}) (>= 0), where cm
    # is the running maximum of ends: the part of it not covered by earlier kernels.
    s = np.right_shift(key, u(db))
    np.bitwise_and(key, u((1 << db) - 1), out=key)
    key += s  # end in offset time
    np.maximum.accumulate(key, out=key)
    np.maximum(s[1:], key[:-1], out=s[1:])
    key -= s
    return np.add.reduceat(key, segs.rstart).astype(np.int64), first_row


def _first_rows(start, segs: ReplaySegments) -> np.ndarray:
    """Row of each replay's earliest kernel, the first in input order among equal starts."""
    rows = segs.rstart.copy()
    late = np.flatnonzero(start[rows] != segs.first)  # replays whose first record is not the earliest
    ends = np.r_[segs.rstart[1:], len(start)]
    if len(late) <= ARGMIN_LOOP_MAX:  # few: one argmin each
        for r in late.tolist():
            rows[r] += int(np.argmin(start[segs.rstart[r] : ends[r]]))  # argmin: first of equal minima
        return rows
    zero = np.flatnonzero(start == np.repeat(segs.first, np.diff(np.r_[segs.rstart, len(start)])))
    return zero[np.r_[True, np.diff(np.searchsorted(segs.rstart, zero, side="right")) != 0]]


def analyze_grouped(trace: Trace) -> Analysis:
    """:func:`graphmon.analysis.replays.analyze` for replay-grouped input (raises Unordered)."""
    start, end, stream, dev, corr, graph = _columns(trace)
    if len(start) == 0:
        raise Unordered("empty")  # the reference handles it
    segs, counts = _segments(start, end, dev, corr, graph)
    o, rid_o, start_o, end_o, gcount, stream_ids, dg_first = _stream_sorted(start, end, stream, segs, counts)
    same, d = _pairs(rid_o, start_o, end_o, gcount)
    busy, first_row = _busy(start, end, segs, counts)
    np.subtract(start_o[1:], end_o[:-1], out=d)
    values = d[same[:-1]]
    nstreams = len(stream_ids)
    # gaps per (device-graph, stream) group: the pairs inside the group's slice of the sorted order
    nonempty = np.flatnonzero(gcount)
    per = np.zeros(len(gcount), np.int64)
    per[nonempty] = np.add.reduceat(same, (np.cumsum(gcount) - gcount)[nonempty], dtype=np.int64)
    has = np.flatnonzero(per)
    if len(has) == 0:
        gaps = empty_gaps()
    else:
        dg, srank = np.divmod(has, nstreams)
        gaps = StreamGaps(device=segs.rdev[dg_first[dg]], graph=segs.rgraph[dg_first[dg]], stream=stream_ids[srank],
                          offsets=np.r_[0, np.cumsum(per[has])].astype(np.int64), values=values)
    return Analysis(trace, replay_rows(trace, segs, busy, stream[first_row]), gaps)


def grouped_runs(trace: Trace) -> StreamRuns:
    """The kernels with each (replay, stream) one run in (start, end) order (raises Unordered)."""
    start, end, stream, dev, corr, graph = _columns(trace)
    if len(start) == 0:
        raise Unordered("empty")
    segs, counts = _segments(start, end, dev, corr, graph)
    o, rid_o, start_o, end_o, gcount, stream_ids, _ = _stream_sorted(start, end, stream, segs, counts)
    _pairs(rid_o, start_o, end_o, gcount)
    srank, _ = _stream_table(stream)
    return StreamRuns(rid_o.astype(np.int64), srank[o].astype(np.int32), start_o, end_o, stream[o], segs)
