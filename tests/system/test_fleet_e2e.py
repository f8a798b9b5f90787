"""The fleet deploy verdict end to end on the CPU: two `graphmon agent`s as two nodes' DaemonSet agents,
engine "pods" (fake torch + fake CUPTI processes with the downward-API variables the shipped manifests
set) rolled from build a to build b, a real `prometheus` scraping both agents with the shipped rules.

Four workloads at once: b widens every gap (uniform), b widens one gap (concentrated), b identical to a,
and a rollback (a is the slow build, b the faster one rolled back to). GraphmonFleetDeployRegression
fires for the first two only; the Argo Rollouts template's query, run against the same Prometheus
while both builds serve, fails the widened canary and passes the identical one.

Time compression, in this Prometheus's copy of dashboards/alerts.yml only: the fleet rules' 5-minute
rate windows are 8 s and the alert's `for: 5m` is 4 s (a test cannot wait 10 minutes); every
threshold, and every other rule, is as shipped.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time

import pytest
import yaml

from _promutil import ALERTS, K8S, ROOT, load_script, require_binary

_prom = load_script(ROOT / "tests" / "system" / "test_prometheus_e2e.py", "_fleet_e2e_prom")
_deploy_e2e = load_script(ROOT / "tests" / "system" / "test_deploy_e2e.py", "_fleet_e2e_deploy")
Prom, _free_port, _stop = _prom.Prom, _prom._free_port, _prom._stop
TESTS = ROOT / "tests"
WORKLOADS = {  # workload: (build a's env, build b's env)
    "uniform": ({}, {"FAKE_EXTRA_GAP_NS": "1500"}),
    "concentrated": ({}, {"FAKE_EXTRA_GAP_LAST_NS": "5000"}),
    "identical": ({}, {}),
    "rollback": ({"FAKE_EXTRA_GAP_NS": "1500"}, {}),
}
CHILD = """
    import os, time, graphmon, torch
    graphmon.attach(interval_s=0.2, first_window_s=0.0, window_launches=4, max_traced_share=1.0)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        pass
    t0 = time.monotonic()
    while not os.path.exists(os.environ["FAKE_STOP"]) and time.monotonic() - t0 < 120:
        g.replay(); time.sleep(0.004)
"""


def _rules(tmp_path):
    doc = yaml.safe_load(ALERTS.read_text())
    for group in doc["groups"]:
        if group["name"] == "graphmon-fleet":
            for rule in group["rules"]:
                rule["expr"] = rule["expr"].replace("[5m]", "[8s]")
                if rule.get("alert") == "GraphmonFleetDeployRegression":
                    rule["for"] = "4s"
    path = tmp_path / "alerts.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _hash(workload: str, build: str) -> str:
    """The pod-template-hash of a workload's build: unique per pod spec, as a ReplicaSet's."""
    return f"{workload[:3]}{build}7f9"


class Fleet:
    def __init__(self, tmp_path):
        self.tmp = tmp_path
        self.env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(TESTS), str(TESTS / "fake_site")]),
                        GRAPHMON_CUPTI_API="cupti:cupti")
        for k in [k for k in self.env if k.startswith("GRAPHMON_") and k != "GRAPHMON_CUPTI_API"]:
            del self.env[k]
        self.agents, self.ports, self.pods = [], [], {}
        for node in ("n0", "n1"):
            sock = tmp_path / node / "agent.sock"
            sock.parent.mkdir()
            port = _free_port()
            self.agents.append((subprocess.Popen([sys.executable, "-m", "graphmon.cli", "agent", "--port", str(port),
                                                  "--socket", str(sock)], env=self.env, stderr=subprocess.DEVNULL),
                                sock))
            self.ports.append(port)

    def start_pod(self, workload: str, build: str, node: int, extra: dict) -> None:
        name = f"{workload}-{build}-{node}"
        env = {**self.env, **extra, "GRAPHMON_AGENT": str(self.agents[node][1]), "FAKE_STOP": str(self.tmp / name),
               "GRAPHMON_POD_NAMESPACE": "fleet", "GRAPHMON_POD_NAME": f"{workload}-{_hash(workload, build)}-x{node}",
               "GRAPHMON_POD_TEMPLATE_HASH": _hash(workload, build), "GRAPHMON_CONTAINER_NAME": "engine"}
        self.pods[name] = subprocess.Popen([sys.executable, "-c", textwrap.dedent(CHILD)], env=env)

    def stop_pod(self, workload: str, build: str, node: int) -> None:
        (self.tmp / f"{workload}-{build}-{node}").touch()

    def close(self) -> None:
        for name in self.pods:
            (self.tmp / name).touch()
        for p in self.pods.values():
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
        for a, _ in self.agents:
            _stop(a)


def _prometheus(tmp_path, ports) -> tuple[subprocess.Popen, Prom]:
    # one target per node's agent, with the engine's labels kept (the PodMonitor's honorLabels)
    targets = [{"targets": [f"127.0.0.1:{p}"], "labels": {"node": f"n{i}", "pod": f"graphmon-agent-{i}"}}
               for i, p in enumerate(ports)]
    return _deploy_e2e.start_prometheus(tmp_path, _rules(tmp_path), [
        {"job_name": "graphmon", "honor_labels": True, "static_configs": targets}])


def _argo_query(canary: str, stable: str) -> str:
    (tmpl,) = [d for d in yaml.safe_load_all((K8S / "canary-analysis.yaml").read_text())
               if d and d["kind"] == "AnalysisTemplate"]
    (m,) = [x for x in tmpl["spec"]["metrics"] if x["name"] == "graphmon-regressed-graphs"]
    args = {"namespace": "fleet", "canary-hash": canary, "stable-hash": stable}
    return re.sub(r"\{\{args\.([\w-]+)\}\}", lambda x: args[x.group(1)], m["provider"]["prometheus"]["query"])


def _firing(prom: Prom) -> set[tuple[str, str]]:
    return {(a["labels"]["workload"], a["labels"]["build"]) for a in prom.get("/api/v1/alerts")["alerts"]
            if a["labels"]["alertname"] == "GraphmonFleetDeployRegression" and a["state"] == "firing"}


def _wait(pred, timeout_s: float, what: str):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        got = pred()
        if got:
            return got
        time.sleep(1)
    pytest.fail(f"timed out waiting for {what}")


def test_a_rolling_update_pages_only_for_the_builds_that_made_decode_slower(tmp_path):
    require_binary("prometheus")
    fleet = Fleet(tmp_path)
    prom_proc = None
    try:
        prom_proc, prom = _prometheus(tmp_path, fleet.ports)
        for wl, (a, _) in WORKLOADS.items():  # build a: one pod on each node
            for node in (0, 1):
                fleet.start_pod(wl, "a", node, a)
        _wait(lambda: len(prom.query('fleet:graphmon_replays:rate5m{build=~".*a7f9"} > 0.1')) == 4, 90,
              "build a's replays")
        time.sleep(6)  # build a serves alone for a while: nothing to compare, nothing fires
        assert _firing(prom) == set()
        for node in (0, 1):  # the rolling update: b's pod up, then a's pod on that node down
            for wl, (_, b) in WORKLOADS.items():
                fleet.start_pod(wl, "b", node, b)
            _wait(lambda: len(prom.query('fleet:graphmon_replays:rate5m{build=~".*b7f9"} > 0.1')) == 4, 60,
                  "build b's replays")
            if node == 0:  # both builds serve: what a canary analysis of each workload sees (once the
                # canary has 0.1 replays/s over the template's 5 minutes: a few seconds of its windows)
                want = {"uniform": 1.0, "concentrated": 1.0, "identical": 0.0, "rollback": 0.0}
                canary: dict = {}

                def analysed():
                    canary.update({wl: float(prom.query(_argo_query(_hash(wl, "b"), _hash(wl, "a")))[0]["value"][1])
                                   for wl in WORKLOADS})
                    return canary == want

                end = time.monotonic() + 30
                while not analysed() and time.monotonic() < end:
                    time.sleep(1)
                assert canary == want, canary
            for wl in WORKLOADS:
                fleet.stop_pod(wl, "a", node)
        widened = {("uniform", _hash("uniform", "b")), ("concentrated", _hash("concentrated", "b"))}
        firing = _wait(lambda: _firing(prom) >= widened and _firing(prom), 90, "the fleet alert for the widened builds")
        assert firing == {("uniform", _hash("uniform", "b")), ("concentrated", _hash("concentrated", "b"))}, firing
        # b is the newest build of every workload; rollback's b (the faster one) and identical's b fire nothing
        newest = {(r["metric"]["workload"], r["metric"]["build"]) for r in prom.query("fleet:graphmon_build:newest")}
        assert newest == {(wl, _hash(wl, "b")) for wl in WORKLOADS}
        reg = {r["metric"]["workload"]: float(r["value"][1]) for r in prom.query("fleet:graphmon_deploy_regression")}
        assert reg == {"uniform": 1.0, "concentrated": 1.0, "identical": 0.0, "rollback": 0.0}, reg
        # a widening; confirmed by the untraced replay time where both builds have one, else the traced rule alone
        both = {r["metric"]["workload"] for r in prom.query("fleet:graphmon_replay_untraced_seconds:added5m")}
        kinds = {(r["metric"]["workload"], r["metric"].get("kind"), r["metric"].get("untraced"))
                 for r in prom.query("fleet:graphmon_deploy_regression == 1")}
        assert kinds == {(wl, "widening", "confirms" if wl in both else "absent") for wl in ("uniform", "concentrated")}, kinds
        # every fleet rule evaluated on the live series of two builds without an error (matching, duplicates)
        rules = [r for g in prom.get("/api/v1/rules")["groups"] if g["name"] == "graphmon-fleet" for r in g["rules"]]
        assert rules and not {r["name"]: r.get("lastError") for r in rules if r["health"] != "ok"}
        # the engine's pod, not the agent's, on its series (honor_labels, as the PodMonitor)
        pods = {r["metric"]["pod"] for r in prom.query('graphmon_up{namespace="fleet"}')}
        assert pods and all(p.split("-")[0] in WORKLOADS for p in pods), pods
    finally:
        fleet.close()
        if prom_proc is not None:
            _stop(prom_proc)
