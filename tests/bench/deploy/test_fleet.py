"""bench/deploy/fleet.py's CPU path (--dry-run: fake torch + CUPTI pods, two real `graphmon agent`s,
a real Prometheus with the fleet rules compressed) end to end: the JSON's shape, the untraced truth
each pod measured on the fake GPU's clock, and the verdicts: the widened build pages within the
deadline, the identical build and the rollback do not, as the untraced replay times say; issue 36's
two acceptance builds (event-record nodes: faster untraced, wider traced; one extra ~1% kernel) are
scored against their untraced truth, which the pods' untraced series decide."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from _promutil import require_binary

ROOT = Path(__file__).resolve().parents[3]
BENCH = ROOT / "bench" / "deploy" / "fleet.py"
# tests/fake_cupti.decode_like(2): the main stream (the span) runs 2 x (400 + 3000 + 416 + 5000) ns;
# the fake's "memcpy" build adds 1500 ns before each of its 4 kernels
ORIGINAL_MS, MEMCPY_MS = 17_632e-6, 23_632e-6
# bench/common/fleet_pods.py's fake builds of 16 layers: "long" 16 x 8816 ns; "eventrec" every gap
# 200 ns shorter untraced (1500 ns longer only while traced); "plus1" one more kernel of 1500 ns
LONG_MS, EVENTREC_MS, PLUS1_MS = 141_056e-6, 134_656e-6, 142_556e-6
TRUTH_MS = {"original": ORIGINAL_MS, "memcpy": MEMCPY_MS, "long": LONG_MS, "eventrec": EVENTREC_MS, "plus1": PLUS1_MS}
TRUTH_REPLAYS = 100


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    require_binary("prometheus")
    out = tmp_path_factory.mktemp("deploy-fleet")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRAPHMON_") and k not in ("RANK", "LOCAL_RANK")}
    # a longer rate window than the bench's dry-run default: a page deadline (window + for) with room on a slow CI
    r = subprocess.run([sys.executable, str(BENCH), "--dry-run", "--out", str(out), "--rate-window", "12",
                        "--margin-s", "5", "--truth-replays", str(TRUTH_REPLAYS)],
                       env=env, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return out, json.loads((out / "deploy-fleet.json").read_text())


def _wl(doc, name):
    (r,) = [w for w in doc["workloads"] if w["workload"] == name]
    return r


def test_the_run_states_its_compression_and_measures_every_pod(run):
    out, doc = run
    assert doc["dry_run"] is True and doc["errors"] == []
    assert (doc["rate_window_s"], doc["for_s"], doc["page_deadline_s"]) == (12, 4, 16)
    assert "[12s] (shipped: [5m])" in doc["prometheus"] and "every other rule as shipped" in doc["prometheus"]
    assert [w["workload"] for w in doc["workloads"]] == ["widened", "identical", "rollback", "eventrec", "plus1"]
    for w in doc["workloads"]:
        a, b = w["builds"]["a"], w["builds"]["b"]
        assert a["hash"] != b["hash"]  # a' of the identical workload is a new pod-template-hash too
        for build in (a, b):
            assert sorted(build["pods"]) == [f"{w['workload']}-{build['hash']}-n{n}" for n in (0, 1)]
            for name, p in build["pods"].items():
                assert p["replays"] == TRUTH_REPLAYS and p["kind"] == build["kind"]
                raw = json.loads((out / "pods" / f"{name}.json").read_text())
                assert len(raw["ms"]) == TRUTH_REPLAYS  # each untraced replay's event time
            assert build["untraced_median_ms"] == pytest.approx(TRUTH_MS[build["kind"]], rel=1e-6)
            assert build["pod_spread"] == 0
        assert w["firing_before_rollout"] == []  # build a alone: nothing to compare with
        assert w["newest_build"] == [b["hash"]]
        assert w["b_first_pod_started_s"] < w["rollout_done_s"]
    assert {w["workload"]: (w["builds"]["a"]["kind"], w["builds"]["b"]["kind"]) for w in doc["workloads"]} == {
        "widened": ("original", "memcpy"), "identical": ("original", "original"), "rollback": ("memcpy", "original"),
        "eventrec": ("long", "eventrec"), "plus1": ("long", "plus1")}
    assert doc["noise_ratio"] == 0  # the fake GPU's replays take the same time in every pod
    table = (out / "deploy-fleet.md").read_text()
    assert all(f"| {w} | " in table for w in ("widened", "identical", "rollback", "eventrec", "plus1"))


def test_only_the_widened_build_pages_and_the_untraced_truth_agrees(run):
    _, doc = run
    widened, identical, rollback = (_wl(doc, n) for n in ("widened", "identical", "rollback"))
    assert widened["untraced_ratio_b_a"] == pytest.approx(MEMCPY_MS / ORIGINAL_MS, rel=1e-6)
    assert identical["untraced_ratio_b_a"] == 1
    assert rollback["untraced_ratio_b_a"] == pytest.approx(ORIGINAL_MS / MEMCPY_MS, rel=1e-6)
    b = widened["builds"]["b"]["hash"]
    assert widened["fired"] and widened["paged_within_deadline"], widened
    assert 0 < widened["fired_after_s"] <= doc["page_deadline_s"]
    assert {k: widened["alert"][k] for k in ("workload", "build", "graph", "namespace")} == \
        {"workload": "widened", "build": b, "graph": "decode_bs1", "namespace": "fleet"}
    assert widened["deploy_regression"][b]["last"] == 1
    assert widened["argo_regressed_graphs"] == 1  # the canary analysis fails the widened canary
    for w in (identical, rollback):
        assert not w["fired"] and w["alert"] is None, w
        reg = w["deploy_regression"][w["builds"]["b"]["hash"]]
        assert reg["samples"] > 0 and reg["max"] == 0  # the verdict was there, and never 1
        assert w["argo_regressed_graphs"] == 0
    assert [w["untraced_slower"] for w in doc["workloads"]][:3] == [True, False, False]
    assert all(w["verdict_agrees_with_untraced"] for w in doc["workloads"][:3])
    assert (widened["alert"]["kind"], widened["alert"]["untraced"]) == ("widening", "confirms")


def test_the_acceptance_builds_are_scored_against_their_untraced_truth(run):
    """eventrec: faster untraced (-4.5%) with gaps 1300 ns wider traced; plus1: +1.06% untraced, no
    gap wider. Every pod's collector times replays untraced (its reference phases and bursts, on
    the fake GPU's clock), so the untraced time decides: eventrec is the observer's alone, plus1
    pages kind="untraced" within 3 minutes, and both verdicts agree with the truth. (Without
    untraced series the traced rule decides alone: the promtool tests in alerts_test.yml.)"""
    _, doc = run
    ev, p1 = _wl(doc, "eventrec"), _wl(doc, "plus1")
    assert ev["untraced_ratio_b_a"] == pytest.approx(EVENTREC_MS / LONG_MS, rel=1e-6) and not ev["untraced_slower"]
    assert p1["untraced_ratio_b_a"] == pytest.approx(PLUS1_MS / LONG_MS, rel=1e-6) and p1["untraced_slower"]
    b_ev = ev["builds"]["b"]["hash"]
    assert all(w["untraced_both"] for w in doc["workloads"]), [w["workload"] for w in doc["workloads"]]
    assert not ev["fired"] and ev["observer_only"][b_ev]["max"] == 1 and ev["argo_regressed_graphs"] == 0, ev
    assert p1["fired"] and p1["fired_after_s"] <= min(doc["page_deadline_s"], 180), p1
    assert (p1["alert"]["kind"], p1["alert"]["untraced"]) == ("untraced", "rose")
    assert p1["argo_regressed_graphs"] == 1
    assert all(w["verdict_agrees_with_untraced"] for w in doc["workloads"])


@pytest.mark.parametrize("argv, message", [
    (["--workloads", "widened,nope"], "unknown workload"),
    (["--prometheus", "/nonexistent/prometheus"], "no Prometheus binary"),
])
def test_bad_arguments_are_one_line_and_exit_2(tmp_path, argv, message):
    r = subprocess.run([sys.executable, str(BENCH), "--dry-run", "--out", str(tmp_path)] + argv,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and message in r.stderr.splitlines()[-1], r.stderr
    assert not (tmp_path / "deploy-fleet.json").exists()
