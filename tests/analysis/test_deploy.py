"""graphmon.analysis.deploy: the regression verdict on the real H200 trace (held-out widenings, nulls)."""

from __future__ import annotations

import re

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
    # net harm: the replay is 5 us slower (the three boundaries sit on the critical path); idle fell,
    # since the side streams' kernels now overlap the main stream's less
    assert g.net == "slower" and g.span.shift_ns == 5000 and g.span.ci_low_ns > 0 and g.idle.shift_ns < 0
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
    g0 = _graph(judge(cmp_, attr, Gate(min_added_ns=0, min_added_rel=0, net_harm=False)), HELD_OUT_GRAPH)
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
    assert doc["regression"] is True
    assert doc["gate"] == {"min_added_ns": 1000.0, "min_added_rel": 0.02, "net_harm": True,
                           "untraced_confirm_rel": 0.005, "untraced_rise_rel": 0.01, "min_untraced": 20}
    g = next(x for x in doc["graphs"] if x["graph"] == HELD_OUT_GRAPH)
    assert g["kind"] == "concentrated" and g["streams"][0]["ci_low_ns"] is not None
    assert g["net"] == "slower" and g["span"]["shift_ns"] == 5000 and g["span"]["ci_low_ns"] > 0
    text = v.format_table("uniform")
    assert f"graph {HELD_OUT_GRAPH} (device 0): REGRESSION (concentrated, boundaries)" in text
    assert "replay as a whole: slower; span median 1600.53 -> 1605.53 us (+5.00 us, 95% CI [+3.90, +6.06])" in text
    assert "PASS: no regression of kind uniform" in text
    assert "FAIL: 1 graph(s) regressed (concentrated)" in v.format_table("any")


def test_bad_arguments(native):
    with pytest.raises(TraceError):
        Gate(min_added_ns=-1)
    with pytest.raises(ValueError):
        deploy_verdict(native, native).regressions("sometimes")
    assert FAIL_ON == ("uniform", "concentrated", "any")


def _rollback(native):
    """The issue's rollback: the reference widened every gap of a graph by 150 ns (idle +~143 us per
    replay); the current build is the original with one boundary +10 us (+7.4 us by chance in the
    real case, with a smaller reference idle time)."""
    gi = native.graph_names().index(HELD_OUT_GRAPH)
    return widen(native, gi, 150), widen_at(native, gi, 7, [40], 10_000)


def test_a_rollback_that_widens_one_boundary_is_not_a_regression(native):
    ref, cur = _rollback(native)
    v = deploy_verdict(ref, cur)
    g = _graph(v, HELD_OUT_GRAPH)
    # the widening is there, reported with its kind, boundary and gap added ...
    assert g.widening and g.kind == "concentrated" and g.widened == 1 and g.gap_added_ns == 10_000 - 150
    assert g.flagged_streams == [7]
    # ... in a replay that got faster as a whole: no regression, nothing to page
    assert g.net == "faster" and g.span.ci_high_ns < 0 and g.idle.ci_high_ns < 0
    assert not g.regression and not v.regressions() and not v.to_json()["regression"]
    assert all(s.verdict in ("improvement", "unchanged") for s in g.streams)
    text = v.format_table()
    assert f"graph {HELD_OUT_GRAPH} (device 0): widened (concentrated, boundaries) but not slower (faster)" in text
    assert "PASS: no regression" in text
    # the strict rule (compare --fail-on-widening) still fails it
    strict = deploy_verdict(ref, cur, gate=Gate(net_harm=False))
    assert [x.graph for x in strict.regressions()] == [HELD_OUT_GRAPH]


def test_a_net_improvement_with_three_widened_boundaries_is_not_a_regression(native):
    """The held-out pair: every boundary -321 ns, three boundaries +5 us: the replay spans 49 us less."""
    gi = native.graph_names().index(HELD_OUT_GRAPH)
    _, cur = held_out_concentrated(widen(native, gi, -321))
    g = _graph(deploy_verdict(native, cur), HELD_OUT_GRAPH)
    assert g.widening and g.kind == "concentrated" and g.widened == 3
    assert g.net == "faster" and not g.regression
    assert g.span.shift_ns < -40_000 and g.span.ci_high_ns < 0


def test_net_effect_rules():
    from graphmon.analysis.compare import ReplayShift
    from graphmon.analysis.deploy import net_effect

    def r(measure, shift, lo, hi, n=20):
        return ReplayShift(measure, n, n, 100_000.0, 100_000.0 + shift, shift, lo, hi)

    gate = Gate()
    assert net_effect(r("span", 5_000, 4_000, 6_000), r("idle", -15_000, -16_000, -14_000), gate) == "slower"
    assert net_effect(r("span", 0, -900, 900), r("idle", 2_000, 1_500, 2_500), gate) == "slower"
    # the span fell: faster, however much the idle time rose
    assert net_effect(r("span", -100, -200, -10), r("idle", 50_000, 40_000, 60_000), gate) == "faster"
    # below the gate's absolute part, or an interval that reaches 0: unchanged
    assert net_effect(r("span", 900, 800, 1_000), r("idle", 0, -10, 10), gate) == "unchanged"
    assert net_effect(r("span", 5_000, 0, 9_000), r("idle", 0, -10, 10), gate) == "unchanged"
    nan = float("nan")
    assert net_effect(r("span", nan, nan, nan, 3), r("idle", nan, nan, nan, 3), gate) == "insufficient"
    assert net_effect(None, None, gate) == "insufficient"


# ---------------------------------------------------------------------- untraced replay time (issue 36)
def _untraced(ref, cur, f_ref=1.0, f_cur=1.0, source=None):
    """Untraced durations per graph: the real replay spans of the first half of ``source``'s replays
    (x f_ref) for the reference, of the second half (x f_cur) for the current build."""
    from graphmon.analysis.compare import untraced_by_graph
    from helpers import untraced_rows

    src = source if source is not None else ref
    return (untraced_by_graph(untraced_rows(src, f_ref, which=0), ref.graph_names()),
            untraced_by_graph(untraced_rows(src, f_cur, which=1), cur.graph_names()))


def test_a_traced_regression_the_untraced_time_does_not_confirm_is_observer_only(native):
    """Issue 36: a build whose traced gaps widen (span +5 us per replay, traced) while its untraced
    replay time falls by 20% must not page; reported with both figures."""
    _, cur = held_out_concentrated(native)
    for f_cur, state in ((0.8, "faster"), (1.0, "unchanged")):
        v = deploy_verdict(native, cur, untraced=_untraced(native, cur, f_cur=f_cur, source=native))
        g = _graph(v, HELD_OUT_GRAPH)
        assert g.widening and g.net == "slower" and g.span.ci_low_ns > 0  # the traced rule would page ...
        assert g.kind == "observer_only" and g.widening_kind == "concentrated" and not g.regression  # ... untraced vetoes
        assert g.untraced == state and g.untraced_replay.replays_baseline == 40 == g.untraced_replay.replays_current
        assert not v.regressions() and not v.to_json()["regression"] and v.untraced == "measured"
    assert g.untraced_replay.ci_low_ns <= 0 <= g.untraced_replay.ci_high_ns
    doc = next(x for x in v.to_json()["graphs"] if x["graph"] == HELD_OUT_GRAPH)
    assert doc["kind"] == "observer_only" and doc["untraced"] == "unchanged" and doc["span"]["shift_ns"] == 5000
    text = deploy_verdict(native, cur, untraced=_untraced(native, cur, f_cur=0.8)).format_table()
    assert (f"graph {HELD_OUT_GRAPH} (device 0): widened (concentrated, boundaries) and slower traced, but the "
            "untraced replay time is faster: observer_only, not a regression") in text
    assert "span median 1600.53 -> 1605.53 us (+5.00 us" in text  # both figures, the traced ...
    assert re.search(r"untraced replay: faster; untraced median 1600\.\d\d -> 1280\.\d\d us \(-3\d\d\.\d\d us, "
                     r"95% CI \[-3\d\d\.\d\d, -3\d\d\.\d\d\]\) \(-20\.0\d%\)", text)  # ... and the untraced
    assert "PASS: no regression" in text


def test_a_traced_regression_the_untraced_time_confirms_pages(native):
    _, cur = held_out_concentrated(native)
    for f_cur in (1.01, 1.007):  # >= 0.5% of the reference's median confirms
        v = deploy_verdict(native, cur, untraced=_untraced(native, cur, f_cur=f_cur))
        g = _graph(v, HELD_OUT_GRAPH)
        assert g.regression and g.kind == "concentrated" and g.why == "boundaries" and g.untraced == "slower"
        assert g.untraced_replay.ci_low_ns > 0 and g.untraced_rel_shift == pytest.approx(f_cur - 1, abs=0.002)
    assert [x.graph for x in v.regressions()] == [HELD_OUT_GRAPH]
    # the uniform widening (every gap +320 ns) with its replays 1% slower untraced
    gi = native.graph_names().index("decode_bs1/upload")
    cur = widen(native, gi)
    g = _graph(deploy_verdict(native, cur, untraced=_untraced(native, cur, f_cur=1.01)), "decode_bs1/upload")
    assert g.regression and g.kind == "uniform" and g.untraced == "slower"


def test_an_untraced_rise_without_a_traced_widening_is_its_own_kind(native):
    """+1.2% untraced (the launch or the kernels got slower), no gap moved: kind untraced, a page.
    (The 1% gate applies to the measured median shift: the two halves' medians differ by up to
    0.15%, so a build at exactly +1% measures on either side of it.)"""
    a, b = half(native, 0), half(native, 1)
    v = deploy_verdict(a, b, untraced=_untraced(a, b, f_cur=1.012, source=native))
    assert {g.untraced for g in v.graphs} == {"slower"}
    assert all(g.regression and g.kind == "untraced" and g.why == "untraced" and not g.widening
               and g.widening_kind == "none" and not g.flagged_streams for g in v.graphs)
    assert v.regressions() == v.graphs and not v.regressions("uniform") and not v.regressions("concentrated")
    assert "REGRESSION (untraced, untraced)" in v.format_table()
    # +0.7% confirms a traced regression but does not page alone; the same halves at 1.0: nothing
    for f in (1.007, 1.0):
        v = deploy_verdict(a, b, untraced=_untraced(a, b, f_cur=f, source=native))
        assert not v.regressions() and all(g.kind == "none" for g in v.graphs)


def test_without_untraced_durations_the_verdict_is_todays_and_says_absent(native):
    _, cur = held_out_concentrated(native)
    before = deploy_verdict(native, cur)
    g = _graph(before, HELD_OUT_GRAPH)
    assert g.regression and g.kind == "concentrated" and g.untraced == "absent" and g.untraced_replay is None
    assert before.untraced == "absent" and before.to_json()["untraced"] == "absent"
    assert "untraced replay: absent" in before.format_table() and "untraced: absent)" in before.format_table()
    # durations on one side only, or of another graph: absent as well
    ub, uc = _untraced(native, cur)
    for u in (({}, uc), (ub, {}), ({"nope": ub[HELD_OUT_GRAPH]}, uc)):
        assert _graph(deploy_verdict(native, cur, untraced=u), HELD_OUT_GRAPH) == g
    # too few (fewer than Gate.min_untraced on a side): insufficient, the traced rule decides
    few = ({k: x[:10] for k, x in ub.items()}, {k: x * 0.8 for k, x in uc.items()})
    v = deploy_verdict(native, cur, untraced=few)
    g2 = _graph(v, HELD_OUT_GRAPH)
    assert g2.regression and g2.kind == "concentrated" and g2.untraced == "insufficient" and not g2.untraced_replay.tested
    assert v.untraced == "insufficient"


def test_the_rollback_still_does_not_page_with_untraced_durations(native):
    """Issue 35's rollback (reference +150 ns on every gap) with the untraced truth beside it."""
    ref, cur = _rollback(native)
    for f_ref in (1.1, 1.0):  # the reference's replays were slower untraced, or the same
        v = deploy_verdict(ref, cur, untraced=_untraced(ref, cur, f_ref=f_ref, source=native))
        g = _graph(v, HELD_OUT_GRAPH)
        assert g.widening and g.net == "faster" and not g.regression and g.kind == "concentrated"
        assert not v.regressions()


def test_the_strict_rule_pages_on_the_widening_whatever_the_untraced_time(native):
    _, cur = held_out_concentrated(native)
    strict = deploy_verdict(native, cur, gate=Gate(net_harm=False), untraced=_untraced(native, cur, f_cur=0.8))
    g = _graph(strict, HELD_OUT_GRAPH)
    assert g.regression and g.kind == "concentrated" and g.untraced == "faster"


def test_untraced_effect_rules():
    from graphmon.analysis.compare import ReplayShift
    from graphmon.analysis.deploy import untraced_effect, untraced_rose

    def r(shift, lo, hi, base=1_000_000.0, n=100):
        return ReplayShift("untraced", n, n, base, base + shift, shift, lo, hi)

    gate = Gate()
    assert untraced_effect(None, gate) == "absent"
    nan = float("nan")
    assert untraced_effect(r(nan, nan, nan, n=10), gate) == "insufficient"
    assert untraced_effect(r(-10, -20, -1), gate) == "faster"
    assert untraced_effect(r(5_000, 4_000, 6_000), gate) == "slower" and not untraced_rose(r(5_000, 4_000, 6_000), gate)
    assert untraced_rose(r(10_000, 9_000, 11_000), gate)
    assert untraced_effect(r(4_999, 4_000, 6_000), gate) == "unchanged"  # below 0.5% of 1 ms
    assert untraced_effect(r(6_000, -1, 9_000), gate) == "unchanged"  # the interval reaches 0
    # a small graph: the 1 us absolute part decides (0.5% of 100 us is 500 ns)
    assert untraced_effect(r(900, 800, 1_000, base=100_000.0), gate) == "unchanged"
    assert untraced_rose(r(1_000, 900, 1_100, base=100_000.0), gate)
    with pytest.raises(TraceError):
        Gate(min_untraced=1)
