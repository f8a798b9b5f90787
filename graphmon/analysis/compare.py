"""Regression detection between two traces: per graph and stream, did the kernel gaps shift?

Unit of evidence: the **median gap of one stream in one replay** (graph launch). Gaps within a
replay are not independent (one slow SM phase lengthens many of them) and tick at 32 ns, so
testing the raw gaps would call every ±1-tick wobble "significant" with thousands of ties.
Per-replay medians are one number per launch, independent across launches to a good
approximation, and robust to the odd stalled kernel.

A (graph, stream) pair is flagged as a **regression** only when all of these hold:
- at least ``min_replays`` replays with gaps on each side;
- the median of the per-replay medians grew by at least ``min_shift_ns`` (default 128 ns = 4
  ticks) AND by at least ``min_rel`` of the baseline (default 20%);
- a two-sided Mann-Whitney U test on the per-replay medians (graphmon.analysis.significance;
  tie-corrected, so the 32 ns quantisation is handled) gives a p-value below ``alpha`` after a Bonferroni correction over all
  tested pairs.
The same rule with the sign reversed reports an "improvement" (never fails CI).

Per matched graph, the replay as a whole is tested too (:class:`ReplayShift`): the shift of the
median span and of the median idle time (span - busy) per replay, with the same bootstrap
interval. :mod:`graphmon.analysis.deploy` uses it for **net harm**: a widening pages only when the
replay got slower as a whole; and, with the same :func:`replay_shift`, the shift of the median
replay time timed untraced (:func:`untraced_by_graph`), which confirms or vetoes a page.

Why 128 ns / 20% and not 2 ticks / 10%: two captures of the *same* graph differ (instance-to-
instance variance). In the bundled H200 capture, decode_bs2 uploaded vs not differ by +80 ns
(+11.6%) on one side stream, Bonferroni-adjusted p = 1e-5; a 2-tick/10% rule would flag that. Across all
null pairs, 9 streams have p_adj < 0.01 with |shift| <= 80 ns (<= 11.6%). The numbers are in
docs/ab/compare-null.json (bench/analysis/compare_null.py). The motivating regression (0.19 -> 0.51 µs,
+320 ns, +168%) is far above both thresholds. The price: a real gap shift below 128 ns or 20%
is reported (shift, CI, p) but not flagged. The replay's span and idle time never flag a stream:
their intervals are within one capture per side, which cannot separate a 1-2% span change from
±1.5% instance variance (use ``graphmon ab`` with several instances per arm for that); the deploy
verdict uses them only to ask whether a widening made the replay slower as a whole.

Matching graphs (first rule that applies, each graph used once):
  1. explicit pairs (``pairs=``/``--pair BASE=CUR``, by display name, label or key); when pairs
     are given, only they are compared;
  2. same label (the application's name for the graph) on the same device;
  3. same key (e.g. "g12": only meaningful within one process) on the same device;
  4. same signature = (median kernels per replay, number of streams), only when exactly one
     unmatched graph on each side has it.
Matching streams: by stream id when both graphs use the same set of ids; otherwise by rank.
A stream's rank is its position when the streams of one replay are ordered by their first
kernel's start; a stream's rank for the graph is the median of its per-replay ranks (ties broken
by id). Stream ids differ between captures (each capture makes its own side streams) while the
fork order inside a graph is fixed by its dependencies, so rank order pairs up the same role.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Mapping, Optional, Sequence

import numpy as np

from graphmon.analysis.replays import ReplayStreamGaps, analyze, replay_stream_gaps, stream_order
from graphmon.analysis.significance import Thresholds, judge, shift_test
from graphmon.model.trace import Trace, TraceError


# ---------------------------------------------------------------------- results
@dataclass(frozen=True)
class StreamShift:
    graph: str  # "base-name" or "base-name -> cur-name" when the names differ
    device: int
    stream_baseline: int
    stream_current: int
    rank: int
    replays_baseline: int
    replays_current: int
    median_baseline_ns: float  # median over replays of the per-replay median gap
    median_current_ns: float
    shift_ns: float  # current - baseline
    rel_shift: float  # shift / baseline (inf when the baseline median is 0)
    ci_low_ns: float  # bootstrap percentile CI of shift_ns
    ci_high_ns: float
    cliffs_delta: float  # P(cur > base) - P(cur < base) over replay pairs, in [-1, 1]
    p_value: float  # Mann-Whitney U, two-sided, on per-replay medians
    p_adjusted: float  # Bonferroni over all tested pairs
    verdict: str  # regression | improvement | unchanged | insufficient


@dataclass(frozen=True)
class ReplayShift:
    """Shift of one per-replay measure (span or idle) of a graph: medians, shift and its interval."""

    measure: str  # span | idle | untraced (replay time timed with kernel tracing off)
    replays_baseline: int
    replays_current: int
    median_baseline_ns: float
    median_current_ns: float
    shift_ns: float  # current - baseline; NaN when a side has fewer than min_replays replays
    ci_low_ns: float  # bootstrap percentile CI of shift_ns
    ci_high_ns: float

    @property
    def tested(self) -> bool:
        return self.shift_ns == self.shift_ns  # not NaN


def replay_shift(measure: str, base: np.ndarray, cur: np.ndarray, th: Thresholds) -> ReplayShift:
    nan = float("nan")
    if min(len(base), len(cur)) < th.min_replays:
        return ReplayShift(measure, len(base), len(cur), float(np.median(base)) if len(base) else nan,
                           float(np.median(cur)) if len(cur) else nan, nan, nan, nan)
    t = shift_test(base, cur, th)
    return ReplayShift(measure, len(base), len(cur), t["median_baseline_ns"], t["median_current_ns"],
                       t["shift_ns"], t["ci_low_ns"], t["ci_high_ns"])


def untraced_by_graph(untraced: Mapping[str, np.ndarray], names: Sequence[str]) -> dict[str, np.ndarray]:
    """Untraced replay durations (graphmon.model.window.UNTRACED_COLUMNS) per graph display name
    (``names``: the trace's ``graph_names()``, which ``graph`` indexes), in row order.

    Rows of an unknown graph (-1) name no graph and are left out. There is no device column: a
    graph name replayed on two devices of one trace gives both the same durations.
    """
    g = np.asarray(untraced.get("graph", ()), np.int64)
    d = np.asarray(untraced.get("duration_ns", ()), np.int64)
    keep = (g >= 0) & (g < len(names))
    return {names[int(k)]: d[keep & (g == k)] for k in np.unique(g[keep]).tolist()}


@dataclass(frozen=True)
class GraphPair:
    baseline: str
    current: str
    device: int
    matched_by: str  # explicit | label | key | signature
    streams_matched_by: str  # id | rank
    kernels_per_replay_baseline: float
    kernels_per_replay_current: float
    replays_baseline: int
    replays_current: int
    span_median_baseline_ns: float
    span_median_current_ns: float
    span_rel_shift: float  # never flags a stream (see docs)
    span: Optional[ReplayShift] = None  # the replay as a whole (graphmon.analysis.deploy's net harm)
    idle: Optional[ReplayShift] = None
    unmatched_streams_baseline: list[int] = field(default_factory=list)
    unmatched_streams_current: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class Comparison:
    graphs: list[GraphPair]
    streams: list[StreamShift]
    unmatched_baseline: list[str]
    unmatched_current: list[str]
    thresholds: Thresholds

    @property
    def regressions(self) -> list[StreamShift]:
        return [s for s in self.streams if s.verdict == "regression"]

    def as_dict(self) -> dict:
        """Plain data; floats may be NaN/inf (graphmon.report.jsonsafe.json_safe makes it JSON)."""
        return {
            "regression": bool(self.regressions),
            "thresholds": asdict(self.thresholds),
            "graphs": [asdict(g) for g in self.graphs],
            "streams": [asdict(s) for s in self.streams],
            "unmatched_baseline": self.unmatched_baseline,
            "unmatched_current": self.unmatched_current,
        }

    def format_table(self) -> str:
        th = self.thresholds
        lines = [
            f"flag rule: shift >= {th.min_shift_ns:g} ns AND >= {th.min_rel:.0%} AND Mann-Whitney p_adj < {th.alpha:g} "
            "(per-replay median gaps)",
        ]
        for g in self.graphs:
            name = g.baseline if g.baseline == g.current else f"{g.baseline} -> {g.current}"
            lines.append("")
            lines.append(
                f"graph {name} (device {g.device}; matched by {g.matched_by}, streams by {g.streams_matched_by}; "
                f"replays {g.replays_baseline}/{g.replays_current}; kernels/replay "
                f"{g.kernels_per_replay_baseline:g}/{g.kernels_per_replay_current:g}; span median "
                f"{g.span_median_baseline_ns / 1e3:.2f} -> {g.span_median_current_ns / 1e3:.2f} us "
                f"({g.span_rel_shift:+.2%}){_idle_text(g.idle)})"
            )
            lines.append(f"  {'stream':>15} {'base ns':>9} {'cur ns':>9} {'shift':>8} {'rel':>8} "
                         f"{'95% CI ns':>17} {'cliff':>6} {'p_adj':>9}  verdict")
            for s in self.streams:
                if s.graph != _pair_name(g.baseline, g.current) or s.device != g.device:
                    continue
                st = str(s.stream_baseline) if s.stream_baseline == s.stream_current else f"{s.stream_baseline}->{s.stream_current}"
                lines.append(
                    f"  {st:>15} {s.median_baseline_ns:9.1f} {s.median_current_ns:9.1f} {s.shift_ns:+8.1f} "
                    f"{s.rel_shift:+8.1%} {f'[{s.ci_low_ns:+.0f}, {s.ci_high_ns:+.0f}]':>17} {s.cliffs_delta:+6.2f} "
                    f"{s.p_adjusted:9.2g}  {s.verdict.upper() if s.verdict == 'regression' else s.verdict}"
                )
            for label, ids in (("baseline", g.unmatched_streams_baseline), ("current", g.unmatched_streams_current)):
                if ids:
                    lines.append(f"  streams only in {label}: {', '.join(map(str, ids))}")
        for label, names in (("baseline", self.unmatched_baseline), ("current", self.unmatched_current)):
            if names:
                lines.append(f"graphs only in {label}: {', '.join(names)}")
        n = len(self.regressions)
        lines.append("")
        lines.append(f"REGRESSION on {n} stream(s)" if n else "no regression")
        return "\n".join(lines)


def _idle_text(r: Optional[ReplayShift]) -> str:
    if r is None or not r.tested:
        return ""
    return f"; idle median {r.median_baseline_ns / 1e3:.2f} -> {r.median_current_ns / 1e3:.2f} us"


def _pair_name(b: str, c: str) -> str:
    return b if b == c else f"{b} -> {c}"


# ---------------------------------------------------------------------- matching
@dataclass
class _Unit:
    device: int
    graph: int
    name: str
    key: str
    label: str
    kernels: float
    streams: int
    rows: np.ndarray  # rows of ReplayStreamGaps
    spans: np.ndarray
    idles: np.ndarray


def graph_units(trace: Trace, rsg: ReplayStreamGaps) -> list[_Unit]:
    names = trace.graph_names()
    rep = analyze(trace).replays
    out = []
    pairs = sorted(set(zip(rsg.device.tolist(), rsg.graph.tolist())))
    for d, g in pairs:
        rows = np.flatnonzero((rsg.device == d) & (rsg.graph == g))
        rsel = (rep.device == d) & (rep.graph == g)
        info = trace.graphs[g]
        out.append(_Unit(d, g, names[g], info.key, info.label, float(np.median(rep.kernels[rsel])),
                         len(np.unique(rsg.stream[rows])), rows, rep.span_ns[rsel], rep.idle_ns[rsel]))
    return out


def match_graphs(base: list[_Unit], cur: list[_Unit], pairs: Sequence[tuple[str, str]]):
    matched: list[tuple[_Unit, _Unit, str]] = []
    b_left, c_left = list(base), list(cur)

    def take(bu, cu, how):
        matched.append((bu, cu, how))
        b_left.remove(bu)
        c_left.remove(cu)

    for bn, cn in pairs:
        bs = [u for u in b_left if bn in (u.name, u.key, u.label)]
        cs = [u for u in c_left if cn in (u.name, u.key, u.label)]
        if not bs or not cs:
            missing = bn if not bs else cn
            raise TraceError(f"--pair {bn}={cn}: no unmatched graph named {missing!r} in the "
                             f"{'baseline' if not bs else 'current'} trace")
        for bu in bs:
            cu = next((c for c in cs if c.device == bu.device and c in c_left), None)
            if cu is not None:
                take(bu, cu, "explicit")
    if pairs:  # the user said which graphs to compare: nothing else is matched automatically
        return matched, b_left, c_left
    for attr, how in (("label", "label"), ("key", "key")):
        for bu in list(b_left):
            v = getattr(bu, attr)
            if not v:
                continue
            cands = [c for c in c_left if c.device == bu.device and getattr(c, attr) == v]
            if len(cands) == 1 and sum(1 for b in b_left if b.device == bu.device and getattr(b, attr) == v) == 1:
                take(bu, cands[0], how)
    for bu in list(b_left):
        sig = (bu.device, bu.kernels, bu.streams)
        bs = [b for b in b_left if (b.device, b.kernels, b.streams) == sig]
        cs = [c for c in c_left if (c.device, c.kernels, c.streams) == sig]
        if len(bs) == 1 and len(cs) == 1:
            take(bu, cs[0], "signature")
    return matched, b_left, c_left


def match_streams(rb: ReplayStreamGaps, bu: _Unit, rc: ReplayStreamGaps, cu: _Unit):
    sb = set(np.unique(rb.stream[bu.rows]).tolist())
    sc = set(np.unique(rc.stream[cu.rows]).tolist())
    if sb == sc:
        return [(s, s, i) for i, s in enumerate(stream_order(rb, bu.rows))], "id", [], []
    ob, oc = stream_order(rb, bu.rows), stream_order(rc, cu.rows)
    k = min(len(ob), len(oc))
    return [(ob[i], oc[i], i) for i in range(k)], "rank", ob[k:], oc[k:]


def compare(baseline: Trace, current: Trace, *, pairs: Sequence[tuple[str, str]] = (),
            thresholds: Thresholds | None = None) -> Comparison:
    """Compare the per-stream gap distributions of the graphs of two traces (see module docs)."""
    th = thresholds or Thresholds()
    rb, rc = replay_stream_gaps(baseline), replay_stream_gaps(current)
    ub, uc = graph_units(baseline, rb), graph_units(current, rc)
    if not ub:
        raise TraceError("baseline trace has no graph kernels to compare")
    if not uc:
        raise TraceError("current trace has no graph kernels to compare")
    matched, b_left, c_left = match_graphs(ub, uc, pairs)
    if not matched:
        raise TraceError("no graph of the baseline matches a graph of the current trace "
                         "(by label, key or kernel/stream signature); name pairs with --pair BASE=CUR")

    graphs: list[GraphPair] = []
    pending: list[dict] = []
    tests: list[dict | None] = []  # None: too few replays to test
    for bu, cu, how in matched:
        smatch, smode, ob, oc = match_streams(rb, bu, rc, cu)
        span_b, span_c = float(np.median(bu.spans)), float(np.median(cu.spans))
        graphs.append(GraphPair(
            baseline=bu.name, current=cu.name, device=bu.device, matched_by=how, streams_matched_by=smode,
            kernels_per_replay_baseline=bu.kernels, kernels_per_replay_current=cu.kernels,
            replays_baseline=len(bu.spans), replays_current=len(cu.spans),
            span_median_baseline_ns=span_b, span_median_current_ns=span_c,
            span_rel_shift=(span_c - span_b) / span_b if span_b else 0.0,
            span=replay_shift("span", bu.spans, cu.spans, th), idle=replay_shift("idle", bu.idles, cu.idles, th),
            unmatched_streams_baseline=ob, unmatched_streams_current=oc,
        ))
        for s_b, s_c, rank in smatch:
            vb = rb.median_gap_ns[bu.rows][rb.stream[bu.rows] == s_b]
            vc = rc.median_gap_ns[cu.rows][rc.stream[cu.rows] == s_c]
            vb, vc = vb[np.isfinite(vb)], vc[np.isfinite(vc)]
            row = {"graph": _pair_name(bu.name, cu.name), "device": bu.device, "stream_baseline": s_b,
                   "stream_current": s_c, "rank": rank, "replays_baseline": len(vb), "replays_current": len(vc)}
            if min(len(vb), len(vc)) < th.min_replays:
                nan = float("nan")
                row.update(median_baseline_ns=float(np.median(vb)) if len(vb) else nan,
                           median_current_ns=float(np.median(vc)) if len(vc) else nan,
                           shift_ns=nan, rel_shift=nan, ci_low_ns=nan, ci_high_ns=nan, cliffs_delta=nan,
                           p_value=nan)
                tests.append(None)
            else:
                row.update(shift_test(vb, vc, th))
                tests.append(row)
            pending.append(row)
    streams = [StreamShift(**r, p_adjusted=p_adj, verdict=v) for r, (p_adj, v) in zip(pending, judge(tests, th))]
    return Comparison(graphs=graphs, streams=streams, unmatched_baseline=[u.name for u in b_left],
                      unmatched_current=[u.name for u in c_left], thresholds=th)
