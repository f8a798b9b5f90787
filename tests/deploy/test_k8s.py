"""docker/k8s/: generated from dashboards/ and alerts.yml, in sync, and sane Kubernetes objects.

No cluster here: the checks are that the committed manifests are what docker/k8s/generate.py
makes (so they cannot drift from dashboards/), that the Deployment round-trips through the
official Kubernetes client's models (a misspelt or mistyped field is dropped or rejected there),
and that the wiring agrees: PodMonitor selector vs pod labels, port names, the socket volume.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from _promutil import ALERTS, ROOT, load_dashboards, load_script, promtool

K8S = ROOT / "docker" / "k8s"


GEN = load_script(K8S / "generate.py", "k8s_generate")


def _docs(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((K8S / name).read_text()) if d is not None]


def test_committed_manifests_are_what_the_generator_makes(tmp_path):
    assert GEN.main(["--check"]) == 0, "docker/k8s is stale: run python docker/k8s/generate.py"
    assert {p.name for p in K8S.glob("*.yaml")} == set(GEN.build({"release": "x"}, {"grafana_dashboard": "1"}, "i", "e"))
    # --check notices drift, e.g. an alert rule edited in dashboards/alerts.yml only.
    GEN.main(["--out", str(tmp_path)])
    assert GEN.main(["--check", "--out", str(tmp_path)]) == 0
    rule = tmp_path / "prometheusrule.yaml"
    rule.write_text(rule.read_text().replace("for: 15m", "for: 1m", 1))
    assert GEN.main(["--check", "--out", str(tmp_path)]) == 1


def test_prometheusrule_is_alerts_yml():
    (doc,) = _docs("prometheusrule.yaml")
    assert doc["apiVersion"] == "monitoring.coreos.com/v1" and doc["kind"] == "PrometheusRule"
    assert doc["spec"]["groups"] == yaml.safe_load(ALERTS.read_text())["groups"]
    assert doc["metadata"]["labels"]["release"] == "kube-prometheus-stack"


def test_prometheusrule_groups_pass_promtool(tmp_path):
    (doc,) = _docs("prometheusrule.yaml")
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump({"groups": doc["spec"]["groups"]}))
    res = promtool("check", "rules", str(path))
    assert res.returncode == 0, res.stdout + res.stderr


def test_dashboard_configmaps_hold_the_dashboards():
    docs = _docs("dashboards-configmap.yaml")
    models = load_dashboards()
    seen = {}
    for doc in docs:
        assert doc["apiVersion"] == "v1" and doc["kind"] == "ConfigMap"
        assert doc["metadata"]["labels"]["grafana_dashboard"] == "1"  # the Grafana sidecar's default label
        (name, text), = doc["data"].items()
        seen[name] = json.loads(text)
        # client-side `kubectl apply` keeps the whole object in a 256 KiB annotation
        assert len(yaml.safe_dump(doc).encode()) < 256 * 1024
    assert seen == models


def test_release_label_is_configurable(tmp_path):
    res = subprocess.run([sys.executable, str(K8S / "generate.py"), "--release", "prom-stack", "--out", str(tmp_path)],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    for name in ("podmonitor.yaml", "prometheusrule.yaml"):
        (doc,) = yaml.safe_load_all((tmp_path / name).read_text())
        assert doc["metadata"]["labels"]["release"] == "prom-stack"
    res = subprocess.run([sys.executable, str(K8S / "generate.py"), "--selector-label", "prometheus=main", "--out", str(tmp_path)],
                         capture_output=True, text=True)
    (doc,) = yaml.safe_load_all((tmp_path / "podmonitor.yaml").read_text())
    assert res.returncode == 0 and doc["metadata"]["labels"]["prometheus"] == "main" and "release" not in doc["metadata"]["labels"]
    bad = subprocess.run([sys.executable, str(K8S / "generate.py"), "--release", "not a label", "--out", str(tmp_path)],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.strip().splitlines()[-1].startswith("generate.py: error: not a Kubernetes label")


def test_podmonitor_scrapes_the_agent_port_of_labelled_pods():
    (pm,) = _docs("podmonitor.yaml")
    (dep,) = _docs("agent-sidecar.yaml")
    assert pm["kind"] == "PodMonitor"
    pod = dep["spec"]["template"]
    # The PodMonitor selects the example pod, and the pod's Deployment selector matches its labels.
    assert pm["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert dep["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    (endpoint,) = pm["spec"]["podMetricsEndpoints"]
    assert {"targetLabel": "job", "replacement": "graphmon"} in endpoint["relabelings"]
    ports = {p["name"]: p["containerPort"] for c in pod["spec"]["containers"] for p in c.get("ports", [])}
    assert ports[endpoint["port"]] == 9479 and len(endpoint["port"]) <= 15


def test_agent_sidecar_shares_the_socket_and_owns_the_port():
    (dep,) = _docs("agent-sidecar.yaml")
    spec = dep["spec"]["template"]["spec"]
    containers = {c["name"]: c for c in spec["containers"]}
    engine, agent = containers["engine"], containers["graphmon-agent"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    for c in (engine, agent):
        env = {e["name"]: e["value"] for e in c["env"]}
        (mount,) = c["volumeMounts"]
        assert "emptyDir" in volumes[mount["name"]]
        assert env["GRAPHMON_AGENT"].startswith(mount["mountPath"] + "/"), "the socket must live in the shared volume"
    assert agent["args"] == ["agent"]
    agent_env = {e["name"]: e["value"] for e in agent["env"]}
    assert agent_env["GRAPHMON_HOST"] == "0.0.0.0" and agent_env["GRAPHMON_PORT"] == "9479"
    assert not any(p["containerPort"] == 9479 for p in engine.get("ports", []))  # only the agent opens graphmon's port
    assert agent["securityContext"]["runAsNonRoot"] and agent["securityContext"]["readOnlyRootFilesystem"]
    assert agent["readinessProbe"]["httpGet"]["port"] == "graphmon"
    # The graphmon CLI accepts what the sidecar runs (once the agent command exists on this branch).
    from graphmon.cli import build_parser

    try:
        args = build_parser().parse_args(agent["args"])
    except SystemExit:
        pytest.skip("`graphmon agent` is not on this branch yet (the agent engineer adds it)")
    assert args.command == "agent"


def test_deployment_round_trips_through_the_kubernetes_models():
    """The official client's models know every field of apps/v1 Deployment: a misspelt key is
    dropped on the way through, a wrong type raises, a missing required field raises."""
    kubernetes = pytest.importorskip("kubernetes")
    client = kubernetes.client.ApiClient()
    (dep,) = _docs("agent-sidecar.yaml")

    def deserialize(obj):
        return client.deserialize(json.dumps(obj), "V1Deployment", "application/json")

    model = deserialize(dep)
    assert client.sanitize_for_serialization(model) == dep
    with pytest.raises(ValueError):  # a container without its required name
        deserialize({**dep, "spec": {**dep["spec"], "template": {"spec": {"containers": [{"image": "x"}]}}}})
    broken = json.loads(json.dumps(dep))
    broken["spec"]["template"]["spec"]["containers"][1]["volumeMount"] = broken["spec"]["template"]["spec"]["containers"][1].pop("volumeMounts")
    assert client.sanitize_for_serialization(deserialize(broken)) != broken
