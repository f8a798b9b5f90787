"""A restart under one agent, end to end on the CPU: `graphmon run` over a launcher that runs rank 0's
worker v1 and then v2 in its place (fake torch + fake CUPTI, tests/fake_site), a real `prometheus`
scraping the agent every second with the shipped alert rules.

v2 with +1.5 us on every boundary: the agent's deploy verdict flags it within three windows of
v2's first replay and GraphmonDeployRegression fires naming the graph and the stream. v2 without
change: the verdict is computed and says no regression, nothing fires.

Time compression: GraphmonDeployRegression's `for: 5m` is 5 s in the copy of dashboards/alerts.yml
that this Prometheus loads (the only change; a test cannot wait 5 minutes). Every other rule is as
shipped (their day-long windows cannot fire here, and must not).
"""

from __future__ import annotations

import re
import subprocess
import time

import pytest
import yaml

from _promutil import ALERTS, ROOT, load_script, require_binary

# The helpers of the neighbouring system tests, reused as they are: `graphmon run` over the fake
# engines, and a real Prometheus on loopback.
_trees = load_script(ROOT / "tests" / "system" / "test_agent_trees.py", "_deploy_e2e_trees")
_prom = load_script(ROOT / "tests" / "system" / "test_prometheus_e2e.py", "_deploy_e2e_prom")
Run, Prom, _free_port, _stop, _wait_http = _trees.Run, _prom.Prom, _prom._free_port, _prom._stop, _prom._wait_http

EXTRA_NS = 1500
FOR_S = 5  # GraphmonDeployRegression's for: in the time-compressed copy
DEADLINE_S = 90


def _compressed_rules(tmp_path):
    doc = yaml.safe_load(ALERTS.read_text())
    hits = 0
    for group in doc["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") == "GraphmonDeployRegression":
                rule["for"] = f"{FOR_S}s"
                hits += 1
    assert hits == 1
    path = tmp_path / "alerts.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _prometheus(tmp_path, target: str) -> tuple[subprocess.Popen, Prom]:
    return start_prometheus(tmp_path, _compressed_rules(tmp_path),
                            [{"job_name": "graphmon", "static_configs": [{"targets": [target]}]}])


def start_prometheus(tmp_path, rules, scrape_configs: list) -> tuple[subprocess.Popen, Prom]:
    """A real Prometheus on loopback scraping and evaluating every second (tests/system/test_fleet_e2e.py too)."""
    port = _free_port()
    config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"}, "rule_files": [str(rules)],
              "scrape_configs": scrape_configs}
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    log = tmp_path / "prometheus.log"
    proc = subprocess.Popen([require_binary("prometheus"), f"--config.file={tmp_path / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
                             "--log.level=warn"], stdout=log.open("w"), stderr=subprocess.STDOUT, cwd=tmp_path)
    _wait_http(f"http://127.0.0.1:{port}/-/ready", proc, log, time.monotonic() + 40)
    return proc, Prom(f"http://127.0.0.1:{port}")


def _deploy_alerts(prom: Prom) -> list[dict]:
    return [a for a in prom.get("/api/v1/alerts")["alerts"] if a["labels"]["alertname"] == "GraphmonDeployRegression"]


def _restart(r: Run, tmp_path) -> tuple[str, dict]:
    """v1 sends a few windows, stops; v2 takes rank 0. Returns v1's pid and v2's process entry."""
    s = r.wait(lambda s: any(p["windows_total"] >= 3 and p["state"] == "running" for p in s["processes"]))
    v1 = next(p for p in s["processes"] if p["state"] == "running")
    assert v1["rank"] == "0"
    (tmp_path / "v1-stop").touch()
    s = r.wait(lambda s: any(p["pid"] != v1["pid"] and p["state"] == "running" and p["records_total"] > 0
                             for p in s["processes"]))
    return v1["pid"], next(p for p in s["processes"] if p["pid"] != v1["pid"] and p["state"] == "running")


@pytest.mark.parametrize("extra_ns", [EXTRA_NS, 0], ids=["widened", "no-change"])
def test_a_restart_under_one_agent_pages_only_on_a_change(tmp_path, monkeypatch, extra_ns):
    require_binary("prometheus")
    monkeypatch.setenv("FAKE_V1_STOP", str(tmp_path / "v1-stop"))
    monkeypatch.setenv("FAKE_V2_EXTRA_GAP_NS", str(extra_ns))
    r = Run(tmp_path, "sequence")
    prom_proc = None
    try:
        prom_proc, prom = _prometheus(tmp_path, r.url.removeprefix("http://"))
        v1_pid, v2 = _restart(r, tmp_path)
        # The verdict: against v1's pooled windows, with v2's second or third window.
        s = r.wait(lambda s: any(d["reference"] == "previous" and d["state"] == "ready" for d in s.get("deploy", [])),
                   timeout=DEADLINE_S)
        (d,) = [d for d in s["deploy"] if d["reference"] == "previous"]
        assert (d["rank"], d["reference_pid"], d["current_pid"]) == ("0", v1_pid, v2["pid"])
        assert d["current_windows"] <= 3, d  # within three windows of v2's first replay
        (g,) = d["graphs"]
        assert g["graph"] == "cap1"  # the capture order names the graph in both processes
        if extra_ns:
            assert d["regression"] and g["regression"] and g["kind"] == "uniform"
            assert g["flagged_streams"] == [7, 8]
            assert all(s["flagged"] and abs(s["shift_ns"] - EXTRA_NS) <= 32 for s in g["streams"])
            assert g["top"] and g["top"][0]["kernel_before"]  # the boundaries, in /status
            text = r.metrics()
            assert 'graphmon_deploy_regression{device="0",graph="cap1",kind="uniform",rank="0",reference="previous"} 1.0' in text
            # Prometheus fires the shipped rule (for compressed to 5 s), naming graph and stream.
            end = time.monotonic() + DEADLINE_S
            firing: list = []
            while time.monotonic() < end:
                firing = [a for a in _deploy_alerts(prom) if a["state"] == "firing"]
                if len(firing) == 2:
                    break
                time.sleep(1)
            assert sorted((a["labels"]["graph"], a["labels"]["stream"], a["labels"]["kind"], a["labels"]["rank"],
                           a["labels"]["reference"]) for a in firing) == [
                ("cap1", "7", "uniform", "0", "previous"), ("cap1", "8", "uniform", "0", "previous")]
            # four boundaries (three on stream 7, one on 8) +1.5 us each
            assert all("(uniform, +6us per replay)" in a["annotations"]["summary"] for a in firing), firing
        else:
            assert not d["regression"] and not g["regression"] and g["kind"] == "none"
            # Prometheus sees the verdict (every kind at 0) for longer than the rule's for: nothing fires.
            end = time.monotonic() + DEADLINE_S
            while time.monotonic() < end:
                zeros = prom.query('graphmon_deploy_regression{rank="0",graph="cap1"} == 0')
                if len(zeros) == 4 and prom.query(f'count_over_time(graphmon_deploy_regression{{kind="uniform"}}[1m]) '
                                                  f'>= {3 * FOR_S}'):
                    break
                time.sleep(1)
            assert len(zeros) == 4  # uniform, concentrated, mixed, untraced
            assert _deploy_alerts(prom) == [] and not prom.query("graphmon_deploy_regression == 1")
    finally:
        assert r.finish() == 0
        if prom_proc is not None:
            _stop(prom_proc)


def test_series_continue_across_the_restart(tmp_path, monkeypatch):
    """One series per (rank, graph, stream) before and after the restart, carrying v2's gaps once v2
    sends windows. Needs the agent's rank-keyed aggregators (a successor takes over its
    predecessor's series): on a build without them, the gone process's series stay beside the new ones."""
    monkeypatch.setenv("FAKE_V1_STOP", str(tmp_path / "v1-stop"))
    monkeypatch.setenv("FAKE_V2_EXTRA_GAP_NS", str(EXTRA_NS))
    r = Run(tmp_path, "sequence")
    pat = re.compile(r'^graphmon_kernel_gap_quantile_seconds\{([^}]*quantile="0\.5"[^}]*)\} (\S+)$', re.M)

    def series(text):
        out: dict = {}
        for labels, value in pat.findall(text):
            d = dict(re.findall(r'(\w+)="([^"]*)"', labels))
            out.setdefault((d["rank"], d["graph"], d["stream"]), []).append(float(value))
        return out

    try:
        _restart(r, tmp_path)
        before_change = series(r.metrics())
        end = time.monotonic() + DEADLINE_S
        after = {}
        while time.monotonic() < end:  # v2's windows reach the series
            after = series(r.metrics())
            if after.get(("0", "cap1", "8")) and max(after[("0", "cap1", "8")]) > 1.5e-6:
                break
            time.sleep(0.2)
        assert set(after) == {("0", "cap1", "7"), ("0", "cap1", "8")}, after
        assert before_change.keys() <= after.keys()
        # one sample per series: the previous process's series were handed over, not kept beside
        assert {k: len(v) for k, v in after.items()} == {k: 1 for k in after}, after
        assert after[("0", "cap1", "8")] == [pytest.approx((600 + EXTRA_NS) * 1e-9)]
    finally:
        assert r.finish() == 0
