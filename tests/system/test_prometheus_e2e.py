"""End to end with the real thing: `graphmon serve` replaying real H200 traces, scraped by a real
`prometheus` binary; every dashboard query and every alert rule runs through Prometheus's HTTP API.

Two graphmon processes, as on a host with one exporter per GPU process:
  rank 0 replays the bundled CUPTI trace (the `graphmon serve` demo: uploaded and lazy decode
  graphs, a 1000-kernel chain); rank 1 replays the Kineto fixture, the source that knows CPU launch
  times, so the launch-latency panel has data too.
The only series allowed to be absent are those a replay cannot have (ABSENT_IN_E2E: the observer
slowdown, which needs a live observer, and the untraced replay time, which needs a live collector
timing launches with tracing off), and the test asserts they are really absent rather than
silently tolerating any empty query.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from _promutil import (
    ALERTS,
    ROOT,
    expand,
    family_of,
    load_alert_rules,
    load_recording_rules,
    load_dashboards,
    panel_targets,
    referenced_metrics,
    require_binary,
    variable_names,
)

SCRAPE_S = 1
RATE_WINDOW = "30s"  # what $__rate_interval becomes: many scrapes at 1 s
STARTUP_DEADLINE_S = 40
KINETO_FIXTURE = ROOT / "tests" / "data" / "h200-kineto-decode-shapeA.json.gz"
# A replay has no live observer, so its overhead is unknown and the gauge is absent by contract; a
# recorded trace was timed traced, so it has no untraced replay time either (the histogram's HELP
# and TYPE are there, no series: tests/deploy/test_dashboards.py finds the panel's series in an
# agent's render, and the promtool test there runs the panel's queries on them).
ABSENT_IN_E2E = {"graphmon_observer_slowdown_ratio", "graphmon_replay_untraced_seconds"}
# Fleet metrics (docs/briefs: agent and export layers, built in parallel with the dashboards).
# While a build does not export one of them at all, queries on it are skipped with that reason;
# as soon as `graphmon serve` exports it, its panels are checked like every other.
# Families only the agent exports (one series per attached process; `graphmon serve` replays a file
# and has none): tests/export/test_agent.py and tests/system/test_agent_trees.py check them.
AGENT_ONLY_METRICS = {
    "graphmon_device_info", "graphmon_process_info", "graphmon_process_last_window_timestamp_seconds",
    "graphmon_empty_windows_total", "graphmon_processes_lost_total", "graphmon_processes",
    # the deploy verdict compares processes of a rank: tests/system/test_deploy_e2e.py checks them
    "graphmon_deploy_regression", "graphmon_deploy_stream_regression", "graphmon_deploy_gap_shift_seconds",
    "graphmon_deploy_gap_added_seconds", "graphmon_deploy_reference_age_seconds", "graphmon_deploy_untraced_shift_seconds",
    "graphmon_agent_up", "graphmon_agent_expects_processes", "graphmon_agent_connections_rejected_total", "graphmon_agent_frames_rejected_total",
    "graphmon_agent_windows_dropped_total", "graphmon_link_windows_dropped_total", "graphmon_link_reconnects_total",
}
# Labels only Kubernetes service discovery adds (PodMonitor): absent from this stack's targets.
K8S_ONLY_LABELS = {"namespace", "pod"}

MODELS = load_dashboards()
PANEL_CASES = [
    pytest.param(name, title, ref, expand(expr, variable_names(model), RATE_WINDOW), id=f"{name}:{title}:{ref}")
    for name, model in MODELS.items()
    for title, ref, expr in panel_targets(model)
]


def _exported(metrics_text: str) -> set[str]:
    exported = set()
    for line in metrics_text.splitlines():
        if line.startswith("# TYPE ") or line.startswith("# HELP "):
            exported.add(line.split()[2])
        elif line and not line.startswith("#"):
            exported.add(line.split("{")[0].split()[0])
    return exported


def _skip_agent_only(metrics_text: str, metrics: set[str]) -> None:
    pending = {m for m in metrics if m in AGENT_ONLY_METRICS and m not in _exported(metrics_text)}
    if pending:
        pytest.skip(f"agent-only families {sorted(pending)}: `graphmon serve` has no attached processes")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


def _wait_http(url: str, proc: subprocess.Popen, log: Path, deadline: float) -> None:
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"{proc.args[:3]} exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    pytest.fail(f"{url} not ready in time:\n{log.read_text()[-3000:]}")


def start_prometheus(tmp: Path, config: dict, deadline: float) -> tuple[subprocess.Popen, Prom]:
    """A real Prometheus on loopback with ``config`` (prometheus.yml as a dict), its data and
    ``prometheus.log`` in ``tmp``, ready by ``deadline`` (else it is stopped and the test fails
    with its log). The fleet and deploy end-to-end tests start theirs here too."""
    port = _free_port()
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
    log = tmp / "prometheus.log"
    proc = subprocess.Popen([require_binary("prometheus"), f"--config.file={tmp / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
                             "--log.level=warn"], stdout=log.open("w"), stderr=subprocess.STDOUT, cwd=tmp)
    try:
        _wait_http(f"http://127.0.0.1:{port}/-/ready", proc, log, deadline)
    except BaseException:
        _stop(proc)
        raise
    return proc, Prom(f"http://127.0.0.1:{port}")


class Prom:
    def __init__(self, base: str):
        self.base = base
        self.client = httpx.Client(base_url=base, timeout=10)

    def get(self, path: str, **params: Any) -> Any:
        r = self.client.get(path, params=params)
        body = r.json()
        assert r.status_code == 200 and body["status"] == "success", f"{path} {params}: {r.status_code} {body}"
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        data = self.get("/api/v1/query", query=expr)
        assert data["resultType"] in ("vector", "scalar"), data
        return data["result"] if data["resultType"] == "vector" else [{"metric": {}, "value": data["result"]}]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    require_binary("prometheus")  # before anything starts: a skip (a failure under GRAPHMON_REQUIRE_PROMETHEUS)
    tmp = tmp_path_factory.mktemp("e2e")
    deadline = time.monotonic() + STARTUP_DEADLINE_S
    procs: list[subprocess.Popen] = []
    try:
        targets = []
        for rank, replay in (("0", None), ("1", KINETO_FIXTURE)):
            port = _free_port()
            log = tmp / f"graphmon-{rank}.log"
            cmd = [sys.executable, "-c", "import sys; from graphmon.cli import main; sys.exit(main())", "serve",
                   "--host", "127.0.0.1", "--port", str(port), "--window-interval-s", "0.2"]
            if replay is not None:
                cmd += ["--replay", str(replay)]
            env = dict(os.environ, RANK=rank)
            procs.append(subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env, cwd=tmp))
            targets.append((f"127.0.0.1:{port}", procs[-1], log))
        for addr, proc, log in targets:
            _wait_http(f"http://{addr}/metrics", proc, log, deadline)

        config = {
            "global": {"scrape_interval": f"{SCRAPE_S}s", "evaluation_interval": f"{SCRAPE_S}s"},
            "rule_files": [str(ALERTS)],
            "scrape_configs": [{"job_name": "graphmon", "static_configs": [{"targets": [t[0] for t in targets]}]}],
        }
        proc, prom = start_prometheus(tmp, config, deadline)
        procs.append(proc)
        plog = tmp / "prometheus.log"
        # Data is "there" when both targets have been scraped often enough for rate() over the
        # window to see counters move.
        while True:
            ready = prom.query(f"count_over_time(graphmon_up[{RATE_WINDOW}]) >= 4")
            moving = prom.query(f"rate(graphmon_windows_total[{RATE_WINDOW}]) > 0")
            if len(ready) == 2 and len(moving) == 2:
                break
            if time.monotonic() > deadline:
                pytest.fail(f"no data in Prometheus in time; targets: {prom.get('/api/v1/targets')}\n{plog.read_text()[-2000:]}")
            time.sleep(0.5)
        metrics_text = "\n".join(httpx.get(f"http://{t[0]}/metrics", timeout=5).text for t in targets)
        yield prom, metrics_text
    finally:
        for proc in reversed(procs):
            _stop(proc)


def _query_until_data(prom: Prom, expr: str, timeout_s: float = 10) -> list[dict[str, Any]]:
    """A query over a fresh stack may need a few more scrapes (e.g. a quantile over rates)."""
    end = time.monotonic() + timeout_s
    while True:
        result = prom.query(expr)
        if result or time.monotonic() > end:
            return result
        time.sleep(1)


@pytest.mark.parametrize("name, title, ref, expr", PANEL_CASES)
def test_every_panel_query_returns_series(stack, name, title, ref, expr):
    prom, metrics_text = stack
    _skip_agent_only(metrics_text, referenced_metrics(expr))
    used = {family_of(m) for m in referenced_metrics(expr)}
    if used & ABSENT_IN_E2E:
        assert used <= ABSENT_IN_E2E, "a panel mixing absent and present metrics must not hide behind the allowance"
        assert prom.query(expr) == [], f"{sorted(used)} is expected absent from a replay; update ABSENT_IN_E2E"
        return
    result = _query_until_data(prom, expr)
    assert result, f"{name} / {title} / {ref} returned no series:\n{expr}"
    values = [float(s["value"][1]) for s in result]
    # NaN would mean an empty rate divided by an empty rate: the panel would draw nothing.
    assert any(v == v for v in values), f"{title} / {ref}: only NaN"


def test_queries_reference_only_exported_metrics(stack):
    _, metrics_text = stack
    exported = _exported(metrics_text)
    used: dict[str, str] = {}
    for name, model in MODELS.items():
        for title, ref, expr in panel_targets(model):
            for m in referenced_metrics(expr):
                used.setdefault(m, f"{name} / {title} / {ref}")
        for var in model["templating"]["list"]:
            for m in referenced_metrics(var.get("definition", "")):
                used.setdefault(m, f"{name} / variable {var['name']}")
    for rule in load_alert_rules():
        for m in referenced_metrics(rule["expr"]):
            used.setdefault(m, f"alert {rule['alert']}")
    missing = {m: where for m, where in used.items()
               if m not in exported and family_of(m) not in ABSENT_IN_E2E and m not in AGENT_ONLY_METRICS}
    assert not missing, f"queries use metrics graphmon does not export: {missing}"
    # The allowed-absent ones are absent from a replay, but spelled as graphmon's collector spells them.
    collector_source = (ROOT / "graphmon" / "export" / "families.py").read_text()
    assert all(f'"{m}"' in collector_source for m in ABSENT_IN_E2E)


def test_variable_queries_return_values(stack):
    prom, _ = stack
    for name, model in MODELS.items():
        names = variable_names(model)
        for var in model["templating"]["list"]:
            if var["type"] != "query":
                continue
            definition = expand(var["definition"], names)
            assert definition.startswith("label_values(") and definition.endswith(")")
            selector, label = definition[len("label_values("):-1].rsplit(",", 1)
            series = prom.get("/api/v1/series", **{"match[]": selector.strip()})
            values = {s.get(label.strip()) for s in series} - {None}
            if var["name"] in K8S_ONLY_LABELS:
                # Outside Kubernetes the variable is empty and "All" (.*) still matches every series.
                assert series and not values, f"{name} variable {var['name']}: {values}"
                continue
            assert values, f"{name} variable {var['name']}: no values for {definition}"
    # Two targets here, two instances in the instance variable: the panels can tell them apart.
    instances = {s["instance"] for s in prom.get("/api/v1/series", **{"match[]": "graphmon_up"})}
    assert len(instances) == 2


def test_ratio_panel_compares_upload_modes_by_label(stack):
    prom, _ = stack
    model = MODELS["graphmon-decode.json"]
    for ref in ("A", "B"):
        (title, _, expr), = [t for t in panel_targets(model) if t[0] == "Uploaded / lazy kernel gap ratio" and t[1] == ref]
        result = _query_until_data(prom, expand(expr, variable_names(model), RATE_WINDOW))
        # Rank 0 replays the bundled trace, whose graphs run in both modes; rank 1 (Kineto) in one.
        modes = {s["metric"]["rank"]: s["metric"]["upload_mode"] for s in prom.query("graphmon_graph_info")}
        assert [s["metric"]["rank"] for s in result] == ["0"], (ref, result, modes)
        assert set(result[0]["metric"]) == {"job", "instance", "rank", "device"}
        assert 0 < float(result[0]["value"][1]) < 100


def test_alert_rules_load_and_evaluate_on_live_data(stack):
    prom, _ = stack
    expected = {r["alert"] for r in load_alert_rules()} | {r["record"] for r in load_recording_rules()}
    end = time.monotonic() + 10
    while True:
        rules = [r for g in prom.get("/api/v1/rules")["groups"] for r in g["rules"]]
        evaluated = all(r.get("lastEvaluation", "").startswith("0001") is False for r in rules)
        if evaluated or time.monotonic() > end:
            break
        time.sleep(1)
    assert {r["name"] for r in rules} == expected
    bad = {r["name"]: r.get("lastError") for r in rules if r["health"] != "ok"}
    assert not bad, f"rules fail on live data: {bad}"
    # A healthy demo pages nobody: no alert is firing (none has had its `for` time anyway, but a
    # rule that matches healthy data would show as pending).
    active = prom.get("/api/v1/alerts")["alerts"]
    assert not active, f"alerts active on a healthy replay: {[(a['labels']['alertname'], a['state']) for a in active]}"


def test_selecting_one_graph_filters_every_decode_panel(stack):
    """Variables at concrete values (as Grafana sends a single selection) narrow the panels."""
    prom, metrics_text = stack
    model = MODELS["graphmon-decode.json"]
    names = variable_names(model)
    # a graph with series of its own at the default level (a detail graph of rank 0)
    chosen = prom.query('graphmon_graph_info{rank="0", upload_mode="uploaded"}')[0]["metric"]["graph"]
    checked = 0
    for title, ref, expr in panel_targets(model):
        if "label_replace" in expr or "upload_mode=\"lazy\"" in expr:
            continue  # the uploaded/lazy ratio needs both twins selected
        if {m for m in referenced_metrics(expr) if m in AGENT_ONLY_METRICS} - _exported(metrics_text):
            continue  # the deploy verdict's panels: tests/system/test_deploy_e2e.py
        if {family_of(m) for m in referenced_metrics(expr)} & ABSENT_IN_E2E:
            continue  # absent from a replay (test_every_panel_query_returns_series checks they are)
        narrowed = expand(expr.replace("$graph", chosen), names, RATE_WINDOW)
        if 'kind="launch_latency"' in expr:
            assert prom.query(narrowed) == [], "the bundled trace (where this graph is) has no launch times"
            continue
        result = _query_until_data(prom, narrowed, timeout_s=5)
        graphs = {s["metric"].get("graph") for s in result} - {None}
        assert result, f"{title} / {ref} lost its data when graph={chosen!r} was selected"
        assert graphs <= {chosen}, f"{title} / {ref} shows other graphs: {graphs}"
        checked += 1
    assert checked >= 10


def test_prometheus_reads_the_gzip_body_whole(stack):
    """Prometheus scrapes with Accept-Encoding: gzip; graphmon answers one gzip member made of
    deflate chunks compressed at render time, family by family (graphmon.export.body). Every
    sample of the body reaches Prometheus: scrape_samples_scraped is the body's sample count."""
    import gzip
    import zlib

    prom, _ = stack
    targets = {t["labels"]["instance"] for t in prom.get("/api/v1/targets")["activeTargets"]}
    for instance in sorted(targets):
        headers = {"Accept": "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5",
                   "Accept-Encoding": "gzip"}  # what Prometheus sends
        with httpx.Client(timeout=5) as c, c.stream("GET", f"http://{instance}/metrics", headers=headers) as resp:
            assert resp.headers["content-encoding"] == "gzip"
            wire = b"".join(resp.iter_raw())
        text = gzip.decompress(wire).decode()
        one = zlib.decompressobj(16 + zlib.MAX_WBITS)
        assert one.decompress(wire).decode() == text and one.eof and not one.unused_data and text.endswith("# EOF\n")
        samples = sum(1 for ln in text.splitlines() if ln and not ln.startswith("#"))
        got = []
        for _ in range(10):
            got = prom.query(f'scrape_samples_scraped{{instance="{instance}"}}')
            if got and float(got[0]["value"][1]) == samples:
                break
            time.sleep(1)
        assert got and float(got[0]["value"][1]) == samples, (instance, samples, got)


def test_two_instances_never_merge(stack):
    """Issue 14 item 6: with two targets, every panel line carries its instance, and a health
    stat shows one value per instance and rank (a down collector can be located)."""
    prom, metrics_text = stack
    for name, model in MODELS.items():
        names = variable_names(model)
        for title, ref, expr in panel_targets(model):
            if "sum by (le)" in expr:
                continue  # the heatmap pools the selected instances by design
            if {m for m in referenced_metrics(expr) if m in AGENT_ONLY_METRICS} - _exported(metrics_text):
                continue
            for series in prom.query(expand(expr, names, RATE_WINDOW)):
                assert series["metric"].get("instance"), f"{name} / {title} / {ref} lost the instance label"
    (title, ref, expr), = [t for t in panel_targets(MODELS["graphmon-health.json"]) if t[0] == "Collector up"]
    result = prom.query(expand(expr, variable_names(MODELS["graphmon-health.json"])))
    assert sorted((s["metric"]["instance"] != "", s["metric"]["rank"]) for s in result) == [(True, "0"), (True, "1")]
    assert len({s["metric"]["instance"] for s in result}) == 2


def test_prometheus_scrapes_a_tls_and_basic_auth_target(tmp_path):
    """`graphmon serve --web.config.file` with TLS and a bcrypt user, scraped by a real Prometheus
    as node_exporter is (scheme https, the CA, basic_auth); a job with a wrong password is down."""
    import bcrypt

    from helpers import make_pki

    require_binary("prometheus")  # before anything starts: a skip (a failure under GRAPHMON_REQUIRE_PROMETHEUS)
    pki = make_pki(tmp_path)
    web = tmp_path / "web.yml"
    web.write_text(f"tls_server_config:\n  cert_file: {pki['cert']}\n  key_file: {pki['key']}\nbasic_auth_users:\n"
                   f"  prometheus: '{bcrypt.hashpw(b'scrape-me', bcrypt.gensalt(rounds=4)).decode()}'\n")
    (tmp_path / "pw").write_text("scrape-me")
    (tmp_path / "bad").write_text("nope")
    port = _free_port()
    deadline = time.monotonic() + STARTUP_DEADLINE_S
    procs = []
    try:
        glog = tmp_path / "graphmon.log"
        procs.append(subprocess.Popen([sys.executable, "-m", "graphmon.cli", "serve", "--port", str(port),
                                       "--window-interval-s", "0.2", "--web.config.file", str(web)],
                                      stdout=glog.open("w"), stderr=subprocess.STDOUT, cwd=tmp_path))
        while "serving" not in glog.read_text():
            assert procs[0].poll() is None and time.monotonic() < deadline, glog.read_text()
            time.sleep(0.1)
        job = {"scheme": "https", "tls_config": {"ca_file": pki["ca"]},
               "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}
        config = {"global": {"scrape_interval": f"{SCRAPE_S}s"}, "scrape_configs": [
            {"job_name": "graphmon-tls", **job, "basic_auth": {"username": "prometheus", "password_file": str(tmp_path / "pw")}},
            {"job_name": "graphmon-wrong-password", **job,
             "basic_auth": {"username": "prometheus", "password_file": str(tmp_path / "bad")}}]}
        proc, prom = start_prometheus(tmp_path, config, deadline)
        procs.append(proc)
        plog = tmp_path / "prometheus.log"
        while True:
            health = {t["labels"]["job"]: (t["health"], t["lastError"]) for t in prom.get("/api/v1/targets")["activeTargets"]}
            if health.get("graphmon-tls", ("",))[0] == "up" and health.get("graphmon-wrong-password", ("",))[0] == "down":
                break
            assert time.monotonic() < deadline, f"targets: {health}\n{plog.read_text()[-2000:]}"
            time.sleep(0.3)
        assert "401" in health["graphmon-wrong-password"][1]
        assert prom.query('graphmon_up{job="graphmon-tls"}') and not prom.query('graphmon_up{job="graphmon-wrong-password"}')
    finally:
        for proc in reversed(procs):
            _stop(proc)
