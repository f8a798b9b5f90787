"""The deploy verdict: did a process's graphs regress against a reference?

One rule for three uses: ``graphmon compare`` (a CI gate on two trace files), the agent's verdict
after a restart (the previous process of the same rank is the reference) and a pinned baseline.
It adds no statistics of its own: it reads :func:`graphmon.analysis.compare.compare` (per-stream
shift of the per-replay median gap, its bootstrap interval, Mann-Whitney with Bonferroni; the
shift of the median span and idle time per replay with their intervals) and
:func:`graphmon.analysis.boundaries.attribute` (which boundaries moved; uniform / concentrated /
mixed) and decides, per matched graph:

- **widening** when compare flags one of its streams, or when the boundary verdict is uniform,
  concentrated or mixed and the gap the named boundaries added per replay passes the
  :class:`Gate` (absolute AND relative to the reference's median idle time per replay). The named
  boundaries are the widened ones (the moved ones for ``uniform``); their summed median shift is
  ``gap_added_ns``. Why a gate on top of the boundary verdict: a single boundary widened by 300 ns
  is real (above every capture-to-capture difference) but costs a replay 0.3 us; CI should fail on
  what costs time, and say how much.
- **net** (:func:`net_effect`), the replay as a whole: ``slower`` when the median idle time or the
  median span per replay rose by at least the gate's ``min_added_ns`` with a bootstrap interval
  above 0 (and the span did not fall); ``faster`` when the span fell (interval below 0); ``unchanged``; ``insufficient`` (fewer
  than ``min_replays`` replays on a side).
- **regression** = widening AND net ``slower``. A widening inside a replay that did not get slower
  (a rollback that undid a slow node but moved one boundary; a build that dropped many small gaps
  and added a few large ones) is reported with its kind, boundaries and gap added, and never pages.
  ``Gate(net_harm=False)`` (``compare --fail-on-widening``) keeps the strict rule: any widening.
- **untraced** (:func:`untraced_effect`), the replay time timed with kernel tracing off (CUDA
  events around the launch; graphmon.model.window.UNTRACED_COLUMNS), the same graph on both sides:
  ``slower`` when its median rose by at least ``max(min_added_ns, untraced_confirm_rel x the
  reference's median)`` with a bootstrap interval above 0; ``faster`` (interval below 0);
  ``unchanged``; ``insufficient`` (fewer than ``min_untraced`` durations on a side); ``absent``
  (none on a side: an old collector, bursts off, a pinned window from the trace store).
- **regression**, with untraced durations (``slower``, ``faster``, ``unchanged``): a traced
  regression (above) pages only when ``untraced`` is ``slower``; otherwise its kind is
  ``observer_only`` and it does not page (tracing made the gaps wider, the replay did not get
  slower: issue 36's event-record build, 20% faster untraced, +649 us per replay traced). A graph
  without a traced regression whose untraced median rose by at least ``untraced_rise_rel`` (and
  ``min_added_ns``), interval above 0, is a regression of kind ``untraced`` (the launch or the
  kernels got slower; no gap says which). With ``insufficient`` or ``absent`` the traced rule
  alone decides and the verdict says which. ``Gate(net_harm=False)`` keeps the strict rule: any
  widening, no veto (an untraced rise still pages).
- **kind**: the widening's boundary verdict (``uniform`` | ``concentrated`` | ``mixed``);
  ``uniform`` when compare flags a stream but no boundary widened (a spread shift below the widened
  threshold); ``none`` without a widening; ``observer_only`` or ``untraced`` as above (the
  widening's own kind stays in ``widening_kind``).

Why compare alone is not enough: a few boundaries widened by microseconds (a new sync, a slow
memcpy node) move no stream's per-replay median, so compare's stream test stays quiet while every
replay is slower: +5 us on three boundaries of the H200 decode graph is +15 us per replay (6 % of
its idle time) and compare flags no stream (tests/test_cli.py). Why widened boundaries alone are not
enough: they ignore what got faster. On the H200, a rollback from a build with a copy node after
every kernel narrowed every stream's median gap by 1.5 us and one boundary by chance widened by
7.4 us: a page for a build whose replays ran 32% faster.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Mapping, Optional, Sequence

import numpy as np

from graphmon.analysis.boundaries import Attribution, attribute, attribution_json
from graphmon.analysis.compare import Comparison, ReplayShift, compare, replay_shift
from graphmon.analysis.significance import Thresholds
from graphmon.model.trace import Trace, TraceError

KINDS = ("uniform", "concentrated", "mixed")
PAGE_KINDS = KINDS + ("untraced",)  # the kinds a regression can have (observer_only never pages)
NETS = ("slower", "faster", "unchanged", "insufficient")
UNTRACED = ("slower", "faster", "unchanged", "insufficient", "absent")
# Untraced durations tested per graph and side, the newest: a percentile bootstrap draws
# n_resamples x n indices per side (2000 x 512 x 8 bytes = 8 MiB), and the median of 512 replays
# whose times spread by 1% (sd) is within +-0.11% (95%), well inside the 0.5% and 1% gates.
UNTRACED_SAMPLES = 512
FAIL_ON = ("uniform", "concentrated", "any")  # concentrated covers mixed: both are "not the whole graph"


@dataclass(frozen=True)
class Gate:
    """How much added gap time per replay a boundary verdict needs to count as a regression."""

    min_added_ns: float = 1000.0  # 1 us per replay: ~4 widened boundaries of the smallest widening (256 ns)
    min_added_rel: float = 0.02  # of the reference's median idle time per replay (span - busy)
    net_harm: bool = True  # a widening is a regression only when the replay got slower as a whole
    # A traced regression pages only when the untraced replay time rose by >= min_added_ns (the
    # traced gate's absolute part: sub-us changes are within CUDA events' ~0.5 us resolution) and
    # by >= 0.5% of the reference's median, interval above 0. Why 0.5%: half the rise that pages
    # alone (below), since the traced rule already found a widening that made the traced replay
    # slower and the untraced time needs only to agree; still 2.5x the replay time's spread
    # between replays on the H200 trace (0.2-0.3%; the chain graph's 1.5% is a few outliers).
    untraced_confirm_rel: float = 0.005
    # Without a traced regression, an untraced rise pages at >= 1% (and min_added_ns): issue 36's
    # +1% build (one extra kernel of known length per replay) must page.
    untraced_rise_rel: float = 0.01
    # Durations per side before the untraced time is tested: the untraced kind pages on its own
    # evidence, so it asks for more than the traced tests' min_replays (5); a burst times hundreds.
    min_untraced: int = 20

    def __post_init__(self) -> None:
        if not (self.min_added_ns >= 0 and self.min_added_rel >= 0
                and self.untraced_confirm_rel >= 0 and self.untraced_rise_rel >= 0):
            raise TraceError("gate thresholds must be >= 0")
        if self.min_untraced < 2:
            raise TraceError("min_untraced must be >= 2")

    def passes(self, added_ns: float, idle_ns: float) -> bool:
        if not (added_ns >= self.min_added_ns):
            return False
        return not (math.isfinite(idle_ns) and idle_ns > 0) or added_ns >= self.min_added_rel * idle_ns


def net_effect(span: Optional[ReplayShift], idle: Optional[ReplayShift], gate: Gate) -> str:
    """Did the replay as a whole get slower? (see the module docs; one of :data:`NETS`)

    Both measures count: idle is the gap time alone, steadier when kernel durations vary; span is
    the replay, so a build whose kernels got faster by more than its gaps widened is ``faster``.
    """
    if span is None or idle is None or not (span.tested and idle.tested):
        return "insufficient"
    if span.ci_high_ns < 0:
        return "faster"
    # The absolute part of the gate only: the widening already passed the relative one, and a
    # replay 5 us slower (span +0.3%) is what three boundaries +5 us cost (the held-out case).
    if any(r.ci_low_ns > 0 and r.shift_ns >= gate.min_added_ns for r in (idle, span)):
        return "slower"
    return "unchanged"


def untraced_effect(shift: Optional[ReplayShift], gate: Gate) -> str:
    """Did the untraced replay time of a graph rise? (see the module docs; one of :data:`UNTRACED`)"""
    if shift is None:
        return "absent"
    if not shift.tested:
        return "insufficient"
    if shift.ci_high_ns < 0:
        return "faster"
    need = max(gate.min_added_ns, gate.untraced_confirm_rel * shift.median_baseline_ns)
    return "slower" if shift.ci_low_ns > 0 and shift.shift_ns >= need else "unchanged"


def untraced_rose(shift: Optional[ReplayShift], gate: Gate) -> bool:
    """An untraced rise that pages without a traced regression (kind ``untraced``)."""
    return (untraced_effect(shift, gate) == "slower"
            and shift.shift_ns >= max(gate.min_added_ns, gate.untraced_rise_rel * shift.median_baseline_ns))


def untraced_shift(base: Optional[np.ndarray], cur: Optional[np.ndarray], gate: Gate,
                   th: Thresholds) -> Optional[ReplayShift]:
    """compare's replay shift of the newest :data:`UNTRACED_SAMPLES` untraced durations per side
    (None: no durations on a side), tested from ``gate.min_untraced`` durations per side."""
    if base is None or cur is None or not len(base) or not len(cur):
        return None
    th = replace(th, min_replays=max(th.min_replays, gate.min_untraced))
    return replay_shift("untraced", np.asarray(base[-UNTRACED_SAMPLES:]), np.asarray(cur[-UNTRACED_SAMPLES:]), th)


@dataclass(frozen=True)
class StreamVerdict:
    stream_baseline: int
    stream_current: int
    replays_baseline: int
    replays_current: int
    median_baseline_ns: float  # median of the per-replay median gaps
    median_current_ns: float
    shift_ns: float
    ci_low_ns: float  # bootstrap interval of the shift
    ci_high_ns: float
    p_adjusted: float
    verdict: str  # compare's: regression | improvement | unchanged | insufficient
    flagged: bool  # the regression points at this stream (compare flagged it, or a named boundary lies on it)


@dataclass(frozen=True)
class GraphVerdict:
    graph: str  # "name" or "base -> cur"
    device: int
    kind: str  # none | uniform | concentrated | mixed (the widening's) | observer_only | untraced
    regression: bool  # widening AND net slower AND untraced agrees; or an untraced rise (see the module docs)
    why: str  # "streams" (compare flagged a stream), "boundaries" (the gate passed), "untraced", "" (none)
    boundary_verdict: str  # attribute's: none | uniform | concentrated | mixed
    gap_added_ns: float  # summed median shift of the named boundaries, per replay
    idle_baseline_ns: float  # median idle time per replay
    idle_current_ns: float
    replays_baseline: int
    replays_current: int
    boundaries: int
    widened: int
    moved: int
    flagged_streams: list[int]  # current stream ids the widening points at
    widening: bool = False  # the gap rule alone (a flagged stream or gated boundaries)
    net: str = "insufficient"  # the replay as a whole: slower | faster | unchanged | insufficient
    span: Optional[ReplayShift] = None  # median span per replay, its shift and interval
    idle: Optional[ReplayShift] = None  # median idle time per replay, its shift and interval
    widening_kind: str = "none"  # the widening's kind, also when kind is observer_only or untraced
    untraced: str = "absent"  # the untraced replay time: slower | faster | unchanged | insufficient | absent
    untraced_replay: Optional[ReplayShift] = None  # its median shift and interval (None: absent)
    untraced_rel_shift: float = math.nan  # its shift / the reference's median
    streams: list[StreamVerdict] = field(default_factory=list)
    top: list[dict] = field(default_factory=list)  # attribute's top boundaries, JSON-ready


@dataclass(frozen=True)
class Verdict:
    graphs: list[GraphVerdict]
    unmatched_baseline: list[str]
    unmatched_current: list[str]
    thresholds: Thresholds
    gate: Gate

    def regressions(self, fail_on: str = "any") -> list[GraphVerdict]:
        if fail_on not in FAIL_ON:
            raise ValueError(f"fail_on must be one of {FAIL_ON}")
        want = {"uniform": ("uniform",), "concentrated": ("concentrated", "mixed"), "any": PAGE_KINDS}[fail_on]
        return [g for g in self.graphs if g.regression and g.kind in want]

    @property
    def untraced(self) -> str:
        """absent (no graph has untraced durations on both sides) | insufficient (none has enough) | measured."""
        states = {g.untraced for g in self.graphs}
        return "absent" if states <= {"absent"} else "insufficient" if states <= {"absent", "insufficient"} else "measured"

    def to_json(self) -> dict:
        return {"regression": bool(self.regressions()), "untraced": self.untraced, "gate": asdict(self.gate),
                "graphs": [_clean(asdict(g)) for g in self.graphs],
                "unmatched_baseline": list(self.unmatched_baseline), "unmatched_current": list(self.unmatched_current)}

    def format_table(self, fail_on: str = "any") -> str:
        g0 = self.gate
        rule = ("a widening (a flagged stream, or boundaries that added >= "
                f"{g0.min_added_ns / 1e3:g} us and >= {g0.min_added_rel:.0%} of the idle time per replay)")
        rule += (" in a replay that got slower as a whole (median idle or span per replay up by the same gate, "
                 "interval above 0)" if g0.net_harm else "; --fail-on-widening: net change not asked")
        rule += (f", and untraced, where measured: its replay time up >= {g0.untraced_confirm_rel:.1%} "
                 f"(else observer_only), or up >= {g0.untraced_rise_rel:.0%} alone (kind untraced)"
                 if g0.net_harm else f"; or an untraced rise >= {g0.untraced_rise_rel:.0%}")
        lines = ["", f"verdict (regression: {rule}; fail on: {fail_on}; untraced: {self.untraced})"]
        for g in self.graphs:
            if g.regression:
                state = f"REGRESSION ({g.kind}, {g.why})"
            elif g.kind == "observer_only":
                state = (f"widened ({g.widening_kind}, {g.why}) and slower traced, but the untraced replay time "
                         f"is {g.untraced}: observer_only, not a regression")
            elif g.widening:
                state = f"widened ({g.kind}, {g.why}) but not slower ({g.net}): not a regression"
            else:
                state = "ok"
            lines.append(f"graph {g.graph} (device {g.device}): {state}; boundaries {g.boundary_verdict}, "
                         f"{g.widened} widened; +{g.gap_added_ns / 1e3:.2f} us/replay against an idle median of "
                         f"{g.idle_baseline_ns / 1e3:.2f} us"
                         + (f"; streams {', '.join(map(str, g.flagged_streams))}" if g.widening else ""))
            lines.append(f"  replay as a whole: {g.net}; " + "; ".join(_shift_text(r) for r in (g.span, g.idle) if r))
            lines.append(f"  untraced replay: {g.untraced}"
                         + (f"; {_shift_text(g.untraced_replay)}" if g.untraced_replay is not None else "")
                         + (f" ({g.untraced_rel_shift:+.2%})" if math.isfinite(g.untraced_rel_shift) else ""))
        bad = self.regressions(fail_on)
        lines.append("")
        lines.append(f"FAIL: {len(bad)} graph(s) regressed ({', '.join(sorted({g.kind for g in bad}))})" if bad
                     else "PASS: no regression" + ("" if not self.regressions() else
                                                   f" of kind {fail_on} (others: see above)"))
        return "\n".join(lines)


def _shift_text(r: ReplayShift) -> str:
    if not r.tested:
        return f"{r.measure} median: {r.replays_baseline}/{r.replays_current} replays, too few to test"
    return (f"{r.measure} median {r.median_baseline_ns / 1e3:.2f} -> {r.median_current_ns / 1e3:.2f} us "
            f"({r.shift_ns / 1e3:+.2f} us, 95% CI [{r.ci_low_ns / 1e3:+.2f}, {r.ci_high_ns / 1e3:+.2f}])")


def _clean(v):
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_clean(x) for x in v]
    return v


def judge(comparison: Comparison, attribution: Attribution, gate: Optional[Gate] = None,
          untraced: Optional[tuple[Mapping[str, np.ndarray], Mapping[str, np.ndarray]]] = None) -> Verdict:
    """The verdict per matched graph from compare's and attribute's results on the same two traces.

    ``untraced``: (reference, current) untraced replay durations per graph display name
    (graphmon.analysis.compare.untraced_by_graph); None or a graph missing on a side: absent."""
    gate = gate or Gate()
    ub, uc = untraced if untraced is not None else ({}, {})
    by_graph = {(a.graph, a.device): a for a in attribution.graphs}
    out = []
    for gp in comparison.graphs:
        name = gp.baseline if gp.baseline == gp.current else f"{gp.baseline} -> {gp.current}"
        rows = [s for s in comparison.streams if s.graph == name and s.device == gp.device]
        a = by_graph.get((name, gp.device))
        bverdict = a.verdict if a is not None else "none"
        named = []  # current stream ids of the boundaries the boundary verdict names
        added, idle_b, idle_c = 0.0, math.nan, math.nan
        if a is not None:
            idle_b, idle_c = a.idle_median_baseline_ns, a.idle_median_current_ns
            sh = a.all_shifts
            if bverdict != "none" and sh:
                mask = sh["moved"] if bverdict == "uniform" else sh["flagged"]
                added = float(sh["shift_ns"][mask].sum())
                named = sorted({int(s) for s in sh["stream_current"][mask].tolist()})
        by_streams = any(s.verdict == "regression" for s in rows)
        by_bounds = bverdict in KINDS and gate.passes(added, idle_b)
        widening = by_streams or by_bounds
        net = net_effect(gp.span, gp.idle, gate)
        traced = widening and (net == "slower" or not gate.net_harm)
        wkind = (bverdict if bverdict in KINDS else ("uniform" if by_streams else "none")) if widening else "none"
        ushift = untraced_shift(ub.get(gp.baseline), uc.get(gp.current), gate, comparison.thresholds)
        ueff = untraced_effect(ushift, gate)
        why = "streams" if by_streams else "boundaries" if by_bounds else ""
        if traced and gate.net_harm and ueff in ("faster", "unchanged"):
            kind, regression = "observer_only", False  # tracing widened it; untraced, the replay is no slower
        elif traced:
            kind, regression = wkind, True
        elif untraced_rose(ushift, gate):
            kind, regression, why = "untraced", True, "untraced"
        else:
            kind, regression = wkind, False
        flagged = set(named) if by_bounds else set()
        flagged |= {s.stream_current for s in rows if s.verdict == "regression"}
        streams = [StreamVerdict(
            stream_baseline=s.stream_baseline, stream_current=s.stream_current, replays_baseline=s.replays_baseline,
            replays_current=s.replays_current, median_baseline_ns=s.median_baseline_ns,
            median_current_ns=s.median_current_ns, shift_ns=s.shift_ns, ci_low_ns=s.ci_low_ns, ci_high_ns=s.ci_high_ns,
            p_adjusted=s.p_adjusted, verdict=s.verdict, flagged=widening and s.stream_current in flagged,
        ) for s in rows]
        out.append(GraphVerdict(
            graph=name, device=gp.device, kind=kind, regression=regression, why=why, boundary_verdict=bverdict,
            gap_added_ns=added, idle_baseline_ns=idle_b, idle_current_ns=idle_c,
            replays_baseline=gp.replays_baseline, replays_current=gp.replays_current,
            boundaries=a.boundaries if a is not None else 0, widened=a.flagged if a is not None else 0,
            moved=a.moved if a is not None else 0,
            flagged_streams=sorted(flagged) if widening else [], widening=widening, net=net, span=gp.span,
            idle=gp.idle, widening_kind=wkind, untraced=ueff, untraced_replay=ushift,
            untraced_rel_shift=(ushift.shift_ns / ushift.median_baseline_ns
                                if ushift is not None and ushift.tested and ushift.median_baseline_ns else math.nan),
            streams=streams,
            top=attribution_json(a)["top"] if a is not None else [],
        ))
    return Verdict(graphs=out, unmatched_baseline=list(comparison.unmatched_baseline),
                   unmatched_current=list(comparison.unmatched_current), thresholds=comparison.thresholds, gate=gate)


def deploy_verdict(baseline: Trace, current: Trace, *, thresholds: Optional[Thresholds] = None,
                   gate: Optional[Gate] = None, top: int = 5, pairs: Sequence[tuple[str, str]] = (),
                   untraced: Optional[tuple[Mapping[str, np.ndarray], Mapping[str, np.ndarray]]] = None) -> Verdict:
    """compare + attribute + :func:`judge` on two traces (the agent's verdict and ``compare``'s exit code)."""
    th = thresholds or Thresholds()
    cmp = compare(baseline, current, pairs=pairs, thresholds=th)
    attr = attribute(baseline, current, pairs=pairs, top=top, min_shift_ns=th.min_shift_ns, min_rel=th.min_rel,
                     min_replays=th.min_replays)
    return judge(cmp, attr, gate, untraced)
