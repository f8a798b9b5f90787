"""The result types of the analysis and the parts that every path computes the same way: the
per-replay table (launch latency, inter-replay gap) and dense ranks. See replays.py for the
definitions."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

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
    launch_latency_ns: np.ndarray  # int64, NO_VALUE where unknown (a skewed clock can make it negative, even -1)
    inter_replay_gap_ns: np.ndarray  # int64, INT64_MIN where there is no previous replay

    def __len__(self) -> int:
        return len(self.span_ns)


NO_VALUE = np.iinfo(np.int64).min


@dataclass(frozen=True)
class StreamGaps:
    """Gaps grouped per (device, graph, stream): groups in (device, graph, stream) order, values
    within a group in (replay, start) order (replays in replay-key order)."""

    device: np.ndarray  # per group
    graph: np.ndarray
    stream: np.ndarray
    offsets: np.ndarray  # group g's values are values[offsets[g]:offsets[g+1]]
    values: np.ndarray  # int64 gap ns, grouped

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


def empty_replays() -> Replays:
    z = np.zeros(0, np.int64)
    return Replays(np.zeros(0, np.int32), np.zeros(0, np.int32), z, z, z, z, z, z, z, z, z)


def empty_gaps() -> StreamGaps:
    z = np.zeros(0, np.int64)
    return StreamGaps(np.zeros(0, np.int32), np.zeros(0, np.int32), z, np.zeros(1, np.int64), z)


class ReplaySegments(NamedTuple):
    """One row per replay in replay-key order: what the per-replay table needs from any path."""

    n: int  # graph kernels
    rstart: np.ndarray  # first kernel of each replay in the path's replay-grouped order
    rdev: np.ndarray
    rcorr: np.ndarray
    rgraph: np.ndarray
    first: np.ndarray  # first kernel start
    last: np.ndarray  # last kernel end


class StreamRuns(NamedTuple):
    """Graph kernels ordered so that each (replay, stream) is one contiguous run sorted by (start,
    end); per-replay gaps (graphmon compare) are read from it."""

    rid: np.ndarray  # replay row (replay-key order) of each kernel
    srank: np.ndarray  # dense rank of the stream id
    start: np.ndarray
    end: np.ndarray
    stream: np.ndarray  # stream id
    segs: ReplaySegments


def replay_rows(trace: Trace, segs: ReplaySegments, busy: np.ndarray, first_stream: np.ndarray) -> Replays:
    """The per-replay table, sorted by (device, first start)."""
    rdev, first, last = segs.rdev, segs.first, segs.last
    span = last - first
    kernels = np.diff(np.r_[segs.rstart, segs.n]).astype(np.int64)
    # First kernel's stream stands in for an unknown launch stream.
    latency, lstream = _launch_info(trace, rdev, segs.rcorr, first)
    rstream = np.where(lstream >= 0, lstream, first_stream)
    inter = _inter_replay(rdev, rstream, first, last)
    o = np.lexsort((first, rdev))  # one row per replay: small
    return Replays(
        device=rdev[o],
        graph=segs.rgraph[o],
        correlation_id=segs.rcorr[o],
        first_start_ns=first[o],
        last_end_ns=last[o],
        span_ns=span[o],
        busy_ns=busy[o],
        idle_ns=(span - busy)[o],
        kernels=kernels[o],
        launch_latency_ns=latency[o],
        inter_replay_gap_ns=inter[o],
    )


def dense_ranks(values: np.ndarray) -> tuple[np.ndarray, int]:
    """Dense rank of each value (0..k-1) and k. O(n) by table lookup for small non-negative ids."""
    lo, hi = int(values.min()), int(values.max())
    if hi - lo < 1 << 22:
        present = np.zeros(hi - lo + 1, dtype=bool)
        present[values - lo] = True
        rank = np.cumsum(present) - 1
        return rank[values - lo].astype(np.int32), int(present.sum())
    uniq, inv = np.unique(values, return_inverse=True)
    return inv.reshape(-1).astype(np.int32), len(uniq)


def _launch_info(trace: Trace, rdev, rcorr, first):
    """Launch latency and launch stream per replay, from the trace's launch rows."""
    nrep = len(rdev)
    latency = np.full(nrep, NO_VALUE, dtype=np.int64)
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
