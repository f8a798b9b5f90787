"""Cross-check graphmon's per-stream idle time against HolisticTraceAnalysis (HTA) on the real Kineto trace.

Writes docs/ab/hta-crosscheck.json (cited by docs/hta-crosscheck.md).
Run: .venv/bin/python bench/analysis/hta_crosscheck.py [--trace T] [--out F]
Definitions (see docs/hta-crosscheck.md): HTA's idle interval on a stream = next.ts - (prev.ts + prev.dur) over
*all* consecutive kernels of the stream; graphmon's gaps are the same intervals restricted to one replay. So
HTA total = graphmon within-replay gap sum + the intervals that cross a replay boundary on that stream.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np

if not __package__:  # run as a file: import bench.* and graphmon from this checkout (bench/README.md)
    sys.path[0] = str(Path(__file__).resolve().parents[2])

from bench.common import cli  # noqa: E402
from bench.common.paths import KINETO, ROOT  # noqa: E402
from graphmon.analysis.replays import analyze, grouped_sums  # noqa: E402
from graphmon.formats.read import read_trace  # noqa: E402


def graphmon_per_stream(trace):
    """Per stream: within-replay gap count/sum (graphmon analyze) and replay-boundary intervals."""
    a = analyze(trace)
    g = a.gaps
    sums = grouped_sums(g.values, g.offsets)
    out = {}
    for i in range(len(g)):
        s = int(g.stream[i])
        d = out.setdefault(s, {"gaps": 0, "gap_sum_ns": 0})
        d["gaps"] += int(g.offsets[i + 1] - g.offsets[i])
        d["gap_sum_ns"] += int(sums[i])
    for s in out:
        m = trace.stream == s
        o = np.argsort(trace.start_ns[m], kind="stable")
        st, en, corr = trace.start_ns[m][o], trace.end_ns[m][o], trace.correlation_id[m][o]
        cross = corr[1:] != corr[:-1]
        iv = (st[1:] - en[:-1])[cross]
        out[s]["boundary_intervals"] = int(cross.sum())
        out[s]["boundary_sum_ns"] = int(iv.sum())
        out[s]["total_idle_ns"] = out[s]["gap_sum_ns"] + out[s]["boundary_sum_ns"]
        out[s]["intervals"] = out[s]["gaps"] + out[s]["boundary_intervals"]
        out[s]["replays"] = int(len(np.unique(corr)))
    return out


def hta_per_stream(path, ns_rounding=True):
    """HTA's idle time breakdown per stream (its public API), in HTA's units (µs).

    ns_rounding=False sets HTA_DISABLE_NS_ROUNDING=1: HTA then keeps Kineto's fractional µs instead of
    rounding each kernel's start up and end down to whole µs.
    """
    from hta.trace_analysis import TraceAnalysis

    old = os.environ.get("HTA_DISABLE_NS_ROUNDING")
    os.environ["HTA_DISABLE_NS_ROUNDING"] = "0" if ns_rounding else "1"

    # HTA logs each step at WARNING: quiet while it runs, and only then (logging.disable is process-
    # wide: left on, it silenced every later WARNING in the process, graphmon's in the tests too)
    before = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        with tempfile.TemporaryDirectory() as td, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            shutil.copy(path, os.path.join(td, os.path.basename(path)))
            ta = TraceAnalysis(trace_dir=td)
            idle, stats = ta.get_idle_time_breakdown(ranks=[0], visualize=False, show_idle_interval_stats=True)
    finally:
        logging.disable(before)
    if old is None:
        del os.environ["HTA_DISABLE_NS_ROUNDING"]
    else:
        os.environ["HTA_DISABLE_NS_ROUNDING"] = old
    out = {}
    for _, r in idle.iterrows():
        d = out.setdefault(int(r["stream"]), {"idle_us": 0.0, "by_category_us": {}, "count_by_category": {}})
        d["idle_us"] += float(r["idle_time"])
        d["by_category_us"][r["idle_category"]] = float(r["idle_time"])
    for cat, r in stats.iterrows():
        out[int(r["stream"])]["count_by_category"][cat] = int(r["count"])
    for d in out.values():
        d["intervals"] = sum(d["count_by_category"].values())
    return out


def crosscheck(path=KINETO):
    trace = read_trace(path, progress=False)
    gm = graphmon_per_stream(trace)
    modes = {"exact": hta_per_stream(path, ns_rounding=False), "rounded": hta_per_stream(path, ns_rounding=True)}
    rows = []
    for s in sorted(gm):
        g = gm[s]
        row = {
            "stream": s,
            "graphmon_within_replay_gaps": g["gaps"],
            "graphmon_within_replay_gap_sum_us": g["gap_sum_ns"] / 1e3,
            "graphmon_boundary_intervals": g["boundary_intervals"],
            "graphmon_boundary_sum_us": g["boundary_sum_ns"] / 1e3,
            "graphmon_total_idle_us": g["total_idle_ns"] / 1e3,
            "graphmon_intervals": g["intervals"],
            "replays_on_stream": g["replays"],
        }
        for mode, ht in modes.items():
            h = ht.get(s)
            row[f"hta_{mode}"] = None if h is None else {
                "total_idle_us": h["idle_us"], "intervals": h["intervals"],
                "diff_us": h["idle_us"] - g["total_idle_ns"] / 1e3,
                "by_category_us": h["by_category_us"], "count_by_category": h["count_by_category"]}
        rows.append(row)
    import hta

    try:
        from importlib.metadata import version

        hta_version = version("HolisticTraceAnalysis")
    except Exception:  # pragma: no cover - metadata missing
        hta_version = getattr(hta, "__version__", "?")
    return {"trace": str(Path(path).relative_to(ROOT)) if Path(path).is_relative_to(ROOT) else str(path),
            "hta_version": hta_version, "streams": rows}


def main(argv=None) -> int:
    ap = cli.parser(__doc__)
    ap.add_argument("--trace", default=str(KINETO))
    ap.add_argument("--out", help="default: docs/ab/hta-crosscheck.json")
    a = ap.parse_args(argv)
    if a.smoke:  # a tenth of the trace
        a.trace = str(cli.kineto_subset(KINETO))
    dst = cli.out_path(a.out, ROOT / "docs" / "ab" / "hta-crosscheck.json", a.smoke)
    doc = crosscheck(a.trace)
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_text(json.dumps(doc, indent=2) + "\n")
    for r in doc["streams"]:
        e, rd = r["hta_exact"], r["hta_rounded"]
        print(f"stream {r['stream']:>4}: graphmon {r['graphmon_total_idle_us']:.3f} us "
              f"({r['graphmon_within_replay_gap_sum_us']:.3f} in replays + {r['graphmon_boundary_sum_us']:.3f} across); "
              f"HTA exact {e['total_idle_us']:.3f} ({e['diff_us']:+.4f}), rounded {rd['total_idle_us']:.3f} "
              f"({rd['diff_us']:+.1f}); intervals {r['graphmon_intervals']} vs {e['intervals']}")
    print(f"wrote {dst}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
