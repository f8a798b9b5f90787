"""Text tables of ``graphmon analyze`` (from the dicts of report/summary.py)."""

from __future__ import annotations


def _fmt_ns(v: float) -> str:
    if v != v:  # NaN
        return "-"
    a = abs(v)
    if a < 10_000:
        return f"{v:.0f} ns"
    if a < 10_000_000:
        return f"{v / 1e3:.2f} µs"
    return f"{v / 1e6:.3f} ms"


def format_table(doc: dict, by: str = "graph", kernel_width: int | None = 60) -> str:
    """``kernel_width``: kernel names cut to this many characters (--by boundary); None: whole."""
    lines = []
    if doc.get("source"):
        lines.append(f"== {doc['source']}")
    lines.append(
        f"{doc['kernels']} kernels, {doc['replays']} replays, {doc['non_graph_kernels']} outside graphs; "
        f"invalid: {doc['invalid_records'] or 'none'}"
    )
    cut = doc.get("truncated")
    if cut:
        lines.append(f"note: a cut trace: {cut['kernels_kept']} of {cut['kernels']} kernels (whole replays, the "
                     f"earliest); {cut['complete']} holds them all")
    if by == "boundary":
        from graphmon.report.boundary_tables import format_widest

        return "\n".join(lines) + "\n" + format_widest(doc.get("boundaries", []), kernel_width)
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
