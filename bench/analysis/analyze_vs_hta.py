"""`graphmon analyze` against HolisticTraceAnalysis (HTA) on the shared Kineto trace, side by side.

Both do the same job on the same file: load a Kineto (torch.profiler) trace and report idle time
between kernels per stream. graphmon: ``read_trace`` + ``analyze`` + the ``--format json``
document (what ``graphmon analyze --format json FILE`` does). HTA: ``TraceAnalysis(trace_dir)``
(its loader and parser) + ``get_idle_time_breakdown``. Timed in this process, alternating which
goes first, median of --runs with min and max; and once more end to end as two fresh processes
(interpreter start and imports included). graphmon's time is split into parsing (the formats
layer) and analysis. Writes bench/results/analyze-vs-hta.json.

    python bench/analysis/analyze_vs_hta.py [--runs 5] [--trace tests/data/h200-kineto-decode-shapeA.json.gz]
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

if not __package__:  # run as a file: import bench.* and graphmon from this checkout (bench/README.md)
    sys.path[0] = str(Path(__file__).resolve().parents[2])

from bench.common import cli  # noqa: E402
from bench.common.paths import KINETO, RESULTS, ROOT  # noqa: E402

HTA_SNIPPET = """
import logging, sys, warnings
logging.disable(logging.WARNING); warnings.simplefilter("ignore")
from hta.trace_analysis import TraceAnalysis
TraceAnalysis(trace_dir=sys.argv[1]).get_idle_time_breakdown(ranks=[0], visualize=False)
"""


def graphmon_once(path: Path) -> tuple[float, float, float]:
    """(parse seconds, analysis + JSON seconds, total)."""
    from graphmon.analysis.replays import analyze
    from graphmon.formats.read import read_trace
    from graphmon.report.summary import analysis_json

    t0 = time.perf_counter()
    trace = read_trace(path, progress=False)
    t1 = time.perf_counter()
    json.dumps(analysis_json(analyze(trace)))
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1, t2 - t0


def hta_once(trace_dir: str) -> float:
    from hta.trace_analysis import TraceAnalysis

    t0 = time.perf_counter()
    TraceAnalysis(trace_dir=trace_dir).get_idle_time_breakdown(ranks=[0], visualize=False)
    return time.perf_counter() - t0


def spread(xs: list[float]) -> dict:
    return {"median": round(statistics.median(xs), 4), "min": round(min(xs), 4), "max": round(max(xs), 4),
            "runs": [round(x, 4) for x in xs]}


def main(argv=None) -> None:
    ap = cli.parser(__doc__)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--trace", default=str(KINETO))
    ap.add_argument("--out", help="default: bench/results/analyze-vs-hta.json")
    args = ap.parse_args(argv)
    if args.smoke:  # one run each on a tenth of the trace
        args.runs, args.trace = 1, str(cli.kineto_subset(KINETO))
    args.out = str(cli.out_path(args.out, RESULTS / "analyze-vs-hta.json", args.smoke))
    path = Path(args.trace)
    logging.disable(logging.WARNING)
    warnings.simplefilter("ignore")
    with tempfile.TemporaryDirectory() as td:
        shutil.copy(path, os.path.join(td, path.name))  # HTA reads every trace file of a folder
        hta_once(td)  # warm imports and caches on both sides
        graphmon_once(path)
        parse, ana, gm, hta = [], [], [], []
        for run in range(args.runs):
            for side in (("g", "h") if run % 2 == 0 else ("h", "g")):
                if side == "g":
                    p, a, t = graphmon_once(path)
                    parse.append(p)
                    ana.append(a)
                    gm.append(t)
                else:
                    hta.append(hta_once(td))
        env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        cold_g, cold_h = [], []
        for _ in range(max(1, args.runs // 2)):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "graphmon.cli", "analyze", "--format", "json", str(path)],
                           check=True, capture_output=True, env=env)
            cold_g.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-c", HTA_SNIPPET, td], check=True, capture_output=True, env=env)
            cold_h.append(time.perf_counter() - t0)
    ratios = [h / g for g, h in zip(gm, hta)]
    from importlib.metadata import version

    res = {
        "trace": str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path),
        "target": "graphmon analyze >= 3x faster than HTA load + idle-time breakdown",
        "in_process_seconds": {
            "graphmon (read_trace + analyze + JSON)": spread(gm),
            "  of which parsing (formats layer)": spread(parse),
            "  of which analysis + JSON": spread(ana),
            "HTA (TraceAnalysis load + get_idle_time_breakdown)": spread(hta),
        },
        "hta_over_graphmon_per_run": [round(r, 2) for r in ratios],
        "hta_over_graphmon_median": round(statistics.median(ratios), 2),
        "fresh_process_seconds (interpreter + imports included)": {
            "graphmon analyze --format json": spread(cold_g), "HTA script": spread(cold_h),
            "hta_over_graphmon_median": round(statistics.median(cold_h) / statistics.median(cold_g), 2)},
        "versions": {"HolisticTraceAnalysis": version("HolisticTraceAnalysis"), "pandas": version("pandas"),
                     "numpy": version("numpy"), "python": sys.version.split()[0]},
        "machine": {"cpu_count": os.cpu_count(), "load_average_at_end": list(os.getloadavg())},
        "command": f"python bench/analysis/analyze_vs_hta.py --runs {args.runs}",
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
