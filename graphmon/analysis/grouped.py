"""Statistics over contiguous groups of one column (``values[offsets[g]:offsets[g+1]]``): exact
quantiles, min/max, sums, and a one-sample summary. No per-value Python loops."""

from __future__ import annotations

import numpy as np

QUANTILES = (0.1, 0.5, 0.9, 0.99)


def grouped_quantiles(values: np.ndarray, offsets: np.ndarray, qs=QUANTILES, presorted: bool = False) -> np.ndarray:
    """Exact quantiles per contiguous group of ``values`` (``values[offsets[g]:offsets[g+1]]``).

    Returns float64 (groups x len(qs)); NaN for empty groups. Linear interpolation between order
    statistics, identical to ``np.quantile(group, q)``. Unsorted groups are handled with
    ``np.partition`` (linear time) unless ``presorted``.
    """
    counts = np.diff(offsets)
    out = np.full((len(counts), len(qs)), np.nan)
    for g in np.flatnonzero(counts > 0).tolist():
        v = values[offsets[g] : offsets[g + 1]]
        n = len(v)
        pos = np.asarray(qs, dtype=np.float64) * (n - 1)
        lo = np.floor(pos).astype(np.int64)
        hi = np.minimum(lo + 1, n - 1)
        if not presorted:
            v = np.partition(v, np.unique(np.r_[lo, hi]))
        vlo, vhi = v[lo].astype(np.float64), v[hi].astype(np.float64)
        out[g] = vlo + (vhi - vlo) * (pos - lo)
    return out


def grouped_minmax(values: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-group min and max (groups must be non-empty)."""
    return np.minimum.reduceat(values, offsets[:-1]), np.maximum.reduceat(values, offsets[:-1])


def grouped_sums(values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Exact int64 sums per contiguous group (empty groups give 0)."""
    counts = np.diff(offsets)
    out = np.zeros(len(counts), dtype=np.int64)
    ok = counts > 0
    if ok.any():
        out[ok] = np.add.reduceat(values, offsets[:-1][ok])
    return out


def summarize(values: np.ndarray, qs=QUANTILES) -> dict[str, float]:
    """count/mean/min/max/quantiles of one 1-D sample (sorted or not)."""
    v = np.sort(np.asarray(values, dtype=np.int64))
    if len(v) == 0:
        return {"count": 0}
    qv = grouped_quantiles(v, np.array([0, len(v)]), qs)[0]
    out = {"count": int(len(v)), "mean": float(v.sum() / len(v)), "min": int(v[0]), "max": int(v[-1])}
    out.update({f"p{_qname(q)}": float(x) for q, x in zip(qs, qv)})
    return out


def _qname(q: float) -> str:
    return f"{q * 100:g}"
