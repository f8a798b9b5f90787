"""bench/diag/replays.py on the fake CUPTI (no GPU): it records every window and its summary
finds a replay shaped like the H200 failure, with its place in the window."""

import json
import os
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "..")


def test_dry_run_records_windows_and_flags_the_odd_replay(tmp_path):
    # the dry run's fake stretches the first kernel of the first replay traced after each enable
    env = {k: v for k, v in os.environ.items() if k not in ("GRAPHMON_AGENT", "GRAPHMON_CUPTI_API")}
    r = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "diag", "replays.py"), "--dry-run", "--steady-s", "1",
                        "--out", str(tmp_path)], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    rep = json.loads((tmp_path / "diag-replays.json").read_text())
    s = rep["variants"]["trees"]["summary"]
    assert s["windows"] >= 2 and s["replays_flagged"] >= 1
    assert s["flagged_position_in_window"] == {"first": s["replays_flagged"]}
    flagged = rep["variants"]["trees"]["flagged"][0]
    assert flagged["longest_over_node_median"]["rank_in_replay"] == 0 and flagged["min_gap_ns"] < -1000
    # graphmon's own assembly of the same records keeps nothing mis-timed
    assert s["graphmon"]["gaps_below_1us"] == 0 and s["graphmon"]["invalid"].get("overfull_replay", 0) > 0
    # the summary can be made again from the file alone
    r = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "diag", "replays_summary.py"),
                        str(tmp_path / "diag-replays.npz")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "replays_flagged" in r.stdout
