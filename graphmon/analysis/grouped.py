"""Statistics over contiguous groups of one column (``values[offsets[g]:offsets[g+1]]``): exact
quantiles, min/max, sums, and a one-sample summary. No per-value Python loops.

Quantiles of a large integer group whose values span a small range (kernel gaps: a few thousand
distinct ns values in millions of gaps) are read off a histogram (bincount + cumsum): the same
order statistics as ``np.partition``, so bit-identical, in a fraction of the time
(bench/results/analysis-throughput.json). Sums are exact whatever the values (int64 sums of gaps
near 6e18 ns would wrap).
"""

from __future__ import annotations

import numpy as np

QUANTILES = (0.1, 0.5, 0.9, 0.99)
# Many small groups (e.g. per-graph summaries of a trace with 100k graphs): one vectorised sort;
# few large ones (the gaps of a 10M-record trace): np.partition per group, linear time.
VECTOR_MIN_GROUPS = 64
VECTOR_MAX_MEAN = 4096
VECTOR_MAX_TOTAL = 1 << 16  # or a few small groups (an agent's window: 16 of ~60 gaps): one sort too
# Counting quantiles when the group's value range is at most COUNT_RANGE_PER_VALUE x its size
# (+ COUNT_RANGE_MIN): the histogram then costs no more memory than one copy of the group.
COUNT_RANGE_PER_VALUE = 1
COUNT_RANGE_MIN = 1 << 16
COUNT_MIN_VALUES = 1024  # below this, np.partition is as fast and needs no min/max pass


def grouped_quantiles(values: np.ndarray, offsets: np.ndarray, qs=QUANTILES, presorted: bool = False) -> np.ndarray:
    """Exact quantiles per contiguous group of ``values`` (``values[offsets[g]:offsets[g+1]]``).

    Returns float64 (groups x len(qs)); NaN for empty groups. Linear interpolation between order
    statistics, identical to ``np.quantile(group, q)``. Unsorted groups are handled with
    ``np.partition`` (linear time) unless ``presorted``.
    """
    counts = np.diff(offsets)
    out = np.full((len(counts), len(qs)), np.nan)
    total = int(offsets[-1] - offsets[0]) if len(counts) else 0
    if (len(counts) > VECTOR_MIN_GROUPS or total <= VECTOR_MAX_TOTAL) and total < VECTOR_MAX_MEAN * len(counts):
        return _quantiles_many(values, offsets, counts, qs, presorted, out)
    for g in np.flatnonzero(counts > 0).tolist():
        v = values[offsets[g] : offsets[g + 1]]
        n = len(v)
        pos = np.asarray(qs, dtype=np.float64) * (n - 1)
        lo = np.floor(pos).astype(np.int64)
        hi = np.minimum(lo + 1, n - 1)
        if presorted:
            vlo, vhi = v[lo], v[hi]
        else:
            got = _counted_order_stats(v, np.r_[lo, hi]) if n >= COUNT_MIN_VALUES else None
            if got is None:
                v = np.partition(v, np.unique(np.r_[lo, hi]))
                vlo, vhi = v[lo], v[hi]
            else:
                vlo, vhi = got[: len(lo)], got[len(lo) :]
        vlo, vhi = vlo.astype(np.float64), vhi.astype(np.float64)
        out[g] = vlo + (vhi - vlo) * (pos - lo)
    return out


def _counted_order_stats(v: np.ndarray, ranks: np.ndarray) -> np.ndarray | None:
    """The order statistics ``np.sort(v)[ranks]`` of an integer sample read off its histogram, or
    None where that does not pay (not integers, or a value range much wider than the sample)."""
    if v.dtype.kind not in "iu":
        return None
    vmin, vmax = int(v.min()), int(v.max())
    budget = COUNT_RANGE_PER_VALUE * len(v) + COUNT_RANGE_MIN
    if vmax - vmin + 1 > budget:
        return None
    # Bins from 0 where the values are small and not negative (gaps often are): no shifted copy
    # of the group, one pass fewer; else from vmin, in [0, span): no wrap, span is small.
    base = 0 if 0 <= vmin and vmax < budget else vmin
    shifted = v - v.dtype.type(base) if base else v
    cum = np.cumsum(np.bincount(shifted.astype(np.intp, copy=False), minlength=vmax - base + 1))  # uint64 too
    # the k-th smallest (from 0) is the first value whose cumulative count exceeds k
    return (np.searchsorted(cum, ranks, side="right").astype(object if v.dtype == np.uint64 else np.int64)
            + base).astype(v.dtype)


def grouped_minmax(values: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-group min and max (groups must be non-empty)."""
    return np.minimum.reduceat(values, offsets[:-1]), np.maximum.reduceat(values, offsets[:-1])


def grouped_sums(values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Exact integer sums per contiguous group (empty groups give 0): int64 when every sum fits,
    else an object array of Python ints (mean = ``sums[g] / n`` is then still correctly rounded).

    A plain int64 sum wraps once |values| x count passes 2**63 (gaps near 6e18 ns). Then each
    value is split into a high and a low 32-bit part, v = hi * 2**32 + lo with lo in [0, 2**32):
    the sums of either part over a group of fewer than 2**31 values fit int64, and the exact sum
    is put together in Python ints, one per group."""
    values = np.asarray(values)
    counts = np.diff(offsets)
    out = np.zeros(len(counts), dtype=np.int64)
    ok = counts > 0
    if not ok.any():
        return out
    heads = offsets[:-1][ok]
    if values.dtype.kind == "f":
        out = out.astype(np.float64)
        out[ok] = np.add.reduceat(values, heads)
        return out
    biggest = max(abs(int(values.min())), abs(int(values.max())))
    if biggest * int(counts.max()) < 2**63:  # no partial sum can wrap
        out[ok] = np.add.reduceat(values, heads)
        return out
    if int(counts.max()) >= 2**31:
        raise ValueError("grouped_sums: a group of 2**31 values or more with values near int64's limits")
    v = values.astype(np.int64, copy=False)
    hi = np.add.reduceat(v >> 32, heads).tolist()
    lo = np.add.reduceat(v & 0xFFFFFFFF, heads).tolist()
    exact = [(h << 32) + l for h, l in zip(hi, lo)]
    if all(-(2**63) <= x < 2**63 for x in exact):
        out[ok] = exact
        return out
    obj = np.zeros(len(counts), dtype=object)
    obj[ok] = exact
    return obj


def _quantiles_many(values, offsets, counts, qs, presorted: bool, out: np.ndarray) -> np.ndarray:
    """grouped_quantiles for many small groups: one sort within groups for all of them (a
    Python step per group was ~30 us: 3 s for 100k graphs), the same order statistics and the
    same float64 arithmetic per group as the loop, so bit-identical to it."""
    start = np.asarray(offsets[:-1], np.int64)
    if not presorted:
        gid = np.repeat(np.arange(len(counts)), counts)
        v = values[start[0] : offsets[-1]] if len(start) else values[:0]
        values = np.empty_like(values)
        values[start[0] : offsets[-1]] = v[np.lexsort((v, gid))]  # groups stay in place, sorted inside
    ok = np.flatnonzero(counts > 0)
    n1 = (counts[ok] - 1)[:, None]
    pos = np.asarray(qs, dtype=np.float64)[None, :] * n1
    lo = np.floor(pos).astype(np.int64)
    hi = np.minimum(lo + 1, n1)
    base = start[ok][:, None]
    vlo, vhi = values[base + lo].astype(np.float64), values[base + hi].astype(np.float64)
    out[ok] = vlo + (vhi - vlo) * (pos - lo)
    return out


def grouped_summaries(values: np.ndarray, offsets: np.ndarray, qs=QUANTILES) -> list[dict[str, float]]:
    """:func:`summarize` of every contiguous group, vectorised (the same dicts, bit for bit)."""
    values = np.asarray(values, dtype=np.int64)
    counts = np.diff(offsets)
    q = grouped_quantiles(values, offsets, qs)
    sums = grouped_sums(values, offsets)
    ok = counts > 0
    mins = np.zeros(len(counts), np.int64)
    maxs = np.zeros(len(counts), np.int64)
    if ok.any():
        mins[ok], maxs[ok] = grouped_minmax(values, np.r_[offsets[:-1][ok], offsets[-1]])
    names = [f"p{_qname(x)}" for x in qs]
    out: list[dict[str, float]] = []
    for g, n in enumerate(counts.tolist()):
        if n == 0:
            out.append({"count": 0})
            continue
        d = {"count": n, "mean": float(sums[g] / n), "min": int(mins[g]), "max": int(maxs[g])}
        d.update(zip(names, q[g].tolist()))
        out.append(d)
    return out


def summarize(values: np.ndarray, qs=QUANTILES) -> dict[str, float]:
    """count/mean/min/max/quantiles of one 1-D sample (sorted or not)."""
    v = np.sort(np.asarray(values, dtype=np.int64))
    if len(v) == 0:
        return {"count": 0}
    qv = grouped_quantiles(v, np.array([0, len(v)]), qs)[0]
    total = grouped_sums(v, np.array([0, len(v)]))[0]
    out = {"count": int(len(v)), "mean": float(total / len(v)), "min": int(v[0]), "max": int(v[-1])}
    out.update({f"p{_qname(q)}": float(x) for q, x in zip(qs, qv)})
    return out


def _qname(q: float) -> str:
    return f"{q * 100:g}"
