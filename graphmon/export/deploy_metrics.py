"""The deploy verdict's Prometheus families and its /status section (graphmon.export.deploy).

Families (labels bounded: rank, device, graph and stream as the gap series carry them; reference
previous | pinned; kind uniform | concentrated | mixed | untraced; never a pid or a kernel name):

- ``graphmon_deploy_regression{rank,device,graph,reference,kind}``: 1 for the kind of a regressed
  graph (graphmon.analysis.deploy: a widening in a replay that got slower as a whole and, where
  the untraced replay time is measured, slower untraced too; or kind ``untraced``, the untraced
  replay time alone up >= 1%), 0 for the other kinds; all four kinds for every graph with a
  verdict; a widening that did not make the replay slower, or one the untraced time does not
  confirm (kind ``observer_only``), stays 0 here and shows in /status (``widening``, ``kind``,
  ``net``, ``span``, ``idle``, ``untraced``, ``untraced_replay``);
- ``graphmon_deploy_stream_regression{rank,device,graph,stream,reference}``: 1 on the streams a
  regression of a widening's kind points at (compare flagged it, or a named boundary lies on it);
  0 for kind ``untraced`` (no stream says where the time went);
- ``graphmon_deploy_gap_shift_seconds{rank,device,graph,stream,reference}``: the stream's shift of
  the median per-replay median gap (compare's; its interval is in /status);
- ``graphmon_deploy_gap_added_seconds{rank,device,graph,reference}``: the summed median shift of
  the boundaries the verdict names, per replay (0 when none widened);
- ``graphmon_deploy_untraced_shift_seconds{rank,device,graph,reference}``: the shift of the median
  untraced replay time against the reference (only where both sides have enough untraced
  durations: absent when /status says ``untraced`` absent or insufficient);
- ``graphmon_deploy_reference_age_seconds{rank,reference}``: since the reference's newest window;
- ``graphmon_deploy_graphs_left_out{rank,reference}``: graphs with a verdict beyond the series cap;
- ``graphmon_deploy_graphs_regressed{rank,reference}``: graphs the verdict finds regressed, exported or not;
- ``graphmon_deploy_windows_dropped_total``, ``graphmon_deploy_ranks_forgotten_total``,
  ``graphmon_deploy_computations_total{outcome}``, ``graphmon_deploy_state_errors_total{op}`` (load | save).

Series exist while the compared process is attached and the comparison is computed: a restart
ends the previous verdict (its series go) until the new process has pooled enough replays.
Per-graph series (14 for a graph with 4 streams: 4 kinds, 4 + 4 per stream, gap added, untraced
shift) are bounded like the gap series: at cardinality
standard and low, at most ``detail_graphs`` graphs per rank and reference, regressed graphs first
(most gap added first), then the rank's detail graphs; at full, ``max_graphs``.
"""

from __future__ import annotations

import math
import time
from typing import Callable, Container, Iterable, Mapping, Optional

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from graphmon.analysis.deploy import KINDS, PAGE_KINDS, GraphVerdict
from graphmon.export.detail import cap_label
from graphmon.export.deploy import DeployVerdict, Result
from graphmon.export.deploy_state import STATE_ERRORS
from graphmon.export.identity import label_by_rank
from graphmon.report.jsonsafe import json_safe

GRAPH = ["rank", "device", "graph", "reference"]
STREAM = ["rank", "device", "graph", "stream", "reference"]


def _exported(r: Result, max_graphs: int) -> tuple[list[GraphVerdict], int]:
    graphs = list(r.verdict.graphs) if r.verdict is not None else []
    graphs.sort(key=lambda g: (not g.regression, -g.gap_added_ns, g.graph))  # regressions first
    return graphs[:max_graphs], max(0, len(graphs) - max_graphs)


def _current_name(g: GraphVerdict) -> str:
    return g.graph.split(" -> ", 1)[1] if " -> " in g.graph else g.graph


class DeployCollector:
    """prometheus_client collector of the deploy verdict (one-method protocol)."""

    def __init__(self, verdict: DeployVerdict, live: Optional[Callable[[], Iterable[str]]] = None, *,
                 max_graphs: int = 64, max_streams: int = 16, max_label_length: int = 128,
                 detail: Optional[Callable[[str], Container]] = None, detail_graphs: int = 2,
                 labels: Optional[Callable[[], Mapping[str, Mapping[str, str]]]] = None) -> None:
        """``detail(rank)``: the rank's detail graphs, (device, graph) pairs (None: every graph
        up to ``max_graphs``, the full level)."""
        self.verdict, self.live = verdict, live
        self.labels = labels  # rank -> the workload labels of its process (graphmon.export.identity)
        self.max_graphs, self.max_streams, self.max_label_length = max_graphs, max_streams, max_label_length
        self.detail, self.detail_graphs = detail, detail_graphs

    def results(self) -> list[Result]:
        """Results whose current process is attached (``live()``: the incarnations connected now)."""
        res = self.verdict.results
        live = set(self.live()) if self.live is not None else None
        return [r for k, r in sorted(res.items()) if live is None or r.current_incarnation in live]

    def _graphs(self, r: Result) -> tuple[list[GraphVerdict], int]:
        """The graphs with series of their own, and how many more have a verdict."""
        graphs, n_left = _exported(r, self.max_graphs)
        if self.detail is None:
            return graphs, n_left
        detail = self.detail(r.rank)
        keep = [g for g in graphs if g.regression][: self.detail_graphs]
        keep += [g for g in graphs if not g.regression and (str(g.device), cap_label(
            _current_name(g), self.max_label_length)) in detail][: max(0, self.detail_graphs - len(keep))]
        return keep, n_left + len(graphs) - len(keep)

    def collect(self) -> Iterable[Metric]:
        by_rank = self.labels() if self.labels is not None else {}
        return label_by_rank(self._collect(), by_rank)

    def _collect(self) -> Iterable[Metric]:
        reg = GaugeMetricFamily("graphmon_deploy_regression",
                                "1 for the kind of regression of a graph against the reference (the previous process "
                                "of the rank, or the pinned baseline); 0 for the other kinds.", labels=GRAPH + ["kind"])
        sreg = GaugeMetricFamily("graphmon_deploy_stream_regression",
                                 "1 on the streams a graph's deploy regression points at.", labels=STREAM)
        shift = GaugeMetricFamily("graphmon_deploy_gap_shift_seconds",
                                  "Shift of the median per-replay median gap of a stream against the reference.",
                                  labels=STREAM)
        added = GaugeMetricFamily("graphmon_deploy_gap_added_seconds",
                                  "Gap time per replay the boundaries named by the verdict added (summed median shift).",
                                  labels=GRAPH)
        untraced = GaugeMetricFamily("graphmon_deploy_untraced_shift_seconds",
                                     "Shift of the median untraced replay time (kernel tracing off) against the "
                                     "reference; only where both sides have enough untraced replays.", labels=GRAPH)
        age = GaugeMetricFamily("graphmon_deploy_reference_age_seconds",
                                "Seconds since the reference's newest window closed.", labels=["rank", "reference"])
        left = GaugeMetricFamily("graphmon_deploy_graphs_left_out",
                                 "Graphs with a deploy verdict beyond the series cap (in /status only).",
                                 labels=["rank", "reference"])
        regressed = GaugeMetricFamily("graphmon_deploy_graphs_regressed",
                                      "Graphs the deploy verdict finds regressed, with series or not.",
                                      labels=["rank", "reference"])
        now = time.time()
        cap = self.max_label_length
        for r in self.results():
            if r.reference_newest_s is not None:
                age.add_metric([r.rank, r.reference], max(0.0, now - r.reference_newest_s))
            if r.state != "ready" or r.verdict is None:
                continue
            graphs, n_left = self._graphs(r)
            left.add_metric([r.rank, r.reference], n_left)
            regressed.add_metric([r.rank, r.reference], len(r.verdict.regressions()))
            for g in graphs:
                lv = [r.rank, str(g.device), cap_label(_current_name(g), cap), r.reference]
                for kind in PAGE_KINDS:
                    reg.add_metric(lv + [kind], 1 if g.regression and g.kind == kind else 0)
                added.add_metric(lv, g.gap_added_ns * 1e-9)
                u = g.untraced_replay
                if u is not None and u.tested:
                    untraced.add_metric(lv, u.shift_ns * 1e-9)
                for s in g.streams[: self.max_streams]:
                    sl = lv[:3] + [str(s.stream_current), r.reference]
                    sreg.add_metric(sl, 1 if g.regression and g.kind in KINDS and s.flagged else 0)
                    if math.isfinite(s.shift_ns):
                        shift.add_metric(sl, s.shift_ns * 1e-9)
        yield reg
        yield sreg
        yield shift
        yield added
        yield untraced
        yield age
        yield left
        yield regressed
        dropped = CounterMetricFamily("graphmon_deploy_windows_dropped",
                                      "Windows the deploy verdict could not pool (its queue was full).")
        dropped.add_metric([], self.verdict.dropped)
        yield dropped
        forgotten = CounterMetricFamily("graphmon_deploy_ranks_forgotten",
                                        "Ranks whose pooled windows the deploy verdict dropped to stay within "
                                        "its bounds (ranks kept, pooled bytes); their successors have no reference.")
        forgotten.add_metric([], self.verdict.ranks_forgotten)
        yield forgotten
        comp = CounterMetricFamily("graphmon_deploy_computations", "Deploy verdict computations by outcome.",
                                   labels=["outcome"])
        for outcome in ("ok", "error"):
            comp.add_metric([outcome], self.verdict.computations.get(outcome, 0))
        yield comp
        state = CounterMetricFamily("graphmon_deploy_state_errors",
                                    "--state-dir files that could not be read (ignored: that rank starts without a "
                                    "reference) or written (tried again), by operation.", labels=["op"])
        errors = self.verdict.state.errors if self.verdict.state is not None else {}
        for op in STATE_ERRORS:
            state.add_metric([op], errors.get(op, 0))
        yield state


def status(verdict: DeployVerdict, live: Optional[Iterable[str]] = None, max_graphs: int = 64) -> list[dict]:
    """/status "deploy": one entry per (rank, reference) with the verdict per graph."""
    now = time.time()
    live = set(live) if live is not None else None
    out = []
    for (_, _), r in sorted(verdict.results.items()):
        if live is not None and r.current_incarnation not in live:
            continue
        graphs, n_left = _exported(r, max_graphs)
        doc = {
            "rank": r.rank, "reference": r.reference, "state": r.state, "reference_id": r.reference_id,
            "reference_pid": r.reference_pid, "current_incarnation": r.current_incarnation, "current_pid": r.current_pid,
            "reference_age_s": None if r.reference_newest_s is None else max(0.0, now - r.reference_newest_s),
            "reference_windows": r.reference_windows, "reference_replays": dict(r.reference_replays),
            "current_window": r.current_window, "current_windows": r.current_windows,
            "current_replays": dict(r.current_replays),
            "untraced": r.verdict.untraced if r.verdict is not None else None,  # absent | insufficient | measured
            "reference_untraced": dict(r.reference_untraced), "current_untraced": dict(r.current_untraced),
            "untraced_left_out": r.untraced_left_out,
            "computed_age_s": None if r.computed_s is None else max(0.0, now - r.computed_s),
            "compute_seconds": r.compute_seconds,
            "regression": bool(r.verdict is not None and r.verdict.regressions()),
            "graphs": json_safe(graphs), "graphs_left_out": n_left,
        }
        if r.error:
            doc["error"] = r.error
        if r.verdict is not None:
            doc["unmatched_reference"] = list(r.verdict.unmatched_baseline)
            doc["unmatched_current"] = list(r.verdict.unmatched_current)
        out.append(doc)
    return out
