"""Time boundary_gaps() and attribute() on the bundled H200 capture (467k kernels, 6 graphs, 480 replays).

Writes bench/results/boundary_speed.json. Best of 3 runs, one process, this machine.

    python bench/analysis/boundary_speed.py [--runs 3] [--out bench/results/boundary_speed.json]
"""

from __future__ import annotations

import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

if not __package__:  # run as a file: import bench.* and graphmon from this checkout (bench/README.md)
    sys.path[0] = str(Path(__file__).resolve().parents[2])

from bench.common import cli  # noqa: E402
from bench.common.paths import NATIVE, RESULTS  # noqa: E402
from graphmon.analysis.boundaries import attribute, boundary_gaps  # noqa: E402
from graphmon.formats.read import read_trace  # noqa: E402


def best(fn, n=3):
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main(argv=None) -> int:
    ap = cli.parser(__doc__)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", help="default: bench/results/boundary_speed.json")
    a = ap.parse_args(argv)
    trace = read_trace(NATIVE, progress=False)
    if a.smoke:  # one run on the first 50k kernels
        a.runs = 1
        trace = trace.select(np.arange(len(trace)) < 50_000)
    res = {
        "kernels": len(trace),
        "boundaries": len(boundary_gaps(trace)),
        "boundary_gaps_s": best(lambda: boundary_gaps(trace), a.runs),
        "attribute_s": best(lambda: attribute(trace, trace), a.runs),
        "machine": platform.processor() or platform.machine(),
    }
    out = cli.out_path(a.out, RESULTS / "boundary_speed.json", a.smoke)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1))
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
