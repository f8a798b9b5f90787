"""Bucket bounds and per-group counts."""

import numpy as np

from graphmon.export.buckets import GAP_BUCKETS_NS, bucket_counts


def test_bucket_counts_le_semantics():
    v = np.array([-5, 32, 33, 64, 10**9], dtype=np.int64)
    c = bucket_counts(v, np.zeros(5, dtype=np.int64), 1, GAP_BUCKETS_NS)[0]
    assert c[0] == 2  # -5 and 32 are <= 32 ns (negatives land in the lowest bucket)
    assert c[1] == 2  # 33 and 64
    assert c[-1] == 1  # +Inf
    assert c.sum() == 5


def test_untraced_bounds_are_log_spaced_over_50_us_to_100_ms_and_standard_is_a_subset():
    from graphmon.export.buckets import UNTRACED_BUCKETS_NS, UNTRACED_BUCKETS_STANDARD_NS

    for bounds, lo, hi in ((UNTRACED_BUCKETS_STANDARD_NS, 2.9, 3.4), (UNTRACED_BUCKETS_NS, 1.3, 1.7)):
        ratios = np.diff(np.log(bounds))
        assert bounds[0] < 50_000 and bounds[-1] >= 100_000_000  # ~50 us .. ~100 ms replays bracketed
        assert np.exp(ratios).min() >= lo and np.exp(ratios).max() <= hi  # one step per factor lo-hi
    # re-binned at render time from the full counts: exact only at bounds the full set has
    assert set(UNTRACED_BUCKETS_STANDARD_NS) <= set(UNTRACED_BUCKETS_NS)


def test_hist_add_is_exact_with_python_ints():
    from graphmon.export.buckets import hist_add

    h = hist_add(None, np.array([1, 2, 0]), np.int64(2**62), 3)
    h = hist_add(h, np.array([0, 1, 5]), np.int64(2**62), 6)
    assert h.counts == (1, 3, 5) and h.sum_ns == 2**63 and h.count == 9  # beyond int64: no wrap
    assert all(type(c) is int for c in h.counts)
