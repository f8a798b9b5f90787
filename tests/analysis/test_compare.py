"""graphmon compare: regressions injected into the real H200 traces are flagged; real null pairs are not."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from graphmon.cli import main
from graphmon.analysis.compare import compare
from graphmon.analysis.replays import replay_stream_gaps
from graphmon.analysis.significance import Thresholds
from graphmon.formats.native import write_trace
from graphmon.formats.read import read_trace
from graphmon.model.trace import Trace, TraceError
from helpers import HELD_OUT_GRAPH, KINETO, NATIVE, WIDEN_NS, half, held_out_concentrated, only, synthetic_trace, widen




# ---------------------------------------------------------------------- the widening is flagged
def test_widen_helper_adds_exactly_320ns_to_every_gap(native):
    g = native.graph_names().index("decode_bs1/upload")
    a, b = replay_stream_gaps(native), replay_stream_gaps(widen(native, g))
    m = a.graph == g
    assert np.array_equal(b.gap_sum_ns[m] - a.gap_sum_ns[m], WIDEN_NS * a.gap_count[m])
    assert np.array_equal(b.median_gap_ns[m], a.median_gap_ns[m] + WIDEN_NS)
    assert np.array_equal(b.gap_sum_ns[~m], a.gap_sum_ns[~m])


@pytest.mark.parametrize("graph", ["decode_bs1/upload", "decode_bs2/no_upload", "chain/upload"])
def test_widening_flagged_on_every_stream_of_the_graph_only(native, graph):
    g = native.graph_names().index(graph)
    res = compare(native, widen(native, g))
    flagged = {(s.graph, s.stream_baseline) for s in res.regressions}
    expected = {(graph, int(s)) for s in np.unique(native.stream[native.graph == g])}
    assert flagged == expected
    for s in res.regressions:
        assert s.shift_ns == pytest.approx(WIDEN_NS, abs=1)
        assert s.ci_low_ns > 0 and s.cliffs_delta > 0.95  # one outlier replay can overlap
    others = [s for s in res.streams if s.graph != graph]
    assert others and all(s.verdict == "unchanged" and s.shift_ns == 0 for s in others)


def test_widening_flagged_in_kineto_trace_and_across_graphs_matched_by_rank(kineto):
    up = kineto.graph_names().index("shapeA/upload")
    wide = widen(kineto, up)
    res = compare(kineto, wide, pairs=[("shapeA/no_upload", "shapeA/upload")])
    # Different stream ids on the two sides: all four streams matched by rank, all four flagged.
    assert res.graphs[0].streams_matched_by == "rank"
    assert len(res.regressions) == 4
    assert [s.rank for s in res.regressions] == [0, 1, 2, 3]


def test_improvement_is_reported_but_not_a_regression(native):
    g = native.graph_names().index("chain/upload")
    res = compare(widen(native, g), native)
    assert not res.regressions
    assert [s.verdict for s in res.streams if s.graph == "chain/upload"] == ["improvement"]


# ---------------------------------------------------------------------- real null pairs are not
def test_real_trace_against_itself_not_flagged(native, kineto):
    for t in (native, kineto):
        res = compare(t, t)
        assert not res.regressions
        assert all(s.shift_ns == 0 and s.verdict == "unchanged" for s in res.streams)
        assert all(g.matched_by == "label" for g in res.graphs)


@pytest.mark.parametrize("base,cur", [
    ("decode_bs1/upload", "decode_bs1/no_upload"),
    ("decode_bs1/no_upload", "decode_bs1/upload"),
    ("decode_bs2/upload", "decode_bs2/no_upload"),
    ("decode_bs2/no_upload", "decode_bs2/upload"),
    ("chain/upload", "chain/no_upload"),
])
def test_two_captures_of_one_workload_not_flagged(native, base, cur):
    res = compare(only(native, base), only(native, cur))
    assert res.graphs[0].matched_by == "signature"
    assert len(res.streams) == len(np.unique(native.stream[native.graph == native.graph_names().index(base)]))
    assert not res.regressions, res.format_table()


def test_kineto_upload_vs_not_not_flagged(kineto):
    res = compare(kineto, kineto, pairs=[("shapeA/upload", "shapeA/no_upload")])
    assert len(res.streams) == 4 and not res.regressions


@pytest.mark.parametrize("which", ["native", "kineto"])
def test_first_vs_second_half_not_flagged(native, kineto, which):
    t = native if which == "native" else kineto
    res = compare(half(t, 0), half(t, 1))
    assert len(res.graphs) == len(t.graphs)
    assert not res.regressions, res.format_table()


def test_default_thresholds_are_what_the_null_pairs_need(native):
    """The 2-tick/10% rule of thumb would flag decode_bs2 upload vs not: why the defaults are 128 ns/20%."""
    loose = Thresholds(min_shift_ns=64, min_rel=0.10)
    res = compare(only(native, "decode_bs2/upload"), only(native, "decode_bs2/no_upload"), thresholds=loose)
    assert len(res.regressions) == 1  # one side stream, +80 ns / +11.6%, significant
    s = res.regressions[0]
    assert 64 <= s.shift_ns < 128 and 0.10 <= s.rel_shift < 0.20


def test_replay_stream_gaps_against_a_loop(native):
    t = native.select(native.graph == native.graph_names().index("decode_bs1/upload"))
    r = replay_stream_gaps(t)
    for i in range(0, len(r), 37):
        m = (t.correlation_id == r.correlation_id[i]) & (t.stream == r.stream[i])
        o = np.argsort(t.start_ns[m], kind="stable")
        s, e = t.start_ns[m][o], t.end_ns[m][o]
        gaps = s[1:] - e[:-1]
        assert r.gap_count[i] == len(gaps) and r.gap_sum_ns[i] == gaps.sum()
        assert r.median_gap_ns[i] == np.median(gaps)
        firsts = sorted((t.start_ns[(t.correlation_id == r.correlation_id[i]) & (t.stream == s_)].min(), s_)
                        for s_ in np.unique(t.stream[t.correlation_id == r.correlation_id[i]]))
        assert [s_ for _, s_ in firsts].index(r.stream[i]) == r.rank[i]


def test_insufficient_replays_reported_not_flagged():
    a = synthetic_trace(replays=3, kernels_per_stream=5, gap_ns=400)
    b = synthetic_trace(replays=3, kernels_per_stream=5, gap_ns=2000)
    res = compare(a, b)
    assert [s.verdict for s in res.streams] == ["insufficient"] and not res.regressions
    res = compare(a, b, thresholds=Thresholds(min_replays=2))
    # constant per-replay medians on each side: a shift, and Mann-Whitney sees complete separation
    assert res.streams[0].shift_ns == 1600


def test_unmatched_graphs_are_listed():
    a = synthetic_trace(n_graphs=2, replays=6, kernels_per_stream=5)
    b = synthetic_trace(n_graphs=1, replays=6, kernels_per_stream=5)
    res = compare(a, b)
    assert [g.baseline for g in res.graphs] == ["graph0"] and res.unmatched_baseline == ["graph1"]


def test_no_match_is_an_error():
    a = synthetic_trace(replays=6, kernels_per_stream=5)
    b = synthetic_trace(replays=6, kernels_per_stream=7)
    b = b.with_graphs([replace(b.graphs[0], label="other", key="gx")])
    with pytest.raises(TraceError, match="no graph of the baseline matches"):
        compare(a, b)
    with pytest.raises(TraceError, match="no unmatched graph named"):
        compare(a, b, pairs=[("graph0", "nope")])


# ---------------------------------------------------------------------- CLI
def test_cli_exit_codes_and_json(native, tmp_path, capsys):
    g = native.graph_names().index("decode_bs1/no_upload")
    wide = tmp_path / "wide.graphmon.npz"
    write_trace(widen(native, g), wide)
    assert main(["compare", str(NATIVE), str(NATIVE)]) == 0
    assert "no regression" in capsys.readouterr().out
    assert main(["compare", str(NATIVE), str(wide), "--format", "json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["regression"] is True
    assert {s["stream_baseline"] for s in doc["streams"] if s["verdict"] == "regression"} == {7, 146, 147, 148}
    # a bad file or a bad flag: exit 2 with one line
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert main(["compare", str(bad), str(NATIVE)]) == 2
    assert main(["compare", str(NATIVE), str(NATIVE), "--pair", "nonsense"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 2 and "graphmon: error:" in err


def test_cli_fails_a_concentrated_regression(native, tmp_path, capsys):
    """The held-out case: +5 us on three boundaries (+15 us per replay). compare's stream test flags
    no stream; the old exit code was 0 ("no regression"), which let it through a CI gate."""
    _, cur = held_out_concentrated(native)
    path = tmp_path / "held-out.graphmon.npz"
    write_trace(cur, path)
    assert main(["compare", str(NATIVE), str(path)]) == 1
    out = capsys.readouterr().out
    assert "no regression" in out  # the stream table's own line: no stream moved
    assert f"graph {HELD_OUT_GRAPH} (device 0): REGRESSION (concentrated, boundaries)" in out
    assert "FAIL: 1 graph(s) regressed (concentrated)" in out
    assert main(["compare", str(NATIVE), str(path), "--fail-on", "concentrated"]) == 1
    assert main(["compare", str(NATIVE), str(path), "--fail-on", "uniform"]) == 0
    assert main(["compare", str(NATIVE), str(path), "--min-added-ns", "20000"]) == 0  # above the 15 us it added
    assert main(["compare", str(NATIVE), str(path), "--min-added-rel", "0.1"]) == 0  # 6 % of the idle per replay
    capsys.readouterr()
    assert main(["compare", str(NATIVE), str(path), "--format", "json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["regression"] is False  # compare's stream verdict, as before
    v = {g["graph"]: g for g in doc["verdict"]["graphs"]}[HELD_OUT_GRAPH]
    assert v["regression"] and v["kind"] == "concentrated" and v["gap_added_ns"] == 15_000
    assert main(["compare", str(NATIVE), str(NATIVE)]) == 0
    assert "PASS: no regression" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:  # argparse: usage error
        main(["compare", str(NATIVE), str(path), "--fail-on", "never"])
    assert e.value.code == 2


def test_cli_passes_a_net_improvement_that_widens_three_boundaries(native, tmp_path, capsys):
    """Issue 35's held-out pair: every boundary -321 ns and three +5 us; the replay spans 49 us less.
    The old rule exited 1 ("REGRESSION (concentrated)"); net harm passes it, --fail-on-widening fails it."""
    g = native.graph_names().index(HELD_OUT_GRAPH)
    _, cur = held_out_concentrated(widen(native, g, -321))
    path = tmp_path / "mixed.graphmon.npz"
    write_trace(cur, path)
    assert main(["compare", str(NATIVE), str(path)]) == 0
    out = capsys.readouterr().out
    assert f"graph {HELD_OUT_GRAPH} (device 0): widened (concentrated, boundaries) but not slower (faster)" in out
    assert "PASS: no regression" in out
    assert main(["compare", "--fail-on-widening", str(NATIVE), str(path)]) == 1
    assert "FAIL: 1 graph(s) regressed (concentrated)" in capsys.readouterr().out
    # and the same widening without the improvement is a net regression: exit 1
    _, worse = held_out_concentrated(native)
    write_trace(worse, path)
    assert main(["compare", "--format", "json", str(NATIVE), str(path)]) == 1
    v = {x["graph"]: x for x in json.loads(capsys.readouterr().out)["verdict"]["graphs"]}[HELD_OUT_GRAPH]
    assert v["net"] == "slower" and v["regression"] and v["span"]["ci_low_ns"] > 0


def test_cli_pair_within_one_trace(capsys):
    assert main(["compare", str(KINETO), str(KINETO), "--pair", "shapeA/upload=shapeA/no_upload"]) == 0
    out = capsys.readouterr().out
    assert "shapeA/upload -> shapeA/no_upload" in out and "matched by explicit" in out


def test_compare_works_without_scipy(tmp_path):
    """The base install (no scipy) gates CI: the old CLI exited 2 with "needs scipy"."""
    import subprocess
    import sys

    from helpers import NATIVE as native_path

    t = read_trace(native_path, progress=False)
    wide = tmp_path / "wide.graphmon.npz"
    write_trace(widen(t, t.graph_names().index("decode_bs1/upload")), wide)
    code = ("import sys; sys.modules['scipy'] = None  # any 'import scipy' now raises ImportError\n"
            "from graphmon.cli import main; sys.exit(main(['compare', sys.argv[1], sys.argv[2]]))")
    r = subprocess.run([sys.executable, "-c", code, str(native_path), str(wide)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 1, r.stderr
    assert "REGRESSION on" in r.stdout


def test_cli_asks_the_untraced_replay_times_both_files_carry(native, tmp_path, capsys):
    """Issue 36 through ``compare``: native files with untraced replay durations (made from the real
    replay spans of the first / second half of the recorded replays). A widening whose untraced time
    fell is observer_only (exit 0; 1 with --fail-on-widening); an untraced rise alone fails; a file
    without them (every file before) keeps the traced rule and says so."""
    from helpers import untraced_rows

    _, cur = held_out_concentrated(native)
    base_p, cur_p, same_p = tmp_path / "base.graphmon.npz", tmp_path / "cur.graphmon.npz", tmp_path / "same.graphmon.npz"
    write_trace(native, base_p, untraced=untraced_rows(native, 1.0, which=0))
    write_trace(cur, cur_p, untraced=untraced_rows(native, 0.8, which=1))
    assert main(["compare", str(base_p), str(cur_p)]) == 0
    out = capsys.readouterr().out
    assert f"graph {HELD_OUT_GRAPH} (device 0): widened (concentrated, boundaries) and slower traced" in out
    assert "observer_only, not a regression" in out and "PASS: no regression" in out and "untraced: measured)" in out
    assert main(["compare", "--fail-on-widening", str(base_p), str(cur_p)]) == 1
    capsys.readouterr()
    write_trace(native, same_p, untraced=untraced_rows(native, 1.012, which=1))  # the same build, +1.2% untraced
    assert main(["compare", "--format", "json", str(base_p), str(same_p)]) == 1
    doc = json.loads(capsys.readouterr().out)["verdict"]
    assert doc["untraced"] == "measured" and {g["kind"] for g in doc["graphs"]} == {"untraced"}
    assert all(g["untraced_replay"]["ci_low_ns"] > 0 for g in doc["graphs"])
    # the untraced side missing: the traced rule, and the verdict says absent
    assert main(["compare", "--format", "json", str(NATIVE), str(cur_p)]) == 1
    doc = json.loads(capsys.readouterr().out)["verdict"]
    g = {x["graph"]: x for x in doc["graphs"]}[HELD_OUT_GRAPH]
    assert doc["untraced"] == "absent" and g["untraced"] == "absent" and g["kind"] == "concentrated" and g["regression"]
