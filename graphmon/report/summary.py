"""Analysis -> plain dicts (the JSON of ``graphmon analyze`` and ``/status``) and text tables."""

from __future__ import annotations

import numpy as np

from graphmon.analysis.replays import QUANTILES, Analysis, grouped_minmax, grouped_quantiles, grouped_sums, replay_groups, summarize

SUMMARY_QS = QUANTILES  # p10, p50, p90, p99


def _dist(values: np.ndarray) -> dict:
    s = summarize(values, SUMMARY_QS)
    return s


def graphs_summary(a: Analysis, gap_quantiles: np.ndarray | None = None) -> list[dict]:
    """Per (device, graph): replays, kernels per replay, span/busy/idle, and per-stream gaps."""
    t = a.trace
    names = t.graph_names()
    r = a.replays
    order, offsets, heads = replay_groups(r)
    # gap_quantiles: the SUMMARY_QS quantiles per gap group, when the caller already has them.
    gq = grouped_quantiles(a.gaps.values, a.gaps.offsets, SUMMARY_QS) if gap_quantiles is None else gap_quantiles
    gsum = grouped_sums(a.gaps.values, a.gaps.offsets)
    neg = grouped_sums((a.gaps.values < 0).astype(np.int64), a.gaps.offsets)
    gmin, gmax = grouped_minmax(a.gaps.values, a.gaps.offsets) if len(a.gaps) else ([], [])
    out = []
    for k, h in enumerate(heads.tolist()):
        rows = order[offsets[k] : offsets[k + 1]]
        dev, gi = int(r.device[h]), int(r.graph[h])
        info = t.graphs[gi]
        kp = r.kernels[rows]
        entry = {
            "graph": names[gi],
            "graph_key": info.key,
            "label": info.label,
            "device": str(dev),
            "upload_mode": info.upload_mode,
            "replays": int(len(rows)),
            "kernels_per_replay": float(np.median(kp)),
            "kernels_per_replay_min": int(kp.min()),
            "kernels_per_replay_max": int(kp.max()),
            "span_ns": _dist(r.span_ns[rows]),
            "busy_ns": _dist(r.busy_ns[rows]),
            "idle_ns": _dist(r.idle_ns[rows]),
        }
        lat = r.launch_latency_ns[rows]
        if (lat >= 0).any():
            entry["launch_latency_ns"] = _dist(lat[lat >= 0])
        inter = r.inter_replay_gap_ns[rows]
        inter = inter[inter != np.iinfo(np.int64).min]
        if len(inter):
            entry["inter_replay_gap_ns"] = _dist(inter)
        streams = []
        sel = np.flatnonzero((a.gaps.device == dev) & (a.gaps.graph == gi))
        for j in sel.tolist():
            cnt = int(a.gaps.offsets[j + 1] - a.gaps.offsets[j])
            q = gq[j]
            streams.append(
                {
                    "stream": str(int(a.gaps.stream[j])),
                    "gaps": cnt,
                    "gap_ns": {
                        "p10": float(q[0]),
                        "p50": float(q[1]),
                        "p90": float(q[2]),
                        "p99": float(q[3]),
                        "mean": float(gsum[j] / cnt),
                        "sum": int(gsum[j]),
                        "min": int(gmin[j]),
                        "max": int(gmax[j]),
                    },
                    "negative_gaps": int(neg[j]),
                }
            )
        entry["streams"] = streams
        out.append(entry)
    return out


def streams_summary(a: Analysis) -> list[dict]:
    """Per (device, stream) across graphs: gap counts and quantiles (``--by stream``)."""
    g = a.gaps
    if len(g) == 0:
        return []
    key = (g.device.astype(np.int64), g.stream)
    grp = g.group_of_values()
    o = np.lexsort((g.values, key[1][grp], key[0][grp]))
    vals = g.values[o]
    d, s = key[0][grp][o], key[1][grp][o]
    new = np.r_[True, (d[1:] != d[:-1]) | (s[1:] != s[:-1])]
    heads = np.flatnonzero(new)
    offs = np.r_[heads, len(vals)]
    q = grouped_quantiles(vals, offs, SUMMARY_QS)
    sums = grouped_sums(vals, offs)
    neg = grouped_sums((vals < 0).astype(np.int64), offs)
    names = a.trace.graph_names()
    out = []
    for j, h in enumerate(heads.tolist()):
        cnt = int(offs[j + 1] - offs[j])
        gsel = (g.device == d[h]) & (g.stream == s[h])
        out.append(
            {
                "device": str(int(d[h])),
                "stream": str(int(s[h])),
                "graphs": sorted({names[i] for i in g.graph[gsel].tolist()}),
                "gaps": cnt,
                "gap_ns": {"p10": float(q[j, 0]), "p50": float(q[j, 1]), "p90": float(q[j, 2]),
                           "p99": float(q[j, 3]), "mean": float(sums[j] / cnt)},
                "negative_gaps": int(neg[j]),
            }
        )
    return out


def analysis_json(a: Analysis, by: str = "graph", source: str | None = None, top: int = 10) -> dict:
    t = a.trace
    non_graph = int((t.graph < 0).sum())
    doc: dict = {
        "graphs": graphs_summary(a),
        "invalid_records": dict(sorted(t.invalid.items())),
        "kernels": int(len(t)),
        "non_graph_kernels": non_graph,
        "replays": int(len(a.replays)),
    }
    if by == "stream":
        doc["streams"] = streams_summary(a)
    if by == "boundary":
        from graphmon.analysis.boundaries import widest

        doc["boundaries"] = widest(t, top)
    if source is not None:
        doc["source"] = source
    return doc


# ---------------------------------------------------------------------- text
def _fmt_ns(v: float) -> str:
    if v != v:  # NaN
        return "-"
    a = abs(v)
    if a < 10_000:
        return f"{v:.0f} ns"
    if a < 10_000_000:
        return f"{v / 1e3:.2f} µs"
    return f"{v / 1e6:.3f} ms"


def format_table(doc: dict, by: str = "graph") -> str:
    lines = []
    if doc.get("source"):
        lines.append(f"== {doc['source']}")
    lines.append(
        f"{doc['kernels']} kernels, {doc['replays']} replays, {doc['non_graph_kernels']} outside graphs; "
        f"invalid: {doc['invalid_records'] or 'none'}"
    )
    if by == "boundary":
        from graphmon.report.boundary_tables import format_widest

        return "\n".join(lines) + "\n" + format_widest(doc.get("boundaries", []))
    if by == "stream":
        hdr = f"{'dev':>3} {'stream':>8} {'gaps':>9} {'p10':>10} {'p50':>10} {'p90':>10} {'p99':>10} {'mean':>10} {'neg':>5}  graphs"
        lines.append(hdr)
        for s in doc.get("streams", []):
            g = s["gap_ns"]
            lines.append(
                f"{s['device']:>3} {s['stream']:>8} {s['gaps']:>9} {_fmt_ns(g['p10']):>10} {_fmt_ns(g['p50']):>10} "
                f"{_fmt_ns(g['p90']):>10} {_fmt_ns(g['p99']):>10} {_fmt_ns(g['mean']):>10} {s['negative_gaps']:>5}  "
                + ",".join(s["graphs"])
            )
        return "\n".join(lines)
    for g in doc["graphs"]:
        lines.append("")
        lines.append(
            f"graph {g['graph']} (device {g['device']}, {g['upload_mode']}): {g['replays']} replays, "
            f"{g['kernels_per_replay']:g} kernels/replay"
        )
        for k in ("span_ns", "busy_ns", "idle_ns", "launch_latency_ns", "inter_replay_gap_ns"):
            if k in g and g[k].get("count"):
                d = g[k]
                lines.append(
                    f"  {k[:-3]:<18} p50 {_fmt_ns(d['p50']):>10}  p90 {_fmt_ns(d['p90']):>10}  "
                    f"p99 {_fmt_ns(d['p99']):>10}  mean {_fmt_ns(d['mean']):>10}"
                )
        lines.append(f"  {'stream':>8} {'gaps':>9} {'p10':>10} {'p50':>10} {'p90':>10} {'p99':>10} {'mean':>10} {'neg':>5}")
        for s in g["streams"]:
            q = s["gap_ns"]
            lines.append(
                f"  {s['stream']:>8} {s['gaps']:>9} {_fmt_ns(q['p10']):>10} {_fmt_ns(q['p50']):>10} "
                f"{_fmt_ns(q['p90']):>10} {_fmt_ns(q['p99']):>10} {_fmt_ns(q['mean']):>10} {s['negative_gaps']:>5}"
            )
    return "\n".join(lines)
