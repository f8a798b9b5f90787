"""Helpers shared by the dashboard, alert, docker and Prometheus end-to-end tests."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DASHBOARDS = ROOT / "dashboards"
ALERTS = DASHBOARDS / "alerts.yml"
ALERTS_TEST = DASHBOARDS / "alerts_test.yml"
K8S = ROOT / "docker" / "k8s"

# CI sets this: a missing promtool/prometheus then fails the test instead of skipping it.
REQUIRE = os.environ.get("GRAPHMON_REQUIRE_PROMETHEUS") == "1"

# graphmon's exported metric families and their sample names (the contract in the lead's brief).
HISTOGRAMS = {
    "graphmon_kernel_gap_seconds",
    "graphmon_replay_gpu_seconds",
    "graphmon_replay_busy_seconds",
    "graphmon_replay_idle_seconds",
    "graphmon_launch_latency_seconds",
    "graphmon_inter_replay_gap_seconds",
    "graphmon_replay_untraced_seconds",  # issue 36: replays timed with kernel tracing off (the fleet rules)
}
OTHER_SAMPLES = {
    "graphmon_kernel_gap_negative_total",
    "graphmon_kernel_gap_quantile_seconds",
    "graphmon_replay_quantile_seconds",
    "graphmon_kernels_per_replay",
    "graphmon_replays_sampled_total",
    "graphmon_graph_info",
    "graphmon_up",
    "graphmon_collector_info",
    "graphmon_windows_total",
    "graphmon_records_total",
    "graphmon_records_dropped_total",
    "graphmon_records_invalid_total",
    "graphmon_series_folded_total",
    "graphmon_last_window_timestamp_seconds",
    "graphmon_collector_errors_total",
    "graphmon_observer_slowdown_ratio",
    # Fleet metrics (docs/dashboards.md; issue 14 items 3-4, issue 12 item 5).
    "graphmon_collector_state",
    "graphmon_graph_last_sampled_timestamp_seconds",
    "graphmon_build_info",
    "graphmon_device_info",
    "graphmon_process_info",
    "graphmon_process_last_window_timestamp_seconds",
    "graphmon_empty_windows_total",
    "graphmon_processes_lost_total",
    "graphmon_processes",
    "graphmon_label_values_truncated_total",
    "graphmon_values_out_of_range_total",
    "graphmon_kernel_tracing_seconds_total",  # issue 13: the tracing budget at work
    "graphmon_graphs",  # issue 38: graphs with and without series of their own
    # The agent's deploy verdict (graphmon/export/deploy_metrics.py)
    "graphmon_deploy_regression",
    "graphmon_deploy_stream_regression",
    "graphmon_deploy_gap_shift_seconds",
    "graphmon_deploy_gap_added_seconds",
    "graphmon_deploy_reference_age_seconds",
    "graphmon_deploy_graphs_left_out",
    "graphmon_deploy_graphs_regressed",
    "graphmon_deploy_windows_dropped_total",
    "graphmon_deploy_ranks_forgotten_total",
    "graphmon_deploy_computations_total",
    "graphmon_deploy_state_errors_total",
    "graphmon_process_start_time_seconds",  # the fleet verdict's newest build (dashboards/alerts.yml graphmon-fleet)
    # The agent's own (issues 28 item 2, 31): liveness from the start, what it refused or dropped.
    "graphmon_agent_up",
    "graphmon_agent_expects_processes",
    "graphmon_agent_connections_rejected_total",
    "graphmon_agent_frames_rejected_total",
    "graphmon_agent_windows_dropped_total",
    "graphmon_agent_ranks_dropped_total",
    "graphmon_agent_connections",
    "graphmon_agent_buffered_bytes",
    "graphmon_agent_trace_store_bytes",
    "graphmon_link_windows_dropped_total",
    "graphmon_link_reconnects_total",
}
CONTRACT_SAMPLES = OTHER_SAMPLES | {h + suffix for h in HISTOGRAMS for suffix in ("_bucket", "_sum", "_count")}

# graphmon's own metrics; not a recorded series (``fleet:graphmon_replays:rate5m``: the rules' own)
METRIC_RE = re.compile(r"(?<![:a-zA-Z0-9_])graphmon_[a-zA-Z0-9_]+(?![a-zA-Z0-9_:])")


def require_binary(name: str) -> str:
    path = shutil.which(name)
    if path:
        return path
    msg = f"{name} not found (Debian package 'prometheus'; ./scripts/test.sh installs it)"
    if REQUIRE:
        pytest.fail(msg + " and GRAPHMON_REQUIRE_PROMETHEUS=1")
    pytest.skip(msg)


def promtool(*args: str, cwd: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([require_binary("promtool"), *args], cwd=cwd, capture_output=True, text=True, timeout=timeout)


def load_dashboards() -> dict[str, dict[str, Any]]:
    return {p.name: json.loads(p.read_text()) for p in sorted(DASHBOARDS.glob("*.json"))}


def iter_panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from iter_panels(panel.get("panels", []))  # collapsed rows nest their panels


def panel_targets(model: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(panel title, refId, expr) of every Prometheus query target of a dashboard."""
    out = []
    for panel in iter_panels(model["panels"]):
        for t in panel.get("targets", []):
            out.append((panel["title"], t["refId"], t["expr"]))
    return out


def variable_names(model: dict[str, Any]) -> list[str]:
    return [v["name"] for v in model["templating"]["list"]]


def expand(expr: str, names: list[str], rate_interval: str = "30s") -> str:
    """What Grafana sends with every variable at "All" (``.*``) and a fixed rate interval.
    Only the dashboard's own variable names are replaced: ``"$1"`` in label_replace stays."""
    expr = expr.replace("$__rate_interval", rate_interval)
    for name in sorted(names, key=len, reverse=True):
        expr = expr.replace("${" + name + "}", ".*").replace("$" + name, ".*")
    assert "$__" not in expr, f"unexpanded Grafana macro in {expr!r}"
    return expr


def referenced_metrics(expr: str) -> set[str]:
    return set(METRIC_RE.findall(expr))


def family_of(sample_name: str) -> str:
    for suffix in ("_bucket", "_sum", "_count"):
        if sample_name.endswith(suffix) and sample_name[: -len(suffix)] in HISTOGRAMS:
            return sample_name[: -len(suffix)]
    return sample_name


def load_alert_rules() -> list[dict[str, Any]]:
    """The alerting rules (recording rules: :func:`load_recording_rules`)."""
    doc = yaml.safe_load(ALERTS.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"] if "alert" in rule]


def load_recording_rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(ALERTS.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"] if "record" in rule]


def load_script(path: Path, name: str):
    """A generator script (dashboards/generate.py, docker/k8s/generate.py) loaded as a module."""
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
