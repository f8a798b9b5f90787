"""compare --plot / analyze --plot: files are written and carry the expected series (checked in the payload)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from graphmon.analysis.boundaries import attribute
from graphmon.cli import main
from graphmon.formats.native import write_trace
from graphmon.formats.read import read_trace
from graphmon.report.plots_compare import FLOOR_NS, TICK_NS, compare_panels, ecdf
from helpers import KINETO, NATIVE, WIDEN_NS, widen, widen_at

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
GRAPH = "decode_bs1/upload"


@pytest.fixture(scope="module")
def native():
    return read_trace(NATIVE, progress=False)


@pytest.fixture(scope="module")
def uniform_file(native, tmp_path_factory):
    p = tmp_path_factory.mktemp("plots") / "uniform.graphmon.npz"
    write_trace(widen(native, native.graph_names().index(GRAPH)), p)
    return p


def plotly_payload(html: str) -> tuple[list, dict]:
    """The traces and layout passed to Plotly.newPlot in a file written by plotly's write_html."""
    i = html.index("Plotly.newPlot(")
    dec = json.JSONDecoder()
    data, end = dec.raw_decode(html, html.index("[", i))
    layout, _ = dec.raw_decode(html, html.index("{", end))
    return data, layout


def _median_from_ecdf(x, y) -> float:
    return x[int(np.searchsorted(y, 0.5))]


def test_ecdf_steps_and_floor():
    x, y = ecdf(np.array([-64, 0, 192, 192, 512, 512, 512, 1024]))
    assert x == [FLOOR_NS, 192.0, 512.0, 1024.0]  # overlaps and zero gaps drawn at the floor
    assert y == [0.25, 0.5, 0.875, 1.0]


def test_compare_plot_html_carries_before_after_per_stream_and_shifts(native, uniform_file, tmp_path, capsys):
    out = tmp_path / "cmp.html"
    rc = main(["compare", str(NATIVE), str(uniform_file), "--plot", str(out), "--format", "json"])
    assert rc == 1
    doc = json.loads(capsys.readouterr().out)
    assert {b["graph"]: b["verdict"] for b in doc["boundaries"]}[GRAPH] == "uniform"
    html = out.read_text()
    # plotly.js inline, nothing loaded from elsewhere: the file works air-gapped
    assert "plotly.js v" in html and len(html) > 1_000_000 and not re.search(r"<script[^>]*\bsrc=", html)
    data, layout = plotly_payload(html)
    g = native.graph_names().index(GRAPH)
    streams = np.unique(native.stream[native.graph == g]).tolist()
    for s in streams:
        before = next(t for t in data if t["name"].startswith(f"{GRAPH} stream {s}: before"))
        after = next(t for t in data if t["name"].startswith(f"{GRAPH} stream {s}: after"))
        assert before["y"][-1] == after["y"][-1] == 1.0
        shift = _median_from_ecdf(after["x"], after["y"]) - _median_from_ecdf(before["x"], before["y"])
        assert shift == WIDEN_NS
    shifts = [t for t in data if t.get("mode") == "markers"]
    assert sorted(t["name"] for t in shifts) == sorted(f"stream {s}" for s in streams)
    assert sum(len(t["y"]) for t in shifts) == 956 and all(v == WIDEN_NS for t in shifts for v in t["y"])
    # only the changed graph is drawn
    assert not any("no_upload" in t["name"] for t in data)
    logs = [v for k, v in layout.items() if k.startswith("xaxis") and v.get("type") == "log"]
    assert len(logs) == len(streams) and all(TICK_NS in ax["tickvals"] and ax["range"][0] < np.log10(TICK_NS)
                                             for ax in logs)
    assert any(sh.get("x0") == TICK_NS for sh in layout["shapes"])  # the 32 ns tick line


def test_compare_plot_png(native, tmp_path, capsys):
    g = native.graph_names().index("decode_bs2/no_upload")
    cur = widen_at(native, g, 154, [10, 40, 100])
    attr = attribute(native, cur)
    rows = compare_panels(attr)
    assert len(rows) == 2 and len(rows[0]) == 4 and rows[1][0].wide  # 4 stream ECDFs + the shift panel
    big = [(x, y) for s in rows[1][0].series for x, y in zip(s.x, s.y) if y > 0]
    assert len(big) == 3 and all(y == 5_000 for _, y in big)
    path = tmp_path / "c.graphmon.npz"
    write_trace(cur, path)
    out = tmp_path / "cmp.png"
    # no stream-level regression, but the boundaries name it (and fail the default --fail-on any)
    assert main(["compare", str(NATIVE), str(path), "--plot", str(out), "--fail-on", "uniform"]) == 0
    text = capsys.readouterr().out
    assert "no regression" in text and "CONCENTRATED; 3/956 boundaries widened" in text
    data = out.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 30_000


def test_analyze_plot_html_has_gap_ecdfs_and_a_replay_timeline(tmp_path, capsys):
    out = tmp_path / "an.html"
    assert main(["analyze", str(KINETO), "--plot", str(out), "--no-progress"]) == 0
    data, _ = plotly_payload(out.read_text())
    trace = read_trace(KINETO, progress=False)
    for g in trace.graph_names():
        steps = [t for t in data if t.get("mode") == "lines" and t["name"].startswith(f"{g}: stream")]
        bars = [t for t in data if t["type"] == "bar" and t["name"].startswith(f"{g}: stream")]
        assert len(steps) == len(bars) == 4
        assert sum(len(t["x"]) for t in bars) == 960  # every kernel of one replay
        assert all(min(t["base"]) >= 0 and min(t["x"]) > 0 for t in bars)


def test_analyze_plot_png_and_by_boundary(tmp_path, capsys):
    out = tmp_path / "an.png"
    assert main(["analyze", str(KINETO), "--plot", str(out), "--by", "boundary", "--top", "2", "--format", "json",
                 "--no-progress"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [len(b["widest"]) for b in doc["boundaries"]] == [2, 2]
    assert out.read_bytes()[:8] == PNG_MAGIC


@pytest.mark.parametrize("argv,msg", [
    (["compare", str(NATIVE), str(NATIVE), "--plot", "x.svg"], "--plot writes .png or .html"),
    (["analyze", str(KINETO), str(NATIVE), "--plot", "x.png"], "--plot draws one trace"),
    (["analyze", str(KINETO), "--by", "boundary", "--top", "0"], "--top must be >= 1"),
])
def test_bad_plot_arguments_one_line_exit_2(argv, msg, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("graphmon: error: ") and msg in err[0]


# ---------------------------------------------------------------- issue 28 item 8
def _titles(html: str) -> tuple[str, list[str]]:
    _, layout = plotly_payload(html)
    return layout["title"]["text"], [a["text"] for a in layout.get("annotations", ())]


def test_compare_plot_titles_follow_the_text_verdict(native, uniform_file, tmp_path, capsys):
    """Three boundaries +5 us: the boundaries say CONCENTRATED, the stream verdict says no
    regression, compare's verdict fails the graph by its boundaries (+15 us per replay): the title
    says so, and no stream panel may say REGRESSION or WIDENED (it said WIDENED before). The three
    lie on a side stream off the critical path (the replay spans 0.55 us more: not slower as a
    whole), so --fail-on-widening makes the boundary verdict the graph's."""
    g = native.graph_names().index("decode_bs2/no_upload")
    path = tmp_path / "c.graphmon.npz"
    write_trace(widen_at(native, g, 154, [10, 40, 100]), path)
    out = tmp_path / "conc.html"
    assert main(["compare", "--fail-on-widening", str(NATIVE), str(path), "--plot", str(out)]) == 1
    text = capsys.readouterr().out
    assert "no regression" in text and "FAIL: 1 graph(s) regressed (concentrated)" in text
    title, panels = _titles(out.read_text())
    assert title.replace("<br>", " ").endswith(": REGRESSION (concentrated boundaries) in decode_bs2/no_upload")
    assert not any("REGRESSION" in t or "WIDENED" in t for t in panels), panels
    # the uniform +320 ns: every stream of the graph is a regression in the text and in the panels
    out = tmp_path / "uni.html"
    assert main(["compare", str(NATIVE), str(uniform_file), "--plot", str(out), "--format", "json"]) == 1
    regressed = {(s["graph"], s["stream_baseline"]) for s in json.loads(capsys.readouterr().out)["streams"]
                 if s["verdict"] == "regression"}
    title, panels = _titles(out.read_text())
    assert title.replace("<br>", " ").endswith(f": REGRESSION on {len(regressed)} streams")
    flagged = {t for t in panels if t.endswith(" REGRESSION")}
    assert flagged == {f"{gr} stream {s} REGRESSION" for gr, s in regressed} and len(flagged) == 4


def test_analyze_plot_draws_every_graph_or_the_chosen_ones_and_names_the_rest(tmp_path, capsys):
    trace = read_trace(NATIVE, progress=False)
    names = trace.graph_names()
    assert len(names) == 6  # more than the 4 drawn before
    out = tmp_path / "all.html"
    assert main(["analyze", str(NATIVE), "--plot", str(out), "--no-progress"]) == 0
    assert "left out" not in capsys.readouterr().err
    data, _ = plotly_payload(out.read_text())
    drawn = {t["name"].split(": stream")[0] for t in data if t.get("mode") == "lines"}
    assert drawn == set(names)
    out = tmp_path / "two.html"
    assert main(["analyze", str(NATIVE), "--plot", str(out), "--graphs", "chain/upload,decode_bs2/upload",
                 "--no-progress"]) == 0
    data, _ = plotly_payload(out.read_text())
    assert {t["name"].split(": stream")[0] for t in data if t.get("mode") == "lines"} == {"chain/upload",
                                                                                         "decode_bs2/upload"}
    out = tmp_path / "cap.png"
    assert main(["analyze", str(NATIVE), "--plot", str(out), "--max-graphs", "2", "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert "--plot left out 4 graphs" in err and "--graphs NAME" in err
    assert sum(n in err for n in names) == 4, err
    assert main(["analyze", str(NATIVE), "--plot", str(out), "--graphs", "nope", "--no-progress"]) == 2
    assert "--graphs: no graph 'nope'" in capsys.readouterr().err
    assert main(["analyze", str(NATIVE), "--graphs", "chain/upload", "--no-progress"]) == 2  # without --plot


def test_plot_titles_are_wrapped_inside_the_figure(tmp_path):
    """A long trace path in the title: the PNG's title lies inside the figure, the HTML's title is
    wrapped to the figure's width (both were clipped)."""
    from graphmon.analysis.boundaries import boundary_gaps
    from graphmon.analysis.replays import analyze
    from graphmon.report.plots_compare import analyze_panels, html_figure, png_figure

    trace = read_trace(KINETO, progress=False)
    rows = analyze_panels(trace, boundary_gaps(trace), analyze(trace).replays)
    title = "graphmon analyze " + "/very/long/folder/name" * 12 + "/h200-kineto-decode-shapeA.json.gz"
    fig = png_figure(rows, title)
    try:
        fig.canvas.draw()
        box, whole = fig._suptitle.get_window_extent(), fig.bbox
        assert whole.x0 <= box.x0 and box.x1 <= whole.x1 and box.y1 <= whole.y1
        assert fig._suptitle.get_text().split() != title.split() and "".join(fig._suptitle.get_text().split()) == "".join(
            title.split())  # wrapped, nothing lost
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)
    layout = html_figure(rows, title).layout
    lines = layout.title.text.split("<br>")
    assert "".join("".join(lines).split()) == "".join(title.split())
    assert len(lines) > 1 and max(map(len, lines)) <= layout.width // 10
