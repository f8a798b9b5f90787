"""Per-boundary shifts between captures of the same graph (null pairs): calibrates the "widened" threshold.

For every null pair in the bundled H200 traces (upload vs no_upload captures of one graph: same kernels,
different instances; and the two halves of each graph's replays), lists the boundaries that moved by the
``moved`` rule (median +128 ns and +20%, current p25 > baseline p75) and the largest such shift.
Writes bench/results/boundary_null.json.
"""

import json
import sys
from pathlib import Path

import numpy as np

from graphmon.analysis.boundaries import attribute
from graphmon.formats.read import read_trace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from helpers import KINETO, NATIVE, half  # noqa: E402

out = []
for path, pairs in ((NATIVE, [("decode_bs1/no_upload", "decode_bs1/upload"), ("decode_bs2/no_upload", "decode_bs2/upload"),
                              ("chain/no_upload", "chain/upload")]),
                    (KINETO, [("shapeA/no_upload", "shapeA/upload")])):
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
res = {"rows": out, "max_moved_shift_ns": max(r["max_moved_shift_ns"] for r in out),
       "max_moved_per_graph": max(r["moved"] for r in out)}
(ROOT / "bench" / "results").mkdir(exist_ok=True)
(ROOT / "bench" / "results" / "boundary_null.json").write_text(json.dumps(res, indent=1))
print(json.dumps({k: v for k, v in res.items() if k != "rows"}))
for r in out:
    print(f"{r['trace']:40} {r['case']:45} {r['graph']:45} moved {r['moved']:3} max {r['max_moved_shift_ns']:6.0f} {r['verdict']}")
