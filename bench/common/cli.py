"""The command line every bench shares: argparse with the bench's docstring as its --help, a
``--smoke`` flag (CPU benches), and where a run writes its results."""

from __future__ import annotations

import argparse
import gzip
import json
import tempfile
from pathlib import Path

SMOKE_HELP = ("a seconds-long run on small inputs, for CI (tests/bench/test_bench_smoke.py): it checks that the "
              "bench runs, not what it measures; writes under a temporary folder unless --out is given")


def parser(doc: str, smoke: bool = True) -> argparse.ArgumentParser:
    """The bench's parser; ``smoke=False`` for GPU benches (CI imports them and asks --help only)."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    if smoke:
        ap.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    return ap


def out_path(given, default, smoke: bool = False) -> Path:
    """``--out`` when given; else ``default`` (a file or folder under bench/results), or in a smoke
    run the same name in a fresh temporary folder: a smoke run never replaces a recorded result."""
    if given:
        return Path(given)
    if smoke:
        return Path(tempfile.mkdtemp(prefix="graphmon-bench-smoke-")) / Path(default).name
    return Path(default)


def kineto_subset(src: Path, every: int = 7) -> Path:
    """A small Kineto trace for smoke runs: every ``every``-th graph launch of ``src`` with its
    kernels and flow events, everything else kept (a temporary .json.gz). The shared trace
    alternates its two graphs 5 launches at a time: a step of 7 keeps launches of both."""
    doc = json.loads(gzip.decompress(Path(src).read_bytes()))
    ev = doc["traceEvents"]
    launches = sorted(e["args"]["correlation"] for e in ev
                      if e.get("cat") == "cuda_runtime" and "GraphLaunch" in e.get("name", ""))
    keep = set(launches[::every])

    def kept(e: dict) -> bool:
        cat = e.get("cat")
        if cat == "kernel" or (cat == "cuda_runtime" and "GraphLaunch" in e.get("name", "")):
            return e.get("args", {}).get("correlation") in keep
        return e.get("id") in keep if cat == "ac2g" else True

    doc["traceEvents"] = [e for e in ev if kept(e)]
    dst = Path(tempfile.mkdtemp(prefix="graphmon-bench-smoke-")) / Path(src).name
    dst.write_bytes(gzip.compress(json.dumps(doc).encode(), compresslevel=1))
    return dst
