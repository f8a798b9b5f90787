"""bench/diag/window_quality.py without a GPU: its report on recorded H200 windows names every
made-up record with its place, and its smoke run on the fake CUPTI keeps every record with
launch boundaries while the collector-thread switch throws launches away."""

import json
import os
import subprocess
import sys

import numpy as np

from bench.diag import window_quality as dwq

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "..")


def test_the_report_places_each_bad_record_of_the_recorded_h200_windows():
    s = dwq.report_recorded(os.path.join(ROOT, "tests", "data", "h200-hf-late-stamps.npz"))
    assert s["records"] == 14521 and s["kept"] == 13645
    assert s["invalid"] == {"incomplete_record": 503, "partial_replay": 241, "launched_outside_window": 132}
    # every one in the last launch of its window: 501 stamped late, the only 2 inversions CUPTI gave
    assert s["bad_by_kind"] == {"late_stamp": 501, "end_before_start": 2} and s["bad_by_launch"] == {"last": 503}
    inv = [x for x in s["bad_records"] if x["kind"] == "end_before_start"]
    assert all(x["dur_ns"] < -1_000_000 and x["start_after_ran_ns"] > 0 for x in inv)  # the start is the made-up one


def test_bad_records_say_what_is_wrong_and_where():
    w = {"start_ns": np.array([100, 200, 300, 0, 500]), "end_ns": np.array([150, 0, 250, 0, 900]),
         "cupti_end_ns": np.array([150, 0, 250, 0, 900]), "graph_id": np.full(5, 5),
         "graph_node_id": (5 << 32) + np.arange(5), "correlation_id": np.array([7, 7, 7, 8, 7]),
         "launch_correlation_id": np.array([6, 7]), "ran_ns": np.array([800])}
    got = {(x["kind"], x["node"], x["launch"]) for x in dwq.bad_records(w)}
    assert got == {("end_0", 1, "2 of 2"), ("end_before_start", 2, "2 of 2"), ("start_0", 3, "outside"),
                   ("late_stamp", 4, "2 of 2")}


def test_smoke_runs_both_arms_on_the_fake(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("GRAPHMON_AGENT", "GRAPHMON_CUPTI_API", "GRAPHMON_BOUNDARY")}
    r = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "diag", "window_quality.py"), "--smoke",
                        "--workloads", "decode4", "--out", str(tmp_path)], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads((tmp_path / "diag-window-quality-smoke-ahead.json").read_text())["results"]
    launch, collector = res["decode4/launch"], res["decode4/collector"]
    assert launch["windows"] >= 1 and launch["invalid"] == {} and launch["kept"] == launch["records"]
    assert collector["invalid"].get("launched_outside_window", 0) > 0
