"""bench/deploy/deploy_restart.py's CPU path (--dry-run: fake CUPTI and torch) end to end, and its scraped
verdict samples replayed through the shipped alert rules with promtool, for that run and
for the committed H200 run (another GPU run's file: GRAPHMON_DEPLOY_RESTART_JSON=path)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from _promutil import ALERTS, promtool

ROOT = Path(__file__).resolve().parents[3]
HOLD_S = 420  # the process keeps running: its last scraped values hold past the rule's `for: 5m`


H200_RUN = ROOT / "bench" / "results" / "gpu-check-13" / "deploy-restart.json"


@pytest.fixture(scope="module", params=["dry-run", "h200"])
def result(request, tmp_path_factory):
    """The CPU dry run made here, and the committed H200 run (or the run named by
    GRAPHMON_DEPLOY_RESTART_JSON): the GPU's scraped samples go through the same assertions."""
    if request.param == "h200":
        return json.loads(Path(os.environ.get("GRAPHMON_DEPLOY_RESTART_JSON", H200_RUN)).read_text())
    out = tmp_path_factory.mktemp("deploy-restart")
    env = {k: v for k, v in os.environ.items() if k not in ("GRAPHMON_AGENT", "GRAPHMON_CUPTI_API", "RANK", "LOCAL_RANK")}
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "deploy" / "deploy_restart.py"), "--dry-run", "--out", str(out),
                        "--interval-s", "0.5", "--timeout-s", "240"], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return json.loads((out / "deploy-restart.json").read_text())


def _restart(result, change, rank="0"):
    return next(r for r in result["restarts"] if r["change"] == change and r["rank"] == rank)


def test_the_memcpy_restart_flags_within_three_windows_and_the_others_do_not(result):
    assert [p["name"] for p in result["phases"]] == ["decode1", "decode2", "decode3", "hf1", "hf2"]
    assert all(p["exit_code"] == 0 and p["windows"] >= 3 for p in result["phases"])
    changed = _restart(result, "memcpy")
    assert changed["windows_to_regression"] is not None and changed["windows_to_regression"] <= 3
    assert changed["final"]["regression"] is True
    (g,) = changed["final"]["graphs"]
    # the fake's +1.5 us on every gap is uniform; on the GPU, a copy node after every kernel should be too
    assert g["kind"] == "uniform" or (not result["dry_run"] and g["kind"] in ("concentrated", "mixed"))
    assert g["gap_added_ns"] > 0 and g["flagged_streams"]
    assert changed["series_before"] and changed["series_after"]
    for r in result["restarts"]:  # one series per (rank, graph, stream): the successor took the rank's over
        assert r["series_before"].keys() <= r["series_after"].keys()
        assert set(r["series_after"].values()) == {1}, r["series_after"]
    sig = {p["name"]: p["signatures"] for p in result["phases"]}
    assert sig["decode1"]["cap1"] and sig["decode2"]["cap1"]  # graphmon_graph_info carries the signature
    for r in (_restart(result, "none", "0"), _restart(result, "none", "1")):
        assert r["windows_to_verdict"] is not None and r["windows_to_verdict"] <= 3
        assert r["windows_to_regression"] is None and r["final"]["regression"] is False
        assert all(v["regression"] is False for v in r["verdicts"])
    assert result["failed_scrapes"] == 0


def _last_seen(values: str) -> str:
    seen = [v for v in values.split() if v != "_"]
    return seen[-1] if seen else "_"


def _promtool_case(tmp_path, restart):
    """The restart's scraped series, the last values held for HOLD_S: the firing alerts at the end
    as promtool's ALERTS series (labels exact; a wrong or missing alert fails the case)."""
    # held at the last value scraped while the new process ran: a phase ends by stopping it (the
    # verdict's series leave with the process), where a deployed process keeps running
    series = [{"series": s["series"], "values": s["values"] + f" {_last_seen(s['values'])}x{HOLD_S}"}
              for s in restart["input_series"]]
    n = len(restart["input_series"][0]["values"].split()) + HOLD_S
    final = restart["final"]
    want = [{"labels": (f'ALERTS{{alertname="GraphmonDeployRegression",alertstate="firing",component="graphmon",'
                        f'device="{g["device"]}",graph="{g["graph"]}",instance="agent",job="graphmon",kind="{g["kind"]}",'
                        f'rank="{restart["rank"]}",reference="previous",severity="warning",stream="{st}"}}'), "value": 1}
            for g in final["graphs"] if g["regression"] for st in g["flagged_streams"]]
    doc = {"rule_files": [str(ALERTS)], "evaluation_interval": "1s", "tests": [{
        "interval": "1s", "input_series": series,
        "promql_expr_test": [{"expr": 'ALERTS{alertname="GraphmonDeployRegression",alertstate="firing"}',
                              "eval_time": f"{n - 1}s", "exp_samples": want}]}]}
    path = tmp_path / f"case-{restart['to']}.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return want, promtool("test", "rules", str(path), cwd=tmp_path)


def test_scraped_verdicts_through_the_shipped_rule(result, tmp_path):
    """The real samples, held past `for: 5m`: the memcpy restart fires the shipped rule once per
    flagged stream, naming graph, stream and kind; the no-change restarts fire nothing."""
    want, res = _promtool_case(tmp_path, _restart(result, "memcpy"))
    assert want and res.returncode == 0, res.stdout + res.stderr
    for rank in ("0", "1"):
        want, quiet = _promtool_case(tmp_path, _restart(result, "none", rank))
        assert want == [] and quiet.returncode == 0, quiet.stdout + quiet.stderr


def test_a_real_prometheus_fired_for_the_memcpy_restart_only(result):
    """Runs with --prometheus (the H200 run): the alerts a real Prometheus with the shipped rules
    (the deploy rule's for: shortened, as the JSON says) had firing as each new process ended."""
    if not result.get("prometheus"):
        pytest.skip("this run had no Prometheus (bench/deploy/deploy_restart.py --prometheus PATH)")
    assert "every other rule as shipped" in result["prometheus"]
    changed = _restart(result, "memcpy")
    (g,) = changed["final"]["graphs"]
    fired = changed["prometheus_alerts"]
    assert sorted(int(a["stream"]) for a in fired) == sorted(g["flagged_streams"])
    assert {(a["rank"], a["graph"], a["kind"], a["reference"]) for a in fired} == {("0", g["graph"], g["kind"], "previous")}
    for rank in ("0", "1"):
        assert _restart(result, "none", rank)["prometheus_alerts"] == []
