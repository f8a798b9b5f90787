"""A restart under one agent, end to end on the CPU: `graphmon run` over a launcher that runs rank 0's
worker v1 and then v2 in its place (fake torch + fake CUPTI, tests/fake_site), a real `prometheus`
scraping the agent every second with the shipped alert rules. Both workers time replays untraced
(reference phases and bursts, CUDA events on the fake GPU's clock), so the verdict has the
untraced replay time of both sides.

- widened: v2 with +1.5 us on every boundary. The agent's deploy verdict flags it within three
  windows of v2's first replay, the untraced time agrees, and GraphmonDeployRegression fires
  naming the graph and the stream.
- no-change: v2 the same build. The verdict says no regression, nothing fires.
- eventrec (issue 36's event-record build, the fleet bench's fake of it): v2 is faster untraced
  (every gap 200 ns narrower) but every gap is 1.3 us wider while traced. Kind observer_only:
  graphmon_deploy_regression stays 0 for every kind once the untraced time is measured, nothing fires.
- plus1 (issue 36's +1% build): one more 1.5 us kernel per 141 us replay (+1.06%), traced and
  untraced alike, no gap wider. Kind untraced: GraphmonDeployUntracedRegression fires naming the
  graph, GraphmonDeployRegression does not.

Time compression: in the copy of dashboards/alerts.yml that this Prometheus loads, the `for:` of
GraphmonDeployRegression (5m) and of GraphmonDeployUntracedRegression (2m) is 5 s (the only
changes; a test cannot wait minutes). Every other rule is as shipped (their day-long windows cannot
fire here, and must not). The workers' untraced bursts, through the environment: 32 launches
every 0.2 s, 200 ms at most (shipped: 128 every 30 s, 1 s), so that each side has hundreds of
untraced replays (the verdict asks 20) within a second of its first window.
"""

from __future__ import annotations

import re
import subprocess
import time

import pytest
import yaml

from _promutil import ALERTS, ROOT, load_script, require_binary
from graphmon.analysis.deploy import Gate

# The helpers of the neighbouring system tests, reused as they are: `graphmon run` over the fake
# engines, and a real Prometheus on loopback.
_trees = load_script(ROOT / "tests" / "system" / "test_agent_trees.py", "_deploy_e2e_trees")
_prom = load_script(ROOT / "tests" / "system" / "test_prometheus_e2e.py", "_deploy_e2e_prom")
Run, Prom, _stop = _trees.Run, _prom.Prom, _prom._stop
# The fleet bench's builds on the fake GPU (their FAKE_<KNOB>s, tests/fake_site/torch/cuda/graphs.py):
# issue 36's acceptance workloads, as bench/deploy/fleet.py runs them.
BUILDS = load_script(ROOT / "bench" / "common" / "fleet_pods.py", "_deploy_e2e_pods").BUILDS

EXTRA_NS = 1500
FOR_S = 5  # the deploy alerts' for: in the time-compressed copy
DEADLINE_S = 90
DEPLOY_ALERTS = ("GraphmonDeployRegression", "GraphmonDeployUntracedRegression")
BURSTS = {"GRAPHMON_UNTRACED_BURST_LAUNCHES": "32", "GRAPHMON_UNTRACED_BURST_INTERVAL_S": "0.2",
          "GRAPHMON_UNTRACED_BURST_DURATION_MS": "200"}
# case: (v1's fake GPU knobs, v2's: v2 keeps v1's where it names none), cap1's kind, the alert that fires
CASES = {
    "widened": ({}, {"EXTRA_GAP_NS": EXTRA_NS}, "uniform", "GraphmonDeployRegression"),
    "no-change": ({}, {}, "none", None),
    "eventrec": (BUILDS["long"][0], BUILDS["eventrec"][0], "observer_only", None),
    "plus1": (BUILDS["long"][0], BUILDS["plus1"][0], "untraced", "GraphmonDeployUntracedRegression"),
}


def _compressed_rules(tmp_path):
    doc = yaml.safe_load(ALERTS.read_text())
    hits = 0
    for group in doc["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") in DEPLOY_ALERTS:
                rule["for"] = f"{FOR_S}s"
                hits += 1
    assert hits == len(DEPLOY_ALERTS)
    path = tmp_path / "alerts.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _prometheus(tmp_path, target: str) -> tuple[subprocess.Popen, Prom]:
    return start_prometheus(tmp_path, _compressed_rules(tmp_path),
                            [{"job_name": "graphmon", "static_configs": [{"targets": [target]}]}])


def start_prometheus(tmp_path, rules, scrape_configs: list) -> tuple[subprocess.Popen, Prom]:
    """A real Prometheus on loopback scraping and evaluating every second (tests/system/test_fleet_e2e.py too)."""
    config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"}, "rule_files": [str(rules)],
              "scrape_configs": scrape_configs}
    return _prom.start_prometheus(tmp_path, config, time.monotonic() + 40)


def _firing(prom: Prom, alertname: str) -> list[dict]:
    return [a for a in prom.get("/api/v1/alerts")["alerts"]
            if a["labels"]["alertname"] == alertname and a["state"] == "firing"]


def _restart(r: Run, tmp_path) -> tuple[str, dict]:
    """v1 sends a few windows, stops; v2 takes rank 0. Returns v1's pid and v2's process entry."""
    s = r.wait(lambda s: any(p["windows_total"] >= 3 and p["state"] == "running" for p in s["processes"]))
    v1 = next(p for p in s["processes"] if p["state"] == "running")
    assert v1["rank"] == "0"
    (tmp_path / "v1-stop").touch()
    s = r.wait(lambda s: any(p["pid"] != v1["pid"] and p["state"] == "running" and p["records_total"] > 0
                             for p in s["processes"]))
    return v1["pid"], next(p for p in s["processes"] if p["pid"] != v1["pid"] and p["state"] == "running")


def _untraced_pooled(d: dict) -> bool:
    """A verdict over enough untraced replays of cap1 on both sides (what was pooled, whatever the verdict made of it)."""
    need = Gate().min_untraced
    return (d["reference"] == "previous" and d["state"] == "ready"
            and min(d["reference_untraced"].get("cap1", 0), d["current_untraced"].get("cap1", 0)) >= need)


@pytest.mark.parametrize("case", list(CASES))
def test_a_restart_under_one_agent_pages_only_on_a_slower_replay(tmp_path, monkeypatch, case):
    v1_knobs, v2_knobs, kind, alert = CASES[case]
    require_binary("prometheus")
    monkeypatch.setenv("FAKE_V1_STOP", str(tmp_path / "v1-stop"))
    for k, v in v1_knobs.items():
        monkeypatch.setenv(f"FAKE_{k}", str(v))
    for k, v in v2_knobs.items():
        monkeypatch.setenv(f"FAKE_V2_{k}", str(v))
    for k, v in BURSTS.items():
        monkeypatch.setenv(k, v)
    r = Run(tmp_path, "sequence")
    prom_proc = None
    try:
        prom_proc, prom = _prometheus(tmp_path, r.url.removeprefix("http://"))
        v1_pid, v2 = _restart(r, tmp_path)
        # The verdict: against v1's pooled windows, with v2's second or third window.
        s = r.wait(lambda s: any(_untraced_pooled(d) for d in s.get("deploy", [])), timeout=DEADLINE_S)
        (d,) = [d for d in s["deploy"] if d["reference"] == "previous"]
        assert (d["rank"], d["reference_pid"], d["current_pid"]) == ("0", v1_pid, v2["pid"])
        assert d["current_windows"] <= 3, d  # within three windows of v2's first replay
        assert d["untraced"] == "measured", d
        (g,) = d["graphs"]
        assert g["graph"] == "cap1"  # the capture order names the graph in both processes
        assert (g["kind"], d["regression"], g["regression"]) == (kind, alert is not None, alert is not None), g
        shift_ns = g["untraced_replay"]["shift_ns"]  # the fake GPU's clock: exact
        text = r.metrics()
        if kind == "uniform":
            assert g["untraced"] == "slower" and shift_ns == 4 * EXTRA_NS  # the 4 kernels of stream 7 start 1.5 us later
            assert g["flagged_streams"] == [7, 8]
            assert all(s["flagged"] and abs(s["shift_ns"] - EXTRA_NS) <= 32 for s in g["streams"])
            assert g["top"] and g["top"][0]["kernel_before"]  # the boundaries, in /status
        elif kind == "none":
            assert g["untraced"] == "unchanged" and shift_ns == 0 and not g["widening"]
        elif kind == "observer_only":  # wider traced, every gap 200 ns narrower untraced
            assert (g["widening"], g["widening_kind"], g["net"], g["untraced"]) == (True, "uniform", "slower", "faster")
            assert shift_ns == 16 * 2 * -200, g["untraced_replay"]  # the 32 kernels of stream 7, each 200 ns sooner
        else:  # the extra kernel: untraced +1.5 us, no gap wider
            assert (g["widening"], g["widening_kind"], g["untraced"], g["why"]) == (False, "none", "slower", "untraced")
            assert shift_ns == BUILDS["plus1"][0]["EXTRA_KERNEL_NS"] and g["untraced_rel_shift"] >= 0.01, g
        if alert:
            assert (f'graphmon_deploy_regression{{device="0",graph="cap1",kind="{kind}",rank="0",reference="previous"}} '
                    "1.0") in text
        # Prometheus: the shipped rule fires (for: compressed), or the verdict, held longer than the
        # rules' for:, fires none.
        want = {"uniform": 2, "untraced": 1}.get(kind, 0)  # one alert per flagged stream; one per graph
        end = time.monotonic() + DEADLINE_S
        firing: list = []
        while time.monotonic() < end:
            firing = _firing(prom, alert) if alert else []
            held = prom.query(f'count_over_time(graphmon_deploy_untraced_shift_seconds{{graph="cap1"}}[1m]) >= {3 * FOR_S}')
            if (want and len(firing) == want) or (not want and held):
                break
            time.sleep(1)
        if kind == "uniform":
            assert sorted((a["labels"]["graph"], a["labels"]["stream"], a["labels"]["kind"], a["labels"]["rank"],
                           a["labels"]["reference"]) for a in firing) == [
                ("cap1", "7", "uniform", "0", "previous"), ("cap1", "8", "uniform", "0", "previous")]
            # four boundaries (three on stream 7, one on 8) +1.5 us each
            assert all("(uniform, +6us per replay)" in a["annotations"]["summary"] for a in firing), firing
        elif kind == "untraced":
            (a,) = firing
            assert ({k: a["labels"][k] for k in ("graph", "kind", "rank", "device", "reference")}
                    == {"graph": "cap1", "kind": "untraced", "rank": "0", "device": "0", "reference": "previous"})
            assert float(a["value"]) == pytest.approx(shift_ns * 1e-9) and "slower untraced" in a["annotations"]["summary"]
        else:
            assert held, "the verdict with its untraced time did not reach Prometheus"
        # Every kind but the page's stayed 0 while the untraced time was measured, and no other deploy
        # alert fired (Prometheus's own ALERTS series, over the whole run).
        measured = prom.query(f'max_over_time((graphmon_deploy_regression{{graph="cap1",kind!="{kind}"}} '
                              'and on (job, instance, rank, device, graph, reference) '
                              'graphmon_deploy_untraced_shift_seconds)[5m:1s])')
        assert len(measured) == (3 if alert else 4) and all(float(m["value"][1]) == 0 for m in measured), measured
        fired = prom.query('count_over_time(ALERTS{alertstate="firing",alertname=~"GraphmonDeploy.*"}[5m])')
        assert {m["metric"]["alertname"] for m in fired} == ({alert} if alert else set()), fired
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
