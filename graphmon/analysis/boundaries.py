"""Per-boundary gaps: which pair of consecutive kernels widened (issue 15, item 2).

A **boundary** is a pair of consecutive kernels of one replay on one stream (``next.start -
prev.end`` is its gap, the same gap as :mod:`graphmon.analysis.replays`). Each replay of a graph
gives one gap per boundary, so a boundary's sample is one value per replay.

Identity of a boundary inside one trace (stable across replays):
- graphs whose kernels all carry CUPTI graph node ids: (device, graph, stream, node id of the
  earlier kernel, node id of the later kernel);
- otherwise (Kineto, nsys without node ids): (device, graph, stream, position on the stream,
  name of the earlier kernel, name of the later kernel).
Across two traces (:func:`attribute`), graphs and streams are matched exactly as ``graphmon compare``
matches them; boundaries then match by node ids when both sides have the same node-id pairs on the
stream (the same process), else by (position, kernel names): node ids are process-local counters,
while the order of a graph's kernels on a stream is fixed by the captured code.

A boundary **moved** when each side has ``min_replays`` gaps, its median grew by at least
``min_shift_ns`` and by ``min_rel`` of the baseline median (compare's stream thresholds), and the
middle halves do not overlap (current p25 > baseline p75): one gap per replay is a small sample, so
a separation rule stands in for a test over thousands of boundaries. It is **widened** (flagged)
when it moved by at least ``WIDENED_MIN_SHIFT_NS`` = 256 ns (8 ticks): between two captures of the
same graph single boundaries differ by up to 224 ns (7 ticks; at most 7 of ~960 boundaries per
graph move at all; bench/analysis/boundary_null.py -> bench/results/boundary_null.json), while the halves of
one capture move none.

Verdict per graph: ``uniform`` when at least half of the boundaries moved (like the seed's upload
regression that widened every gap; so many never move together between captures); else ``none``
when no boundary widened; ``concentrated`` when at most ``max(3, 10%)`` widened (like a new sync or a
slow memcpy node); ``mixed`` otherwise. The share a set of boundaries explains is their summed
median shift over the summed median shift of all matched boundaries of the graph (the gap time per
replay the graph gained; idle time = span - busy is reported beside it, since kernels overlapping
on other streams make it move differently).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Sequence

import numpy as np

from graphmon.model.trace import Trace

WIDENED_MIN_SHIFT_NS = 256.0  # 8 ticks: above every boundary shift between captures of one graph (bench/analysis/boundary_null.py)
UNIFORM_MIN_FRACTION = 0.5
CONCENTRATED_MAX_FRACTION = 0.10
CONCENTRATED_MAX_COUNT = 3


@dataclass(frozen=True)
class Boundaries:
    """One row per boundary of a trace; ``values[offsets[b]:offsets[b+1]]`` = its gaps (ns, sorted)."""

    device: np.ndarray  # int32
    graph: np.ndarray  # int32 index into trace.graphs
    stream: np.ndarray  # int64
    position: np.ndarray  # int64 median index on its stream (0 = between the 1st and 2nd kernel)
    node_prev: np.ndarray  # int64 graph node ids, 0 when the graph has none
    node_next: np.ndarray
    name_prev: np.ndarray  # int32 name ids into trace.names, -1 unknown
    name_next: np.ndarray
    at_ns: np.ndarray  # float64 mean time of the boundary after its replay's first kernel start
    by_node: np.ndarray  # bool: identified by node ids
    offsets: np.ndarray  # int64, len = boundaries + 1
    values: np.ndarray  # int64 gaps, grouped per boundary and sorted within each group
    names: tuple[str, ...] = ()

    def __len__(self) -> int:
        return len(self.device)

    @property
    def counts(self) -> np.ndarray:
        return np.diff(self.offsets)

    def quantile(self, q: float) -> np.ndarray:
        return sorted_quantile(self.values, self.offsets, q)


def sorted_quantile(values: np.ndarray, offsets: np.ndarray, q: float) -> np.ndarray:
    """Quantile ``q`` of every group of presorted ``values`` (numpy's linear rule), vectorised; NaN if empty."""
    n = np.diff(offsets)
    out = np.full(len(n), np.nan)
    ok = n > 0
    if not ok.any():
        return out
    pos = q * (n[ok] - 1)
    lo = np.floor(pos).astype(np.int64)
    hi = np.minimum(lo + 1, n[ok] - 1)
    base = offsets[:-1][ok]
    vlo = values[base + lo].astype(np.float64)
    vhi = values[base + hi].astype(np.float64)
    out[ok] = vlo + (vhi - vlo) * (pos - lo)
    return out


def _empty(names) -> Boundaries:
    z = np.zeros(0, np.int64)
    zi = np.zeros(0, np.int32)
    return Boundaries(zi, zi, z, z, z, z, zi, zi, np.zeros(0), np.zeros(0, bool), np.zeros(1, np.int64), z, tuple(names))


def boundary_gaps(trace: Trace) -> Boundaries:
    """Every boundary of the graph kernels of ``trace`` with its per-replay gaps (see module docs)."""
    idx = np.flatnonzero(trace.graph >= 0)
    if len(idx) < 2:
        return _empty(trace.names)
    cols = [a[idx] for a in (trace.device, trace.correlation_id, trace.stream, trace.start_ns, trace.end_ns,
                             trace.graph, trace.graph_node_id, trace.name_id)]
    o = np.lexsort((cols[4], cols[3], cols[2], cols[1], cols[0]))
    dev, corr, stream, start, end, graph, node, name = (c[o] for c in cols)
    n = len(start)
    new_replay = np.r_[True, (dev[1:] != dev[:-1]) | (corr[1:] != corr[:-1])]
    rid = np.cumsum(new_replay) - 1
    first = np.minimum.reduceat(start, np.flatnonzero(new_replay))
    new_group = new_replay | np.r_[True, stream[1:] != stream[:-1]]
    i = np.arange(n)
    pos_on_stream = i - np.maximum.accumulate(np.where(new_group, i, 0))
    p = np.flatnonzero(~new_group[1:])  # earlier kernel of each consecutive pair on one stream
    if len(p) == 0:
        return _empty(trace.names)
    q = p + 1
    gap = start[q] - end[p]
    # Node ids identify a boundary only when every kernel of the graph has one.
    ng = int(graph.max()) + 1
    missing = np.bincount(graph, weights=(node <= 0), minlength=ng) > 0
    by_node = ~missing[graph[p]]
    k1 = np.where(by_node, node[p], pos_on_stream[p])
    k2 = np.where(by_node, node[q], 0)
    k3 = np.where(by_node, 0, name[p])
    k4 = np.where(by_node, 0, name[q])
    bo = np.lexsort((gap, k4, k3, k2, k1, stream[p], graph[p], dev[p]))
    keys = np.stack([dev[p], graph[p], stream[p], k1, k2, k3, k4])[:, bo]
    head = np.flatnonzero(np.r_[True, (keys[:, 1:] != keys[:, :-1]).any(axis=0)])
    offsets = np.r_[head, len(bo)].astype(np.int64)
    counts = np.diff(offsets)
    pb, qb = p[bo], q[bo]
    at = np.add.reduceat((end[pb] - first[rid[pb]]).astype(np.float64), head) / counts
    # Median position per boundary: positions sorted within each group, then the middle one.
    po = np.lexsort((pos_on_stream[pb], np.repeat(np.arange(len(head)), counts)))
    posb = pos_on_stream[pb][po]
    position = posb[offsets[:-1] + (counts - 1) // 2].astype(np.int64)
    hp, hq = pb[head], qb[head]
    return Boundaries(
        device=dev[hp], graph=graph[hp], stream=stream[hp], position=position,
        node_prev=np.where(by_node[bo][head], node[hp], 0), node_next=np.where(by_node[bo][head], node[hq], 0),
        name_prev=name[hp], name_next=name[hq], at_ns=at, by_node=by_node[bo][head],
        offsets=offsets, values=gap[bo], names=tuple(trace.names),
    )


# ---------------------------------------------------------------------- two traces
@dataclass(frozen=True)
class BoundaryShift:
    """One matched boundary: its place in the graph, its kernels and its median gap on each side."""

    graph: str
    device: int
    stream_baseline: int
    stream_current: int
    stream_rank: int  # the stream's role in the graph (fork order), as ``compare`` pairs streams
    position: int  # index of the boundary on its stream (baseline)
    kernel_before: str  # demangled when a demangler is available
    kernel_after: str
    at_us: float  # mean time of the boundary after the replay's first kernel (baseline), µs
    median_baseline_ns: float
    median_current_ns: float
    shift_ns: float
    replays_baseline: int
    replays_current: int
    moved: bool  # median +min_shift_ns and +min_rel, middle halves separated
    flagged: bool  # moved and by at least WIDENED_MIN_SHIFT_NS: a widened boundary


@dataclass(frozen=True)
class GraphAttribution:
    graph: str
    device: int
    boundaries: int  # matched boundaries
    unmatched_baseline: int
    unmatched_current: int
    matched_by: str  # node | position
    moved: int
    flagged: int  # widened boundaries
    flagged_streams: list[int]  # baseline stream ids the verdict points at (see attribute)
    streams: int
    gap_change_ns: float  # summed median shift of all matched boundaries (gap time per replay)
    widened_shift_ns: float  # summed median shift of the widened boundaries (what a few of them added per replay)
    moved_shift_ns: float  # summed median shift of the moved boundaries
    median_shift_ns: float  # the typical boundary's shift (about the injected step when uniform)
    idle_median_baseline_ns: float  # per replay: span - busy (context; overlap makes it differ from the gaps)
    idle_median_current_ns: float
    top_share: float  # share of gap_change_ns the top boundaries explain (NaN when the change is 0)
    verdict: str  # none | uniform | concentrated | mixed
    top: list[BoundaryShift]
    # For plots (not in the JSON): per matched boundary stream_rank, stream, at_us, shift_ns, flagged;
    # "gaps": {stream rank: (baseline stream, current stream, baseline gaps, current gaps)}.
    all_shifts: dict = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class Attribution:
    graphs: list[GraphAttribution]
    min_shift_ns: float
    min_rel: float
    widened_min_shift_ns: float = WIDENED_MIN_SHIFT_NS

    def to_json(self) -> list[dict]:
        return [attribution_json(g) for g in self.graphs]


def _clean(v):
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def attribution_json(g: GraphAttribution) -> dict:
    d = {k: _clean(v) for k, v in asdict(g).items() if k not in ("top", "all_shifts")}
    d["top"] = [{k: _clean(v) for k, v in asdict(b).items()} for b in g.top]
    return d


def display_names(names: Sequence[str]) -> list[str]:
    """Kernel names for people: demangled by ``graphmon.formats.chrome.demangle`` when it exists.

    The name table is small (one entry per distinct kernel), so one call per name is fine; a
    demangler that takes the whole list is used as such. A failing demangler leaves the raw names.
    """
    try:
        from graphmon.formats.chrome import demangle  # type: ignore[attr-defined]
    except ImportError:
        return list(names)
    names = list(names)
    try:
        out = demangle(names)
        if isinstance(out, (list, tuple)) and len(out) == len(names):
            return [str(s) for s in out]
    except Exception:  # noqa: BLE001 - a demangler of one name at a time; tried below
        pass
    try:
        return [str(demangle(s)) for s in names]
    except Exception:  # noqa: BLE001 - names stay readable raw; never fail a report over a demangler
        return names


def _stats(b: Boundaries, rows: np.ndarray) -> tuple[np.ndarray, ...]:
    cnt = b.counts[rows]
    off = np.r_[0, np.cumsum(cnt)].astype(np.int64)
    # Gather the groups of ``rows`` in this order: each group's start, then a running index.
    take = np.repeat(b.offsets[rows] - off[:-1], cnt) + np.arange(off[-1])
    vals = b.values[take]
    return (sorted_quantile(vals, off, 0.5), sorted_quantile(vals, off, 0.25), sorted_quantile(vals, off, 0.75),
            np.diff(off))


def _match_rows(bb: Boundaries, rb: np.ndarray, bc: Boundaries, rc: np.ndarray, gname_b, gname_c):
    """Pairs of boundary rows (baseline, current) of one matched stream, and how they matched."""
    nb = np.stack([bb.node_prev[rb], bb.node_next[rb]], axis=1)
    nc = np.stack([bc.node_prev[rc], bc.node_next[rc]], axis=1)
    same_nodes = (bb.by_node[rb].all() and bc.by_node[rc].all() and len(rb) == len(rc)
                  and set(map(tuple, nb.tolist())) == set(map(tuple, nc.tolist())))
    if same_nodes:
        kb, kc, how = nb, nc, "node"
    else:
        kb = np.stack([bb.position[rb], gname_b[bb.name_prev[rb]], gname_b[bb.name_next[rb]]], axis=1)
        kc = np.stack([bc.position[rc], gname_c[bc.name_prev[rc]], gname_c[bc.name_next[rc]]], axis=1)
        how = "position"
    allk, inv = np.unique(np.concatenate([kb, kc]), axis=0, return_inverse=True)
    inv = inv.reshape(-1)
    ib, ic = inv[: len(rb)], inv[len(rb):]
    # A key seen twice on one side (two equal kernel pairs at one position) cannot be paired.
    cb = np.bincount(ib, minlength=len(allk))
    cc = np.bincount(ic, minlength=len(allk))
    ok = (cb == 1) & (cc == 1)
    where_b = np.full(len(allk), -1)
    where_c = np.full(len(allk), -1)
    where_b[ib] = np.arange(len(rb))
    where_c[ic] = np.arange(len(rc))
    keys = np.flatnonzero(ok)
    return rb[where_b[keys]], rc[where_c[keys]], how


def attribute(baseline: Trace, current: Trace, *, pairs: Sequence[tuple[str, str]] = (), top: int = 5,
              min_shift_ns: float = 128.0, min_rel: float = 0.20, min_replays: int = 5,
              widened_min_shift_ns: float = WIDENED_MIN_SHIFT_NS) -> Attribution:
    """Top boundaries by median gap shift, per matched graph (see module docs). Needs no scipy."""
    from graphmon.analysis.compare import graph_units, match_graphs, match_streams
    from graphmon.analysis.replays import analyze, replay_stream_gaps

    bb, bc = boundary_gaps(baseline), boundary_gaps(current)
    rsb, rsc = replay_stream_gaps(baseline), replay_stream_gaps(current)
    ub, uc = graph_units(baseline, rsb), graph_units(current, rsc)
    matched, _, _ = match_graphs(ub, uc, pairs)
    # One id per distinct kernel name across both traces (the last slot: name id -1).
    gid: dict[str, int] = {}
    gname_b = np.array([gid.setdefault(s, len(gid)) for s in baseline.names] + [-1], np.int64)
    gname_c = np.array([gid.setdefault(s, len(gid)) for s in current.names] + [-1], np.int64)
    shown_b = display_names(baseline.names)  # matched boundaries carry the same kernels on both sides
    rep_b, rep_c = analyze(baseline).replays, analyze(current).replays
    out = []
    for bu, cu, _how in matched:
        smatch, _, _, _ = match_streams(rsb, bu, rsc, cu)
        gname = bu.name if bu.name == cu.name else f"{bu.name} -> {cu.name}"
        sel_b = (bb.device == bu.device) & (bb.graph == bu.graph)
        sel_c = (bc.device == cu.device) & (bc.graph == cu.graph)
        pb, pc, ranks, hows, gaps = [], [], [], set(), {}
        for s_b, s_c, rank in smatch:
            gaps[rank] = (int(s_b), int(s_c), _stream_values(bb, sel_b & (bb.stream == s_b)),
                          _stream_values(bc, sel_c & (bc.stream == s_c)))
            xb, xc, how = _match_rows(bb, np.flatnonzero(sel_b & (bb.stream == s_b)), bc,
                                      np.flatnonzero(sel_c & (bc.stream == s_c)), gname_b, gname_c)
            pb.append(xb)
            pc.append(xc)
            ranks.append(np.full(len(xb), rank))
            hows.add(how)
        pb_a = np.concatenate(pb) if pb else np.zeros(0, np.int64)
        pc_a = np.concatenate(pc) if pc else np.zeros(0, np.int64)
        rank_a = np.concatenate(ranks) if ranks else np.zeros(0, np.int64)
        mb, qb25, qb75, nb = _stats(bb, pb_a)
        mc, qc25, qc75, nc = _stats(bc, pc_a)
        shift = mc - mb
        enough = (nb >= min_replays) & (nc >= min_replays)
        moved = enough & (shift >= min_shift_ns) & (shift >= min_rel * np.maximum(mb, 0)) & (qc25 > qb75)
        flagged = moved & (shift >= max(min_shift_ns, widened_min_shift_ns))
        total = float(shift.sum())
        sign = -1.0 if total < 0 else 1.0
        order = np.lexsort((np.arange(len(shift)), -sign * shift))
        order = order[sign * shift[order] > 0][:top]  # only boundaries that moved the way the graph did
        share = float(shift[order].sum() / total) if total != 0 else float("nan")
        nflag, nmoved = int(flagged.sum()), int(moved.sum())
        nbnd = len(shift)
        # Breadth uses "moved": many boundaries moving together is no capture-to-capture wobble
        # (null pairs move at most a few), so a uniform +160 ns is caught like compare's streams.
        if nmoved and nmoved >= UNIFORM_MIN_FRACTION * nbnd:
            verdict = "uniform"
        elif nflag == 0:
            verdict = "none"
        elif nflag <= max(CONCENTRATED_MAX_COUNT, CONCENTRATED_MAX_FRACTION * nbnd):
            verdict = "concentrated"
        else:
            verdict = "mixed"
        tops = [BoundaryShift(
            graph=gname, device=bu.device, stream_baseline=int(bb.stream[pb_a[j]]), stream_current=int(bc.stream[pc_a[j]]),
            stream_rank=int(rank_a[j]), position=int(bb.position[pb_a[j]]),
            kernel_before=_shown(shown_b, bb.name_prev[pb_a[j]]), kernel_after=_shown(shown_b, bb.name_next[pb_a[j]]),
            at_us=float(bb.at_ns[pb_a[j]] / 1e3), median_baseline_ns=float(mb[j]), median_current_ns=float(mc[j]),
            shift_ns=float(shift[j]), replays_baseline=int(nb[j]), replays_current=int(nc[j]), moved=bool(moved[j]),
            flagged=bool(flagged[j]),
        ) for j in order.tolist()]
        ib = (rep_b.device == bu.device) & (rep_b.graph == bu.graph)
        ic = (rep_c.device == cu.device) & (rep_c.graph == cu.graph)
        out.append(GraphAttribution(
            graph=gname, device=bu.device, boundaries=nbnd,
            unmatched_baseline=int(sel_b.sum()) - nbnd, unmatched_current=int(sel_c.sum()) - nbnd,
            matched_by="+".join(sorted(hows)) or "-", moved=nmoved, flagged=nflag,
            flagged_streams=sorted({int(bb.stream[pb_a[j]]) for j in
                                    np.flatnonzero(moved if verdict == "uniform" else flagged).tolist()}),
            streams=len(smatch), gap_change_ns=total,
            widened_shift_ns=float(shift[flagged].sum()), moved_shift_ns=float(shift[moved].sum()),
            median_shift_ns=float(np.median(shift)) if len(shift) else float("nan"),
            idle_median_baseline_ns=float(np.median(rep_b.idle_ns[ib])) if ib.any() else float("nan"),
            idle_median_current_ns=float(np.median(rep_c.idle_ns[ic])) if ic.any() else float("nan"),
            top_share=share, verdict=verdict, top=tops,
            all_shifts={"stream_rank": rank_a, "at_us": bb.at_ns[pb_a] / 1e3, "shift_ns": shift, "flagged": flagged,
                        "moved": moved, "stream": bb.stream[pb_a], "stream_current": bc.stream[pc_a], "gaps": gaps},
        ))
    return Attribution(graphs=out, min_shift_ns=min_shift_ns, min_rel=min_rel,
                       widened_min_shift_ns=max(min_shift_ns, widened_min_shift_ns))


def _stream_values(b: Boundaries, rows: np.ndarray) -> np.ndarray:
    """Every gap of the boundaries selected by the boolean ``rows``."""
    return b.values[np.repeat(rows, b.counts)]


def _shown(shown: list[str], name_id) -> str:
    i = int(name_id)
    return shown[i] if 0 <= i < len(shown) else ""


def widest(trace: Trace, top: int = 10, b: Boundaries | None = None) -> list[dict]:
    """Per graph, the ``top`` boundaries with the widest median gap (``analyze --by boundary``)."""
    b = boundary_gaps(trace) if b is None else b
    if len(b) == 0:
        return []
    med, p90 = b.quantile(0.5), b.quantile(0.9)
    shown = display_names(trace.names)
    gnames = trace.graph_names()
    out = []
    pairs = np.unique(np.stack([b.device, b.graph], axis=1), axis=0)
    for dev, g in pairs.tolist():
        rows = np.flatnonzero((b.device == dev) & (b.graph == g))
        gap_sum = float(np.nansum(med[rows]))
        rows = rows[np.lexsort((rows, -med[rows]))][:top]
        out.append({
            "graph": gnames[g], "device": str(dev), "boundaries": int(((b.device == dev) & (b.graph == g)).sum()),
            "gap_median_sum_ns": gap_sum,
            "widest": [{
                "stream": str(int(b.stream[r])), "position": int(b.position[r]),
                "kernel_before": _shown(shown, b.name_prev[r]), "kernel_after": _shown(shown, b.name_next[r]),
                "at_us": float(b.at_ns[r] / 1e3), "replays": int(b.counts[r]),
                "gap_ns": {"p50": float(med[r]), "p90": float(p90[r])},
                "share_of_gap_sum": float(med[r] / gap_sum) if gap_sum > 0 else None,
            } for r in rows.tolist()],
        })
    return out


def live_top_boundaries(baseline_trace: Trace, window_trace: Trace, k: int = 5, **thresholds) -> list[dict]:
    """The top ``k`` boundaries of the last window against the pinned baseline window, JSON-ready.

    For ``/status`` and ``/trace/{id}``: one dict per graph found in both windows (matched like
    ``graphmon compare``), never metric labels (kernel names are unbounded). Empty when either window
    has no graph kernels or no graph in common.
    """
    if not (baseline_trace.graph >= 0).any() or not (window_trace.graph >= 0).any():
        return []
    return attribute(baseline_trace, window_trace, top=k, **thresholds).to_json()
