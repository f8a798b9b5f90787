"""docker/k8s/: generated from dashboards/ and alerts.yml, in sync, and sane Kubernetes objects.

No cluster here: the checks are that the committed manifests are what docker/k8s/generate.py
makes (so they cannot drift from dashboards/), that every object round-trips through a typed
model (the official Kubernetes client's; prometheus-operator's CRDs as cloudcoil's generated
models), so a misspelt or mistyped field is dropped or rejected; that every command line and
GRAPHMON_* variable in them is one graphmon accepts; and that the wiring agrees: PodMonitor
selector vs pod labels, port names, the socket volume, the socket's group. tests/system/
test_sidecar.py runs the agent with these settings.
"""

from __future__ import annotations

import json
import os
import re
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


def _pod_specs() -> dict[str, dict]:
    """file name -> pod template spec, of every workload in docker/k8s."""
    out = {}
    for path in sorted(K8S.glob("*.yaml")):
        for doc in _docs(path.name):
            if doc["kind"] in ("Deployment", "DaemonSet"):
                out[f"{path.name}:{doc['kind']}"] = doc["spec"]["template"]["spec"]
    return out


def _env(container: dict) -> dict[str, str]:
    """Literal values; a downward-API value as ``fieldRef:<its field path>``."""
    return {e["name"]: e["value"] if "value" in e else "fieldRef:" + e["valueFrom"]["fieldRef"]["fieldPath"]
            for e in container.get("env", [])}


def _agent_pod_and_engine_pod(name: str) -> tuple[dict, dict, dict, dict]:
    """(agent container, its pod spec, engine container, its pod spec) of a shipped manifest."""
    specs = {k: v for k, v in _pod_specs().items() if k.startswith(name + ":")}
    containers = {c["name"]: (c, spec) for spec in specs.values() for c in spec["containers"]}
    return (*containers["graphmon-agent"], *containers["engine"])


def _supplementary_groups(pod: dict) -> set[int]:
    """What Kubernetes adds to every container's groups: fsGroup and supplementalGroups."""
    sc = pod.get("securityContext") or {}
    return {g for g in [sc.get("fsGroup"), *sc.get("supplementalGroups", [])] if g is not None}


@pytest.mark.parametrize("name", ["agent-sidecar.yaml", "agent-daemonset.yaml"])
def test_agent_shares_the_socket_with_the_engine_and_owns_the_port(name):
    agent, agent_pod, engine, engine_pod = _agent_pod_and_engine_pod(name)
    agent_env, engine_env = _env(agent), _env(engine)
    sock = agent_env["GRAPHMON_AGENT"]
    assert engine_env["GRAPHMON_AGENT"] == sock == "/run/graphmon/agent.sock"
    sources = []
    for c, pod in ((agent, agent_pod), (engine, engine_pod)):
        volumes = {v["name"]: v for v in pod["volumes"]}
        (mount,) = [m for m in c["volumeMounts"] if m["name"] == "graphmon-socket"]
        assert sock.startswith(mount["mountPath"] + "/"), "the socket must live in the mounted volume"
        sources.append({k: v for k, v in volumes[mount["name"]].items() if k != "name"})
    if agent_pod is engine_pod:  # sidecar: one pod, one emptyDir
        assert "emptyDir" in sources[0]
    else:  # DaemonSet: the same host folder in both pods
        assert sources[0]["hostPath"]["path"] == sources[1]["hostPath"]["path"] == "/run/graphmon"
    assert agent["args"] == ["agent"]
    assert agent_env["GRAPHMON_HOST"] == "0.0.0.0" and agent_env["GRAPHMON_PORT"] == "9479"
    assert not any(p["containerPort"] == 9479 for p in engine.get("ports", []))  # only the agent opens graphmon's port
    sc = agent["securityContext"]
    assert sc["runAsNonRoot"] and sc["readOnlyRootFilesystem"] and sc["runAsUser"] == 65534
    assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"] == {"drop": ["ALL"]}
    # The sidecar's readiness would gate the engine's pod (out of its Service while the agent is
    # slow): it has a startup and a liveness probe only; the DaemonSet's pods are the agent alone.
    probes = {k for k in agent if k.endswith("Probe")}
    assert probes == ({"readinessProbe", "livenessProbe"} if agent_pod is not engine_pod
                      else {"startupProbe", "livenessProbe"})
    assert all(agent[k]["httpGet"] == {"path": "/healthz", "port": "graphmon"} for k in probes)
    # a DaemonSet agent may sit on a node that serves nothing: GraphmonNoProcessAttached stays quiet there
    assert agent_env.get("GRAPHMON_EXPECT_PROCESSES") == ("false" if agent_pod is not engine_pod else None)
    # the token comes from the Secret as a file (never a command-line argument), only into the agent
    token_dir = os.path.dirname(agent_env["GRAPHMON_TOKEN_FILE"])
    (tm,) = [m for m in agent["volumeMounts"] if m["mountPath"] == token_dir]
    secret = {v["name"]: v for v in agent_pod["volumes"]}[tm["name"]]["secret"]
    assert tm["readOnly"] and secret["secretName"] == "graphmon" and secret["items"] == [{"key": "token", "path": "token"}]
    assert not any("TOKEN" in e["name"] for e in engine.get("env", []))
    assert "--token" not in " ".join(agent["args"])
    # memory: 2x the highest RSS measured (500 MiB, README "Measured"), so a burst of windows is no OOM kill
    assert agent["resources"]["limits"]["memory"] == "1Gi"
    # The engine runs as root (as vllm/vllm-openai does) and gets in by the socket's group: the
    # agent allows that group, can give its socket that group, and the engine pod has it.
    assert engine["securityContext"]["runAsUser"] == 0
    (gid,) = map(int, agent_env["GRAPHMON_AGENT_ALLOW_GIDS"].split(","))
    assert gid == sc["runAsGroup"] or gid in _supplementary_groups(agent_pod)
    assert gid in _supplementary_groups(engine_pod)


def test_socket_gid_is_one_flag_and_out_folders_are_made(tmp_path):
    out = tmp_path / "my-manifests" / "prod"  # not there yet: `--out my-manifests/` as the docs say
    res = subprocess.run([sys.executable, str(K8S / "generate.py"), "--socket-gid", "2000", "--out", str(out)],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    (dep,) = yaml.safe_load_all((out / "agent-sidecar.yaml").read_text())
    ds, engine = [d for d in yaml.safe_load_all((out / "agent-daemonset.yaml").read_text()) if d]
    pods = {"sidecar": dep["spec"]["template"]["spec"], "daemonset": ds["spec"]["template"]["spec"],
            "engine": engine["spec"]["template"]["spec"]}
    # OnRootMismatch: kubelet leaves a model volume's files alone when its root has the group already
    assert pods["sidecar"]["securityContext"] == {"fsGroup": 2000, "fsGroupChangePolicy": "OnRootMismatch"}
    assert pods["engine"]["securityContext"] == {"supplementalGroups": [2000]}
    for pod in (pods["sidecar"], pods["daemonset"]):
        agent = [c for c in pod["containers"] if c["name"] == "graphmon-agent"][0]
        assert _env(agent)["GRAPHMON_AGENT_ALLOW_GIDS"] == "2000" and agent["securityContext"]["runAsGroup"] == 2000
    assert "os.chown('/run/graphmon', 0, 2000)" in pods["daemonset"]["initContainers"][0]["command"][2]
    bad = subprocess.run([sys.executable, str(K8S / "generate.py"), "--socket-gid", "-1", "--out", str(out)],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "not a group id" in bad.stderr.strip().splitlines()[-1]


def test_daemonset_prepares_the_host_folder_for_the_agent():
    (ds, engine) = _docs("agent-daemonset.yaml")
    spec = ds["spec"]["template"]["spec"]
    (init,) = spec["initContainers"]
    agent = spec["containers"][0]
    gid = int(_env(agent)["GRAPHMON_AGENT_ALLOW_GIDS"])
    assert init["volumeMounts"] == [m for m in agent["volumeMounts"] if m["name"] == "graphmon-socket"]
    code = init["command"][2]
    assert init["command"][:2] == ["python3", "-c"] and compile(code, "init", "exec")
    assert f"os.chown('/run/graphmon', 0, {gid})" in code and "os.chmod('/run/graphmon', 0o770)" in code
    assert init["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN"]}
    assert spec["volumes"][0]["hostPath"]["type"] == "DirectoryOrCreate"
    # the engine pod waits for the prepared folder instead of making a root-owned one
    assert engine["spec"]["template"]["spec"]["volumes"][0]["hostPath"]["type"] == "Directory"
    assert "graphmon.io/scrape" not in engine["spec"]["template"]["metadata"]["labels"]
    assert ds["spec"]["template"]["metadata"]["labels"]["graphmon.io/scrape"] == "true"  # the PodMonitor's selector


def _graphmon_variables() -> set[str]:
    """Every GRAPHMON_* variable graphmon reads: its settings' fields and the names in its code."""
    from graphmon.settings import CuptiSettings, Settings

    names = {f"GRAPHMON_{f.upper()}" for model in (Settings, CuptiSettings) for f in model.model_fields}
    for path in (ROOT / "graphmon").rglob("*.py"):
        names |= set(re.findall(r"""["'](GRAPHMON_[A-Z0-9_]+)["']""", path.read_text()))
    return names


def test_manifest_command_lines_and_variables_are_graphmons(monkeypatch, tmp_path):
    from graphmon.cli import build_parser
    from graphmon.settings import Settings
    from graphmon.sources.remote import PeerPolicy

    known = _graphmon_variables()
    assert {"GRAPHMON_AGENT", "GRAPHMON_AGENT_ALLOW_GIDS", "GRAPHMON_HOST", "GRAPHMON_PORT"} <= known
    checked = 0
    for where, spec in _pod_specs().items():
        for c in spec.get("initContainers", []) + spec["containers"]:
            env = _env(c)
            for name in env:
                if name.startswith("GRAPHMON_"):
                    assert name in known, f"{where} {c['name']}: graphmon does not read {name}"
            if c["image"].startswith("graphmon:") and "command" not in c:
                # the image's ENTRYPOINT is graphmon: args are its command line, and its settings
                # (flags and variables together) must be valid
                args = build_parser().parse_args(c["args"])
                for k in [k for k in os.environ if k.startswith("GRAPHMON_")]:
                    monkeypatch.delenv(k)
                for k, v in env.items():
                    if k.endswith("_FILE"):  # a mounted Secret: a file of the same name here
                        assert v.startswith("/run/secrets/"), (k, v)
                        v = str(tmp_path / os.path.basename(v))
                        (tmp_path / os.path.basename(v)).write_text("a-token\n")
                    monkeypatch.setenv(k, v)
                Settings()
                PeerPolicy.from_env()
                assert args.command == "agent"
                checked += 1
    assert checked == 2  # the sidecar and the DaemonSet agents


def _round_trip_models():
    kubernetes = pytest.importorskip("kubernetes")
    from cloudcoil.models.prometheus_operator import v1 as monitoring

    import crd_models

    client = kubernetes.client.ApiClient()

    def k8s(model):
        return lambda d: client.sanitize_for_serialization(client.deserialize(json.dumps(d), model, "application/json"))

    def crd(model):
        return lambda d: model.model_validate(d).model_dump(by_alias=True, exclude_unset=True, mode="json")

    return {("apps/v1", "Deployment"): k8s("V1Deployment"), ("apps/v1", "DaemonSet"): k8s("V1DaemonSet"),
            ("v1", "ConfigMap"): k8s("V1ConfigMap"),
            ("monitoring.coreos.com/v1", "PodMonitor"): crd(monitoring.PodMonitor),
            ("monitoring.coreos.com/v1", "PrometheusRule"): crd(monitoring.PrometheusRule),
            ("argoproj.io/v1alpha1", "AnalysisTemplate"): crd(crd_models.AnalysisTemplate),
            ("flagger.app/v1beta1", "MetricTemplate"): crd(crd_models.MetricTemplate)}


@pytest.mark.parametrize("name", sorted(p.name for p in K8S.glob("*.yaml")))
def test_every_manifest_round_trips_through_typed_models(name):
    """A misspelt key is dropped on the way through (the round trip differs), a wrong type or a
    missing required field raises. Every kind shipped must have a model here."""
    models = _round_trip_models()
    for doc in _docs(name):
        key = (doc["apiVersion"], doc["kind"])
        assert key in models, f"{name}: no model checks {key}"
        assert models[key](doc) == doc
        broken = json.loads(json.dumps(doc))
        broken["metadata"]["label"] = broken["metadata"].pop("labels")  # misspelt
        assert models[key](broken) != broken


def test_round_trip_notices_what_it_should():
    models = _round_trip_models()
    (dep,) = _docs("agent-sidecar.yaml")
    with pytest.raises(ValueError):  # a container without its required name
        models[("apps/v1", "Deployment")]({**dep, "spec": {**dep["spec"], "template": {"spec": {"containers": [{"image": "x"}]}}}})
    broken = json.loads(json.dumps(dep))
    agent = broken["spec"]["template"]["spec"]["containers"][1]
    agent["volumeMount"] = agent.pop("volumeMounts")
    assert models[("apps/v1", "Deployment")](broken) != broken
    (pm,) = _docs("podmonitor.yaml")
    bad = json.loads(json.dumps(pm))
    bad["spec"]["podMetricsEndpoints"][0]["interval"] = 15  # a number where the CRD wants a duration string
    with pytest.raises(ValueError):
        models[("monitoring.coreos.com/v1", "PodMonitor")](bad)
    bad["spec"]["podMetricEndpoints"] = bad["spec"].pop("podMetricsEndpoints")
    bad["spec"]["podMetricEndpoints"][0]["interval"] = "15s"
    assert models[("monitoring.coreos.com/v1", "PodMonitor")](bad) != bad


def test_docs_describe_exactly_the_shipped_manifests():
    """Every docker/ path the docs name exists, and docs/deployment.md describes every manifest."""
    shipped = {p.name for p in K8S.glob("*.yaml")}
    text = (ROOT / "docs" / "deployment.md").read_text()
    described = set(re.findall(r"^\| `([\w.-]+\.yaml)` \|", text, re.M))
    assert described == shipped
    for doc in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]:
        for path in re.findall(r"\bdocker/[\w./-]*[\w]", doc.read_text()):
            assert (ROOT / path).exists(), f"{doc.name} names {path}, which is not shipped"
    assert not re.search(r"(?<!ships no )helm chart", text, re.I)  # none is shipped


def test_the_generators_run_in_the_base_install():
    """`pip install .` (what docs/deployment.md sets up) brings every module the generators import:
    the standard library and base dependencies only (pyyaml is one: the web config is YAML too)."""
    import ast

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    base = {re.split(r"[<>=!~\[ ;]", d, maxsplit=1)[0].lower() for d in deps}
    dist_of = {"yaml": "pyyaml"}  # import name -> distribution, where they differ
    for script in (K8S / "generate.py", ROOT / "dashboards" / "generate.py"):
        for node in ast.walk(ast.parse(script.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else [])
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top != "__future__":
                    assert dist_of.get(top, top) in base, f"{script.name} imports {top}, not a base dependency"
