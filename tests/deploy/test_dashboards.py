"""The Grafana dashboards: generated JSON is current, well-formed, and every query parses.

Whether every query returns data against a live graphmon is tests/test_prometheus_e2e.py.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import yaml

from _promutil import (
    CONTRACT_SAMPLES,
    DASHBOARDS,
    expand,
    iter_panels,
    load_dashboards,
    load_alert_rules,
    load_script,
    panel_targets,
    promtool,
    referenced_metrics,
    variable_names,
)


GEN = load_script(DASHBOARDS / "generate.py", "dashboards_generate")
MODELS = load_dashboards()


def test_committed_json_is_what_the_generator_makes(tmp_path):
    assert set(MODELS) == set(GEN.build()), "a dashboard JSON was added or removed without the generator"
    for name, model in GEN.build().items():
        assert (DASHBOARDS / name).read_text() == GEN.render(model), f"{name} is stale: run python dashboards/generate.py"
    # --check notices a stale file (so CI would too).
    GEN.main(["--out", str(tmp_path)])
    assert GEN.main(["--check", "--out", str(tmp_path)]) == 0
    stale = tmp_path / "graphmon-decode.json"
    stale.write_text(stale.read_text().replace("Median kernel gap", "Mean kernel gap"))
    assert GEN.main(["--check", "--out", str(tmp_path)]) == 1


@pytest.mark.parametrize("name", sorted(MODELS))
def test_datasource_is_a_template_variable(name):
    model = MODELS[name]
    text = (DASHBOARDS / name).read_text()
    assert "__inputs" not in text and "DS_PROMETHEUS" not in text  # file provisioning can't resolve these
    ds_vars = [v for v in model["templating"]["list"] if v["type"] == "datasource"]
    assert [v["name"] for v in ds_vars] == ["datasource"] and ds_vars[0]["query"] == "prometheus"
    for panel in iter_panels(model["panels"]):
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        for t in panel["targets"]:
            assert t["datasource"]["uid"] == "${datasource}"
    for var in model["templating"]["list"]:
        if var["type"] == "query":
            assert var["datasource"]["uid"] == "${datasource}"
            # "All" must mean "every value", also values that appear after the dashboard loaded.
            assert var["includeAll"] and var["allValue"] == ".*" and var["multi"]


def test_decode_dashboard_has_the_filter_variables():
    names = variable_names(MODELS["graphmon-decode.json"])
    assert names == ["datasource", "job", "instance", "namespace", "pod", "rank", "device", "graph", "upload_mode", "stream"]
    assert variable_names(MODELS["graphmon-health.json"]) == ["datasource", "job", "instance", "namespace", "pod", "rank"]
    # Each variable's query only uses variables defined before it (Grafana resolves in order).
    model = MODELS["graphmon-decode.json"]
    seen: list[str] = []
    for var in model["templating"]["list"]:
        if var["type"] == "query":
            used = set(re.findall(r"\$(\w+)", var["definition"]))
            assert used <= set(seen), (var["name"], used - set(seen))
            assert var["query"]["query"] == var["definition"]
        seen.append(var["name"])


@pytest.mark.parametrize("name", sorted(MODELS))
def test_layout_ids_and_grid(name):
    model = MODELS[name]
    panels = list(iter_panels(model["panels"]))
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    occupied: set[tuple[int, int]] = set()
    for p in panels:
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24, p["title"]
        cells = {(g["x"] + dx, g["y"] + dy) for dx in range(g["w"]) for dy in range(g["h"])}
        assert not cells & occupied, f"panel {p['title']!r} overlaps another"
        occupied |= cells
    assert len({m["uid"] for m in MODELS.values()}) == len(MODELS)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_queries_only_use_exported_metrics(name):
    for title, ref, expr in panel_targets(MODELS[name]):
        unknown = referenced_metrics(expr) - CONTRACT_SAMPLES
        assert not unknown, f"{name} / {title} / {ref} uses metrics graphmon does not export: {unknown}"
    for var in MODELS[name]["templating"]["list"]:
        if var["type"] == "query":
            assert not referenced_metrics(var["definition"]) - CONTRACT_SAMPLES


def test_required_panels_are_there():
    exprs = {name: " ".join(e for _, _, e in panel_targets(m)) for name, m in MODELS.items()}
    decode, health = exprs["graphmon-decode.json"], exprs["graphmon-health.json"]
    for needed in ('graphmon_kernel_gap_quantile_seconds{quantile="0.5"', 'graphmon_kernel_gap_quantile_seconds{quantile="0.9"',
                   "graphmon_kernel_gap_seconds_bucket", 'kind=~"gpu|busy|idle"',
                   "graphmon_replay_idle_seconds_sum", "graphmon_kernels_per_replay", 'kind="launch_latency"',
                   'kind="inter_replay_gap"'):
        assert needed in decode, needed
    for needed in ("graphmon_up", "graphmon_windows_total", "graphmon_records_dropped_total", "graphmon_records_invalid_total",
                   "graphmon_observer_slowdown_ratio", "graphmon_series_folded_total", "graphmon_collector_errors_total",
                   "graphmon_last_window_timestamp_seconds"):
        assert needed in health, needed
    heatmaps = [p for p in iter_panels(MODELS["graphmon-decode.json"]["panels"]) if p["type"] == "heatmap"]
    assert heatmaps and all(t["format"] == "heatmap" for p in heatmaps for t in p["targets"])
    assert all(p["options"]["calculate"] is False for p in heatmaps)  # buckets come from Prometheus


def test_untraced_replay_time_sits_beside_the_traced_span_and_says_which_is_which():
    """Issue 36: the untraced replay time (mean from _sum/_count, p90 from the histogram) in one
    panel with the traced span, next to the traced replay panel, every legend naming its kind."""
    panels = [p for p in iter_panels(MODELS["graphmon-decode.json"]["panels"]) if p["type"] != "row"]
    (i,) = [i for i, p in enumerate(panels) if "graphmon_replay_untraced_seconds" in str(p["targets"])]
    p, traced = panels[i], panels[i - 1]
    assert "UNTRACED" in p["title"] and "traced span" in p["title"] and "graphmon_replay_quantile_seconds" in str(traced)
    assert p["gridPos"]["y"] == traced["gridPos"]["y"] and p["gridPos"]["x"] == traced["gridPos"]["x"] + traced["gridPos"]["w"]
    exprs = [t["expr"] for t in p["targets"]]
    assert "rate(graphmon_replay_untraced_seconds_sum" in exprs[0] and "rate(graphmon_replay_untraced_seconds_count" in exprs[0]
    assert exprs[1].startswith("histogram_quantile(0.9, ") and "graphmon_replay_untraced_seconds_bucket" in exprs[1]
    assert "rate(graphmon_replay_gpu_seconds_sum" in exprs[2]
    assert [t["legendFormat"].split(" {{")[0] for t in p["targets"]] == ["untraced mean", "untraced p90", "traced span mean"]


def test_upload_modes_come_from_the_upload_mode_label_not_graph_names():
    """Real engines' graph labels carry no /upload suffix (issue 14 item 7): no query parses them."""
    exprs = [e for m in MODELS.values() for _, _, e in panel_targets(m)]
    assert not any("label_replace" in e or "/upload" in e or "no_upload" in e for e in exprs)
    (ratio,) = [p for p in iter_panels(MODELS["graphmon-decode.json"]["panels"]) if p["title"] == "Uploaded / lazy kernel gap ratio"]
    for t in ratio["targets"]:
        assert 'upload_mode=~"uploaded|instantiate_upload"' in t["expr"] and 'upload_mode="lazy"' in t["expr"]


SELECTOR_RE = re.compile(r"(?<![:\w])(graphmon_[a-zA-Z0-9_]+)(?![\w:])(\{[^}]*\})?")  # not a recorded series (fleet:...)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_selector_filters_by_host_and_aggregations_keep_the_instance(name):
    """With two pods, series never merge: every metric selector carries the job, instance,
    namespace and pod variables, every `by (...)` keeps job and instance (except the pooled
    heatmap), and every legend names the instance."""
    for title, ref, expr in panel_targets(MODELS[name]):
        for metric, sel in SELECTOR_RE.findall(expr):
            for var in ("job", "instance", "namespace", "pod"):
                assert f'{var}=~"${var}"' in sel, f"{title} / {ref}: {metric} is not filtered by ${var}"
        for by in re.findall(r"by \(([^)]*)\)", expr):
            labels = {x.strip() for x in by.split(",")}
            assert labels >= {"job", "instance"} or labels == {"le"}, f"{title} / {ref}: by ({by}) merges instances"
    for panel in iter_panels(MODELS[name]["panels"]):
        if panel["type"] in ("timeseries", "stat"):
            for t in panel["targets"]:
                assert "{{instance}}" in t["legendFormat"], f"{panel['title']} / {t['refId']}: legend without instance"


def test_health_dashboard_has_state_and_process_panels():
    exprs = " ".join(e for _, _, e in panel_targets(MODELS["graphmon-health.json"]))
    for needed in ("graphmon_collector_state", "graphmon_process_info", "graphmon_process_last_window_timestamp_seconds",
                   "graphmon_empty_windows_total", "graphmon_processes_lost_total", "graphmon_processes{",
                   "graphmon_build_info", "graphmon_device_info"):
        assert needed in exprs, needed


def test_decode_dashboard_has_a_rank_skew_row():
    panels = list(iter_panels(MODELS["graphmon-decode.json"]["panels"]))
    rows = [p["title"] for p in panels if p["type"] == "row"]
    assert any(r.startswith("Rank skew") for r in rows)
    i = next(i for i, p in enumerate(panels) if p["type"] == "row" and p["title"].startswith("Rank skew"))
    skew = panels[i + 1:i + 4]
    kinds = [re.search(r'kind="(\w+)"', p["targets"][0]["expr"]).group(1) for p in skew]
    assert kinds == ["gpu", "idle", "idle"]
    assert len({p["gridPos"]["y"] for p in skew}) == 1  # side by side
    assert all("by (job, instance, rank)" in p["targets"][0]["expr"] for p in skew)


def test_every_query_parses_with_promtool(tmp_path):
    """promtool parses each expanded query as a recording rule: a typo fails here, without a server."""
    rules = []
    for name, model in MODELS.items():
        names = variable_names(model)
        for i, (title, ref, expr) in enumerate(panel_targets(model)):
            rules.append({"record": f"check:{model['uid'].replace('-', '_')}:{i}_{ref}", "expr": expand(expr, names)})
    path = tmp_path / "panels.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "panels", "rules": rules}]}))
    res = promtool("check", "rules", str(path))
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"SUCCESS: {len(rules)} rules found" in res.stdout + res.stderr

    # And the check would notice a broken one.
    path.write_text(yaml.safe_dump({"groups": [{"name": "bad", "rules": [{"record": "x", "expr": "sum by (le (rate(x[1m]))"}]}]}))
    assert promtool("check", "rules", str(path)).returncode != 0


def test_lazy_series_are_drawn_dashed():
    """The dashed-line override matches a lazy series' legend and no uploaded one."""
    matcher = re.compile(GEN.LAZY_DASHED["matcher"]["options"])
    legends = [t["legendFormat"] for p in iter_panels(MODELS["graphmon-decode.json"]["panels"])
               if p["type"] == "timeseries" for t in p["targets"] if "{{upload_mode}}" in t["legendFormat"]]
    assert len(legends) >= 5
    for legend in legends:
        def render(mode: str) -> str:
            return re.sub(r"\{\{(\w+)\}\}", lambda m: mode if m.group(1) == "upload_mode" else "x", legend)
        assert matcher.fullmatch(render("lazy")) and not matcher.fullmatch(render("uploaded"))
    for p in iter_panels(MODELS["graphmon-decode.json"]["panels"]):
        if p["type"] == "timeseries":
            assert GEN.LAZY_DASHED in p["fieldConfig"]["overrides"]


MATCHER_RE = re.compile(r'(\w+)\s*(=~|!~|!=|=)\s*"([^"]*)"')


def _default_level_samples():
    """(name, labels) of every sample an agent exports at the default level: one rank with 64
    graphs on 4 streams (launch times, the observer slowdown, untraced replay times), and a deploy verdict (every graph
    regressed, as a driver change would) through the agent's own collectors."""
    import time
    from types import SimpleNamespace

    from prometheus_client.parser import text_string_to_metric_families

    from graphmon.export.agent import Agent
    from graphmon.export.agent_http import AgentHealthCollector, AgentMetrics
    from graphmon.export.deploy_metrics import DeployCollector
    from graphmon.model.window import Window
    from graphmon.model.wire import encode_window
    from graphmon.settings import Settings
    from helpers import AgentClient, deploy_result, many_graphs, untraced, wait_until

    agent = Agent(Settings(port=0), tick_s=0.05, heartbeat_lost_s=60).start()
    try:
        c = AgentClient(agent.socket_path, rank="0", pid=4242)
        c.s.sendall(encode_window(Window(trace=many_graphs(), started_s=time.time() - 1, ended_s=time.time(),
                                         observer_slowdown=1.02)))
        assert wait_until(lambda: agent.snapshots() and agent.snapshots()[0].windows_total == 1, timeout=20)
        # untraced replay times of every graph (given to the rank's aggregator: the wire is the collector's)
        agent.ranks["0"].aggregator.ingest(Window(trace=many_graphs(), started_s=time.time() - 1, ended_s=time.time(),
                                                  untraced=untraced(np.arange(64), np.full(64, 600_000))))
        verdict = SimpleNamespace(results={("0", "previous"): deploy_result(untraced_shift_ns=20_000.0)}, dropped=0, ranks_forgotten=0,
                                  computations={}, state=None)
        deploy = DeployCollector(verdict, detail=lambda rank: agent.snapshots()[0].detail_graphs, detail_graphs=2)
        m = AgentMetrics(agent, collectors=[AgentHealthCollector(agent), deploy])
        m.render(["text"])
        text = m.body("text").text.decode()
    finally:
        agent.stop()
    return [(s.name, s.labels) for f in text_string_to_metric_families(text) for s in f.samples]


def _selectors(expr: str):
    for metric, sel in SELECTOR_RE.findall(expr):
        matchers = [(k, op, v) for k, op, v in MATCHER_RE.findall(sel) if "$" not in v]
        yield metric, matchers


def _matches(labels: dict, matchers) -> bool:
    for k, op, v in matchers:
        got = labels.get(k, "")
        ok = re.fullmatch(v, got) is not None if op in ("=~", "!~") else got == v
        if ok != (op in ("=", "=~")):
            return False
    return True


def test_every_panel_and_alert_selector_has_series_at_the_default_level():
    """--cardinality standard (the default) keeps per-graph series for the detail graphs only:
    every selector of every panel, variable and alert rule (with its literal label matchers:
    quantile, kind, upload_mode, state ...) still finds series in what an agent exports then.
    (tests/system/test_prometheus_e2e.py runs the panels through Prometheus against `serve`.)"""
    samples = _default_level_samples()
    exprs = [(f"{name} / {title} / {ref}", expr) for name, model in MODELS.items()
             for title, ref, expr in panel_targets(model)]
    exprs += [(f"{name} / variable {v['name']}", v["definition"]) for name, model in MODELS.items()
              for v in model["templating"]["list"] if v["type"] == "query"]
    exprs += [(f"alert {r['alert']}", r["expr"]) for r in load_alert_rules()]
    missing = []
    for where, expr in exprs:
        for metric, matchers in _selectors(expr):
            if not any(n == metric and _matches(lab, matchers) for n, lab in samples):
                missing.append((where, metric, matchers))
    assert not missing, missing
    assert len(exprs) > 60


def test_the_untraced_panel_gives_the_rows_mean_and_p90_through_prometheus(tmp_path):
    """The untraced panel's queries, run by Prometheus's engine (promtool) on a real render scraped
    after a start at 0: the mean is the rows' mean, the p90 the histogram's interpolation in the
    bucket all of them fall in, the traced span mean the traced histogram's (to 1e-9)."""
    from prometheus_client.exposition import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from graphmon.export.aggregator import Aggregator
    from graphmon.export.collector import make_registry
    from helpers import synthetic_trace, untraced, window

    agg = Aggregator()
    rows = [310_000 + 50_000 * i for i in range(12)]  # 0.31-0.86 ms: all in the (0.3 ms, 1 ms] bucket
    agg.ingest(window(synthetic_trace(n_graphs=1), untraced=untraced([0] * len(rows), rows)))
    text = generate_latest(make_registry(agg.snapshots)).decode()
    # every counter 0 a scrape before (no extrapolation toward zero: rate() scales all series alike)
    series = [{"series": s.name + "{" + ", ".join(f'{k}="{v}"' for k, v in sorted({**s.labels, "instance": "i",
                                                                                 "job": "graphmon"}.items())) + "}",
               "values": f"0 {s.value!r}"} for f in text_string_to_metric_families(text)
              if f.name in ("graphmon_replay_untraced_seconds", "graphmon_replay_gpu_seconds") for s in f.samples]
    gpu = agg.snapshot().replay_hist[("0", "graph0", "uploaded")]["gpu"]
    want = [sum(rows) / len(rows) * 1e-9, 3e-4 + (1e-3 - 3e-4) * 0.9, gpu.sum_ns / gpu.count * 1e-9]
    model = MODELS["graphmon-decode.json"]
    (panel,) = [p for p in iter_panels(model["panels"]) if "graphmon_replay_untraced_seconds" in str(p.get("targets"))]
    labels = '{device="0", graph="graph0", instance="i", job="graphmon", rank="0", upload_mode="uploaded"}'
    (tmp_path / "empty.yml").write_text("groups: []\n")
    doc = {"rule_files": ["empty.yml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": series,
        "promql_expr_test": [{"expr": f"abs(({expand(tg['expr'], variable_names(model), '2m')}) / {v!r} - 1) < bool 1e-9",
                              "eval_time": "1m", "exp_samples": [{"labels": labels, "value": 1}]}
                             for tg, v in zip(panel["targets"], want)]}]}
    (tmp_path / "panel_test.yml").write_text(yaml.safe_dump(doc))
    r = promtool("test", "rules", "panel_test.yml", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
