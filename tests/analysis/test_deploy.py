"""graphmon.analysis.deploy: the regression verdict on the real H200 trace (held-out widenings, nulls)."""

from __future__ import annotations

import pytest

from graphmon.analysis.boundaries import attribute
from graphmon.analysis.compare import compare
from graphmon.analysis.deploy import FAIL_ON, Gate, deploy_verdict, judge
from graphmon.model.trace import TraceError
from helpers import HELD_OUT_GRAPH, half, held_out_concentrated, widen, widen_at


def _graph(v, name):
    return next(g for g in v.graphs if g.graph == name)


def test_held_out_concentrated_widening_is_a_regression(native):
    picks, cur = held_out_concentrated(native)
    # compare's stream test alone passes it: no stream's per-replay median moves (the old exit 0)
    assert not compare(native, cur).regressions
    v = deploy_verdict(native, cur)
    g = _graph(v, HELD_OUT_GRAPH)
    assert g.regression and g.kind == "concentrated" and g.why == "boundaries"
    assert g.gap_added_ns == 15_000 and g.widened == 3
    assert g.flagged_streams == sorted(s for s, _ in picks)
    assert {(b["stream_current"], b["position"]) for b in g.top[:3]} == set(picks)
    assert [x.graph for x in v.regressions()] == [HELD_OUT_GRAPH]
    assert v.regressions("concentrated") and not v.regressions("uniform")
    assert all(not x.regression and x.kind == "none" and not x.flagged_streams for x in v.graphs if x is not g)
    # the flagged streams are the ones named, with compare's shift and interval beside them
    assert {s.stream_current for s in g.streams if s.flagged} == {s for s, _ in picks}
    assert all(s.verdict == "unchanged" and s.ci_low_ns <= s.shift_ns <= s.ci_high_ns for s in g.streams)


def test_uniform_widening_is_a_uniform_regression_on_every_stream(native):
    gi = native.graph_names().index("decode_bs1/upload")
    v = deploy_verdict(native, widen(native, gi))
    g = _graph(v, "decode_bs1/upload")
    assert g.regression and g.kind == "uniform" and g.why == "streams"
    assert g.flagged_streams == [7, 142, 143, 144]
    assert all(s.flagged and s.verdict == "regression" and s.shift_ns == 320 for s in g.streams)
    assert g.gap_added_ns > 100_000  # ~950 boundaries x 320 ns
    assert v.regressions("uniform") and not v.regressions("concentrated")


@pytest.mark.parametrize("how", ["itself", "halves"])
def test_nulls_are_no_regression(native, how):
    a, b = (native, native) if how == "itself" else (half(native, 0), half(native, 1))
    v = deploy_verdict(a, b)
    assert v.graphs and not v.regressions()
    assert all(g.kind == "none" and g.gap_added_ns == 0 and not any(s.flagged for s in g.streams) for g in v.graphs)


def test_the_gate_keeps_a_small_widening_quiet(native):
    """One boundary +300 ns is real (widened) but adds 0.3 us per replay: below the 1 us gate."""
    gi = native.graph_names().index(HELD_OUT_GRAPH)
    cur = widen_at(native, gi, 156, [100], 300)
    cmp_, attr = compare(native, cur), attribute(native, cur)
    v = judge(cmp_, attr)
    g = _graph(v, HELD_OUT_GRAPH)
    assert g.boundary_verdict == "concentrated" and g.widened == 1 and g.gap_added_ns == 300
    assert not g.regression and g.kind == "none"
    g0 = _graph(judge(cmp_, attr, Gate(min_added_ns=0, min_added_rel=0)), HELD_OUT_GRAPH)
    assert g0.regression and g0.kind == "concentrated" and g0.flagged_streams == [156]


def test_the_gate_is_relative_to_the_idle_time_per_replay(native):
    _, cur = held_out_concentrated(native)
    v = deploy_verdict(native, cur, gate=Gate(min_added_rel=0.10))  # 15 us is 6 % of ~251 us idle
    g = _graph(v, HELD_OUT_GRAPH)
    assert g.idle_baseline_ns == pytest.approx(251_116, rel=0.01)
    assert not g.regression
    assert Gate().passes(15_000, float("nan"))  # unknown idle: the absolute threshold alone
    assert not Gate().passes(999, float("nan"))


def test_json_and_table(native):
    _, cur = held_out_concentrated(native)
    v = deploy_verdict(native, cur)
    doc = v.to_json()
    assert doc["regression"] is True and doc["gate"] == {"min_added_ns": 1000.0, "min_added_rel": 0.02}
    g = next(x for x in doc["graphs"] if x["graph"] == HELD_OUT_GRAPH)
    assert g["kind"] == "concentrated" and g["streams"][0]["ci_low_ns"] is not None
    text = v.format_table("uniform")
    assert f"graph {HELD_OUT_GRAPH} (device 0): REGRESSION (concentrated, boundaries)" in text
    assert "PASS: no regression of kind uniform" in text
    assert "FAIL: 1 graph(s) regressed (concentrated)" in v.format_table("any")


def test_bad_arguments(native):
    with pytest.raises(TraceError):
        Gate(min_added_ns=-1)
    with pytest.raises(ValueError):
        deploy_verdict(native, native).regressions("sometimes")
    assert FAIL_ON == ("uniform", "concentrated", "any")
