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
