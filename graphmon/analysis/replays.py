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

import numpy as np

from graphmon.model.trace import Trace, replay_key

QUANTILES = (0.1, 0.5, 0.9, 0.99)


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
    gmask = trace.graph >= 0
    idx = None if gmask.all() else np.flatnonzero(gmask)

    def col(a):
        return a if idx is None else a[idx]

    dev, corr = col(trace.device), col(trace.correlation_id)
    if len(dev) == 0:
        return Analysis(trace, _empty_replays(), _empty_gaps())
    # 1. replays: stable sort by (device, correlation id)
    dc = replay_key(dev, corr)
    o1 = np.argsort(dc, kind="stable")
    dcs = dc[o1]
    new = np.empty(len(dcs), dtype=bool)
    new[0] = True
    np.not_equal(dcs[1:], dcs[:-1], out=new[1:])
    rstart = np.flatnonzero(new)
    rid = np.cumsum(new) - 1
    nrep = len(rstart)
    start = col(trace.start_ns)[o1]
    end = col(trace.end_ns)[o1]
    stream = col(trace.stream)[o1]
    head = o1[rstart]
    rdev, rcorr, rgraph = dev[head], corr[head], col(trace.graph)[head]

    first = np.minimum.reduceat(start, rstart)
    last = np.maximum.reduceat(end, rstart)
    span = last - first
    kernels = np.diff(np.r_[rstart, len(start)]).astype(np.int64)
    rel_s = start - first[rid]
    rel_e = end - first[rid]
    srank, nstreams = _dense_ranks(stream)

    tb = int(rel_e.max()).bit_length()
    rb = max(1, int(nrep - 1).bit_length())
    sb = max(1, int(nstreams - 1).bit_length())
    packs = rb + sb + tb <= 62
    # 2. union busy per replay: order by (replay, start)
    if rb + tb <= 62:
        o3 = np.argsort((rid << tb) | rel_s, kind="stable")
    else:
        o3 = np.lexsort((rel_s, rid))
    # o3 only reorders kernels inside each replay's block, so rid and the block starts are unchanged.
    busy = _union_busy_sorted(rid, rel_s[o3], rel_e[o3], nrep, rstart)
    # 3. per-stream gaps: order by (replay, stream, start, end)
    if packs:
        key = (rid << (sb + tb)) | (srank.astype(np.int64) << tb) | rel_s
        o2 = np.argsort(key, kind="stable")
        ks = key[o2]
        if (ks[1:] == ks[:-1]).any():  # equal starts on one stream: order those by end, exactly
            o2 = np.lexsort((rel_e, rel_s, srank, rid))
    else:
        o2 = np.lexsort((rel_e, rel_s, srank, rid))
    r2, s2 = rid[o2], srank[o2]
    same = (r2[1:] == r2[:-1]) & (s2[1:] == s2[:-1])
    pair = np.flatnonzero(same)  # position (in o2 order) of the earlier kernel of each pair
    gap = start[o2[pair + 1]] - end[o2[pair]]
    # Group id per gap from its replay's (device, graph) rank and its stream rank: small ints, so
    # device/graph/stream are looked up only for each group's first gap.
    dg_rank, ndg = _dense_ranks((rdev.astype(np.int64) << 32) | rgraph)
    rp = r2[pair]
    gid = dg_rank[rp].astype(np.int64) * nstreams + s2[pair]
    order, heads = _group_order(gid, ndg * nstreams)
    h = order[heads]
    gaps = StreamGaps(
        device=rdev[rp[h]],
        graph=rgraph[rp[h]],
        stream=stream[o2[pair[h]]],
        offsets=np.r_[heads, len(gap)].astype(np.int64),
        values=gap[order],
    ) if len(gap) else _empty_gaps()

    # First kernel's stream stands in for an unknown launch stream.
    first_stream = stream[o3[rstart]]
    latency, lstream = _launch_info(trace, rdev, rcorr, first)
    rstream = np.where(lstream >= 0, lstream, first_stream)
    inter = _inter_replay(rdev, rstream, first, last)

    o = np.lexsort((first, rdev))  # one row per replay: small
    replays = Replays(
        device=rdev[o],
        graph=rgraph[o],
        correlation_id=rcorr[o],
        first_start_ns=first[o],
        last_end_ns=last[o],
        span_ns=span[o],
        busy_ns=busy[o],
        idle_ns=(span - busy)[o],
        kernels=kernels[o],
        launch_latency_ns=latency[o],
        inter_replay_gap_ns=inter[o],
    )
    return Analysis(trace, replays, gaps)


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


# ---------------------------------------------------------------------- statistics
def grouped_quantiles(values: np.ndarray, offsets: np.ndarray, qs=QUANTILES, presorted: bool = False) -> np.ndarray:
    """Exact quantiles per contiguous group of ``values`` (``values[offsets[g]:offsets[g+1]]``).

    Returns float64 (groups x len(qs)); NaN for empty groups. Linear interpolation between order
    statistics, identical to ``np.quantile(group, q)``. Unsorted groups are handled with
    ``np.partition`` (linear time) unless ``presorted``.
    """
    counts = np.diff(offsets)
    out = np.full((len(counts), len(qs)), np.nan)
    for g in np.flatnonzero(counts > 0).tolist():
        v = values[offsets[g] : offsets[g + 1]]
        n = len(v)
        pos = np.asarray(qs, dtype=np.float64) * (n - 1)
        lo = np.floor(pos).astype(np.int64)
        hi = np.minimum(lo + 1, n - 1)
        if not presorted:
            v = np.partition(v, np.unique(np.r_[lo, hi]))
        vlo, vhi = v[lo].astype(np.float64), v[hi].astype(np.float64)
        out[g] = vlo + (vhi - vlo) * (pos - lo)
    return out


def grouped_minmax(values: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-group min and max (groups must be non-empty)."""
    return np.minimum.reduceat(values, offsets[:-1]), np.maximum.reduceat(values, offsets[:-1])


def grouped_sums(values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Exact int64 sums per contiguous group (empty groups give 0)."""
    counts = np.diff(offsets)
    out = np.zeros(len(counts), dtype=np.int64)
    ok = counts > 0
    if ok.any():
        out[ok] = np.add.reduceat(values, offsets[:-1][ok])
    return out


def summarize(values: np.ndarray, qs=QUANTILES) -> dict[str, float]:
    """count/mean/min/max/quantiles of one 1-D sample (sorted or not)."""
    v = np.sort(np.asarray(values, dtype=np.int64))
    if len(v) == 0:
        return {"count": 0}
    qv = grouped_quantiles(v, np.array([0, len(v)]), qs)[0]
    out = {"count": int(len(v)), "mean": float(v.sum() / len(v)), "min": int(v[0]), "max": int(v[-1])}
    out.update({f"p{_qname(q)}": float(x) for q, x in zip(qs, qv)})
    return out


def _qname(q: float) -> str:
    return f"{q * 100:g}"


def replay_groups(replays: Replays) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Group replays by (device, graph): returns (order, offsets, head rows) for grouped stats."""
    o = np.lexsort((replays.graph, replays.device))
    d, g = replays.device[o], replays.graph[o]
    new = np.r_[True, (d[1:] != d[:-1]) | (g[1:] != g[:-1])] if len(o) else np.zeros(0, bool)
    heads = np.flatnonzero(new)
    return o, np.r_[heads, len(o)].astype(np.int64), o[heads]
