"""Is a shift between two samples real? Thresholds, the shift test and the Bonferroni verdicts
shared by ``graphmon compare`` and ``graphmon ab``. The only module that imports scipy."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from graphmon.model.trace import TraceError


@dataclass(frozen=True)
class Thresholds:
    """What counts as a real change (see graphmon.analysis.compare's docstring for the reasons)."""

    min_shift_ns: float = 128.0
    min_rel: float = 0.20
    alpha: float = 0.01
    min_replays: int = 5
    n_resamples: int = 2000  # bootstrap resamples for the CI of the shift
    confidence: float = 0.95
    seed: int = 0

    def __post_init__(self) -> None:
        if not (self.min_shift_ns >= 0 and self.min_rel >= 0):
            raise TraceError("thresholds must be >= 0")
        if not 0 < self.alpha < 1 or not 0 < self.confidence < 1:
            raise TraceError("alpha and confidence must be in (0, 1)")
        if self.min_replays < 2:
            raise TraceError("min_replays must be >= 2")


def bootstrap_ci(x: np.ndarray, y: np.ndarray, statistic: Callable, *, n_resamples: int, confidence: float,
                 seed: int) -> tuple[float, float]:
    """Percentile bootstrap CI of ``statistic(x, y, axis=-1)`` (vectorised), x and y resampled apart."""
    from scipy import stats

    ci = stats.bootstrap((x, y), statistic, n_resamples=n_resamples, confidence_level=confidence,
                         method="percentile", vectorized=True, rng=np.random.default_rng(seed))
    return float(ci.confidence_interval.low), float(ci.confidence_interval.high)


def shift_test(base: np.ndarray, cur: np.ndarray, th: Thresholds) -> dict:
    """Median shift, bootstrap CI, Cliff's delta and Mann-Whitney p of two samples of per-replay medians."""
    from scipy import stats

    base = np.asarray(base, np.float64)
    cur = np.asarray(cur, np.float64)
    mb, mc = float(np.median(base)), float(np.median(cur))
    shift = mc - mb
    rel = shift / mb if mb != 0 else (0.0 if shift == 0 else math.copysign(math.inf, shift))
    if len(np.unique(np.r_[base, cur])) == 1:
        p, delta = 1.0, 0.0  # identical constant samples: nothing to test
    else:
        res = stats.mannwhitneyu(cur, base, alternative="two-sided", method="asymptotic")
        p = float(res.pvalue)
        delta = 2.0 * float(res.statistic) / (len(cur) * len(base)) - 1.0

    def dmed(x, y, axis=-1):
        return np.median(x, axis=axis) - np.median(y, axis=axis)

    lo, hi = bootstrap_ci(cur, base, dmed, n_resamples=th.n_resamples, confidence=th.confidence, seed=th.seed)
    return {"median_baseline_ns": mb, "median_current_ns": mc, "shift_ns": shift, "rel_shift": rel,
            "ci_low_ns": lo, "ci_high_ns": hi, "cliffs_delta": delta, "p_value": p}


def verdict(shift_ns: float, rel_shift: float, p_adjusted: float, th: Thresholds) -> str:
    big = abs(shift_ns) >= th.min_shift_ns and abs(rel_shift) >= th.min_rel
    if not big or not p_adjusted < th.alpha:
        return "unchanged"
    return "regression" if shift_ns > 0 else "improvement"


def judge(tests: Sequence[dict | None], th: Thresholds) -> list[tuple[float, str]]:
    """(Bonferroni-adjusted p, verdict) per :func:`shift_test` result; None = not tested
    (too few replays): (NaN, "insufficient"). The correction counts the tested ones only."""
    m = sum(1 for t in tests if t is not None)
    out = []
    for t in tests:
        if t is None:
            out.append((math.nan, "insufficient"))
            continue
        p_adj = min(1.0, t["p_value"] * m)
        out.append((p_adj, verdict(t["shift_ns"], t["rel_shift"], p_adj, th)))
    return out
