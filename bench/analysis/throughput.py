"""Analysis throughput on one core: 10M kernel records built from the real H200 capture.

Tiles the real 467,200-record capture (shifting times and correlation ids per tile) to N records,
then times, side by side in one process and alternating which goes first, the analysis + exact
quantiles with the fast path (graphmon.analysis.replays.analyze) and with today's reference
implementation (graphmon.analysis.reference.analyze_reference), after checking that both give
bit-identical results on the tiled trace; and, the same way, the exact gap quantiles by counting
(bincount + cumsum, the default for small-range integer groups) against the np.partition fallback
(``quantiles_counting_vs_partition``). The machine may be shared and noisy: each figure is the
median of --runs runs with min and max, and a plain column copy is timed alongside as a gauge of
the memory bandwidth the process got. Pinned to CPU 0 (like ``taskset -c 0``) where the OS allows.
Runs twice, in fresh processes: with ``graphmon analyze``'s heap setting (analysis/heap.py: freed
temporaries reused; the headline figures) and with glibc's default (``allocator_default``).
Writes bench/results/analysis-throughput.json.

    python bench/analysis/throughput.py [--records 10000000] [--runs 5]
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

if not __package__:  # run as a file: import bench.* and graphmon from this checkout (bench/README.md)
    sys.path[0] = str(Path(__file__).resolve().parents[2])

from bench.common import cli  # noqa: E402
from bench.common.paths import NATIVE, RESULTS  # noqa: E402
from graphmon.analysis import grouped, replays  # noqa: E402
from graphmon.analysis.grouped import grouped_quantiles  # noqa: E402
from graphmon.analysis.reference import analyze_reference  # noqa: E402
from graphmon.export.aggregator import Aggregator  # noqa: E402
from graphmon.formats.read import read_trace  # noqa: E402
from graphmon.model.trace import Trace  # noqa: E402
from graphmon.model.window import Window  # noqa: E402
from graphmon.report.summary import graphs_summary  # noqa: E402


def tiled(base: Trace, n: int) -> Trace:
    reps = -(-n // len(base))
    span = int(base.end_ns.max() - base.start_ns.min()) + 1_000_000
    corr = int(base.correlation_id.max()) + 1
    k = np.arange(reps, dtype=np.int64)

    def tile(col, step):
        return (col[None, :] + (k[:, None] * step)).reshape(-1)[:n]

    return Trace.build(
        start_ns=tile(base.start_ns, span), end_ns=tile(base.end_ns, span),
        stream=np.tile(base.stream, reps)[:n], correlation_id=tile(base.correlation_id, corr),
        graph_id=np.tile(base.graph_id, reps)[:n], device=np.tile(base.device, reps)[:n],
        name_id=np.tile(base.name_id, reps)[:n], names=base.names, graphs=base.graphs,
    )


def identical(a, b) -> bool:
    for part in ("replays", "gaps"):
        x, y = getattr(a, part), getattr(b, part)
        for f in dataclasses.fields(x):
            u, v = getattr(x, f.name), getattr(y, f.name)
            if u.dtype != v.dtype or not np.array_equal(u, v):
                return False
    return True


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def stats(seconds: list[float], n: int) -> dict:
    rates = [n / s for s in seconds]
    return {"seconds": [round(s, 4) for s in seconds], "median_seconds": round(statistics.median(seconds), 4),
            "records_per_second_median": round(statistics.median(rates)),
            "records_per_second_min": round(min(rates)), "records_per_second_max": round(max(rates))}


def both(args) -> None:
    """One fresh process per allocator setting (a process's heap setting cannot be undone), the
    batch one first in the JSON: it is what ``graphmon analyze`` runs with."""
    import subprocess
    import tempfile

    out: dict = {}
    for alloc in ("batch", "default"):
        with tempfile.TemporaryDirectory() as d:
            f = Path(d) / "r.json"
            subprocess.run([sys.executable, __file__, "--records", str(args.records), "--runs", str(args.runs),
                            "--allocator", alloc, "--out", str(f)], check=True, stdout=subprocess.DEVNULL)
            out[alloc] = json.loads(f.read_text())
    res = dict(out["batch"])
    res["allocator_default"] = {k: out["default"][k] for k in ("analysis_with_quantiles", "parts_of_fast",
                                                               "quantiles_counting_vs_partition", "memory_gauge")}
    res["allocator_default"]["what"] = ("the same run in a process with glibc's default mmap threshold (every large "
                                        "temporary a fresh mmap: first-touch page faults); measured right after")
    res["command"] = f"python bench/analysis/throughput.py --records {args.records} --runs {args.runs}"
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps(res, indent=2))


def partition_quantiles(values, offsets):
    """grouped_quantiles with the counting path off: the np.partition fallback alone."""
    saved = grouped.COUNT_MIN_VALUES
    grouped.COUNT_MIN_VALUES = 1 << 62
    try:
        return grouped_quantiles(values, offsets)
    finally:
        grouped.COUNT_MIN_VALUES = saved


def main(argv=None) -> None:
    ap = cli.parser(__doc__)
    ap.add_argument("--records", type=int, default=10_000_000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--out", help="default: bench/results/analysis-throughput.json")
    ap.add_argument("--allocator", choices=("both", "batch", "default"), default="both",
                    help="batch: graphmon analyze's heap setting (graphmon/analysis/heap.py); default: glibc's")
    args = ap.parse_args(argv)
    if args.smoke:  # 200k records, one run, this process only
        args.records, args.runs, args.allocator = 200_000, 1, "batch"
    args.out = str(cli.out_path(args.out, RESULTS / "analysis-throughput.json", args.smoke))
    if args.allocator == "both":
        return both(args)
    if args.allocator == "batch":
        from graphmon.analysis.heap import reuse_heap_for_batch

        if not reuse_heap_for_batch():
            raise SystemExit("the batch heap setting is not available here (glibc only)")
    pinned = None
    if hasattr(os, "sched_setaffinity"):
        try:
            os.sched_setaffinity(0, {0})
            pinned = sorted(os.sched_getaffinity(0))
        except OSError:
            pass
    base = read_trace(NATIVE)
    t_build, trace = timed(lambda: tiled(base, args.records))
    n = len(trace)

    def fast():
        a = replays.analyze(trace)
        return a, grouped_quantiles(a.gaps.values, a.gaps.offsets)

    def reference():
        a = analyze_reference(trace)
        return a, grouped_quantiles(a.gaps.values, a.gaps.offsets)

    replays.PATHS.clear()
    a_fast, q_fast = fast()
    a_ref, q_ref = reference()
    same = identical(a_fast, a_ref) and np.array_equal(q_fast, q_ref, equal_nan=True)
    del a_ref, q_ref
    col = trace.start_ns
    same_q = (grouped_quantiles(a_fast.gaps.values, a_fast.gaps.offsets).tobytes()
              == partition_quantiles(a_fast.gaps.values, a_fast.gaps.offsets).tobytes())
    t_fast, t_ref, t_copy, t_an, t_q, t_qp = [], [], [], [], [], []
    for run in range(args.runs):
        order = (("fast", fast), ("reference", reference)) if run % 2 == 0 else (("reference", reference), ("fast", fast))
        for name, fn in order:
            s, _ = timed(fn)
            (t_fast if name == "fast" else t_ref).append(s)
        t_copy.append(timed(col.copy)[0])
        s, a = timed(lambda: replays.analyze(trace))
        t_an.append(s)
        qs = ((t_q, grouped_quantiles), (t_qp, partition_quantiles))
        for out, fn in (qs if run % 2 == 0 else qs[::-1]):
            out.append(timed(lambda: fn(a.gaps.values, a.gaps.offsets))[0])
    paths = dict(replays.PATHS)
    t_sum, _ = timed(lambda: graphs_summary(a_fast))
    t_agg, _ = timed(lambda: Aggregator().ingest(Window(trace, 0.0, 1.0)))
    speedups = [r / f for r, f in zip(t_ref, t_fast)]
    res = {
        "records": n,
        "replays": int(len(a_fast.replays)),
        "gap_groups": int(len(a_fast.gaps)),
        "bit_identical_fast_vs_reference": bool(same),
        "paths_taken": paths,
        "target_records_per_second": 20_000_000,
        "analysis_with_quantiles": {
            "fast": stats(t_fast, n),
            "reference (today's implementation)": stats(t_ref, n),
            "speedup_per_run": [round(x, 2) for x in speedups],
            "speedup_median": round(statistics.median(speedups), 2),
        },
        "parts_of_fast": {"analyze": stats(t_an, n), "exact quantiles (p10/p50/p90/p99, all groups)": stats(t_q, n)},
        "quantiles_counting_vs_partition": {
            "bit_identical": bool(same_q), "gap_values": int(len(a_fast.gaps.values)),
            "counting (bincount + cumsum, the default)": stats(t_q, n),
            "np.partition (the fallback)": stats(t_qp, n),
            "speedup_per_run": [round(p / c, 2) for p, c in zip(t_qp, t_q)],
            "speedup_median": round(statistics.median([p / c for p, c in zip(t_qp, t_q)]), 2)},
        "memory_gauge": {"copy of one int64 column (80 MB at 10M), seconds": [round(s, 4) for s in t_copy],
                         "GB_per_second_median": round(n * 8 / statistics.median(t_copy) / 1e9, 2)},
        "once": {"report summary, seconds": round(t_sum, 4),
                 "full window ingest (analyze + histograms + snapshot), seconds": round(t_agg, 4),
                 "Trace.build validation of the tiled trace (incl. tiling), seconds": round(t_build, 4)},
        "machine": {"cpu": platform.processor() or platform.machine(), "cpu_count": os.cpu_count(),
                    "pinned_to_cpus": pinned, "load_average_at_end": list(os.getloadavg()),
                    "python": platform.python_version(), "numpy": np.__version__},
        "allocator": args.allocator,
        "command": f"python bench/analysis/throughput.py --records {args.records} --runs {args.runs}",
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
