"""bench/attach_cpu.py end to end on the fake CUPTI with a real agent process (no GPU)."""

import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import attach_cpu as A  # noqa: E402


def test_both_arms_attach_in_turn_and_the_old_rings_come_back(tmp_path):
    from graphmon.sources.cupti import collector, launches

    env = {k: os.environ.get(k) for k in ("GRAPHMON_CUPTI_API", "GRAPHMON_AGENT")}
    r = A.main(["--attaches", "2", "--out", str(tmp_path)])
    assert r == 0 and collector.LaunchRing is launches.LaunchRing  # the eager arm undone
    assert {k: os.environ.get(k) for k in env} == env  # no agent socket left for later tests
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
