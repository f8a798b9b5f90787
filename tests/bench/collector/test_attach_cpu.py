"""bench/collector/attach_cpu.py end to end on the fake CUPTI with a real agent process (no GPU)."""

import json
import os
import subprocess
import sys

import numpy as np

from bench.collector import attach_cpu as A


def test_both_arms_attach_in_turn(tmp_path):
    # a process of its own: the bench puts the fake CUPTI on its path
    root = os.path.join(os.path.dirname(__file__), "..", "..", "..")
    env = {k: v for k, v in os.environ.items() if k not in ("GRAPHMON_AGENT", "GRAPHMON_CUPTI_API")}
    r = subprocess.run([sys.executable, os.path.join(root, "bench", "collector", "attach_cpu.py"), "--attaches", "2",
                        "--out", str(tmp_path)], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads((tmp_path / "attach-cpu.json").read_text())
    assert [x["arm"] for x in res["rows"]] == ["current", "eager", "eager", "current"]
    for arm in ("current", "eager"):
        s = res["summary"][arm]
        assert s["attaches"] == 2 and s["attach_ms"] > 0 and s["attach_cpu_ms"] > 0 and s["ticker_gap_ms"] > 0


def test_ticker_longest_gap_in_a_span():
    t = A.Ticker()
    t.stop.set()
    t.thread.join()
    t.t, t.gap = [1.0, 2.0, 3.0], [0.001, 0.009, 0.002]
    assert t.longest_ms(1.5, 3.5) == 9.0 and t.longest_ms(2.5, 3.5) == 2.0 and t.longest_ms(5, 6) == 0.0
    assert np.isclose(A.summarize([{"arm": "a", "attach_ms": 1, "attach_cpu_ms": 2, "ticker_gap_ms": 3},
                                   {"arm": "a", "attach_ms": 3, "attach_cpu_ms": 4, "ticker_gap_ms": 5}])["a"]["attach_ms"], 2)
