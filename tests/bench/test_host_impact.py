"""bench/host_impact.py's paired-block estimator (the median overhead the issue's target is read
from), on a synthetic loop whose "on" steps are slower by a known amount: no GPU, no CUPTI."""

import os
import sys
import threading
import time

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import host_impact as H  # noqa: E402


def test_sign_test_interval_is_the_binomial_order_statistics():
    from scipy.stats import binom

    for n in (6, 10, 37, 314):
        x = np.arange(n, dtype=float)
        lo, hi = H.sign_test_ci(x)
        k = int(binom.ppf(0.025, n, 0.5))  # P(X <= k-1) <= 0.025 < P(X <= k)
        if binom.cdf(k, n, 0.5) <= 0.025:
            k += 1
        assert (lo, hi) == (x[k - 1], x[n - k])
        assert 1 - (binom.cdf(n - k, n, 0.5) - binom.cdf(k - 1, n, 0.5)) <= 0.05  # covers the median >= 95%
    assert H.sign_test_ci(np.arange(5.0)) is None


@pytest.mark.parametrize("slower", [0.0, 0.05])
def test_paired_blocks_recover_a_known_slowdown(monkeypatch, slower):
    on = threading.Event()

    class Src:
        stats = {"windows": 0}

    def attach_ready(**kw):
        on.set()
        return None, Src()

    import graphmon

    monkeypatch.setattr(H, "attach_ready", attach_ready)
    monkeypatch.setattr(graphmon, "detach", on.clear)
    base = 0.0004

    def run_once():  # 20 steps of 0.4 ms, (1 + slower) x longer while "attached"
        t = [time.perf_counter()]
        for _ in range(20):
            end = time.perf_counter() + base * (1 + slower if on.is_set() else 1)
            while time.perf_counter() < end:
                pass
            t.append(time.perf_counter())
        return np.asarray(t)

    r = H.paired(run_once, 4.0, 0.05, 1e9, skip_s=0.01)
    pairs = r.pop("_pairs")
    assert r["n_pairs"] == len(pairs) >= 15 and not r["errors"]
    want = 100 * np.log(1 + slower)
    assert abs(r["median_overhead_pct"] - want) < 1.5, r  # a busy CI core adds noise, not bias
    assert r["ci95_low_pct"] <= r["median_overhead_pct"] <= r["ci95_high_pct"]


def test_arms_side_by_side_each_recover_their_own_slowdown(monkeypatch):
    # Two kinds of "on" interleaved pair by pair in one run (the machine's state drifts: arms run
    # one after the other compared different minutes): each arm's figure is its own.
    slower = {"fast": 0.0, "slow": 0.08}
    state = {"on": None}

    class Src:
        stats = {"windows": 0}

    def attach_ready(**kw):
        state["on"] = kw["which"]
        return None, Src()

    import graphmon

    monkeypatch.setattr(H, "attach_ready", attach_ready)
    monkeypatch.setattr(graphmon, "detach", lambda: state.update(on=None))
    base = 0.0004

    def run_once():
        t = [time.perf_counter()]
        for _ in range(20):
            k = state["on"]
            end = time.perf_counter() + base * (1 + (slower[k] if k else 0.0))
            while time.perf_counter() < end:
                pass
            t.append(time.perf_counter())
        return np.asarray(t)

    r = H.paired(run_once, 6.0, 0.05, 1e9, skip_s=0.01, arms={"fast": {"which": "fast"}, "slow": {"which": "slow"}})
    arms = r["arms"]
    assert set(arms) == {"fast", "slow"} and r["arm"] == "fast" and not r["errors"]
    assert abs(arms["fast"]["n_pairs"] - arms["slow"]["n_pairs"]) <= 2 and arms["fast"]["n_pairs"] >= 10
    for k, want in slower.items():
        assert abs(arms[k]["median_overhead_pct"] - 100 * np.log(1 + want)) < 2.0, (k, arms[k])
        assert len(r["_arm_pairs"][k]) == arms[k]["n_pairs"]
    assert arms["fast"]["attach_kw"] == {"which": "fast"}
