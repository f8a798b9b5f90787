"""Snapshots are frozen data."""

import pytest

from graphmon.export.aggregator import Aggregator

from helpers import synthetic_trace, window


def test_snapshot_is_immutable():
    agg = Aggregator()
    agg.ingest(window(synthetic_trace()))
    s = agg.snapshot()
    with pytest.raises(TypeError):
        s.gap_hist[("x",)] = None  # type: ignore[index]
    with pytest.raises(Exception):
        s.windows_total = 5  # type: ignore[misc]
