"""bench/overhead/burst_cost.py's arithmetic on synthetic steps whose burst cost is known: no GPU."""

import numpy as np
import pytest

from bench.overhead import burst_cost as B


def steps_with(bursts, windows, extra_ms=0.0, window_extra_ms=0.0, n=6000, step_ms=1.0, seed=0):
    """A steady loop of ``step_ms`` steps (a little noise); steps ending in a burst take
    ``extra_ms`` more, steps in a window ``window_extra_ms`` more. Returns (steps s, ends s)."""
    rng = np.random.default_rng(seed)
    steps = np.full(n, step_ms / 1e3) + rng.normal(0, 2e-6, n)
    t = 0.0
    ends = np.empty(n)
    for i in range(n):
        end = t + steps[i]
        if any(a <= end <= b for a, b, _ in bursts):
            steps[i] += extra_ms / 1e3
        if any(end >= a and end - steps[i] <= b for a, b in windows):
            steps[i] += window_extra_ms / 1e3
        t += steps[i]
        ends[i] = t
    return steps, ends


def test_an_arm_counts_each_bursts_excess_and_leaves_windows_out():
    bursts = [(1.0, 1.1, 100), (3.0, 3.1, 100), (4.5, 4.6, 100)]
    windows = [(2.0, 2.05), (4.55, 4.7)]  # the third burst shares steps with a window: left out
    steps, ends = steps_with(bursts, windows, extra_ms=0.03, window_extra_ms=0.5)
    s = B.summarize_arm(steps, ends, windows, bursts)
    assert [b["timed"] for b in s["bursts"]] == [100, 100]
    for b in s["bursts"]:  # ~97 steps of 1.03 ms in a 100 ms burst: +0.03 ms each
        assert b["excess_ms"] == pytest.approx(0.03 * b["steps"], rel=0.05) and 90 <= b["steps"] <= 100
    assert s["median_quiet_step_ms"] == pytest.approx(1.0, abs=0.001)
    assert s["steps_in_windows"] > 0 and s["mean_step_ms"] < 1.01  # the windows' +0.5 ms left out


def test_compare_gives_the_averaged_cost_per_interval():
    runs = []
    for r in range(4):
        bursts = [(1.0 + k, 1.1 + k, 128) for k in range(0, 5, 2)]
        on = B.summarize_arm(*steps_with(bursts, [], extra_ms=0.04, seed=r), [], bursts)
        off = B.summarize_arm(*steps_with([], [], seed=10 + r), [], [])
        runs.append({"bursts": on, "off": off})
    c = B.compare(runs, interval_s=2.0)
    per_burst_ms = np.mean([b["excess_ms"] for x in runs for b in x["bursts"]["bursts"]])
    assert per_burst_ms == pytest.approx(0.04 * 97, rel=0.1)
    assert c["bursts_measured"] == 12 and c["averaged_cost_pct"] == pytest.approx(per_burst_ms / 2000 * 100)
    lo, hi = c["averaged_cost_ci95_pct"]
    assert lo <= c["averaged_cost_pct"] <= hi and c["meets_target"] is (hi < B.TARGET_PCT)
    # the direct ratio: ~290 of ~5900 steps 4% slower is ~+0.2% of the mean step
    assert c["mean_step_ratio_pct"] == pytest.approx(100 * 0.04 * 290 / 6000, rel=0.3)
    assert c["mean_step_ratio_ci95_pct"][0] < c["mean_step_ratio_pct"] < c["mean_step_ratio_ci95_pct"][1]
