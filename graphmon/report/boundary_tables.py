"""Text tables of per-boundary results: ``compare`` attribution and ``analyze --by boundary``."""

from __future__ import annotations

import math

from graphmon.analysis.boundaries import Attribution
from graphmon.report.names import KERNEL_WIDTH, display_kernel

def short_kernel(name: str, width: int | None = KERNEL_WIDTH) -> str:
    """A kernel name that fits a table column (graphmon.report.names: demangled, folded, cut in the
    middle of its template arguments; None: the whole demangled name)."""
    return display_kernel(name, width)


def _f(v: float, spec: str = ".0f") -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


def format_attribution(attr: Attribution, width: int | None = KERNEL_WIDTH) -> str:
    lines = ["", f"boundaries (two consecutive kernels of a replay on one stream): moved = median +{attr.min_shift_ns:g} ns "
                 f"and +{attr.min_rel:.0%} and current p25 > baseline p75; widened = moved by >= {attr.widened_min_shift_ns:g} ns"]
    for g in attr.graphs:
        if g.verdict == "none":
            lines.append(f"graph {g.graph} (device {g.device}): no widened boundary ({g.boundaries} matched)")
            continue
        lines.append(
            f"graph {g.graph} (device {g.device}): {g.verdict.upper()}; {g.flagged}/{g.boundaries} boundaries "
            f"widened ({g.moved} moved) on {len(g.flagged_streams)}/{g.streams} streams; median boundary shift "
            f"{g.median_shift_ns:+.0f} ns; summed median gap change "
            f"{g.gap_change_ns / 1e3:+.2f} us/replay (idle median {_f(g.idle_median_baseline_ns / 1e3, '.2f')} -> "
            f"{_f(g.idle_median_current_ns / 1e3, '.2f')} us); top {len(g.top)} explain {_f(g.top_share * 100, '.1f')}%"
            + (f"; unmatched {g.unmatched_baseline}/{g.unmatched_current}" if g.unmatched_baseline or g.unmatched_current else "")
        )
        if not g.top:
            continue
        lines.append(f"  {'stream':>10} {'pos':>4} {'at us':>8} {'base ns':>9} {'cur ns':>9} {'shift':>9}  flag   kernels")
        for b in g.top:
            st = str(b.stream_baseline) if b.stream_baseline == b.stream_current else f"{b.stream_baseline}->{b.stream_current}"
            lines.append(
                f"  {st:>10} {b.position:>4} {b.at_us:8.1f} {b.median_baseline_ns:9.0f} {b.median_current_ns:9.0f} "
                f"{b.shift_ns:+9.0f}  {'WIDE ' if b.flagged else 'moved' if b.moved else '     '}  {short_kernel(b.kernel_before, width)} -> "
                f"{short_kernel(b.kernel_after, width)}"
            )
    return "\n".join(lines)


def format_widest(graphs: list[dict], width: int | None = KERNEL_WIDTH) -> str:
    lines = []
    for g in graphs:
        lines.append("")
        lines.append(f"graph {g['graph']} (device {g['device']}): {g['boundaries']} boundaries, summed median gap "
                     f"{g['gap_median_sum_ns'] / 1e3:.2f} us/replay; widest:")
        lines.append(f"  {'stream':>8} {'pos':>4} {'at us':>8} {'p50 ns':>9} {'p90 ns':>9} {'share':>6}  kernels")
        for b in g["widest"]:
            share = b["share_of_gap_sum"]
            lines.append(
                f"  {b['stream']:>8} {b['position']:>4} {b['at_us']:8.1f} {b['gap_ns']['p50']:9.0f} "
                f"{b['gap_ns']['p90']:9.0f} {_f(share * 100 if share is not None else None, '5.1f')}%  "
                f"{short_kernel(b['kernel_before'], width)} -> {short_kernel(b['kernel_after'], width)}"
            )
    return "\n".join(lines)
