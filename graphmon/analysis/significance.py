"""Is a shift between two samples real? Thresholds, the shift test and the Bonferroni verdicts
shared by ``graphmon compare`` and ``graphmon ab``.

The two statistical tools, the Mann-Whitney U test and a percentile bootstrap, are written here in
numpy instead of importing scipy, so that ``graphmon compare`` (regression gating in CI, a core
job) works from the base install. Why by hand: scipy is ~145 MB installed (113 MB + 30 MB of
bundled libraries, measured in this venv) against ~70 lines here, and the base install also goes
into the sidecar agent image. Both follow scipy's definitions exactly (``mannwhitneyu``: average
ranks, tie-corrected normal approximation with continuity correction, exact null distribution for
small samples without ties; ``bootstrap(method="percentile")``: the same resampling draws from the
same generator); tests/analysis/test_significance.py checks them against scipy on random and
tied data.
"""

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
    """Percentile bootstrap CI of ``statistic(x, y, axis=-1)`` (vectorised), x and y resampled apart.

    Same draws and interval as ``scipy.stats.bootstrap((x, y), statistic, method="percentile",
    vectorized=True, rng=np.random.default_rng(seed))``: one (n_resamples, len) block of indices
    per sample, in order, and linear-interpolated quantiles of the bootstrap distribution.
    """
    rng = np.random.default_rng(seed)
    x, y = np.asarray(x), np.asarray(y)
    if x.shape == y.shape and np.array_equal(x, y):
        # One sample measured twice (a trace compared with itself): resampled together, so every
        # resample's shift is 0 and so is the interval. Apart, two draws of the same sample give
        # an interval as wide as two independent ones ([-16, +30] ns on the H200 capture).
        idx = rng.integers(0, len(x), (n_resamples, len(x)))
        resampled = [x[idx], y[idx]]
    else:
        resampled = [s[rng.integers(0, len(s), (n_resamples, len(s)))] for s in (x, y)]
    theta = statistic(*resampled, axis=-1)
    alpha = (1 - confidence) / 2
    lo, hi = np.quantile(theta, [alpha, 1 - alpha])
    return float(lo), float(hi)


@dataclass(frozen=True)
class MannWhitney:
    statistic: float  # U of the first sample
    pvalue: float


def mannwhitneyu(x, y, *, alternative: str = "two-sided", method: str = "auto",
                 use_continuity: bool = True) -> MannWhitney:
    """Mann-Whitney U test of two 1-D samples, as ``scipy.stats.mannwhitneyu`` defines it.

    method "asymptotic": normal approximation with tie correction (and continuity correction);
    "exact": the exact null distribution of U (no tie correction, as scipy); "auto": exact when
    one sample has at most 8 values and there are no ties, else asymptotic.
    """
    x, y = np.asarray(x, np.float64).ravel(), np.asarray(y, np.float64).ravel()
    if len(x) == 0 or len(y) == 0:
        raise ValueError("x and y must be non-empty")
    if np.isnan(x).any() or np.isnan(y).any():
        raise ValueError("x and y must not contain NaNs")
    if alternative not in ("two-sided", "less", "greater") or method not in ("auto", "asymptotic", "exact"):
        raise ValueError(f"bad alternative {alternative!r} or method {method!r}")
    n1, n2 = len(x), len(y)
    ranks, ties = _average_ranks(np.concatenate([x, y]))
    u1 = float(ranks[:n1].sum()) - n1 * (n1 + 1) / 2
    u2 = n1 * n2 - u1
    u, factor = {"greater": (u1, 1), "less": (u2, 1)}.get(alternative, (max(u1, u2), 2))
    if method == "auto":
        method = "exact" if (n1 <= 8 or n2 <= 8) and not (ties > 1).any() else "asymptotic"
    if method == "exact":
        p = _u_exact_sf(int(u), n1, n2)
    else:
        n = n1 + n2
        tie_term = float((ties.astype(np.float64) ** 3 - ties).sum())
        s = math.sqrt(n1 * n2 / 12 * ((n + 1) - tie_term / (n * (n - 1))))
        num = u - n1 * n2 / 2 - (0.5 if use_continuity else 0.0)
        z = num / s if s > 0 else math.copysign(math.inf, num) if num else math.nan
        p = 0.5 * math.erfc(z / math.sqrt(2))  # normal survival function at z
    return MannWhitney(statistic=u1, pvalue=min(max(p * factor, 0.0), 1.0))


def _average_ranks(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """1-based ranks with ties given their average rank, and the size of every tie group."""
    o = np.argsort(v, kind="stable")
    sv = v[o]
    head = np.flatnonzero(np.r_[True, sv[1:] != sv[:-1]])
    sizes = np.diff(np.r_[head, len(v)])
    avg = head + (sizes + 1) / 2  # mean of ranks head+1 .. head+size
    ranks = np.empty(len(v))
    ranks[o] = np.repeat(avg, sizes)
    return ranks, sizes


def _u_exact_sf(u: int, n1: int, n2: int) -> float:
    """P(U >= u) under the null hypothesis, from the exact distribution of U.

    The number of arrangements with U = k is the coefficient of q^k in the Gaussian binomial
    coefficient [n1+n2 choose n1]_q = prod_{i=1..n1} (1 - q^(n2+i)) / (1 - q^i): exact integer
    power-series arithmetic (Python ints), degree n1*n2. Multiplying by (1 - q^k) subtracts a
    shifted copy; dividing by it is a running sum along each residue class mod k.
    """
    deg = n1 * n2
    if u <= 0:
        return 1.0
    if u > deg:
        return 0.0
    c = np.zeros(deg + 1, dtype=object)
    c[0] = 1
    for i in range(1, n1 + 1):
        k = n2 + i
        if k <= deg:
            c[k:] = c[k:] - c[:-k]
    for i in range(1, n1 + 1):
        for r in range(i):
            c[r::i] = np.cumsum(c[r::i])
    total = math.comb(n1 + n2, n1)
    return int(c[u:].sum()) / total


def shift_test(base: np.ndarray, cur: np.ndarray, th: Thresholds) -> dict:
    """Median shift, bootstrap CI, Cliff's delta and Mann-Whitney p of two samples of per-replay medians."""
    base = np.asarray(base, np.float64)
    cur = np.asarray(cur, np.float64)
    mb, mc = float(np.median(base)), float(np.median(cur))
    shift = mc - mb
    rel = shift / mb if mb != 0 else (0.0 if shift == 0 else math.copysign(math.inf, shift))
    if len(np.unique(np.r_[base, cur])) == 1:
        p, delta = 1.0, 0.0  # identical constant samples: nothing to test
    else:
        res = mannwhitneyu(cur, base, alternative="two-sided", method="asymptotic")
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
