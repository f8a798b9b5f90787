"""Per-boundary shifts between captures of the same graph (null pairs): calibrates the "widened" threshold.

For every null pair in the bundled H200 traces (upload vs no_upload captures of one graph: same kernels,
different instances; and the two halves of each graph's replays), lists the boundaries that moved by the
``moved`` rule (median +128 ns and +20%, current p25 > baseline p75) and the largest such shift.
Writes bench/results/boundary_null.json.

    python bench/analysis/boundary_null.py [--out bench/results/boundary_null.json]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

if not __package__:  # run as a file: import bench.* and graphmon from this checkout (bench/README.md)
    sys.path[0] = str(Path(__file__).resolve().parents[2])

from bench.common import cli  # noqa: E402
from bench.common.paths import KINETO, NATIVE, RESULTS, TESTS, on_path  # noqa: E402
from graphmon.analysis.boundaries import attribute  # noqa: E402
from graphmon.formats.read import read_trace  # noqa: E402

on_path(TESTS)
from helpers import half  # noqa: E402  (the shared test helpers: a trace's first or second half of replays)

PAIRS = ((NATIVE, [("decode_bs1/no_upload", "decode_bs1/upload"), ("decode_bs2/no_upload", "decode_bs2/upload"),
                   ("chain/no_upload", "chain/upload")]),
         (KINETO, [("shapeA/no_upload", "shapeA/upload")]))


def null_rows(sources=PAIRS) -> list[dict]:
    out = []
    for path, pairs in sources:
        t = read_trace(path, progress=False)
        cases = [(f"{a} vs {b}", t, t, [(a, b)]) for a, b in pairs] + [(f"{b} vs {a}", t, t, [(b, a)]) for a, b in pairs]
        cases.append(("first half vs second half (all graphs)", half(t, 0), half(t, 1), []))
        for name, base, cur, pr in cases:
            attr = attribute(base, cur, pairs=pr, top=10_000)
            for g in attr.graphs:
                sh = g.all_shifts["shift_ns"]
                moved = [b.shift_ns for b in g.top if b.moved]
                out.append({"trace": path.name, "case": name, "graph": g.graph, "boundaries": g.boundaries,
                            "moved": len(moved), "max_moved_shift_ns": max(moved, default=0.0),
                            "max_abs_shift_ns": float(np.max(np.abs(sh))) if len(sh) else 0.0, "verdict": g.verdict})
    return out


def main(argv=None) -> int:
    ap = cli.parser(__doc__)
    ap.add_argument("--out", help="default: bench/results/boundary_null.json")
    a = ap.parse_args(argv)
    out = null_rows(PAIRS[:1] if a.smoke else PAIRS)  # smoke: the native capture's pairs only
    res = {"rows": out, "max_moved_shift_ns": max(r["max_moved_shift_ns"] for r in out),
           "max_moved_per_graph": max(r["moved"] for r in out)}
    path = cli.out_path(a.out, RESULTS / "boundary_null.json", a.smoke)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(res, indent=1))
    print(json.dumps({k: v for k, v in res.items() if k != "rows"}))
    for r in out:
        print(f"{r['trace']:40} {r['case']:45} {r['graph']:45} moved {r['moved']:3} max {r['max_moved_shift_ns']:6.0f} "
              f"{r['verdict']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
