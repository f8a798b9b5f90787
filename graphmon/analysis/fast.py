"""The fast path of :func:`graphmon.analysis.replays.analyze`, for records in the order that CUPTI
and profilers deliver them: bit-identical to reference.py, at memory speed.

What the data guarantees, checked here in O(n) (the caller falls back to reference.py where a
check fails): replays arrive grouped, i.e. the kernels of one (device, correlation id) are
contiguous and the blocks come in increasing replay-key order (a graph launch's records arrive
together, and correlation ids grow with launches). And, for speed only: each stream's kernels of a
replay arrive in (start, end) order.
Then no general sort and no second gather is needed. Each kernel becomes one packed uint64
(replay, start - replay's first start, duration), and
- per-stream gaps: ONE stable radix sort of a small group id (the replay's (device, graph) rank
  and the stream rank, int16) and one gather of the packed keys put every (device, graph, stream)
  group together, replays in order inside it, each replay's kernels on that stream in start order
  (checked; where a stream went back in time the grouped keys are sorted, which timsort does in
  near-linear time on such input). Consecutive kernels of one replay in that order make the gaps,
  which come out already in StreamGaps order.
- busy time (union of a replay's intervals over all streams) needs start order across streams:
  one in-place sort of the packed *values* (nearly sorted: timsort), then one running maximum.
Why not numba (issue 16 measured a numba single pass at 23-36M records/s): it costs ~200 MB
installed and a ~2 s first compile that holds the GIL, and this numpy formulation reaches the
target without it. bench/results/analysis-throughput.json, 10M records on one core of a shared
2-core machine, median of 5 (fast and reference side by side, alternating): 38.0M records/s with
quantiles (the reference 17.3M) in ``graphmon analyze``'s process, whose freed temporaries are
reused (analysis/heap.py), and 27.8M with glibc's default allocator, where first-touch page
faults on the temporaries are much of the time and most of the spread.
"""

from __future__ import annotations

import numpy as np

from graphmon.analysis.results import (Analysis, ReplaySegments, StreamGaps, StreamRuns, empty_gaps, replay_rows)
from graphmon.model.trace import Trace, replay_key

INT16_GROUPS = 1 << 15  # below this many (device, graph, stream) groups the sort key is int16: radix sort
ARGMIN_LOOP_MAX = 1024  # replays whose first record is not the earliest: up to this many, one argmin each
BUSY_BLOCK = 1 << 16  # records per block of the busy-time pass (two 512 KB columns: in the cache)


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


def _stream_table(stream: np.ndarray, lo: int, hi: int):
    """(rank of each stream id, int16/int32) via a lookup table, and the ids by rank; ``lo``,
    ``hi``: the column's min and max."""
    if hi - lo >= 1 << 22:
        ids, inv = np.unique(stream, return_inverse=True)
        return inv.reshape(-1).astype(np.int32), ids.astype(stream.dtype)
    base = 0 if 0 <= lo and hi < 1 << 22 else lo  # index by the id itself: no shifted copy
    shifted = stream if base == 0 else stream - base
    present = np.zeros(hi - base + 1, dtype=bool)
    present[shifted] = True
    ids = np.flatnonzero(present)
    table = np.cumsum(present, dtype=np.int32) - 1
    if len(ids) < INT16_GROUPS:
        table = table.astype(np.int16)
    return table[shifted], (ids + base).astype(stream.dtype)


class _Layout:
    """Bit layout of the packed per-kernel key: replay << (tb + db) | start - first start << db |
    duration, in uint64 (a replay's relative times and durations are small)."""

    def __init__(self, segs: ReplaySegments, dur: np.ndarray):
        self.tb = max(1, int((segs.last - segs.first).max()).bit_length())  # any end - first start fits
        self.rb = max(1, int(len(segs.rstart) - 1).bit_length())
        self.db = max(1, int(dur.max()).bit_length())
        if self.rb + self.tb + self.db > 62:
            raise Unordered("keys_too_wide")

    def pack(self, start, dur, segs: ReplaySegments, counts) -> np.ndarray:
        # (start << db) + duration + ((replay << (tb + db)) - (first << db)) in uint64, whose
        # wrap-around is exact modulo 2**64: intermediate terms overflow, the sum (< 2**62) does not.
        u = np.uint64
        key = np.left_shift(start.view(u), u(self.db))
        key += dur.view(u)
        key += np.repeat((np.arange(len(counts), dtype=u) << u(self.tb + self.db)) - (segs.first.view(u) << u(self.db)),
                         counts)
        return key


def _group_ids(stream, segs: ReplaySegments, counts):
    """Per kernel: (device, graph) rank of its replay * stream slots + its stream's slot, int16
    where it fits, and the stream id of each slot.

    A slot is the stream id itself when ids are small (CUPTI's are: 7, 142..156 on the H200) and
    every (device-graph, id) pair fits int16: one int16 cast of the column, where a dense rank
    needs a scatter and a gather over it (10M records: ~8 ms against ~24 ms). Slots of absent
    streams are empty groups. Else the slot is the stream's dense rank (_stream_table)."""
    # (device, graph) rank per replay, in the order of the reference: by (device << 32) | graph
    dgkey = (segs.rdev.astype(np.int64) << 32) | segs.rgraph
    dg_ids, dg_first, dg_rank = np.unique(dgkey, return_index=True, return_inverse=True)
    lo, hi = int(stream.min()), int(stream.max())
    if lo >= 0 and len(dg_ids) * (hi + 1) < INT16_GROUPS:
        slot, stream_ids = stream.astype(np.int16), np.arange(hi + 1, dtype=stream.dtype)
    else:
        slot, stream_ids = _stream_table(stream, lo, hi)
    nslots = len(stream_ids)
    ngroups = len(dg_ids) * nslots
    if len(dg_ids) == 1:
        gid = slot
    else:
        dtype = np.int16 if ngroups < INT16_GROUPS else np.int32
        gid = np.repeat((dg_rank.reshape(-1) * nslots).astype(dtype), counts)
        gid += slot
    return gid, ngroups, stream_ids, dg_first


class _Sorted:
    """The packed keys grouped by (device-graph, stream) and, within a group, in (replay, start,
    duration) order: each (replay, stream) one run, ordered as the reference orders it.

    Fresh full-length arrays cost page faults on first touch (as much as the arithmetic), so the
    argsort's index array, dead after the one gather, is reused as the scratch column below."""

    def __init__(self, key: np.ndarray, gid: np.ndarray, ngroups: int, lay: _Layout):
        o = np.argsort(gid, kind="stable")  # radix sort for int16 keys: input order kept per group
        # group sizes from the group boundaries (bincount would first widen gid to 64 bits)
        inner = np.searchsorted(gid[o], np.arange(1, ngroups, dtype=gid.dtype))
        self.gcount = np.diff(np.r_[0, inner, len(gid)])
        kg = key[o]  # the one gather
        self.scratch = o.view(np.uint64)
        del o
        n = len(kg)
        cuts = np.cumsum(self.gcount)[:-1]
        self.cuts = cuts[(cuts > 0) & (cuts < n)]
        self.same = np.empty(n, dtype=bool)  # first: "went back in time"; then: "is a pair"
        down = self.same[:-1]
        np.less(kg[1:], kg[:-1], out=down)
        down[self.cuts - 1] = False  # a new group may start lower
        self.resorted = bool(down.any())
        u = np.uint64
        shift = lay.rb + lay.tb + lay.db
        if self.resorted:
            # A stream's records went back in time: sort within the groups. The input is nearly
            # sorted (grouped, mostly in order), so timsort stays near-linear.
            if ngroups > 1:
                if shift + int(ngroups - 1).bit_length() > 64:
                    raise Unordered("keys_too_wide")
                kg |= np.repeat(np.arange(ngroups, dtype=u) << u(shift), self.gcount)
            kg.sort(kind="stable")
        self.rid = np.right_shift(kg, u(lay.tb + lay.db), out=self.scratch)
        if self.resorted and ngroups > 1:
            self.rid &= u((1 << lay.rb) - 1)
        self.kg = kg

    def pairs(self) -> np.ndarray:
        """same[k]: sorted kernels k and k+1 are consecutive on one stream of one replay (length n,
        the last slot False)."""
        same = self.same
        np.equal(self.rid[1:], self.rid[:-1], out=same[:-1])
        same[-1] = False
        same[self.cuts - 1] = False  # same replay, next (device, graph, stream) group: not a pair
        return same

    def times(self, lay: _Layout) -> tuple[np.ndarray, np.ndarray]:
        """(start, end) relative to each kernel's replay's first start, uint64, in place: the
        replay ids and the packed keys are gone afterwards."""
        u = np.uint64
        s = np.right_shift(self.kg, u(lay.db), out=self.scratch)
        s &= u((1 << lay.tb) - 1)
        e = np.bitwise_and(self.kg, u((1 << lay.db) - 1), out=self.kg)
        e += s
        self.rid = self.kg = None
        return s, e


def _busy(key: np.ndarray, lay: _Layout, segs: ReplaySegments, scratch: np.ndarray) -> np.ndarray:
    """Union busy time per replay from the packed keys (sorted here, in place; ``scratch``: a free
    uint64 column as long as ``key``)."""
    key.sort(kind="stable")  # timsort: the input is nearly sorted
    # In "offset time" t' = replay << tb | relative time, replays never overlap, so one running
    # maximum of ends serves all replays. A kernel adds cm_i - max(s'_i, cm_{i-1}) (>= 0), where cm
    # is the running maximum of ends: the part of it not covered by earlier kernels. In blocks
    # that stay in the cache (the running maximum carried over): 10M records, 78 -> 68 ms.
    u = np.uint64
    db, dmask, carry = u(lay.db), u((1 << lay.db) - 1), None
    for a in range(0, len(key), BUSY_BLOCK):
        k, s = key[a : a + BUSY_BLOCK], scratch[a : a + BUSY_BLOCK]
        np.right_shift(k, db, out=s)
        np.bitwise_and(k, dmask, out=k)
        k += s  # end in offset time
        if carry is not None and k[0] < carry:
            k[0] = carry
        np.maximum.accumulate(k, out=k)
        s0 = s[0]
        np.maximum(s[1:], k[:-1], out=s[1:])
        if carry is not None and s0 < carry:
            s[0] = carry
        carry = k[-1]
        k -= s
    return np.add.reduceat(key, segs.rstart).astype(np.int64)


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


def _prepare(trace: Trace):
    start, end, stream, dev, corr, graph = _columns(trace)
    if len(start) == 0:
        raise Unordered("empty")  # the reference handles it
    segs, counts = _segments(start, end, dev, corr, graph)
    dur = np.subtract(end, start)
    lay = _Layout(segs, dur)
    key = lay.pack(start, dur, segs, counts)
    del dur
    gid, ngroups, stream_ids, dg_first = _group_ids(stream, segs, counts)
    srt = _Sorted(key, gid, ngroups, lay)
    return start, stream, segs, lay, key, srt, stream_ids, dg_first


def analyze_grouped(trace: Trace) -> tuple[Analysis, str]:
    """:func:`graphmon.analysis.replays.analyze` for replay-grouped input (raises Unordered), and
    which path it took: "grouped", or "grouped_resorted" when a stream's records needed sorting."""
    start, stream, segs, lay, key, srt, stream_ids, dg_first = _prepare(trace)
    same = srt.pairs()
    s, e = srt.times(lay)
    gap = np.subtract(s[1:], e[:-1], out=e[:-1])  # wraps to the right negative value as int64
    values = gap.view(np.int64)[same[:-1]]
    del e, gap
    nstreams = len(stream_ids)
    # gaps per (device-graph, stream) group: the pairs inside the group's slice of the sorted order
    gcount = srt.gcount
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
    resorted = srt.resorted
    del srt, same
    busy = _busy(key, lay, segs, s)
    first_row = _first_rows(start, segs)
    path = "grouped_resorted" if resorted else "grouped"
    return Analysis(trace, replay_rows(trace, segs, busy, stream[first_row]), gaps), path


def grouped_runs(trace: Trace) -> StreamRuns:
    """The kernels with each (replay, stream) one run in (start, end) order (raises Unordered)."""
    start, stream, segs, lay, key, srt, stream_ids, dg_first = _prepare(trace)
    rid = srt.rid.astype(np.int64)  # a copy: times() reuses the memory
    s, e = srt.times(lay)
    first = segs.first[rid]
    nslots = len(stream_ids)
    slot = np.repeat(np.arange(len(srt.gcount)) % nslots, srt.gcount)
    # the reference's dense rank of each stream id (slots may be ids, with absent ones between)
    present = (srt.gcount.reshape(-1, nslots) > 0).any(axis=0)
    srank = (np.cumsum(present, dtype=np.int32) - 1)[slot]
    return StreamRuns(rid, srank, first + s.view(np.int64), first + e.view(np.int64), stream_ids[slot], segs)
