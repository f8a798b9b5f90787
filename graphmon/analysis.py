"""Pure, vectorised analysis of a :class:`~graphmon.trace.Trace`: replays, gaps, quantiles.

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

from .trace import Trace

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
    """Segment ``trace`` into replays and compute per-replay figures and per-stream gaps."""
    g = trace.graph >= 0
    idx = np.flatnonzero(g)
    dev = trace.device[idx]
    corr = trace.correlation_id[idx]
    stream = trace.stream[idx]
    start = trace.start_ns[idx]
    end = trace.end_ns[idx]
    graph = trace.graph[idx]

    # One sort serves both replay segmentation and per-stream gaps.
    order = np.lexsort((end, start, stream, corr, dev))
    dev, corr, stream, start, end, graph = (a[order] for a in (dev, corr, stream, start, end, graph))
    n = len(start)
    if n == 0:
        return Analysis(trace, _empty_replays(), _empty_gaps())

    new_replay = np.r_[True, (dev[1:] != dev[:-1]) | (corr[1:] != corr[:-1])]
    rstart = np.flatnonzero(new_replay)
    rid = np.cumsum(new_replay) - 1
    nrep = len(rstart)

    first = np.minimum.reduceat(start, rstart)
    last = np.maximum.reduceat(end, rstart)
    span = last - first
    kernels = np.diff(np.r_[rstart, n])
    busy = _union_busy(rid, start, end, first, nrep)

    # Per-stream gaps: consecutive kernels in (replay, stream, start) order.
    same = (rid[1:] == rid[:-1]) & (stream[1:] == stream[:-1])
    gap = (start[1:] - end[:-1])[same]
    gsel = np.flatnonzero(same)  # position of the earlier kernel of each pair
    gaps = _group_gaps(dev[gsel], graph[gsel], stream[gsel], gap)

    rdev = dev[rstart]
    rcorr = corr[rstart]
    rgraph = graph[rstart]
    # The stream of the replay's first kernel (by start time) stands in for an unknown launch stream.
    first_stream = _first_stream(rid, start, stream, nrep)
    latency, lstream = _launch_info(trace, rdev, rcorr, first)
    rstream = np.where(lstream >= 0, lstream, first_stream)
    inter = _inter_replay(rdev, rstream, first, last)

    # Final replay order: by device then time.
    o = np.lexsort((first, rdev))
    replays = Replays(
        device=rdev[o],
        graph=rgraph[o],
        correlation_id=rcorr[o],
        first_start_ns=first[o],
        last_end_ns=last[o],
        span_ns=span[o],
        busy_ns=busy[o],
        idle_ns=(span - busy)[o],
        kernels=kernels[o].astype(np.int64),
        launch_latency_ns=latency[o],
        inter_replay_gap_ns=inter[o],
    )
    return Analysis(trace, replays, gaps)


def _empty_replays() -> Replays:
    z = np.zeros(0, np.int64)
    return Replays(np.zeros(0, np.int32), np.zeros(0, np.int32), z, z, z, z, z, z, z, z, z)


def _empty_gaps() -> StreamGaps:
    z = np.zeros(0, np.int64)
    return StreamGaps(np.zeros(0, np.int32), np.zeros(0, np.int32), z, np.zeros(1, np.int64), z)


def _union_busy(rid, start, end, first, nrep) -> np.ndarray:
    """Length of the union of [start, end) per replay, across streams.

    Sorted by (replay, start), an interval adds ``max(0, end - max(start, M))`` where M is the
    largest end seen earlier in the same replay: a segmented running maximum, done with one
    global ``maximum.accumulate`` over times made relative to the replay and offset per replay.
    """
    o = np.lexsort((start, rid))
    r, s, e = rid[o], start[o], end[o]
    rel_s = s - first[r]
    rel_e = e - first[r]
    width = int(rel_e.max()) + 1
    if width * nrep >= 2**62:  # offsets would overflow int64: fall back to chunks of replays
        busy = np.zeros(nrep, dtype=np.int64)
        step = max(1, (2**62) // width)
        for lo in range(0, nrep, step):
            m = (r >= lo) & (r < lo + step)
            busy[lo : lo + step] = _union_busy_offsets(r[m] - lo, rel_s[m], rel_e[m], width, min(step, nrep - lo))
        return busy
    return _union_busy_offsets(r, rel_s, rel_e, width, nrep)


def _union_busy_offsets(r, rel_s, rel_e, width, nrep) -> np.ndarray:
    off = r.astype(np.int64) * width
    cm = np.maximum.accumulate(rel_e + off)
    prev = np.r_[np.int64(-1), cm[:-1]] - off  # running max before this interval, relative
    first_in_replay = np.r_[True, r[1:] != r[:-1]]
    prev = np.where(first_in_replay, -1, prev)
    add = np.maximum(0, rel_e - np.maximum(rel_s, prev))
    # r is sorted, so reduceat gives exact int64 sums (bincount's float weights round above 2^53).
    out = np.zeros(nrep, dtype=np.int64)
    heads = np.flatnonzero(first_in_replay)
    out[r[heads]] = np.add.reduceat(add, heads)
    return out


def _first_stream(rid, start, stream, nrep) -> np.ndarray:
    o = np.lexsort((start, rid))
    r = rid[o]
    head = np.r_[True, r[1:] != r[:-1]]
    out = np.full(nrep, -1, dtype=np.int64)
    out[r[head]] = stream[o][head]
    return out


def _launch_info(trace: Trace, rdev, rcorr, first):
    """Launch latency and launch stream per replay, from the trace's launch rows."""
    nrep = len(rdev)
    latency = np.full(nrep, -1, dtype=np.int64)
    lstream = np.full(nrep, -1, dtype=np.int64)
    L = trace.launches
    if len(L["correlation_id"]) == 0:
        return latency, lstream
    lkey = (L["device"].astype(np.int64) << 48) ^ L["correlation_id"]
    order = np.argsort(lkey, kind="stable")
    skey = lkey[order]
    rkey = (rdev.astype(np.int64) << 48) ^ rcorr
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


def _group_gaps(dev, graph, stream, gap) -> StreamGaps:
    if len(gap) == 0:
        return _empty_gaps()
    o = np.lexsort((gap, stream, graph, dev))
    dev, graph, stream, gap = dev[o], graph[o], stream[o], gap[o]
    new = np.r_[True, (dev[1:] != dev[:-1]) | (graph[1:] != graph[:-1]) | (stream[1:] != stream[:-1])]
    heads = np.flatnonzero(new)
    return StreamGaps(
        device=dev[heads],
        graph=graph[heads],
        stream=stream[heads],
        offsets=np.r_[heads, len(gap)].astype(np.int64),
        values=gap,
    )


# ---------------------------------------------------------------------- statistics
def grouped_quantiles(values: np.ndarray, offsets: np.ndarray, qs=QUANTILES) -> np.ndarray:
    """Exact quantiles per group of values already sorted within groups.

    Returns float64 array (groups x len(qs)); NaN for empty groups. Linear interpolation,
    identical to ``np.quantile(group_values, q)``.
    """
    counts = np.diff(offsets)
    ng = len(counts)
    out = np.full((ng, len(qs)), np.nan)
    ok = counts > 0
    if not ok.any():
        return out
    base = offsets[:-1][ok].astype(np.float64)
    nm1 = (counts[ok] - 1).astype(np.float64)
    v = values.astype(np.float64)
    for j, q in enumerate(qs):
        pos = q * nm1
        lo = np.floor(pos)
        frac = pos - lo
        i_lo = (base + lo).astype(np.int64)
        i_hi = np.minimum(i_lo + 1, (base + nm1).astype(np.int64))
        out[ok, j] = v[i_lo] + (v[i_hi] - v[i_lo]) * frac
    return out


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
