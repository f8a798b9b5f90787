"""Per-boundary attribution on the real H200 traces: injected uniform and concentrated widenings."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from graphmon.analysis.boundaries import (WIDENED_MIN_SHIFT_NS, attribute, boundary_gaps, live_top_boundaries,
                                          widest)
from graphmon.analysis.compare import compare
from graphmon.formats.read import read_trace
from graphmon.model.trace import Trace
from graphmon.report.boundary_tables import format_attribution, short_kernel
from helpers import KINETO, NATIVE, WIDEN_NS, half, widen, widen_at

CONC_NS = 5_000



def _pick_three(trace: Trace, graph: int) -> list[tuple[int, int]]:
    """Three (stream, position) boundaries with small gaps on three different streams of ``graph``."""
    b = boundary_gaps(trace)
    med = b.quantile(0.5)
    out = []
    for s in np.unique(b.stream[b.graph == graph]).tolist()[:3]:
        rows = np.flatnonzero((b.graph == graph) & (b.stream == s) & (med < 1_000) & (b.position >= 5))
        out.append((int(s), int(b.position[rows[len(rows) // 2]])))
    return out


def _concentrated(trace: Trace, graph: int):
    picks = _pick_three(trace, graph)
    cur = trace
    for s, p in picks:
        cur = widen_at(cur, graph, s, [p], CONC_NS)
    return picks, cur


# ---------------------------------------------------------------------- identity
@pytest.mark.parametrize("which,replays", [("native", 80), ("kineto", 30)])
def test_every_boundary_has_one_gap_per_replay(request, which, replays):
    t = request.getfixturevalue(which)
    b = boundary_gaps(t)
    assert len(b) and np.all(b.counts == replays)  # identity is stable across replays
    assert b.by_node.all() if which == "native" else not b.by_node.any()
    # every gap of the trace is in exactly one boundary
    from graphmon.analysis.replays import analyze

    a = analyze(t)
    assert len(b.values) == len(a.gaps.values)
    assert np.array_equal(np.sort(b.values), np.sort(a.gaps.values))


def test_boundary_gaps_match_a_direct_computation(kineto):
    b = boundary_gaps(kineto)
    r = int(np.flatnonzero((b.stream == 142) & (b.position == 7))[0])
    g = int(b.graph[r])
    direct = []
    for c in np.unique(kineto.correlation_id[(kineto.graph == g) & (kineto.stream == 142)]):
        m = np.flatnonzero((kineto.correlation_id == c) & (kineto.stream == 142))
        m = m[np.argsort(kineto.start_ns[m], kind="stable")]
        direct.append(kineto.start_ns[m[8]] - kineto.end_ns[m[7]])
        assert kineto.name_id[m[7]] == b.name_prev[r] and kineto.name_id[m[8]] == b.name_next[r]
    assert np.array_equal(b.values[b.offsets[r]:b.offsets[r + 1]], np.sort(direct))


# ---------------------------------------------------------------------- uniform
@pytest.mark.parametrize("which,graph", [("native", "decode_bs1/upload"), ("native", "decode_bs2/no_upload"),
                                         ("kineto", "shapeA/upload")])
def test_uniform_widening_every_stream_flagged_uniform(request, which, graph):
    t = request.getfixturevalue(which)
    g = t.graph_names().index(graph)
    attr = attribute(t, widen(t, g))
    by = {a.graph: a for a in attr.graphs}
    a = by[graph]
    assert a.verdict == "uniform"
    assert a.flagged_streams == sorted(np.unique(t.stream[t.graph == g]).tolist())
    assert np.all(a.all_shifts["shift_ns"] == WIDEN_NS)  # every boundary moved by exactly the injected step
    assert a.median_shift_ns == WIDEN_NS
    assert a.gap_change_ns == WIDEN_NS * a.boundaries
    assert a.top and a.top_share == pytest.approx(len(a.top) / a.boundaries)  # no few boundaries explain it
    assert all(o.verdict == "none" and o.flagged == 0 and not o.top for n, o in by.items() if n != graph)
    # compare flags the same streams
    assert {s.stream_baseline for s in compare(t, widen(t, g)).regressions} == set(a.flagged_streams)


def test_uniform_widening_below_the_widened_threshold_still_uniform(native):
    g = native.graph_names().index("decode_bs1/upload")
    a = attribute(native, widen(native, g, 160)).graphs[g]
    assert a.flagged == 0 and a.moved > a.boundaries / 2 and a.verdict == "uniform"


# ---------------------------------------------------------------------- concentrated
@pytest.mark.parametrize("which,graph", [("native", "decode_bs2/no_upload"), ("kineto", "shapeA/no_upload")])
def test_three_widened_boundaries_reported_first_concentrated(request, which, graph):
    t = request.getfixturevalue(which)
    g = t.graph_names().index(graph)
    picks, cur = _concentrated(t, g)
    a = {x.graph: x for x in attribute(t, cur).graphs}[graph]
    assert a.verdict == "concentrated"
    assert a.flagged == 3 and a.moved == 3
    assert {(b.stream_baseline, b.position) for b in a.top[:3]} == set(picks)
    assert len(a.top) == 3  # nothing else moved in the direction of the change
    assert all(b.flagged and b.shift_ns == CONC_NS for b in a.top)
    assert a.top_share == pytest.approx(1.0)
    assert a.gap_change_ns == 3 * CONC_NS
    assert a.flagged_streams == sorted(s for s, _ in picks)
    assert all(b.kernel_before and b.kernel_after for b in a.top)
    assert a.matched_by == ("node" if which == "native" else "position")


def test_concentrated_matched_by_position_when_node_ids_differ(native):
    """Node ids are process-local: a second capture has others; position + kernel names match."""
    g = native.graph_names().index("decode_bs1/upload")
    picks, cur = _concentrated(native, g)
    cur = replace(cur, graph_node_id=cur.graph_node_id + 1_000_000)
    a = attribute(native, cur).graphs[g]
    assert a.matched_by == "position" and a.unmatched_baseline == 0
    assert {(b.stream_baseline, b.position) for b in a.top[:3]} == set(picks)
    assert a.verdict == "concentrated"


def test_concentrated_across_graphs_with_other_stream_ids(kineto):
    """Baseline and current captures with different stream ids (matched by rank, as compare does)."""
    up = kineto.graph_names().index("shapeA/upload")
    picks, cur = _concentrated(kineto, up)
    a = attribute(kineto, cur, pairs=[("shapeA/no_upload", "shapeA/upload")]).graphs[0]
    assert a.matched_by == "position"
    assert {(b.stream_current, b.position) for b in a.top[:3]} == set(picks)
    assert a.flagged == 3 and a.verdict == "concentrated"


# ---------------------------------------------------------------------- nulls
@pytest.mark.parametrize("which", ["native", "kineto"])
def test_trace_against_itself_flags_nothing(request, which):
    t = request.getfixturevalue(which)
    attr = attribute(t, t)
    assert attr.graphs and all(a.verdict == "none" and a.flagged == 0 and a.moved == 0 and not a.top
                               and a.gap_change_ns == 0 for a in attr.graphs)


@pytest.mark.parametrize("which", ["native", "kineto"])
def test_two_halves_of_one_capture_flag_nothing(request, which):
    t = request.getfixturevalue(which)
    attr = attribute(half(t, 0), half(t, 1))
    assert all(a.verdict == "none" and a.moved == 0 for a in attr.graphs)


@pytest.mark.parametrize("pair", [("decode_bs2/no_upload", "decode_bs2/upload"), ("decode_bs1/upload", "decode_bs1/no_upload")])
def test_two_captures_of_one_graph_widen_nothing(native, pair):
    """Capture-to-capture differences stay under the widened threshold (bench/analysis/boundary_null.py)."""
    a = attribute(native, native, pairs=[pair], top=1000).graphs[0]
    assert a.flagged == 0 and a.verdict == "none"
    assert max((b.shift_ns for b in a.top if b.moved), default=0) < WIDENED_MIN_SHIFT_NS


# ---------------------------------------------------------------------- outputs
def test_json_and_table(native):
    g = native.graph_names().index("decode_bs2/no_upload")
    picks, cur = _concentrated(native, g)
    attr = attribute(native, cur, top=4)
    doc = json.loads(json.dumps(attr.to_json(), allow_nan=False))  # JSON-ready: no numpy, no NaN
    d = {x["graph"]: x for x in doc}["decode_bs2/no_upload"]
    assert d["verdict"] == "concentrated" and len(d["top"]) == 3 and "all_shifts" not in d
    assert d["top"][0]["shift_ns"] == CONC_NS and d["top"][0]["flagged"] is True
    text = format_attribution(attr)
    assert "decode_bs2/no_upload (device 0): CONCENTRATED; 3/956 boundaries widened" in text
    for s, p in picks:
        assert any(line.split()[:2] == [str(s), str(p)] and "+5000" in line for line in text.splitlines())


def test_live_top_boundaries(native):
    g = native.graph_names().index("decode_bs2/no_upload")
    picks, cur = _concentrated(native, g)
    base_win, cur_win = half(native, 0), half(cur, 1)
    out = live_top_boundaries(base_win, cur_win, k=2)
    json.dumps(out, allow_nan=False)
    d = {x["graph"]: x for x in out}
    assert d["decode_bs2/no_upload"]["verdict"] == "concentrated"
    assert len(d["decode_bs2/no_upload"]["top"]) == 2
    assert {(b["stream_baseline"], b["position"]) for b in d["decode_bs2/no_upload"]["top"]} <= set(picks)
    assert all(x["verdict"] == "none" for n, x in d.items() if n != "decode_bs2/no_upload")
    assert live_top_boundaries(base_win, native.select(native.graph < 0), k=2) == []


def test_widest_lists_the_largest_median_gaps(kineto):
    b = boundary_gaps(kineto)
    med = b.quantile(0.5)
    out = widest(kineto, top=3, b=b)
    assert [x["graph"] for x in out] == kineto.graph_names()
    for x, g in zip(out, range(len(out))):
        want = np.sort(med[b.graph == g])[::-1][:3]
        assert [w["gap_ns"]["p50"] for w in x["widest"]] == want.tolist()
        assert x["gap_median_sum_ns"] == pytest.approx(med[b.graph == g].sum())


def test_short_kernel_folds_templates_and_parameters():
    n = ("void at::native::vectorized_elementwise_kernel<8, at::native::AUnaryFunctor<c10::BFloat16, float>, "
         "std::array<char*, 2ul> >(int, at::native::AUnaryFunctor<c10::BFloat16, float>, std::array<char*, 2ul>)")
    assert short_kernel(n, 200) == "vectorized_elementwise_kernel<8, AUnaryFunctor<…>, std::array<…> >"
    assert short_kernel("nvjet_sm90_tst_64x8", 200) == "nvjet_sm90_tst_64x8"
    assert len(short_kernel(n, 20)) == 20


@pytest.mark.parametrize("kind", ["per_name", "batch", "broken"])
def test_kernel_names_use_the_demangler_when_present(native, monkeypatch, kind):
    import graphmon.formats.chrome as chrome
    from graphmon.analysis.boundaries import display_names

    def per_name(s):
        if not isinstance(s, str):
            raise TypeError("one name")
        return "D:" + s

    fns = {"per_name": per_name, "batch": lambda xs: ["D:" + s for s in xs],
           "broken": lambda xs: (_ for _ in ()).throw(RuntimeError("no c++filt"))}
    monkeypatch.setattr(chrome, "demangle", fns[kind], raising=False)
    shown = display_names(native.names)
    assert shown == (list(native.names) if kind == "broken" else ["D:" + s for s in native.names])
    g = native.graph_names().index("decode_bs2/no_upload")
    a = attribute(native, widen_at(native, g, 154, [10])).graphs[g]
    assert a.top[0].kernel_before == shown[native.name_id[(native.graph == g) & (native.stream == 154)][10]]


def test_small_and_degenerate_traces():
    from helpers import synthetic_trace

    one = synthetic_trace(n_streams=2, replays=6, kernels_per_stream=1)  # no consecutive kernels on a stream
    assert len(boundary_gaps(one)) == 0
    a = attribute(one, one).graphs[0]
    assert a.boundaries == 0 and a.verdict == "none" and a.top == []
    assert widest(one) == [] and live_top_boundaries(one, one) == [{**attribute(one, one).to_json()[0]}]
    t = synthetic_trace(n_streams=2, replays=6, kernels_per_stream=5, gap_ns=400)  # no node ids: by position
    b = boundary_gaps(t)
    assert len(b) == 8 and not b.by_node.any() and np.all(b.counts == 6) and np.all(b.values == 400)
    a = attribute(t, widen_at(t, 0, 1, [2], 1_000)).graphs[0]
    assert a.verdict == "concentrated" and [(x.stream_baseline, x.position, x.shift_ns) for x in a.top] == [(1, 2, 1_000)]
