"""Where things are: the checkout, its test data and examples, and bench/results."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
DATA = TESTS / "data"
EXAMPLES = ROOT / "examples"
RESULTS = ROOT / "bench" / "results"
NATIVE = DATA / "h200-cupti-decode-v1.graphmon.npz"  # the real H200 capture (467,200 kernels, 6 graphs)
KINETO = DATA / "h200-kineto-decode-shapeA.json.gz"  # the shared 50 MB Kineto trace (57,600 kernels)
MiB = 2**20


def on_path(*dirs: Path) -> None:
    """Put folders on sys.path (first), once each: tests/ (the shared test helpers and the fake
    CUPTI), examples/ (decode_server), tests/gpu (the real clients of the GPU tests)."""
    for d in reversed([str(d) for d in dirs]):
        if d not in sys.path:
            sys.path.insert(0, d)
