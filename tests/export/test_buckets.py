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
