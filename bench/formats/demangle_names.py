"""Which demangler for kernel names? Correctness and speed on the real kernel names in the traces.

Reference: binutils' ``c++filt`` (GNU's demangler, the one ``nsys`` and ``nvidia-smi``-side tools
agree with). For each candidate package: how many of the real mangled names it demangles to exactly
c++filt's text, how many it fails on, and the time per name.

    .venv/bin/python bench/formats/demangle_names.py [--out bench/results/demangle.json]
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

if not __package__:  # run as a file: import bench.* and graphmon from this checkout (bench/README.md)
    sys.path[0] = str(Path(__file__).resolve().parents[2])

from bench.common import cli  # noqa: E402
from bench.common.paths import DATA, RESULTS  # noqa: E402

NEEDS = ("c++filt",)  # executables on PATH (tests/bench/test_bench_smoke.py skips the smoke run without them)
SOURCES = sorted(DATA.glob("*.npz"))  # raw CUPTI npz ("names") and native traces (meta_json "names")


def mangled_names() -> list[str]:
    names: set[str] = set()
    for p in SOURCES:
        with np.load(p, allow_pickle=False) as z:
            if "names" in z.files:
                names.update(z["names"].tolist())
            if "meta_json" in z.files:
                names.update(json.loads(bytes(z["meta_json"]).decode()).get("names", []))
    return sorted(n for n in names if n.startswith("_Z"))


def candidates():
    out = {}
    try:
        import cxxfilt

        out["cxxfilt"] = lambda s: cxxfilt.demangle(s, external_only=False)
    except ImportError:
        pass
    try:
        from itanium_demangler import parse

        out["itanium_demangler"] = lambda s: str(parse(s))
    except ImportError:
        pass
    try:
        import cpp_demangle

        out["cpp_demangle"] = cpp_demangle.demangle
    except ImportError:
        pass
    return out


def main(argv=None) -> int:
    ap = cli.parser(__doc__)
    ap.add_argument("--out", help="default: bench/results/demangle.json")
    args = ap.parse_args(argv)
    names = mangled_names()[:50] if args.smoke else mangled_names()
    out_path = cli.out_path(args.out, RESULTS / "demangle.json", args.smoke)
    if not shutil.which("c++filt"):
        print("demangle_names: c++filt (binutils) is needed as the reference", file=sys.stderr)
        return 2
    ref = subprocess.run(["c++filt"], input="\n".join(names) + "\n", capture_output=True, text=True, check=True).stdout.splitlines()
    results = {}
    for name, fn in candidates().items():
        exact = failed = 0
        diffs = []
        t0 = time.perf_counter()
        for s, want in zip(names, ref):
            try:
                got = fn(s)
            except Exception:  # noqa: BLE001 - any failure counts as one
                failed += 1
                continue
            if got == want:
                exact += 1
            elif len(diffs) < 3:
                diffs.append({"mangled": s[:200], "got": str(got)[:200], "c++filt": want[:200]})
        dt = time.perf_counter() - t0
        results[name] = {"exact": exact, "failed": failed, "different": len(names) - exact - failed,
                         "us_per_name": round(dt / len(names) * 1e6, 1), "examples_of_differences": diffs}
        print(f"{name:18s} exact {exact}/{len(names)}  failed {failed}  {results[name]['us_per_name']} us/name", flush=True)
    out = {"names": len(names), "sources": [p.name for p in SOURCES], "reference": "c++filt (GNU binutils)", "results": results}
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(out, indent=2) + "\n")
    print("wrote", out_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
