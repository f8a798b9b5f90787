"""graphmon.export.untraced: untraced replay times per series key, the bounded recent sample
behind /status's quantiles, the rows' checks, and the lookup by an uncut graph name."""

from __future__ import annotations

import numpy as np
import pytest

from graphmon.export.aggregator import Aggregator
from graphmon.export.buckets import MAX_VALUE_NS
from graphmon.export.detail import cap_label
from graphmon.export.untraced import UNTRACED_SAMPLE, UntracedTimes, summary_of, untraced_rows

from helpers import synthetic_trace, untraced, window


def test_the_summary_is_over_the_newest_sample_exactly_as_numpy_gives_it():
    rng = np.random.default_rng(1)
    key = ("0", "g", "lazy")
    u = UntracedTimes()
    sent = []
    for n in (1_000, 3_500, 700, 9_000, 5):  # wraps the ring, and a batch larger than it
        d = rng.integers(30_000, 5_000_000, n)
        sent.append(d)
        u.fold({0: key}, np.zeros(n, np.int64), d, 1.0)
        newest = np.concatenate(sent)[-UNTRACED_SAMPLE:]
        want = {"count": len(newest), "mean": newest.mean() * 1e-9,
                **dict(zip(("p10", "p50", "p90", "p99"), np.quantile(newest, [0.1, 0.5, 0.9, 0.99]) * 1e-9))}
        assert dict(u.summary[key]) == pytest.approx(want, rel=1e-12)
    every = np.concatenate(sent)
    assert u.hist[key].count == len(every) and u.hist[key].sum_ns == int(every.sum())  # the histogram keeps all


def test_rows_of_several_graphs_sharing_a_key_fold_together():
    u = UntracedTimes()
    key = ("0", "other", "lazy")  # two graphs folded into "other" by the graph cap
    u.fold({3: key, 5: key, 6: ("0", "g6", "lazy")}, np.array([3, 5, 6, 3]), np.array([10, 20, 30, 40]), 1.0)
    assert u.hist[key].count == 3 and u.hist[key].sum_ns == 70 and u.summary[key]["count"] == 3
    assert u.hist[("0", "g6", "lazy")].sum_ns == 30


def test_untraced_rows_map_unknown_graphs_and_leave_out_non_times():
    g, d, bad = untraced_rows(untraced([0, -1, 2, 5, 1, 1], [5, 6, 7, 8, 0, MAX_VALUE_NS + 1]), n_graphs=3)
    assert g.tolist() == [0, -1, 2, -1] and d.tolist() == [5, 6, 7, 8] and bad == 2


@pytest.mark.parametrize("table", [
    {"graph": np.zeros(2, np.int32), "duration_ns": np.ones(3, np.int64)},
    {"graph": np.zeros((2, 1), np.int32), "duration_ns": np.ones((2, 1), np.int64)},
    {"graph": np.zeros(2, np.int32), "duration_ns": np.array([1.5, 2.0])},
])
def test_a_malformed_untraced_table_fails_its_window_counted_and_nothing_folded(table):
    agg = Aggregator()
    agg.ingest(window(synthetic_trace(), untraced=table))
    s = agg.snapshot()
    assert s.errors_total == {"analysis": 1} and s.windows_total == 0 and not s.untraced_hist
    agg.ingest(window(synthetic_trace(), untraced=untraced([0], [100])))  # the next window proceeds
    assert agg.snapshot().untraced_hist[("0", "graph0", "uploaded")].count == 1


def test_a_graph_named_longer_than_its_label_cap_is_found_by_its_uncut_name():
    long = "decode_" + "x" * 300
    cut = cap_label(long, 128)
    sums = {("0", cut, "lazy"): {"count": 1}, ("0", cap_label(long + "y", 128), "lazy"): {"count": 2}}
    assert summary_of(sums, "0", long, "lazy") == {"count": 1}
    assert summary_of(sums, "0", long, "uploaded") is None and summary_of(sums, "1", long, "lazy") is None
    assert summary_of(sums, "0", "decode_x", "lazy") is None
