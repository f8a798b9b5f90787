#!/usr/bin/env python3
"""Generate graphmon's Grafana dashboards (JSON) from one place, so panels stay consistent.

Usage:
    python dashboards/generate.py          # (re)write dashboards/*.json
    python dashboards/generate.py --check  # exit 1 if a committed JSON differs from what this makes

The committed JSON is what users import and what Grafana's file provisioning loads; tests check it
is up to date and run every panel query against a real Prometheus scraping ``graphmon serve``.

Conventions:
- The data source is a ``datasource`` template variable (file provisioning does not resolve
  ``__inputs``), so every panel and variable points at ``${datasource}``.
- Template variables (job, instance, namespace, pod, then rank, device, graph, upload_mode,
  stream) are multi-select regex matchers with ``.*`` as "All", so a query with every variable at
  "All" sees every series; ``namespace=~".*"`` also matches series without the label (outside
  Kubernetes). Every selector carries the host variables, and every aggregation keeps ``job,
  instance``, so two pods never merge and legends say which instance a line comes from.
- Upload modes are told apart by the ``upload_mode`` label only, never by graph names.
- Why not grafana-foundation-sdk: see docs/dashboards.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

DS = {"type": "prometheus", "uid": "${datasource}"}
RATE = "$__rate_interval"

# Where a series comes from: Prometheus's job and instance, and the pod's namespace and name
# (PodMonitor adds them; absent elsewhere, where ".*" still matches).
HOST_VARS = ("job", "instance", "namespace", "pod")
HOST_SEL = ", ".join(f'{v}=~"${v}"' for v in HOST_VARS)
HOST_BY = "job, instance"
RANK_SEL = HOST_SEL + ', rank=~"$rank"'
GRAPH_SEL = RANK_SEL + ', device=~"$device", graph=~"$graph", upload_mode=~"$upload_mode"'
STREAM_SEL = GRAPH_SEL + ', stream=~"$stream"'
# For uploaded-vs-lazy comparisons, which pick the upload mode themselves.
STREAM_SEL_ANY_MODE = RANK_SEL + ', device=~"$device", graph=~"$graph", stream=~"$stream"'
UPLOADED = 'upload_mode=~"uploaded|instantiate_upload"'
WHERE = "{{instance}} r{{rank}}"  # every legend says which instance and rank


def mean_per(metric: str, by: str, sel: str) -> str:
    """Mean observation of histogram ``metric`` over the rate window, grouped ``by``."""
    return (
        f"sum by ({by}) (rate({metric}_sum{{{sel}}}[{RATE}]))\n"
        f"/\nsum by ({by}) (rate({metric}_count{{{sel}}}[{RATE}]))"
    )


def hist_quantile(q: str, metric: str, by: str, sel: str) -> str:
    return f"histogram_quantile({q}, sum by (le, {by}) (rate({metric}_bucket{{{sel}}}[{RATE}])))"


def or_zero(expr: str, by: str, present: str = f"graphmon_up{{{RANK_SEL}}}") -> str:
    """``expr``, or 0 per ``by`` group of the always-present series ``present``: a counter with a
    label such as ``reason`` has no series until its first increment, and "0 errors" should read
    0, not "No data"."""
    return f"({expr})\nor\nsum by ({by}) (0 * {present})"


# --- panel builders -------------------------------------------------------------------------


# Series of lazily uploaded graphs (legends carry "[lazy]") are drawn dashed, so uploaded and
# lazy twins read apart at a glance in every time series panel.
LAZY_DASHED = {
    "matcher": {"id": "byRegexp", "options": ".*\\[lazy\\].*"},
    "properties": [{"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 6]}}],
}


class Layout:
    """Places panels left to right on Grafana's 24-column grid, wrapping rows."""

    def __init__(self) -> None:
        self.x = 0
        self.y = 0
        self.row_h = 0
        self.next_id = 1

    def place(self, w: int, h: int) -> dict[str, int]:
        if self.x + w > 24:
            self.x, self.y, self.row_h = 0, self.y + self.row_h, 0
        pos = {"x": self.x, "y": self.y, "w": w, "h": h}
        self.x += w
        self.row_h = max(self.row_h, h)
        return pos

    def new_id(self) -> int:
        self.next_id += 1
        return self.next_id - 1


def target(expr: str, legend: str = "", *, ref: str = "A", instant: bool = False, fmt: str = "time_series") -> dict[str, Any]:
    return {
        "datasource": DS,
        "refId": ref,
        "expr": expr,
        "legendFormat": legend or "__auto",
        "range": not instant,
        "instant": instant,
        "format": fmt,
        "editorMode": "code",
    }


def targets(*pairs: tuple[str, str]) -> list[dict[str, Any]]:
    return [target(expr, legend, ref=chr(ord("A") + i)) for i, (expr, legend) in enumerate(pairs)]


def row(layout: Layout, title: str) -> dict[str, Any]:
    if layout.x:
        layout.x, layout.y, layout.row_h = 0, layout.y + layout.row_h, 0
    pos = layout.place(24, 1)
    layout.x, layout.y, layout.row_h = 0, layout.y + 1, 0
    return {"type": "row", "id": layout.new_id(), "title": title, "collapsed": False, "gridPos": pos, "panels": []}


def timeseries(layout: Layout, title: str, description: str, tgts: list[dict[str, Any]], *, unit: str = "s",
               w: int = 12, h: int = 8, min_value: float | None = 0) -> dict[str, Any]:
    defaults: dict[str, Any] = {"unit": unit, "custom": {"drawStyle": "line", "lineWidth": 1, "showPoints": "never"}}
    if min_value is not None:
        defaults["min"] = min_value
    return {
        "type": "timeseries",
        "id": layout.new_id(),
        "title": title,
        "description": description,
        "datasource": DS,
        "gridPos": layout.place(w, h),
        "fieldConfig": {"defaults": defaults, "overrides": [LAZY_DASHED]},
        "options": {
            "legend": {"displayMode": "table", "placement": "bottom", "calcs": ["lastNotNull", "max"]},
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
        "targets": tgts,
    }


def heatmap(layout: Layout, title: str, description: str, expr: str, *, w: int = 12, h: int = 8) -> dict[str, Any]:
    return {
        "type": "heatmap",
        "id": layout.new_id(),
        "title": title,
        "description": description,
        "datasource": DS,
        "gridPos": layout.place(w, h),
        "fieldConfig": {"defaults": {"custom": {"scaleDistribution": {"type": "linear"}}}, "overrides": []},
        "options": {
            # Prometheus already bucketed the data: Grafana must not re-bucket it.
            "calculate": False,
            "yAxis": {"unit": "s", "axisPlacement": "left"},
            "rowsFrame": {"layout": "le"},
            "color": {"mode": "scheme", "scheme": "Oranges", "exponent": 0.5, "fill": "dark-orange"},
            "cellGap": 1,
            "tooltip": {"show": True, "yHistogram": True},
        },
        "targets": [dict(target(expr, "{{le}}"), format="heatmap")],
    }


def stat(layout: Layout, title: str, description: str, expr: str, legend: str, *, unit: str = "none",
         w: int = 6, h: int = 4, thresholds: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {
        "type": "stat",
        "id": layout.new_id(),
        "title": title,
        "description": description,
        "datasource": DS,
        "gridPos": layout.place(w, h),
        "fieldConfig": {
            "defaults": {
                "unit": unit,
                "thresholds": {"mode": "absolute", "steps": thresholds or [{"color": "green", "value": None}]},
            },
            "overrides": [],
        },
        "options": {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                    "colorMode": "background", "graphMode": "none", "textMode": "value_and_name"},
        "targets": [target(expr, legend)],
    }


def table(layout: Layout, title: str, description: str, expr: str, *, w: int = 24, h: int = 7) -> dict[str, Any]:
    return {
        "type": "table",
        "id": layout.new_id(),
        "title": title,
        "description": description,
        "datasource": DS,
        "gridPos": layout.place(w, h),
        "fieldConfig": {"defaults": {}, "overrides": []},
        "options": {"showHeader": True},
        # format=table gives one row per series with its labels as columns; hide the constant
        # value and the timestamp.
        "transformations": [
            {"id": "organize", "options": {"excludeByName": {"Time": True, "Value": True, "__name__": True}}},
        ],
        "targets": [target(expr, "", instant=True, fmt="table")],
    }


# --- template variables ---------------------------------------------------------------------


def datasource_var() -> dict[str, Any]:
    return {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
            "current": {}, "hide": 0, "refresh": 1, "regex": "", "options": []}


def query_var(name: str, label: str, query: str) -> dict[str, Any]:
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DS,
        "definition": query,
        "query": {"query": query, "refId": f"var-{name}", "qryType": 1},
        "refresh": 2,  # on time-range change: graphs come and go as the server restarts
        "includeAll": True,
        "allValue": ".*",
        "multi": True,
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "sort": 1,
        "hide": 0,
        "regex": "",
        "options": [],
    }


def dashboard(uid: str, title: str, description: str, variables: list[dict[str, Any]], panels: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": ["graphmon", "cuda-graphs"],
        "timezone": "browser",
        "editable": True,
        "graphTooltip": 1,  # shared crosshair: compare gap, replay and health panels at one instant
        "refresh": "10s",
        "schemaVersion": 39,
        "version": 1,
        "time": {"from": "now-1h", "to": "now"},
        "templating": {"list": [datasource_var(), *variables]},
        "annotations": {"list": []},
        "links": [{"title": "graphmon dashboards", "type": "dashboards", "tags": ["graphmon"], "asDropdown": True}],
        "panels": panels,
    }


# --- the dashboards -------------------------------------------------------------------------


# Every graphmon endpoint exports one of these from the start: graphmon_up (serve, in-process)
# or graphmon_agent_up (an agent, also before any process attached).
LIVENESS = '__name__=~"graphmon_up|graphmon_agent_up"'


def host_vars() -> list[dict[str, Any]]:
    """job, instance, namespace, pod: each narrowed by the ones before it."""
    out, sel = [], [LIVENESS]
    for name, label in (("job", "Job"), ("instance", "Instance"), ("namespace", "Namespace"), ("pod", "Pod")):
        inner = "{" + ", ".join(sel) + "}"
        out.append(query_var(name, label, f"label_values({inner}, {name})"))
        sel.append(f'{name}=~"${name}"')
    return out


def rank_var() -> dict[str, Any]:
    return query_var("rank", "Rank", f"label_values(graphmon_up{{{HOST_SEL}}}, rank)")


def decode_dashboard() -> dict[str, Any]:
    lay = Layout()
    p: list[dict[str, Any]] = []
    gauge_gap = "graphmon_kernel_gap_quantile_seconds"
    legend_stream = "{{graph}} s{{stream}} [{{upload_mode}}] " + WHERE + "/d{{device}}"
    legend_graph = "{{graph}} [{{upload_mode}}] " + WHERE + "/d{{device}}"
    by_graph = f"{HOST_BY}, rank, device, graph, upload_mode"
    by_dev = f"{HOST_BY}, rank, device"
    by_rank = f"{HOST_BY}, rank"

    p.append(row(lay, "Kernel gaps (gap = next kernel start - previous kernel end, same replay and stream)"))
    p.append(timeseries(lay, "Median kernel gap per stream (last window)",
                        "Exact median of the gaps of the last collector window, per graph, stream and upload mode.",
                        targets((f'{gauge_gap}{{quantile="0.5", {STREAM_SEL}}}', legend_stream))))
    p.append(timeseries(lay, "p90 kernel gap per stream (last window)",
                        "Exact 90th percentile of the gaps of the last collector window.",
                        targets((f'{gauge_gap}{{quantile="0.9", {STREAM_SEL}}}', legend_stream))))
    p.append(timeseries(lay, "Kernel gap by upload mode (histogram, rate window)",
                        "Quantiles estimated from the gap histogram over the rate window, all selected graphs "
                        "and streams pooled per instance and upload mode. Bucket-resolution estimates; the per-window panels above are exact.",
                        targets(
                            (hist_quantile("0.5", "graphmon_kernel_gap_seconds", f"{HOST_BY}, upload_mode", STREAM_SEL),
                             "p50 [{{upload_mode}}] {{instance}}"),
                            (hist_quantile("0.99", "graphmon_kernel_gap_seconds", f"{HOST_BY}, upload_mode", STREAM_SEL),
                             "p99 [{{upload_mode}}] {{instance}}"),
                        )))
    p.append(heatmap(lay, "Kernel gap distribution (heatmap)",
                     "Gaps per second in each histogram bucket, all selected instances pooled (narrow with the "
                     "instance variable). Overlaps (negative gaps) are counted apart, not here.",
                     f"sum by (le) (rate(graphmon_kernel_gap_seconds_bucket{{{STREAM_SEL}}}[{RATE}]))"))
    uploaded_median = f'avg by ({by_dev}) ({gauge_gap}{{quantile="0.5", {UPLOADED}, {STREAM_SEL_ANY_MODE}}})'
    lazy_median = f'avg by ({by_dev}) ({gauge_gap}{{quantile="0.5", upload_mode="lazy", {STREAM_SEL_ANY_MODE}}})'
    uploaded_mean = mean_per("graphmon_kernel_gap_seconds", by_dev, f"{UPLOADED}, {STREAM_SEL_ANY_MODE}")
    lazy_mean = mean_per("graphmon_kernel_gap_seconds", by_dev, 'upload_mode="lazy", ' + STREAM_SEL_ANY_MODE)
    p.append(timeseries(lay, "Uploaded / lazy kernel gap ratio",
                        "Below 1: uploading graphs before launch shortens gaps. Where one process (rank, device) runs "
                        "graphs in both upload modes (the upload_mode label; graph names play no part): the mean over "
                        "graphs and streams of the last-window median gap, uploaded / lazy; and the mean gap from the "
                        "histograms over the rate window. Empty where a process runs one mode only.",
                        targets(
                            (f"{uploaded_median}\n/ on ({by_dev})\n{lazy_median}", "last-window medians " + WHERE + "/d{{device}}"),
                            (f"({uploaded_mean})\n/ on ({by_dev})\n({lazy_mean})", "histogram means " + WHERE + "/d{{device}}"),
                        ), unit="none", min_value=None))
    p.append(timeseries(lay, "Negative gaps (overlapping kernels) per second",
                        "Kernels that started before the previous kernel on the same stream ended (not in the gap "
                        "histogram). 0 while none happen.",
                        targets((or_zero(f"sum by ({by_graph}) (rate(graphmon_kernel_gap_negative_total{{{STREAM_SEL}}}[{RATE}]))",
                                         by_graph, f"graphmon_replays_sampled_total{{{GRAPH_SEL}}}"),
                                 legend_graph)), unit="ops"))

    p.append(row(lay, "Replays (span = first kernel start to last kernel end of one replay)"))
    p.append(timeseries(lay, "Replay GPU time, busy and idle (median, last window)",
                        "gpu: replay span; busy: union of kernel execution; idle = gpu - busy.",
                        targets(
                            (f'graphmon_replay_quantile_seconds{{quantile="0.5", kind=~"gpu|busy|idle", {GRAPH_SEL}}}',
                             "{{graph}} {{kind}} p50 [{{upload_mode}}] " + WHERE + "/d{{device}}"),
                            (f'graphmon_replay_quantile_seconds{{quantile="0.99", kind="gpu", {GRAPH_SEL}}}',
                             "{{graph}} gpu p99 [{{upload_mode}}] " + WHERE + "/d{{device}}"),
                        )))
    untraced = "graphmon_replay_untraced_seconds"
    p.append(timeseries(lay, "Replay time UNTRACED (CUDA events, kernel tracing off) vs traced span",
                        "Untraced: graph replays timed by CUDA events recorded in the launch callbacks around the "
                        "launch while kernel tracing is off (bursts between windows): it includes the event records "
                        "and the launch latency from the enter callback to the first kernel, not tracing's cost. "
                        "Mean from _sum/_count and p90 from the histogram over the rate window. Traced span: first "
                        "kernel start to last kernel end with CUPTI tracing on (mean over the rate window), slower "
                        "by the observer effect. Compare each line with itself over time, not the two kinds.",
                        targets(
                            (mean_per(untraced, by_graph, GRAPH_SEL), "untraced mean {{graph}} [{{upload_mode}}] " + WHERE),
                            (hist_quantile("0.9", untraced, by_graph, GRAPH_SEL),
                             "untraced p90 {{graph}} [{{upload_mode}}] " + WHERE),
                            (mean_per("graphmon_replay_gpu_seconds", by_graph, GRAPH_SEL),
                             "traced span mean {{graph}} [{{upload_mode}}] " + WHERE),
                        )))
    p.append(timeseries(lay, "Idle per replay attributable to gaps",
                        "Mean idle time per replay (no kernel running on any stream between the replay's first start "
                        "and last end: the cost of gaps), next to the sum of all per-stream kernel gaps per replay "
                        "(larger when streams' gaps do not overlap each other's kernels).",
                        targets(
                            (mean_per("graphmon_replay_idle_seconds", by_graph, GRAPH_SEL),
                             "idle/replay {{graph}} [{{upload_mode}}] " + WHERE),
                            (f"sum by ({by_graph}) (rate(graphmon_kernel_gap_seconds_sum{{{GRAPH_SEL}}}[{RATE}]))\n/\n"
                             f"sum by ({by_graph}) (rate(graphmon_replay_gpu_seconds_count{{{GRAPH_SEL}}}[{RATE}]))",
                             "sum of gaps/replay {{graph}} [{{upload_mode}}] " + WHERE),
                        )))
    p.append(timeseries(lay, "Idle share of replay GPU time",
                        "Idle time / replay span over the rate window: the fraction of a replay the GPU waits between kernels.",
                        targets((f"sum by ({by_graph}) (rate(graphmon_replay_idle_seconds_sum{{{GRAPH_SEL}}}[{RATE}]))\n/\n"
                                 f"sum by ({by_graph}) (rate(graphmon_replay_gpu_seconds_sum{{{GRAPH_SEL}}}[{RATE}]))",
                                 legend_graph)), unit="percentunit"))
    p.append(timeseries(lay, "Kernels per replay (median, last window)", "",
                        targets((f"graphmon_kernels_per_replay{{{GRAPH_SEL}}}", legend_graph)), unit="none"))
    p.append(timeseries(lay, "Replays sampled per second", "Replays whose kernels the collector timed.",
                        targets((f"sum by ({by_graph}) (rate(graphmon_replays_sampled_total{{{GRAPH_SEL}}}[{RATE}]))",
                                 legend_graph)), unit="ops"))
    replay_q = "graphmon_replay_quantile_seconds"
    p.append(timeseries(lay, "Launch latency (CPU launch to first kernel start, last window)",
                        "Exact quantiles of the last window. Only where the launch time is known (live CUPTI, Kineto "
                        "traces); no data for recorded traces without launches.",
                        targets(
                            (f'{replay_q}{{kind="launch_latency", quantile="0.5", {GRAPH_SEL}}}',
                             "p50 {{graph}} [{{upload_mode}}] " + WHERE),
                            (f'{replay_q}{{kind="launch_latency", quantile="0.99", {GRAPH_SEL}}}',
                             "p99 {{graph}} [{{upload_mode}}] " + WHERE),
                        )))
    p.append(timeseries(lay, "Gap between replays (last window)",
                        "Previous replay's last kernel end to the next replay's first kernel start, same graph: host-side "
                        "time between decode steps. Exact quantiles of the last window.",
                        targets(
                            (f'{replay_q}{{kind="inter_replay_gap", quantile="0.5", {GRAPH_SEL}}}',
                             "p50 {{graph}} [{{upload_mode}}] " + WHERE),
                            (f'{replay_q}{{kind="inter_replay_gap", quantile="0.9", {GRAPH_SEL}}}',
                             "p90 {{graph}} [{{upload_mode}}] " + WHERE),
                        )))

    # Rank skew (issue 17, CPU side): the ranks of one agent (a tensor-parallel group in one pod
    # or host) side by side; GraphmonRankIdleSkew fires on the ratio panel's condition.
    idle_by_rank = f'avg by ({by_rank}) (graphmon_replay_quantile_seconds{{quantile="0.5", kind="idle", {GRAPH_SEL}}})'
    p.append(row(lay, "Rank skew (the ranks behind one agent side by side)"))
    p.append(timeseries(lay, "Replay span per rank (median, last window)",
                        "Median replay GPU time per rank, averaged over the selected graphs.",
                        targets((f'avg by ({by_rank}) (graphmon_replay_quantile_seconds{{quantile="0.5", kind="gpu", {GRAPH_SEL}}})',
                                 WHERE)), w=8))
    p.append(timeseries(lay, "Idle per replay per rank (median, last window)",
                        "Median GPU idle time per replay per rank, averaged over the selected graphs.",
                        targets((idle_by_rank, WHERE)), w=8))
    p.append(timeseries(lay, "Idle per rank / median of its peers",
                        "Each rank's idle per replay over the median of the ranks of the same instance: 1 when "
                        "balanced; GraphmonRankIdleSkew fires above 1.5 (and 2 us) for 15 minutes.",
                        targets((f"{idle_by_rank}\n/ on ({HOST_BY}) group_left\nquantile by ({HOST_BY}) (0.5, {idle_by_rank})",
                                 WHERE)), unit="none", w=8, min_value=None))

    # The agent's deploy verdict (issue 27): the process that took over a rank against the one
    # before it, or against a pinned baseline. No upload_mode label: selected by rank, device,
    # graph and stream only. GraphmonDeployRegression fires on the table's rows.
    deploy_sel = RANK_SEL + ', device=~"$device", graph=~"$graph"'
    legend_ref = "{{graph}} vs {{reference}} " + WHERE + "/d{{device}}"
    p.append(row(lay, "Deploy verdict (after a restart: the new process of a rank against the previous one)"))
    p.append(table(lay, "Deploy regressions now", "One row per graph that regressed against its reference "
                   "(previous process, or the pinned baseline) and its kind: uniform (every gap), concentrated or mixed "
                   "(a few boundaries). GET /status on the agent (\"deploy\") names the boundaries and kernels.",
                   f"graphmon_deploy_regression{{{deploy_sel}}} == 1", w=12, h=8))
    p.append(timeseries(lay, "Gap added per replay by the deploy",
                        "Summed median shift of the boundaries the verdict names (widened ones; moved ones when "
                        "uniform): gap time each replay gained against the reference. 0 after a restart without change.",
                        targets((f"graphmon_deploy_gap_added_seconds{{{deploy_sel}}}", legend_ref))))
    p.append(timeseries(lay, "Median gap shift per stream after the deploy",
                        "Shift of the median per-replay median gap of each stream against the reference (graphmon "
                        "compare's statistic; its 95% interval is in /status).",
                        targets((f'graphmon_deploy_gap_shift_seconds{{{deploy_sel}, stream=~"$stream"}}',
                                 "{{graph}} s{{stream}} vs {{reference}} " + WHERE)), min_value=None))
    p.append(timeseries(lay, "Deploy reference age",
                        "Seconds since the reference's newest window: how old the previous process's (or the pinned) "
                        "windows are that the current process is compared with.",
                        targets((f"graphmon_deploy_reference_age_seconds{{{RANK_SEL}}}", "{{reference}} " + WHERE))))

    p.append(row(lay, "Graphs"))
    p.append(table(lay, "Graphs seen", "One row per graph exec: key, label, upload mode, batch size, whether it was "
                   "uploaded on its launch stream, and its structural signature (kernels, streams, nodes without a "
                   "kernel, kernel-name hash).", f"graphmon_graph_info{{{GRAPH_SEL}}}"))

    variables = [
        *host_vars(),
        rank_var(),
        query_var("device", "Device", f'label_values(graphmon_graph_info{{{RANK_SEL}}}, device)'),
        query_var("graph", "Graph", f'label_values(graphmon_graph_info{{{RANK_SEL}, device=~"$device"}}, graph)'),
        query_var("upload_mode", "Upload mode",
                  f'label_values(graphmon_graph_info{{{RANK_SEL}, device=~"$device", graph=~"$graph"}}, upload_mode)'),
        query_var("stream", "Stream", f"label_values(graphmon_kernel_gap_quantile_seconds{{{GRAPH_SEL}}}, stream)"),
    ]
    return dashboard("graphmon-decode", "graphmon / CUDA graph decode timing",
                     "Kernel gaps and replay timing of CUDA graphs, per graph, stream and upload mode.", variables, p)


def health_dashboard() -> dict[str, Any]:
    lay = Layout()
    p: list[dict[str, Any]] = []
    by_rank = f"{HOST_BY}, rank"
    red_below_1 = [{"color": "red", "value": None}, {"color": "green", "value": 1}]
    p.append(stat(lay, "Collector up", "1 while data flows from the rank's collector; 0 while it is starting, blocked, "
                  "degraded, stopped or failing (see the state panel).",
                  f"min by ({by_rank}) (graphmon_up{{{RANK_SEL}}})", WHERE, thresholds=red_below_1))
    p.append(stat(lay, "Time since last window", "Seconds since the last analysis window closed. Grows when the collector stalls.",
                  f"time() - max by ({by_rank}) (graphmon_last_window_timestamp_seconds{{{RANK_SEL}}})", WHERE, unit="s",
                  thresholds=[{"color": "green", "value": None}, {"color": "orange", "value": 60}, {"color": "red", "value": 300}]))
    p.append(stat(lay, "Observer slowdown", "Replay time inside a sampling window / outside it (1.0 = no overhead). "
                  "Absent where unknown, e.g. replayed traces.",
                  f"max by ({by_rank}) (graphmon_observer_slowdown_ratio{{{RANK_SEL}}})", WHERE, unit="none",
                  thresholds=[{"color": "green", "value": None}, {"color": "orange", "value": 1.05}, {"color": "red", "value": 1.2}]))
    p.append(stat(lay, "Series folded into \"other\"", "Graphs beyond the series cap are exported as graph=\"other\"; raise the cap if this grows.",
                  f"sum by ({by_rank}) (graphmon_series_folded_total{{{RANK_SEL}}})", WHERE,
                  thresholds=[{"color": "green", "value": None}, {"color": "orange", "value": 1}]))
    p.append(stat(lay, "Graphs without series of their own", "Graphs of the rank beyond its detail graphs (the ones "
                  "the GPU spends most time in, --detail-graphs; all graphs at --cardinality full): counted here, their "
                  "figures in /status and /graphs.",
                  f'sum by ({by_rank}) (graphmon_graphs{{detail="false", {RANK_SEL}}})', WHERE,
                  thresholds=[{"color": "green", "value": None}]))
    p.append(table(lay, "Collector state", "Current state per instance and rank: running, starting (no graph launched "
                   "yet), blocked (another CUPTI subscriber such as a profiler: a warning, not a failure), degraded, "
                   "stopped, error. GET /status on the agent gives the reason.",
                   f"graphmon_collector_state{{{RANK_SEL}}} == 1", h=5))
    p.append(timeseries(lay, "Windows per second", "Analysis windows closed per second.",
                        targets((f"sum by ({by_rank}) (rate(graphmon_windows_total{{{RANK_SEL}}}[{RATE}]))", WHERE)), unit="ops"))
    p.append(timeseries(lay, "Kernel records per second", "Records analysed and records dropped (buffer full) per second.",
                        targets(
                            (f"sum by ({by_rank}) (rate(graphmon_records_total{{{RANK_SEL}}}[{RATE}]))", "records " + WHERE),
                            (f"sum by ({by_rank}) (rate(graphmon_records_dropped_total{{{RANK_SEL}}}[{RATE}]))", "dropped " + WHERE),
                        ), unit="ops"))
    p.append(timeseries(lay, "Dropped record share", "Dropped / (analysed + dropped) over the rate window. Any drop biases gap statistics.",
                        targets((f"sum by ({by_rank}) (rate(graphmon_records_dropped_total{{{RANK_SEL}}}[{RATE}]))\n/\n"
                                 f"(sum by ({by_rank}) (rate(graphmon_records_total{{{RANK_SEL}}}[{RATE}]))\n"
                                 f" + sum by ({by_rank}) (rate(graphmon_records_dropped_total{{{RANK_SEL}}}[{RATE}])))",
                                 WHERE)), unit="percentunit"))
    p.append(timeseries(lay, "Invalid records by reason", "Kernel records excluded by validation (zero start, end before start, duplicate ...) per second.",
                        targets((or_zero(f"sum by ({by_rank}, reason) (rate(graphmon_records_invalid_total{{{RANK_SEL}}}[{RATE}]))", by_rank),
                                 "{{reason}} " + WHERE)), unit="ops"))
    p.append(timeseries(lay, "Collector errors by stage", "Errors caught inside the collector (it never raises into the serving process), per stage.",
                        targets((or_zero(f"sum by ({by_rank}, stage) (increase(graphmon_collector_errors_total{{{RANK_SEL}}}[{RATE}]))", by_rank),
                                 "{{stage}} " + WHERE)), unit="none"))
    p.append(timeseries(lay, "Observer slowdown over time", "Replay time inside a sampling window / outside it.",
                        targets((f"graphmon_observer_slowdown_ratio{{{RANK_SEL}}}", WHERE)), unit="none", min_value=None))
    p.append(timeseries(lay, "Share of time traced", "Share of the time CUPTI kernel tracing was on (the GPU ran "
                        "observed, slower by the observer slowdown). The tracing budget max_traced_share bounds it "
                        "(0.05% by default) unless max_interval_s or a POST /capture asks for more.",
                        targets((f"sum by ({by_rank}) (rate(graphmon_kernel_tracing_seconds_total{{{RANK_SEL}}}[{RATE}]))",
                                 WHERE)), unit="percentunit"))

    # Processes (issue 12 item 5): one agent, many processes; silent emptiness is counted here.
    p.append(row(lay, "Processes (one agent per pod or host; each process that replays graphs attaches to it)"))
    p.append(stat(lay, "Processes attached", "Processes attached to each agent (any state but stopped or lost). "
                  "An agent exports this from the start, so an agent nobody attached to reads 0, not No data; "
                  "0 for 10 minutes fires GraphmonNoProcessAttached.",
                  f'sum by ({HOST_BY}) (graphmon_processes{{{HOST_SEL}, state!~"stopped|lost"}})', "{{instance}}",
                  thresholds=red_below_1, h=6))
    p.append(timeseries(lay, "Agent: refused, rejected and dropped", "Over the rate window: connections the agent "
                        "refused by reason (uid, too_many_processes, hello_timeout ...), frames that failed "
                        "validation by reason, windows the agent did not ingest per rank (queue_full, memory, "
                        "invalid), and windows a rank's collector dropped before sending and its reconnects.",
                        targets(
                            (f"sum by ({HOST_BY}, reason) (increase(graphmon_agent_connections_rejected_total{{{HOST_SEL}}}[{RATE}]))",
                             "refused {{reason}} {{instance}}"),
                            (f"sum by ({HOST_BY}, reason) (increase(graphmon_agent_frames_rejected_total{{{HOST_SEL}}}[{RATE}]))",
                             "bad frame {{reason}} {{instance}}"),
                            (f"sum by ({by_rank}, reason) (increase(graphmon_agent_windows_dropped_total{{{RANK_SEL}}}[{RATE}]))",
                             "agent dropped {{reason}} " + WHERE),
                            (f"sum by ({by_rank}) (increase(graphmon_link_windows_dropped_total{{{RANK_SEL}}}[{RATE}]))",
                             "collector dropped " + WHERE),
                            (f"sum by ({by_rank}) (increase(graphmon_link_reconnects_total{{{RANK_SEL}}}[{RATE}]))",
                             "reconnects " + WHERE),
                        ), unit="none", w=18, h=6))
    p.append(table(lay, "Processes", "Every attached process: rank, pid, physical device, host and state.",
                   f"graphmon_process_info{{{RANK_SEL}}}", h=6))
    p.append(timeseries(lay, "Last window age per process", "Seconds since each process's last window reached the agent.",
                        targets((f"time() - graphmon_process_last_window_timestamp_seconds{{{RANK_SEL}}}", WHERE + " pid {{pid}}")),
                        unit="s", w=8))
    p.append(timeseries(lay, "Empty windows by reason", "no_records: a window saw graph launches and kept no record; "
                        "no_windows: a process replays graphs but produced no window within 3 intervals. "
                        "GraphmonNoData pages when they keep coming with no record.",
                        targets((f"sum by ({by_rank}, reason) (increase(graphmon_empty_windows_total{{{RANK_SEL}}}[{RATE}]))",
                                 "{{reason}} " + WHERE)), unit="none", w=8))
    p.append(timeseries(lay, "Processes by state and lost", "Attached processes per state, and processes the agent lost "
                        "(connection dropped, heartbeats stopped) over the rate window.",
                        targets(
                            (f"sum by ({HOST_BY}, state) (graphmon_processes{{{HOST_SEL}}})", "{{state}} {{instance}}"),
                            (f"sum by ({HOST_BY}) (increase(graphmon_processes_lost_total{{{HOST_SEL}}}[{RATE}]))", "lost {{instance}}"),
                        ), unit="none", w=8))
    p.append(row(lay, "Versions and devices"))
    p.append(table(lay, "Build", "graphmon, torch, CUDA driver and runtime, libcupti and engine versions per agent.",
                   f"graphmon_build_info{{{HOST_SEL}}}", h=5))
    p.append(table(lay, "Devices", "Physical GPU per rank: UUID (join with dcgm-exporter on UUID), PCI bus id, name, host.",
                   f"graphmon_device_info{{{RANK_SEL}}}", h=6))
    p.append(table(lay, "Collector", "Backend and version per rank.", f"graphmon_collector_info{{{RANK_SEL}}}", h=5))
    variables = [*host_vars(), rank_var()]
    return dashboard("graphmon-health", "graphmon / collector health",
                     "Is graphmon collecting, in which processes, how much, what it drops or rejects, and what it costs the host.",
                     variables, p)


def build() -> dict[str, dict[str, Any]]:
    """File name -> dashboard JSON model."""
    return {"graphmon-decode.json": decode_dashboard(), "graphmon-health.json": health_dashboard()}


def render(model: dict[str, Any]) -> str:
    return json.dumps(model, indent=2, sort_keys=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="fail if the committed JSON is not what this generates")
    ap.add_argument("--out", type=Path, default=HERE, help="output folder (default: dashboards/)")
    args = ap.parse_args(argv)
    texts = {name: render(model) for name, model in build().items()}
    return write_or_check(texts, args.out, args.check, "python dashboards/generate.py")


def write_or_check(texts: dict[str, str], out: Path, check: bool, regen: str) -> int:
    """Write each generated file into ``out``; with ``check``, write nothing and fail (1) when a
    committed file differs. docker/k8s/generate.py shares it."""
    stale = []
    for name, text in texts.items():
        path = out / name
        if check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
    if stale:
        print(f"out of date: {', '.join(stale)}; run {regen}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
