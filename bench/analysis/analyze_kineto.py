"""`graphmon analyze` of the shared 50 MB Kineto trace: this tree against an earlier commit, side by side.

Each run is a fresh process (imports count, as they do for a user), alternating which tree goes
first, and reports its phases: imports + parser (what `graphmon analyze` loads before reading),
reading the trace, the analysis + summary, and the process's whole wall time. The earlier tree is
exported with `git archive` into a temporary folder and run from there (pure Python: reading and
analysing a Kineto trace needs no built extension).

    python bench/analysis/analyze_kineto.py [--against REV] [--runs 5] [--out bench/results/analyze-kineto.json]
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path

if not __package__:  # run as a file: import bench.* and graphmon from this checkout (bench/README.md)
    sys.path[0] = str(Path(__file__).resolve().parents[2])

from bench.common import cli  # noqa: E402
from bench.common.paths import KINETO as TRACE, RESULTS, ROOT  # noqa: E402

# Runs in the measured process: the phases of `graphmon analyze --format json TRACE`, in the order
# main() runs them (the parser is built the way each tree's main() builds it).
PHASES = r"""
import inspect, json, sys, time
t0 = time.perf_counter()
import graphmon.cli as cli
from graphmon.analysis.heap import reuse_heap_for_batch
from graphmon.analysis.replays import analyze
from graphmon.formats.read import read_trace
from graphmon.report.summary import analysis_json
from graphmon.report.tables import format_table
takes_command = bool(inspect.signature(cli.build_parser).parameters)
parser = cli.build_parser("analyze") if takes_command else cli.build_parser()
parser.parse_args(["analyze", sys.argv[1]])
t1 = time.perf_counter()
reuse_heap_for_batch()
trace = read_trace(sys.argv[1], progress=False)
t2 = time.perf_counter()
doc = analysis_json(analyze(trace))
t3 = time.perf_counter()
print(json.dumps({"imports_and_parser_s": t1 - t0, "read_s": t2 - t1, "analysis_s": t3 - t2,
                  "kernels": len(trace), "pydantic_imported": "pydantic" in sys.modules,
                  "tqdm_imported": "tqdm" in sys.modules, "graphs": len(doc["graphs"]), "graphmon_from": cli.__file__}))
"""


def export(rev: str, into: Path) -> None:
    data = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", rev, "graphmon"], check=True,
                          capture_output=True).stdout
    with tarfile.open(fileobj=BytesIO(data)) as tf:
        tf.extractall(into, filter="data")


def one_run(tree: Path, trace: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree), PYTHONDONTWRITEBYTECODE="1")
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", PHASES, str(trace)], capture_output=True, text=True, env=env,
                       cwd=str(tree), check=True)
    wall = time.perf_counter() - t0
    got = json.loads(r.stdout.strip().splitlines()[-1])
    if not got.pop("graphmon_from").startswith(str(tree)):
        raise SystemExit(f"graphmon was not imported from {tree}")
    return {**got, "process_wall_s": wall}


def summary(runs: list[dict]) -> dict:
    out = {}
    for k in ("process_wall_s", "imports_and_parser_s", "read_s", "analysis_s"):
        v = [r[k] for r in runs]
        out[k] = {"median": round(statistics.median(v), 4), "min": round(min(v), 4), "max": round(max(v), 4),
                  "runs": [round(x, 4) for x in v]}
    out["pydantic_imported"] = runs[0]["pydantic_imported"]
    out["tqdm_imported"] = runs[0]["tqdm_imported"]
    return out


def main(argv=None) -> int:
    ap = cli.parser(__doc__)
    ap.add_argument("--against", default="3b5b9e2", help="the earlier commit (default: the issue's landed main)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--trace", default=str(TRACE))
    ap.add_argument("--out", help="default: bench/results/analyze-kineto.json")
    args = ap.parse_args(argv)
    if args.smoke:  # HEAD against this tree, one run each, on a tenth of the trace
        args.against, args.runs, args.trace = "HEAD", 1, str(cli.kineto_subset(TRACE))
    args.out = str(cli.out_path(args.out, RESULTS / "analyze-kineto.json", args.smoke))
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no", "graphmon"],
                                capture_output=True, text=True).stdout.strip())
    trace = Path(args.trace)
    with tempfile.TemporaryDirectory() as d:
        old_tree = Path(d)
        export(args.against, old_tree)
        trees = {"before": old_tree, "after": ROOT}
        one_run(ROOT, trace), one_run(old_tree, trace)  # warm the page cache for both
        runs: dict[str, list] = {"before": [], "after": []}
        for i in range(args.runs):
            for name in (("before", "after") if i % 2 == 0 else ("after", "before")):
                runs[name].append(one_run(trees[name], trace))
                print(name, json.dumps(runs[name][-1]), flush=True)
    res = {name: summary(r) for name, r in runs.items()}
    assert runs["before"][0]["kernels"] == runs["after"][0]["kernels"]
    ratio = {k: round(res["before"][k]["median"] / res["after"][k]["median"], 2)
             for k in ("process_wall_s", "imports_and_parser_s", "read_s")}
    out = {
        "what": "graphmon analyze of the shared Kineto trace in fresh processes, before and after, alternating",
        "trace": trace.name, "trace_bytes_gz": trace.stat().st_size,
        "trace_bytes_json": len(__import__("gzip").decompress(trace.read_bytes())),
        "kernels": runs["after"][0]["kernels"],
        "before": {"rev": args.against, **res["before"]},
        "after": {"rev": head + ("-dirty" if dirty else ""), **res["after"]},
        "speedup_median_before_over_after": ratio,
        "machine": {"python": platform.python_version(), "cpu_count": os.cpu_count(),
                    "load_average_at_end": list(os.getloadavg()), "shared": "2-core machine shared with other work"},
        "command": f"python bench/analysis/analyze_kineto.py --against {args.against} --runs {args.runs}",
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
