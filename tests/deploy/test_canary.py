"""docker/k8s/canary-analysis.yaml: the Argo Rollouts AnalysisTemplate and the Flagger MetricTemplate.
Their PromQL, with the arguments a rollout gives them, runs in Prometheus's own engine (promtool's
unit tests) over series of a stable build and canaries: a widened canary fails, an identical one and
one that is faster as a whole pass, a canary with no replays fails the data check. Where both sides
have untraced replay times (graphmon_replay_untraced_seconds) they decide: a widening with a faster
untraced replay passes, one the untraced time confirms fails, and so does an untraced rise of 1%
alone; without untraced times on a side the traced rule decides alone."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from _promutil import K8S, promtool

DOCS = {d["kind"]: d for d in yaml.safe_load_all((K8S / "canary-analysis.yaml").read_text()) if d}
ARGO, FLAGGER = DOCS["AnalysisTemplate"], DOCS["MetricTemplate"]
SPAN, IDLE, GAP, UNTRACED = 1.6e-3, 250e-6, 250e-6, 1.5e-3  # per replay, the stable build
WIDE = (SPAN + 300e-6, IDLE + 300e-6, GAP + 300e-6)  # every gap +~0.3 us
SAME = (SPAN + 0.4e-6, IDLE + 0.2e-6, GAP + 0.3e-6)
BUILDS = {  # build: (span, idle, gap time, untraced replay time or None: no untraced series) per replay
    "stable": (SPAN, IDLE, GAP, UNTRACED),
    "wide": (*WIDE, None),  # no untraced times: the traced rule alone
    "same": (*SAME, None),
    "faster": (SPAN - 50e-6, IDLE - 50e-6, GAP + 15e-6, None),  # a few gaps wider in a faster replay
    "observer": (*WIDE, UNTRACED * 0.8),  # wider traced, 20% faster untraced (an event-record node)
    "confirmed": (*WIDE, UNTRACED * 1.02),  # wider traced, +2% untraced
    "gate": (*WIDE, UNTRACED * 1.004),  # wider traced, +0.4% untraced: below the 0.5% that confirms
    "slower": (*SAME, UNTRACED * 1.011),  # the same traced, +1.1% untraced (one kernel more)
    "slightly": (*SAME, UNTRACED * 1.008),  # the same traced, +0.8% untraced: below the 1% of its own
}


def _series(labels: dict, s: float, i: float, g: float, u: float | None) -> list[dict]:
    lab = ",".join(f'{k}="{v}"' for k, v in {**labels, "graph": "decode", "rank": "0"}.items())
    per_min, untraced_per_min = 60, 300  # replays a minute, traced and untraced
    out = [{"series": f"graphmon_replay_gpu_seconds_count{{{lab}}}", "values": f"0+{per_min}x20"},
           {"series": f"graphmon_replay_gpu_seconds_sum{{{lab}}}", "values": f"0+{per_min * s:.6g}x20"},
           {"series": f"graphmon_replay_idle_seconds_sum{{{lab}}}", "values": f"0+{per_min * i:.6g}x20"},
           {"series": f'graphmon_kernel_gap_seconds_sum{{{lab},stream="7"}}', "values": f"0+{per_min * g:.6g}x20"}]
    if u is not None:
        out += [{"series": f"graphmon_replay_untraced_seconds_count{{{lab}}}", "values": f"0+{untraced_per_min}x20"},
                {"series": f"graphmon_replay_untraced_seconds_sum{{{lab}}}", "values": f"0+{untraced_per_min * u:.9g}x20"}]
    return out


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


# canary: graphs regressed (the template's result; it fails the canary when > 0)
VERDICTS = {"wide": 1, "same": 0, "faster": 0, "observer": 0, "confirmed": 1, "gate": 0, "slower": 1, "slightly": 0}


def test_the_argo_template_fails_a_widened_canary_and_passes_the_others(tmp_path):
    cases = [(_argo("graphmon-regressed-graphs", b), v) for b, v in VERDICTS.items()]
    cases += [(_argo("graphmon-canary-replays", "same"), 1), (_argo("graphmon-canary-replays", "absent"), 0)]
    res = _check(tmp_path, cases)
    assert res.returncode == 0, res.stdout + res.stderr
    conds = {m["name"]: m["successCondition"] for m in ARGO["spec"]["metrics"]}
    # the conditions as Argo reads result[0]: 1 regressed graph fails, 0 passes; no replays fails
    assert conds == {"graphmon-regressed-graphs": "result[0] == 0", "graphmon-canary-replays": "result[0] >= 0.1"}


def test_the_flagger_template_fails_a_widened_canary_and_passes_the_others(tmp_path):
    res = _check(tmp_path, [(_flagger(b), v) for b, v in VERDICTS.items()])
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.parametrize("canary, edits, why", [
    ("faster", [(") > 1e-6) or", ") > -1) or"), ("> -1e-6", "> -1")], "without the net-harm clause the faster canary fails"),
    ("observer", [("unless ((", "or ((")], "a widening the untraced time does not confirm fails"),
    ("wide", [("unless ((", "and ((")], "a canary without untraced times never fails on a widening"),
    ("gate", [(">= 0.005", ">= 0")], "a 0.4% untraced rise confirms a widening"),
    ("slightly", [(">= 0.01", ">= 0.005")], "a 0.8% untraced rise fails on its own"),
])
def test_a_mutated_query_is_noticed(tmp_path, canary, edits, why):
    """The tests bite: each clause of the query is what keeps one canary's verdict right."""
    q = _flagger(canary)
    for old, new in edits:
        assert old in q
        q = q.replace(old, new)
    res = _check(tmp_path, [(q, VERDICTS[canary])])
    assert res.returncode != 0 and "exp:" in res.stdout + res.stderr, why  # a wrong value, not a broken query


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
