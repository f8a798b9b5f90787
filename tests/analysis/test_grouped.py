"""analysis/grouped.py: grouped statistics equal numpy's per-group results."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from graphmon.analysis.grouped import grouped_minmax, grouped_quantiles, grouped_sums, summarize


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
