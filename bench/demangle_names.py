"""Which demangler for kernel names? Correctness and speed on the real kernel names in the traces.

Reference: binutils' ``c++filt`` (GNU's demangler, the one ``nsys`` and ``nvidia-smi``-side tools
agree with). For each candidate package: how many of the real mangled names it demangles to exactly
c++filt's text, how many it fails on, and the time per name.

    .venv/bin/python bench/demangle_names.py [--out bench/results/demangle.json]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
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


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "demangle.json"))
    args = ap.parse_args()
    names = mangled_names()
    if not shutil.which("c++filt"):
        print("c++filt (binutils) is needed as the reference", file=sys.stderr)
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
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print("wrote", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
