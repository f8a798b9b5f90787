"""Pictures of gap distributions and boundaries (issue 15, item 3): PNG (matplotlib) or HTML (plotly).

``compare --plot``: per graph, one panel per stream with the gap ECDF before and after (log x axis
down to the 32 ns timestamp tick), and one panel with every boundary's median shift along the graph
(x = when the boundary happens in the replay). ``analyze --plot``: per graph, the gap ECDF per
stream and the timeline of the replay with the median span.

The figure is first described as plain panels and series (:class:`Panel`, :class:`Series`) and then
drawn by either backend, so both files show the same data and tests can check the series. The
HTML embeds plotly.js (works air-gapped) and the series as plain JSON lists.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from graphmon.analysis.boundaries import Attribution, Boundaries
from graphmon.model.trace import Trace, TraceError

TICK_NS = 32  # CUPTI kernel timestamps on H100/H200 advance in 32 ns steps
FLOOR_NS = 16  # gaps <= this (zero and overlaps) are drawn here: a log axis has no 0
LOG_TICKS_NS = (32, 100, 320, 1_000, 3_200, 10_000, 32_000, 100_000, 320_000, 1_000_000)
MAX_GRAPHS = 4  # compare --plot: the graphs that changed most
BEFORE, AFTER = "#1f77b4", "#d62728"
STREAM_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22")


@dataclass
class Series:
    name: str
    x: list
    y: list
    color: str
    kind: str = "step"  # step | markers | bars (x = start, width = duration, y = row label)
    width: list = field(default_factory=list)
    size: list = field(default_factory=list)


@dataclass
class Panel:
    title: str
    xlabel: str
    ylabel: str
    series: list[Series]
    xlog: bool = False
    wide: bool = False  # spans the whole row
    ref_x: float | None = None  # a dotted vertical reference line (the 32 ns tick)
    tag: str = ""  # prefixes the series names in the HTML's one shared legend
    zero: bool = False  # y axis includes 0 (a shift is read against no shift)
    notes: list = field(default_factory=list)  # (x, y, text) labels on points


def _tick_label(ns: float) -> str:
    if ns < 1_000:
        return f"{ns:g} ns"
    if ns < 1_000_000:
        return f"{ns / 1e3:g} µs"
    return f"{ns / 1e6:g} ms"


def ecdf(values: np.ndarray) -> tuple[list, list]:
    """Steps of the empirical CDF on the log axis: one point per distinct (32 ns quantised) value."""
    v = np.maximum(np.sort(np.asarray(values, np.int64)), FLOOR_NS)
    if len(v) == 0:
        return [], []
    x, idx = np.unique(v, return_index=True)
    last = np.r_[idx[1:], len(v)]  # fraction of values <= x
    if len(x) > 2000:  # keep the file small: 2000 evenly spaced steps are indistinguishable
        keep = np.unique(np.linspace(0, len(x) - 1, 2000).astype(np.int64))
        x, last = x[keep], last[keep]
    return x.astype(float).tolist(), (last / len(v)).tolist()


def _gap_panel(title: str, pairs: list[tuple[str, np.ndarray, str]], tag: str = "") -> Panel:
    series = []
    for name, vals, color in pairs:
        x, y = ecdf(vals)
        series.append(Series(f"{name} (n={len(vals)}, median {np.median(vals) if len(vals) else float('nan'):.0f} ns)",
                             x, y, color))
    return Panel(title, f"gap (log; ≤{FLOOR_NS} ns incl. overlaps at {FLOOR_NS})", "fraction of gaps ≤ x", series,
                 xlog=True, ref_x=TICK_NS, tag=tag)


# ---------------------------------------------------------------------- figure descriptions
def compare_panels(attr: Attribution, regressions=()) -> list[list[Panel]]:
    """Rows of panels for ``compare --plot``: the graphs that changed first (at most MAX_GRAPHS).

    ``regressions``: the StreamShift rows ``compare`` flagged (``Comparison.regressions``): a stream
    panel says REGRESSION exactly when the text verdict does (one verdict for text and plot)."""
    flagged = {(r.graph, r.device, r.stream_baseline, r.stream_current) for r in regressions}
    changed = [g for g in attr.graphs if g.verdict != "none"]
    # Only the graphs with widened boundaries (the largest change first); with none, the first graph.
    graphs = sorted(changed, key=lambda g: -abs(g.gap_change_ns))[:MAX_GRAPHS] or attr.graphs[:1]
    rows: list[list[Panel]] = []
    for g in graphs:
        gaps = g.all_shifts.get("gaps", {})
        row = []
        for rank, (s_b, s_c, vb, vc) in sorted(gaps.items()):
            st = f"{s_b}" if s_b == s_c else f"{s_b}->{s_c}"
            flag = " REGRESSION" if (g.graph, g.device, s_b, s_c) in flagged else ""
            row.append(_gap_panel(f"{g.graph} stream {st}{flag}",
                                  [("before", vb, BEFORE), ("after", vc, AFTER)], tag=f"{g.graph} stream {st}"))
        rows.append(row)
        sh = g.all_shifts
        series = []
        for rank in np.unique(sh["stream_rank"]).tolist():
            m = sh["stream_rank"] == rank
            s_id = int(sh["stream"][m][0])
            fl = sh["flagged"][m]
            series.append(Series(f"stream {s_id}", sh["at_us"][m].tolist(), sh["shift_ns"][m].tolist(),
                                 STREAM_COLORS[rank % len(STREAM_COLORS)], "markers",
                                 size=np.where(fl, 9, 4).tolist()))
        # Name the widened boundaries when they are few (a uniform shift needs no labels).
        notes = [] if g.verdict == "uniform" else [
            (b.at_us, b.shift_ns, f"stream {b.stream_baseline} #{b.position}") for b in g.top if b.flagged]
        rows.append([Panel(f"{g.graph}: median gap shift per boundary ({g.verdict}; {g.flagged}/{g.boundaries} "
                           f"widened; large markers = widened)", "boundary time in the replay (µs)",
                           "median shift (ns)", series, wide=True, zero=True, notes=notes)])
    return rows


def analyze_panels(trace: Trace, b: Boundaries, replays, pairs: list | None = None) -> list[list[Panel]]:
    """Rows of panels for ``analyze --plot``: gap ECDF per stream and one replay's timeline per graph
    (``pairs``: the (device, graph) to draw; default: every graph with gaps)."""
    names = trace.graph_names()
    rows: list[list[Panel]] = []
    if pairs is None:
        pairs = np.unique(np.stack([b.device, b.graph], axis=1), axis=0).tolist()
    group = np.repeat(np.arange(len(b)), b.counts)
    for dev, g in pairs:
        sel = (b.device == dev) & (b.graph == g)
        streams = np.unique(b.stream[sel]).tolist()
        cur = [(f"stream {s}", b.values[(sel & (b.stream == s))[group]], STREAM_COLORS[i % len(STREAM_COLORS)])
               for i, s in enumerate(streams)]
        panel = _gap_panel(f"{names[g]} (device {dev}): gaps", cur, tag=names[g])
        rows.append([panel, _timeline_panel(trace, replays, dev, g, streams, names[g])])
    return rows


def _timeline_panel(trace: Trace, replays, dev: int, g: int, streams: list, gname: str) -> Panel:
    rsel = np.flatnonzero((replays.device == dev) & (replays.graph == g))
    pick = rsel[np.argsort(replays.span_ns[rsel], kind="stable")[len(rsel) // 2]]
    corr = replays.correlation_id[pick]
    k = np.flatnonzero((trace.device == dev) & (trace.correlation_id == corr) & (trace.graph == g))
    t0 = trace.start_ns[k].min()
    series = []
    for i, s in enumerate(streams):
        m = k[trace.stream[k] == s]
        series.append(Series(f"stream {s}", ((trace.start_ns[m] - t0) / 1e3).tolist(), [f"stream {s}"] * len(m),
                             STREAM_COLORS[i % len(STREAM_COLORS)], "bars",
                             width=((trace.end_ns[m] - trace.start_ns[m]) / 1e3).tolist()))
    return Panel(f"{gname}: median-span replay ({replays.span_ns[pick] / 1e3:.1f} µs)",
                 "time since the replay's first kernel (µs)", "", series, tag=gname)


# ---------------------------------------------------------------------- rendering
def write_figure(rows: list[list[Panel]], path: str, title: str) -> None:
    """Draw ``rows`` to ``path``: .png with matplotlib, .html with plotly (JS inline)."""
    ext = os.path.splitext(path)[1].lower()
    if not rows or not any(rows):
        raise TraceError("nothing to plot (no graph kernels)")
    if ext == ".png":
        _write_png(rows, path, title)
    elif ext in (".html", ".htm"):
        _write_html(rows, path, title)
    else:
        raise TraceError(f"--plot writes .png or .html, got {path!r}")


def _log_range(p: Panel) -> tuple[float, float]:
    """x range of a log panel: from just below the floor (so the 32 ns tick shows) to past the largest gap."""
    xmax = max((max(s.x) for s in p.series if s.x), default=TICK_NS * 10)
    return FLOOR_NS * 0.9, max(xmax * 1.3, TICK_NS * 4)


def _zero_range(p: Panel) -> tuple[float, float]:
    """y range holding 0 and every point, padded so points on the edge stay visible."""
    ys = [y for s in p.series for y in s.y]
    lo, hi = min(ys + [0.0]), max(ys + [0.0])
    pad = 0.08 * max(hi - lo, 1.0)
    return lo - pad, hi + pad


def wrap_title(title: str, chars: int) -> list[str]:
    """A long title (a long trace path) in lines of at most ``chars`` characters, cut at spaces or
    path separators: a figure clips a title wider than itself."""
    import textwrap

    parts = textwrap.wrap(title, chars, break_long_words=False, break_on_hyphens=False)
    out = []
    for p in parts:  # a word longer than the line (a path): cut after a separator
        while len(p) > chars:
            cut = max(p.rfind("/", 0, chars), p.rfind("\\", 0, chars))
            cut = cut + 1 if cut > 0 else chars
            out.append(p[:cut])
            p = p[cut:]
        out.append(p)
    return out


def png_figure(rows, title):
    """The matplotlib figure of ``rows`` (closed by the caller)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    ncols = max(len(r) for r in rows if not r[0].wide) if any(not r[0].wide for r in rows) else 1
    width_in = 4.6 * max(ncols, 2)
    fig = plt.figure(figsize=(width_in, 3.4 * len(rows) + 0.3), constrained_layout=True)
    grid = fig.add_gridspec(len(rows), ncols)
    for i, row in enumerate(rows):
        for j, p in enumerate(row):
            ax = fig.add_subplot(grid[i, :] if p.wide else grid[i, j])
            _draw_mpl(ax, p)
    fig.suptitle("\n".join(wrap_title(title, int(width_in * 72 / (12 * 0.62)))), fontsize=12)  # ~0.62 em a char
    return fig


def _write_png(rows, path, title) -> None:
    import matplotlib.pyplot as plt

    fig = png_figure(rows, title)
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _draw_mpl(ax, p: Panel) -> None:
    for s in p.series:
        if s.kind == "step":
            ax.step(s.x, s.y, where="post", color=s.color, label=s.name, lw=1.4)
        elif s.kind == "markers":
            ax.scatter(s.x, s.y, s=[z * z / 2 for z in s.size] or 8, color=s.color, label=s.name, alpha=0.7, lw=0)
        else:
            ax.barh(s.y, s.width, left=s.x, color=s.color, height=0.6, label=s.name)
    if p.xlog:
        ax.set_xscale("log")
        lo, hi = _log_range(p)
        ticks = [t for t in LOG_TICKS_NS if t <= hi]
        ax.set_xticks(ticks, [_tick_label(t) for t in ticks], rotation=30, fontsize=7)
        ax.minorticks_off()
        ax.set_xlim(lo, hi)
    if p.ref_x is not None:
        ax.axvline(p.ref_x, color="grey", ls=":", lw=1)
    if p.zero:
        ax.set_ylim(*_zero_range(p))
        ax.axhline(0, color="grey", lw=0.8)
    for k, (x, y, text) in enumerate(p.notes):  # staggered so neighbours do not overprint
        ax.annotate(text, (x, y), textcoords="offset points", xytext=(4, -10 - 10 * (k % 3)), fontsize=7)
    ax.set_title(p.title, fontsize=8)
    ax.set_xlabel(p.xlabel, fontsize=7)
    ax.set_ylabel(p.ylabel, fontsize=7)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)
    if any(s.kind != "bars" for s in p.series):
        ax.legend(fontsize=6, loc="best")


def _write_html(rows, path, title) -> None:
    html_figure(rows, title).write_html(path, include_plotlyjs=True, full_html=True)


def html_figure(rows: list[list[Panel]], title: str):
    """The plotly figure of ``rows`` (a ``plotly.graph_objects.Figure``)."""
    try:
        from plotly.subplots import make_subplots
    except ImportError:
        from graphmon.buildinfo import install_hint

        raise TraceError(f"--plot .html needs plotly: {install_hint('ab')} (or write a .png)") from None
    import plotly.graph_objects as go

    ncols = max(len(r) for r in rows)
    specs = [[({"colspan": ncols} if p.wide else {}) if j < len(r) else None for j, p in
              enumerate(r + [None] * (ncols - len(r)))] for r in rows]
    titles = [p.title for r in rows for p in r]
    fig = make_subplots(rows=len(rows), cols=ncols, specs=specs, subplot_titles=titles,
                        vertical_spacing=min(0.15, 0.5 / len(rows)), horizontal_spacing=0.08)
    for i, row in enumerate(rows, start=1):
        for j, p in enumerate(row, start=1):
            for s in p.series:
                name = f"{p.tag}: {s.name}" if p.tag else s.name
                common = {"name": name, "legendgroup": f"{i}-{j}", "marker": {"color": s.color}}
                if s.kind == "step":
                    tr = go.Scatter(x=s.x, y=s.y, mode="lines", line={"shape": "hv", "color": s.color}, **common)
                elif s.kind == "markers":
                    tr = go.Scatter(x=s.x, y=s.y, mode="markers", **{**common, "marker": {"color": s.color, "size": s.size}})
                else:
                    tr = go.Bar(x=s.width, y=s.y, base=s.x, orientation="h", name=name, legendgroup=f"{i}-{j}",
                                marker={"color": s.color, "line": {"width": 0}})  # no outline: bars are thin
                fig.add_trace(tr, row=i, col=j)
            fig.update_xaxes(title_text=p.xlabel, row=i, col=j)
            fig.update_yaxes(title_text=p.ylabel, row=i, col=j)
            if p.xlog:
                lo, hi = _log_range(p)
                fig.update_xaxes(type="log", tickvals=list(LOG_TICKS_NS), ticktext=[_tick_label(t) for t in LOG_TICKS_NS],
                                 range=[np.log10(lo), np.log10(hi)], row=i, col=j)
            if p.ref_x is not None:
                fig.add_vline(x=p.ref_x, line_dash="dot", line_color="grey", row=i, col=j)
            if p.zero:
                fig.update_yaxes(range=list(_zero_range(p)), row=i, col=j)
            for k, (x, y, text) in enumerate(p.notes):
                fig.add_annotation(x=x, y=y, text=text, showarrow=False, yshift=-12 - 12 * (k % 3), xshift=40,
                                   font={"size": 10}, row=i, col=j)
    # Room on the right for the legend (series names carry their panel); the title wrapped to the
    # figure's width (~8 px a character at plotly's 17 px title font).
    width = 560 * max(ncols, 2) + 450
    lines = wrap_title(title, width // 10)
    fig.update_layout(title={"text": "<br>".join(lines)}, height=440 * len(rows) + 24 * len(lines), width=width,
                      barmode="overlay", showlegend=True, margin={"t": 60 + 24 * len(lines)})
    return fig


def plot_compare(attr: Attribution, path: str, title: str = "graphmon compare: kernel gaps before / after",
                 regressions=(), boundary_regressions=()) -> None:
    """``regressions``: ``Comparison.regressions`` of the same comparison (titles follow its verdict);
    ``boundary_regressions``: (graph, kind) of graphs that regressed by their boundaries alone
    (graphmon.analysis.deploy, no stream flagged): the title names them, as compare's verdict does."""
    n = len(regressions)
    parts = [f"REGRESSION on {n} stream{'s' if n != 1 else ''}"] if n else []
    parts += [f"REGRESSION ({kind} boundaries) in {graph}" for graph, kind in boundary_regressions]
    verdict = "; ".join(parts) or "no regression"
    write_figure(compare_panels(attr, regressions), path, f"{title}: {verdict}")


def plot_analysis(trace: Trace, path: str, title: str = "graphmon analyze: kernel gaps", graphs=None,
                  max_graphs: int = 12) -> list[str]:
    """Draw the graphs named in ``graphs`` (display name, label or key; default: every graph, the
    most replayed first, at most ``max_graphs``). Returns the names of graphs the cap left out."""
    from graphmon.analysis.boundaries import boundary_gaps
    from graphmon.analysis.replays import analyze

    b = boundary_gaps(trace)
    replays = analyze(trace).replays
    names = trace.graph_names()
    have = [tuple(p) for p in np.unique(np.stack([b.device, b.graph], axis=1), axis=0).tolist()] if len(b) else []
    if graphs:
        want = list(dict.fromkeys(graphs))
        unknown = [w for w in want if not any(w in (names[g], trace.graphs[g].label, trace.graphs[g].key)
                                              for _, g in have)]
        if unknown:
            raise TraceError(f"--graphs: no graph {', '.join(map(repr, unknown))} with gaps in this trace "
                             f"(graphs: {', '.join(names[g] for _, g in have)})")
        chosen = [(d, g) for d, g in have if {names[g], trace.graphs[g].label, trace.graphs[g].key} & set(want)]
    else:
        count = dict.fromkeys(have, 0)
        for dg in zip(replays.device.tolist(), replays.graph.tolist()):
            if dg in count:
                count[dg] += 1
        chosen = sorted(have, key=lambda dg: -count[dg])[: max(1, max_graphs)]
    chosen = sorted(chosen)
    several = len({d for d, _ in have}) > 1
    left = [] if graphs else [names[g] + (f" (device {d})" if several else "") for d, g in have if (d, g) not in chosen]
    if len(chosen) < len(have):
        title += f" ({len(chosen)} of {len(have)} graphs)"
    write_figure(analyze_panels(trace, b, replays, [list(p) for p in chosen]), path, title)
    return left
