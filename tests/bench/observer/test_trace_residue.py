"""bench/observer/trace_residue.py's comparisons on synthetic spans: a graph captured after a window 10%
slower, the instances of one arm alike. No GPU."""

import numpy as np
import pytest

from bench.observer import trace_residue as R


def test_residue_comparisons_find_a_slower_graph_captured_after_the_window():
    rng = np.random.default_rng(0)

    def s(us):
        return us * 1e3 + rng.normal(0, 500, 60)

    spans = {"before/A1": s(1411), "before/A2": s(1412), "after/A1": s(1411), "after/A2": s(1412),
             "after/B1": s(1553), "after/B2": s(1552), "before/CA": s(360), "after/CA": s(360), "after/CB": s(360)}
    res = R.analyze_residue(spans, n_boot=300)
    assert abs(res["instance_spread_before"]["pct"]) < 0.2
    assert abs(res["never_traced_graph_after_a_window"]["pct"]) < 0.2
    assert res["captured_after_vs_before_window"]["pct"] == pytest.approx(10.0, abs=0.2)
    assert res["captured_after_vs_before_window"]["pct_ci"][0] > 9
    assert "traced_captured_after_vs_before" not in res  # no traced phase: not reported
    assert res["median_us"]["after/B1"] == pytest.approx(1553, abs=1)


def test_cli_refuses_bad_arguments(tmp_path):
    with pytest.raises(SystemExit):
        R.main(["--out", str(tmp_path), "--block", "2"])
