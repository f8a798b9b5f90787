"""analysis/grouped.py: grouped statistics equal numpy's per-group results."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from graphmon.analysis.grouped import grouped_minmax, grouped_quantiles, grouped_sums, grouped_summaries, summarize


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(-10**6, 10**6), min_size=0, max_size=30), min_size=1, max_size=8))
def test_grouped_quantiles_equal_numpy(groups):
    vals = np.concatenate([np.sort(np.array(g, dtype=np.int64)) for g in groups])
    offs = np.cumsum([0] + [len(g) for g in groups])
    q = grouped_quantiles(vals, offs)
    for i, g in enumerate(groups):
        if g:
            np.testing.assert_allclose(q[i], np.quantile(np.array(g, dtype=np.float64), [0.1, 0.5, 0.9, 0.99]))
        else:
            assert np.isnan(q[i]).all()


def test_summarize_matches_numpy():
    v = np.array([5, 1, 9, 3, 3, 8], dtype=np.int64)
    s = summarize(v)
    assert s["count"] == 6 and s["min"] == 1 and s["max"] == 9
    assert s["p50"] == pytest.approx(np.quantile(v, 0.5))
    assert s["p99"] == pytest.approx(np.quantile(v, 0.99))


def test_grouped_sums_and_minmax_exact_int64():
    big = 2**62 // 3
    vals = np.array([big, big, 1, -5, 7], dtype=np.int64)
    offs = np.array([0, 2, 2, 5])
    assert grouped_sums(vals, offs).tolist() == [2 * big, 0, 3]  # exact above 2**53
    lo, hi = grouped_minmax(vals, np.array([0, 2, 5]))
    assert lo.tolist() == [big, -5] and hi.tolist() == [big, 7]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(-10**12, 10**12), min_size=0, max_size=12), min_size=65, max_size=200),
       st.booleans())
def test_many_group_path_is_bit_identical_to_the_loop(groups, presorted):
    """Over VECTOR_MIN_GROUPS groups one vectorised sort replaces the per-group loop: the same
    float64 bits, sorted input or not, with empty groups."""
    import graphmon.analysis.grouped as grouped

    vals = np.concatenate([np.sort(np.array(g, dtype=np.int64)) if presorted else np.array(g, dtype=np.int64)
                           for g in groups])
    offs = np.cumsum([0] + [len(g) for g in groups]).astype(np.int64)
    fast = grouped_quantiles(vals, offs, presorted=presorted)
    saved = grouped.VECTOR_MIN_GROUPS
    grouped.VECTOR_MIN_GROUPS = 10**9  # the loop
    try:
        loop = grouped_quantiles(vals, offs, presorted=presorted)
    finally:
        grouped.VECTOR_MIN_GROUPS = saved
    assert fast.tobytes() == loop.tobytes()
    if not presorted:
        assert np.array_equal(vals, np.concatenate([np.array(g, dtype=np.int64) for g in groups]))  # input untouched


def test_grouped_summaries_equal_summarize_per_group():
    rng = np.random.default_rng(3)
    groups = [rng.integers(-10**9, 10**9, int(rng.integers(0, 9))) for _ in range(300)]
    offs = np.cumsum([0] + [len(g) for g in groups]).astype(np.int64)
    got = grouped_summaries(np.concatenate(groups), offs)
    assert got == [summarize(g) for g in groups]


def test_sums_near_6e18_do_not_wrap():
    """Two gaps of 6e18 ns: an int64 sum wraps to -6.4e18 (mean -3.2e18); the exact sum does not."""
    big = 6 * 10**18
    vals = np.array([big, big + 1, 5, big, 3], dtype=np.int64)
    offs = np.array([0, 2, 3, 5])
    sums = grouped_sums(vals, offs)
    assert [int(x) for x in sums] == [2 * big + 1, 5, big + 3]
    assert float(sums[0] / 2) == pytest.approx(6e18)
    s = summarize(vals[:2])
    assert s["mean"] == float((2 * big + 1) / 2) > 0
    d = grouped_summaries(vals, offs)
    assert d[0]["mean"] == float((2 * big + 1) / 2) and d[2]["mean"] == float((big + 3) / 2)
    neg = np.array([-big, -big, -(2**63) + 1], dtype=np.int64)
    assert [int(x) for x in grouped_sums(neg, np.array([0, 3]))] == [-2 * big - 2**63 + 1]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(-(2**63) + 1, 2**63 - 1), min_size=0, max_size=20), min_size=1, max_size=6))
def test_grouped_sums_are_exact_python_int_sums(groups):
    vals = np.array([x for g in groups for x in g], dtype=np.int64)
    offs = np.cumsum([0] + [len(g) for g in groups])
    assert [int(x) for x in grouped_sums(vals, offs)] == [sum(g) for g in groups]


def _partition_quantiles(vals, offs, qs=(0.1, 0.5, 0.9, 0.99)):
    """The np.partition formulation, written out (the fallback the counting path must equal)."""
    out = np.full((len(offs) - 1, len(qs)), np.nan)
    for g in range(len(offs) - 1):
        v = vals[offs[g] : offs[g + 1]]
        n = len(v)
        if n == 0:
            continue
        pos = np.asarray(qs, dtype=np.float64) * (n - 1)
        lo = np.floor(pos).astype(np.int64)
        hi = np.minimum(lo + 1, n - 1)
        p = np.partition(v, np.unique(np.r_[lo, hi]))
        vlo, vhi = p[lo].astype(np.float64), p[hi].astype(np.float64)
        out[g] = vlo + (vhi - vlo) * (pos - lo)
    return out


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3000), st.integers(-(2**40), 2**40), st.integers(1, 5000)),
                min_size=1, max_size=5),
       st.sampled_from([np.int64, np.int32, np.uint32, np.uint64, np.int16]), st.data())
def test_counting_quantiles_are_bit_identical_to_partition(specs, dtype, data):
    """Large integer groups with a small value range take the bincount/cumsum path: the same
    float64 bits as np.partition, for any offset, range, size and integer dtype."""
    import graphmon.analysis.grouped as grouped

    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    info = np.iinfo(dtype)
    groups = []
    for n, base, span in specs:
        base = int(np.clip(base, info.min, info.max - span))
        groups.append(rng.integers(base, base + span, n, endpoint=True).astype(dtype))
    vals = np.concatenate(groups) if groups else np.zeros(0, dtype)
    offs = np.cumsum([0] + [len(g) for g in groups]).astype(np.int64)
    saved = grouped.COUNT_MIN_VALUES
    grouped.COUNT_MIN_VALUES = 1  # every non-empty group takes the counting path where the range allows
    try:
        got = grouped_quantiles(vals, offs)
    finally:
        grouped.COUNT_MIN_VALUES = saved
    assert got.tobytes() == _partition_quantiles(vals, offs).tobytes()
    assert got.tobytes() == grouped_quantiles(vals, offs).tobytes()  # default thresholds: the same


def test_counting_quantiles_taken_for_gaps_and_skipped_for_wide_ranges(monkeypatch):
    """The counting path runs on gap-like groups (and only there): spied on, not assumed."""
    import graphmon.analysis.grouped as grouped

    calls = []
    real = grouped._counted_order_stats
    monkeypatch.setattr(grouped, "_counted_order_stats", lambda v, r: calls.append(len(v)) or real(v, r))
    rng = np.random.default_rng(0)
    gaps = (rng.integers(0, 40, 100_000) * 32).astype(np.int64)  # 32 ns ticks
    wide = rng.integers(0, 2**60, 5_000)
    q = grouped_quantiles(np.r_[gaps, wide], np.array([0, len(gaps), len(gaps) + len(wide)]))
    assert q.tobytes() == _partition_quantiles(np.r_[gaps, wide], np.array([0, len(gaps), len(gaps) + len(wide)])).tobytes()
    assert calls == [100_000, 5_000]
    assert real(wide, np.array([0, 1])) is None and real(gaps.astype(np.float64), np.array([0])) is None
