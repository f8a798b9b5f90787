"""bench/overhead/host_impact.py's paired-block estimator (the median overhead the issue's target is read
from), on a synthetic loop whose "on" steps are slower by a known amount: no GPU, no CUPTI."""

import threading
import time

import numpy as np
import pytest

from bench.common import hostloop as H


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
    tail = r["tail"]  # the pooled blocks' steps: every on and off block of the pairs
    assert tail["steps_on"] >= 15 * 5 and tail["steps_off"] >= 15 * 5
    assert tail["p999_ci95"][0] <= tail["p999_step_ratio"] <= tail["p999_ci95"][1]


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


def _blocks(n_pairs, steps, rng, long_every=0, long_ms=3.0, base_ms=1.7):
    """Block step arrays (ms) with a level switch between pairs (the machine's bursts) and, with
    ``long_every``, one step in that many made ``long_ms`` longer."""
    out = []
    for i in range(n_pairs):
        level = base_ms * (1.3 if (i // 20) % 3 == 2 else 1.0)  # a slow spell shared by both arms
        x = level + rng.gamma(2.0, 0.02, steps)
        if long_every:
            x[rng.random(steps) < 1 / long_every] += long_ms
        out.append(x)
    return out


def test_tail_compare_finds_rare_long_steps_and_not_a_null():
    rng = np.random.default_rng(1)
    off = _blocks(300, 60, rng)
    hit = H.tail_compare(_blocks(300, 60, rng, long_every=250), off)
    assert hit["p999_ci95"][0] > 1.5 and hit["max_step_increase_ms"] > 2.0
    assert hit["long_steps_per_1000_on"] > 2.5 and hit["long_steps_per_1000_off"] < 0.5
    null = H.tail_compare(_blocks(300, 60, rng), off)
    assert null["p999_ci95"][0] <= 1.0 <= null["p999_ci95"][1], null
    assert abs(null["max_step_increase_ms"]) < 1.0 and null["long_steps_per_1000_on"] < 0.5
    assert 0.9 < null["aa_p999_step_ratio"] < 1.1 and abs(null["aa_max_step_diff_ms"]) < 1.0
    with pytest.raises(ValueError):
        H.tail_compare(off[:3], off[:3])
    with pytest.raises(ValueError):
        H.tail_compare(off[:10], off[:9])


def test_phases_null_is_the_worst_off_against_off():
    a, b, c = np.full(1000, 2.0), np.full(1000, 2.0), np.full(1000, 2.0)
    b[5] = 6.0  # one burst in the second off phase
    c[:10] = 3.0  # a longer p99.9 in the third
    r = H.phases_null([a, b, c])
    assert r["aa_max_step_diff_ms"] == pytest.approx(4.0)
    assert r["aa_p999_step_ratio_max"] == pytest.approx(1.5)  # the third's p99.9 (3 ms) over the first's
    assert H.phases_null([a]) == {"aa_max_step_diff_ms": None, "aa_p999_step_ratio_max": None}
