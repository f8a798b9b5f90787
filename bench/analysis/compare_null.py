"""The null distribution behind graphmon compare's default thresholds, from the real H200 fixtures.

For every pair of captures of the same workload (uploaded vs not in the raw-CUPTI capture, both
directions; the Kineto capture; first vs second half of each graph's replays) it runs
graphmon.analysis.compare with no effect-size floor (min_shift_ns=0, min_rel=0) and records each stream's
shift, relative shift and adjusted p-value, plus the largest |shift| seen. Also records the
injected 0.19->0.51 us widening (+320 ns on every gap) for contrast.

Writes docs/ab/compare-null.json. Run: .venv/bin/python bench/analysis/compare_null.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

if not __package__:  # run as a file: import bench.* and graphmon from this checkout (bench/README.md)
    sys.path[0] = str(Path(__file__).resolve().parents[2])

from bench.common import cli  # noqa: E402
from bench.common.paths import KINETO, NATIVE, ROOT, TESTS, on_path  # noqa: E402
from graphmon.analysis.compare import Thresholds, compare  # noqa: E402
from graphmon.formats.read import read_trace  # noqa: E402

on_path(TESTS)
from helpers import half, only, widen  # noqa: E402  (the shared test helpers)

NO_FLOOR = Thresholds(min_shift_ns=0, min_rel=0)


def rows(name, res):
    return [{"pair": name, "graph": s.graph, "rank": s.rank, "shift_ns": s.shift_ns, "rel_shift": s.rel_shift,
             "p_adjusted": s.p_adjusted, "significant": bool(s.p_adjusted < NO_FLOOR.alpha)} for s in res.streams]


def main(argv=None) -> int:
    ap = cli.parser(__doc__)
    ap.add_argument("--out", help="default: docs/ab/compare-null.json")
    args = ap.parse_args(argv)
    kineto_path = cli.kineto_subset(KINETO) if args.smoke else KINETO  # smoke: a tenth of the Kineto trace
    native, kineto = read_trace(NATIVE, progress=False), read_trace(kineto_path, progress=False)
    null = []
    for w in ("decode_bs1", "decode_bs2", "chain"):
        for a, b in (("upload", "no_upload"), ("no_upload", "upload")):
            null += rows(f"{w}/{a} vs {w}/{b}", compare(only(native, f"{w}/{a}"), only(native, f"{w}/{b}"), thresholds=NO_FLOOR))
    null += rows("kineto shapeA/upload vs shapeA/no_upload",
                 compare(kineto, kineto, pairs=[("shapeA/upload", "shapeA/no_upload")], thresholds=NO_FLOOR))
    null += rows("native first vs second half", compare(half(native, 0), half(native, 1), thresholds=NO_FLOOR))
    null += rows("kineto first vs second half", compare(half(kineto, 0), half(kineto, 1), thresholds=NO_FLOOR))
    sig = [r for r in null if r["significant"]]
    g = native.graph_names().index("decode_bs1/upload")
    effect = rows("decode_bs1/upload widened by 320 ns per gap", compare(native, widen(native, g), thresholds=NO_FLOOR))
    effect = [r for r in effect if r["graph"] == "decode_bs1/upload"]
    doc = {
        "null_pairs": null,
        "null_max_abs_shift_ns": max(abs(r["shift_ns"]) for r in null),
        "null_max_abs_rel_shift": max(abs(r["rel_shift"]) for r in null),
        "null_significant_streams": len(sig),
        "null_significant_max_abs_shift_ns": max((abs(r["shift_ns"]) for r in sig), default=0),
        "null_significant_max_abs_rel_shift": max((abs(r["rel_shift"]) for r in sig), default=0),
        "defaults": {"min_shift_ns": Thresholds().min_shift_ns, "min_rel": Thresholds().min_rel, "alpha": Thresholds().alpha},
        "injected_widening": effect,
    }
    dst = cli.out_path(args.out, ROOT / "docs" / "ab" / "compare-null.json", args.smoke)
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_text(json.dumps(doc, indent=2) + "\n")
    print({k: v for k, v in doc.items() if k not in ("null_pairs", "injected_widening")})
    print("widening:", [(r["rank"], r["shift_ns"], round(r["rel_shift"], 3)) for r in effect])
    return 0


if __name__ == "__main__":
    sys.exit(main())
