"""docker/k8s/canary-analysis.yaml: the Argo Rollouts AnalysisTemplate and the Flagger MetricTemplate.
Their PromQL, with the arguments a rollout gives them, runs in Prometheus's own engine (promtool's
unit tests) over series of a stable build and canaries: a widened canary fails, an identical one and
one that is faster as a whole pass, a canary with no replays fails the data check."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from _promutil import K8S, promtool

DOCS = {d["kind"]: d for d in yaml.safe_load_all((K8S / "canary-analysis.yaml").read_text()) if d}
ARGO, FLAGGER = DOCS["AnalysisTemplate"], DOCS["MetricTemplate"]
SPAN, IDLE, GAP = 1.6e-3, 250e-6, 250e-6  # per replay, the stable build
BUILDS = {  # build: (span, idle, gap time) per replay
    "stable": (SPAN, IDLE, GAP),
    "wide": (SPAN + 300e-6, IDLE + 300e-6, GAP + 300e-6),  # every gap +~0.3 us
    "same": (SPAN + 0.4e-6, IDLE + 0.2e-6, GAP + 0.3e-6),
    "faster": (SPAN - 50e-6, IDLE - 50e-6, GAP + 15e-6),  # a few gaps wider in a faster replay
}


def _series(labels: dict, s: float, i: float, g: float) -> list[dict]:
    lab = ",".join(f'{k}="{v}"' for k, v in {**labels, "graph": "decode", "rank": "0"}.items())
    per_min = 60  # replays a minute
    return [{"series": f"graphmon_replay_gpu_seconds_count{{{lab}}}", "values": f"0+{per_min}x20"},
            {"series": f"graphmon_replay_gpu_seconds_sum{{{lab}}}", "values": f"0+{per_min * s:.6g}x20"},
            {"series": f"graphmon_replay_idle_seconds_sum{{{lab}}}", "values": f"0+{per_min * i:.6g}x20"},
            {"series": f'graphmon_kernel_gap_seconds_sum{{{lab},stream="7"}}', "values": f"0+{per_min * g:.6g}x20"}]


def _input() -> list[dict]:
    out = []
    for build, v in BUILDS.items():
        # Argo: one workload, builds told apart by rollouts-pod-template-hash
        out += _series({"namespace": "argo", "workload": "llm", "build": build, "pod": f"llm-{build}-a"}, *v)
        # Flagger: the canary Deployment <target> and its <target>-primary (stable)
        if build != "stable":
            out += _series({"namespace": "flagger", "workload": build, "build": "h1", "pod": f"{build}-h1-a"}, *v)
            out += _series({"namespace": "flagger", "workload": f"{build}-primary", "build": "h0",
                            "pod": f"{build}-primary-h0-a"}, *BUILDS["stable"])
    return out


def _argo(metric: str, canary: str) -> str:
    (m,) = [x for x in ARGO["spec"]["metrics"] if x["name"] == metric]
    args = {"namespace": "argo", "canary-hash": canary, "stable-hash": "stable"}
    return re.sub(r"\{\{args\.([\w-]+)\}\}", lambda x: args[x.group(1)], m["provider"]["prometheus"]["query"])


def _flagger(target: str) -> str:
    vals = {"namespace": "flagger", "target": target, "interval": "5m"}
    return re.sub(r"\{\{ (\w+) \}\}", lambda x: vals[x.group(1)], FLAGGER["spec"]["query"])


def _check(tmp_path: Path, cases: list[tuple[str, float]]):
    (tmp_path / "empty.yml").write_text("groups: []\n")
    doc = {"rule_files": ["empty.yml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": _input(),
        "promql_expr_test": [{"expr": q, "eval_time": "15m", "exp_samples": [{"labels": "{}", "value": v}]}
                             for q, v in cases]}]}
    (tmp_path / "t.yml").write_text(yaml.safe_dump(doc, sort_keys=False, width=100000))
    return promtool("test", "rules", "t.yml", cwd=tmp_path)


def test_the_argo_template_fails_a_widened_canary_and_passes_the_others(tmp_path):
    cases = [(_argo("graphmon-regressed-graphs", "wide"), 1), (_argo("graphmon-regressed-graphs", "same"), 0),
             (_argo("graphmon-regressed-graphs", "faster"), 0),
             (_argo("graphmon-canary-replays", "same"), 1), (_argo("graphmon-canary-replays", "absent"), 0)]
    res = _check(tmp_path, cases)
    assert res.returncode == 0, res.stdout + res.stderr
    conds = {m["name"]: m["successCondition"] for m in ARGO["spec"]["metrics"]}
    # the conditions as Argo reads result[0]: 1 regressed graph fails, 0 passes; no replays fails
    assert conds == {"graphmon-regressed-graphs": "result[0] == 0", "graphmon-canary-replays": "result[0] >= 0.1"}


def test_the_flagger_template_fails_a_widened_canary_and_passes_the_others(tmp_path):
    res = _check(tmp_path, [(_flagger("wide"), 1), (_flagger("same"), 0), (_flagger("faster"), 0)])
    assert res.returncode == 0, res.stdout + res.stderr


def test_a_mutated_query_is_noticed(tmp_path):
    """The tests bite: without the net-harm clause the faster canary fails."""
    q = _flagger("faster").replace("> -1e-6", "> -1").replace(") > 1e-6) or", ") > -1) or")
    res = _check(tmp_path, [(q, 0)])
    assert res.returncode != 0


def test_the_templates_use_only_what_their_tools_fill_in():
    argo_args = {a["name"] for a in ARGO["spec"]["args"]}
    for m in ARGO["spec"]["metrics"]:
        used = set(re.findall(r"\{\{args\.([\w-]+)\}\}", m["provider"]["prometheus"]["query"]
                              + m["provider"]["prometheus"]["address"]))
        assert used <= argo_args and {"name", "successCondition", "provider"} <= set(m)
    assert ARGO["apiVersion"] == "argoproj.io/v1alpha1" and FLAGGER["apiVersion"] == "flagger.app/v1beta1"
    # Flagger renders its query with these variables only (its MetricTemplate docs)
    assert set(re.findall(r"\{\{ (\w+) \}\}", FLAGGER["spec"]["query"])) <= {"namespace", "target", "interval",
                                                                             "name", "service", "ingress"}
    assert FLAGGER["spec"]["provider"]["type"] == "prometheus"
