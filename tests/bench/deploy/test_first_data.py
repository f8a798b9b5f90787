"""bench/deploy/first_data.py: its /metrics reading, its summary, and one dry-run start under
`graphmon run` on the fake torch + fake CUPTI (no GPU)."""

import json
import os
import subprocess
import sys

from bench.deploy import first_data as F

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "..")


def test_gap_series_counts_only_series_with_samples():
    text = ("# HELP graphmon_kernel_gap_seconds x\n"
            'graphmon_kernel_gap_seconds_count{graph="a",stream="7"} 12.0\n'
            'graphmon_kernel_gap_seconds_count{graph="b",stream="7"} 0.0\n'
            'graphmon_kernel_gap_seconds_sum{graph="a",stream="7"} 1e-3\n')
    assert F.gap_series(text) == 1 and F.gap_series("") == 0
    assert F.metric_sum('graphmon_windows_total{rank="0"} 3.0\ngraphmon_windows_total{rank="1"} 2.0\n',
                        "graphmon_windows_total") == 5.0


def test_summary_median_worst_and_target():
    starts = [{"client": "hf", "first_data_after_steady_s": v, "steady_after_launch_s": 30.0} for v in (2.0, 9.0, 4.0)]
    starts.append({"client": "vllm", "first_data_after_steady_s": None, "steady_after_launch_s": 20.0})
    s = F.summarize(starts)
    assert s["hf"]["median_s"] == 4.0 and s["hf"]["worst_s"] == 9.0 and s["hf"]["met"]
    assert s["vllm"]["with_data"] == 0 and not s["vllm"]["met"]  # a start without data fails the target


def test_one_dry_run_start_sees_data_soon_after_the_steady_replay(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("GRAPHMON_AGENT", "GRAPHMON_CUPTI_API")}
    r = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "deploy", "first_data.py"), "--dry-run", "--starts", "1",
                        "--clients", "hf", "--timeout-s", "60", "--out", str(tmp_path)],
                       env=env, capture_output=True, text=True, timeout=150)
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads((tmp_path / "first-data.json").read_text())
    (start,) = res["starts"]
    assert start.get("error") is None, start
    # the window opened on the fake client's first steady launches, after its 2 s "compile" pause
    assert 0 < start["first_data_after_steady_s"] < 5.0 and res["summary"]["hf"]["met"]
