"""Where ``graphmon analyze --format json`` spends its time on a trace with many graphs.

Builds a synthetic native trace of N graphs (3 replays each, 2 streams, 4 kernels per stream),
then times each stage in one process: read, analyze, the summary dicts, and the JSON text indented
(indent=2, the old output; json.dump to a stream, as the old CLI did, and
json.dumps to one string) and compact (separators without spaces, what a pipe now gets). Also
times the whole CLI as a subprocess writing to a pipe. Writes bench/results/analyze-json.json.

    python bench/analysis/analyze_json.py [--graphs 100000]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

if not __package__:  # run as a file: import bench.* and graphmon from this checkout (bench/README.md)
    sys.path[0] = str(Path(__file__).resolve().parents[2])

from bench.common import cli  # noqa: E402
from bench.common.paths import RESULTS, ROOT  # noqa: E402
from graphmon.analysis.replays import analyze  # noqa: E402
from graphmon.formats.native import write_trace  # noqa: E402
from graphmon.formats.read import read_trace  # noqa: E402
from graphmon.model.trace import GraphInfo, Trace  # noqa: E402
from graphmon.report.summary import analysis_json  # noqa: E402


def many_graphs(n_graphs: int, replays: int = 3, streams: int = 2, kernels: int = 4) -> Trace:
    per_replay = streams * kernels
    n = n_graphs * replays * per_replay
    i = np.arange(n, dtype=np.int64)
    replay = i // per_replay  # global replay index
    k = i % kernels
    start = 10**9 + replay * 10_000 + k * 1_000 + (i // kernels % streams) * 50
    return Trace.build(start_ns=start, end_ns=start + 700, stream=(i // kernels) % streams + 7,
                       correlation_id=replay + 1, graph_id=replay // replays + 1,
                       graphs=[GraphInfo(key=f"g{g + 1}", graph_id=g + 1) for g in range(n_graphs)])


def timed(f):
    t0 = time.perf_counter()
    out = f()
    return out, time.perf_counter() - t0


def main(argv=None) -> None:
    ap = cli.parser(__doc__)
    ap.add_argument("--graphs", type=int, default=100_000)
    ap.add_argument("--out", help="default: bench/results/analyze-json.json")
    args = ap.parse_args(argv)
    if args.smoke:
        args.graphs = 200
    res: dict = {"graphs": args.graphs}
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "many.graphmon.npz")
        write_trace(many_graphs(args.graphs), path)
        trace, res["read_s"] = timed(lambda: read_trace(path, progress=False))
        res["kernels"] = len(trace)
        a, res["analyze_s"] = timed(lambda: analyze(trace))
        doc, res["summary_s"] = timed(lambda: analysis_json(a, by="graph"))
        text, res["json_indent2_s"] = timed(lambda: json.dumps(doc, indent=2))
        res["json_indent2_bytes"] = len(text)
        import io

        _, res["json_dump_indent2_stream_s"] = timed(lambda: json.dump(doc, io.StringIO(), indent=2))
        text, res["json_compact_s"] = timed(lambda: json.dumps(doc, separators=(",", ":")))
        res["json_compact_bytes"] = len(text)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
        cmd = [sys.executable, "-m", "graphmon.cli", "analyze", "--format", "json", "--no-progress", path]
        r, res["cli_pipe_s"] = timed(lambda: subprocess.run(cmd, stdout=subprocess.PIPE, env=env, check=True))
        res["cli_pipe_bytes"] = len(r.stdout)
    out = cli.out_path(args.out, RESULTS / "analyze-json.json", args.smoke)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
