"""analysis/significance.py: the numpy Mann-Whitney U and bootstrap against scipy, and the verdicts."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from graphmon.analysis.significance import Thresholds, bootstrap_ci, judge, mannwhitneyu, shift_test, verdict

stats = pytest.importorskip("scipy.stats")  # the reference (dev extra); graphmon itself never imports it

sample = st.lists(st.integers(-6, 6), min_size=1, max_size=25)  # small integer range: many ties


@settings(max_examples=300, deadline=None)
@given(sample, sample, st.sampled_from(["two-sided", "less", "greater"]),
       st.sampled_from(["auto", "asymptotic", "exact"]), st.booleans())
def test_mannwhitneyu_equals_scipy_on_tied_data(x, y, alternative, method, continuity):
    x, y = np.array(x, float), np.array(y, float)
    if method != "exact" and len(np.unique(np.r_[x, y])) == 1:
        return  # all values tied: scipy divides 0 by 0 (NaN); shift_test never asks (tested below)
    want = stats.mannwhitneyu(x, y, alternative=alternative, method=method, use_continuity=continuity)
    got = mannwhitneyu(x, y, alternative=alternative, method=method, use_continuity=continuity)
    assert got.statistic == want.statistic
    assert got.pvalue == pytest.approx(want.pvalue, rel=1e-12, abs=1e-300)


@pytest.mark.parametrize("n1,n2", [(1, 1), (2, 9), (3, 4), (5, 8), (8, 8), (7, 30), (9, 12), (20, 20), (60, 45)])
def test_mannwhitneyu_equals_scipy_on_continuous_data(n1, n2):
    rng = np.random.default_rng(n1 * 100 + n2)
    for shift in (0.0, 0.4, 1.5):
        x, y = rng.normal(0, 1, n1), rng.normal(shift, 1, n2)
        for method in ("auto", "asymptotic", "exact"):
            for alt in ("two-sided", "less", "greater"):
                want = stats.mannwhitneyu(x, y, alternative=alt, method=method)
                got = mannwhitneyu(x, y, alternative=alt, method=method)
                assert got.statistic == want.statistic
                assert got.pvalue == pytest.approx(want.pvalue, rel=1e-12, abs=1e-300), (method, alt)


def test_exact_distribution_sums_to_one_and_is_symmetric():
    from graphmon.analysis.significance import _u_exact_sf

    n1, n2 = 6, 9
    sf = np.array([_u_exact_sf(u, n1, n2) for u in range(n1 * n2 + 2)])
    pmf = sf[:-1] - sf[1:]
    assert sf[0] == 1.0 and sf[-1] == 0.0 and pmf.sum() == pytest.approx(1.0)
    assert np.allclose(pmf, pmf[::-1])  # U and n1*n2 - U have the same null distribution
    assert pmf[0] == pytest.approx(1 / math.comb(15, 6))


def test_bad_input_rejected():
    with pytest.raises(ValueError):
        mannwhitneyu([], [1.0])
    with pytest.raises(ValueError):
        mannwhitneyu([np.nan], [1.0])


@pytest.mark.parametrize("n1,n2,confidence", [(6, 9, 0.95), (40, 50, 0.9), (3, 3, 0.99)])
def test_bootstrap_equals_scipy_percentile(n1, n2, confidence):
    rng = np.random.default_rng(n1)
    x, y = rng.normal(400, 30, n1).round(), rng.normal(430, 30, n2).round()

    def dmed(a, b, axis=-1):
        return np.median(a, axis=axis) - np.median(b, axis=axis)

    want = stats.bootstrap((x, y), dmed, n_resamples=999, confidence_level=confidence, method="percentile",
                           vectorized=True, rng=np.random.default_rng(7)).confidence_interval
    lo, hi = bootstrap_ci(x, y, dmed, n_resamples=999, confidence=confidence, seed=7)
    assert (lo, hi) == pytest.approx((want.low, want.high), rel=1e-12)


def test_constant_samples_are_not_tested():
    r = shift_test(np.full(6, 400.0), np.full(7, 400.0), Thresholds())
    assert r["p_value"] == 1.0 and r["cliffs_delta"] == 0.0 and r["shift_ns"] == 0.0


def test_judge_bonferroni_counts_tested_only():
    th = Thresholds()
    big = {"shift_ns": 300.0, "rel_shift": 0.5, "p_value": 0.004}
    out = judge([big, None, dict(big, shift_ns=-300.0, rel_shift=-0.5), dict(big, p_value=0.2)], th)
    assert [v for _, v in out] == ["unchanged", "insufficient", "unchanged", "unchanged"]  # 0.004 * 3 > 0.01
    out = judge([big, None, dict(big, shift_ns=-300.0, rel_shift=-0.5, p_value=1e-6)], th)
    assert out[0] == (pytest.approx(0.008), "regression") and out[2][1] == "improvement"
    assert math.isnan(out[1][0]) and out[1][1] == "insufficient"


def test_one_tick_noise_never_flags_even_when_significant():
    rng = np.random.default_rng(1)
    base = 384 + 32 * rng.integers(0, 2, 500)
    cur = 416 + 32 * rng.integers(0, 2, 500)  # +1 tick everywhere: p tiny, effect below thresholds
    r = shift_test(base, cur, Thresholds())
    assert r["p_value"] < 1e-10
    assert verdict(r["shift_ns"], r["rel_shift"], r["p_value"], Thresholds()) == "unchanged"


def test_large_shift_with_few_replays_is_not_significant():
    th = Thresholds(min_replays=2)
    r = shift_test(np.array([400.0, 800.0, 420.0]), np.array([900.0, 410.0, 1000.0]), th)
    assert r["shift_ns"] >= 128 and r["p_value"] > th.alpha


def test_cliffs_delta_and_ci_match_definitions():
    rng = np.random.default_rng(2)
    base, cur = rng.normal(400, 30, 40), rng.normal(700, 30, 50)
    r = shift_test(base, cur, Thresholds())
    brute = np.mean(np.sign(cur[:, None] - base[None, :]))
    assert r["cliffs_delta"] == pytest.approx(brute)
    assert r["ci_low_ns"] <= r["shift_ns"] <= r["ci_high_ns"]
    assert r["shift_ns"] == pytest.approx(np.median(cur) - np.median(base))
