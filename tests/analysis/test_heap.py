"""analysis/heap.py: a batch process reuses its freed temporaries instead of faulting pages in."""

import subprocess
import sys

import pytest

PROBE = r"""
import resource, sys
import numpy as np
from graphmon.analysis.heap import reuse_heap_for_batch
applied = reuse_heap_for_batch() if sys.argv[1] == "batch" else False
def touch():
    a = np.empty(64 << 17, np.int64)  # 64 MiB: over glibc's largest default mmap threshold
    a.fill(1)
    return int(a[-1])
touch()  # the first one faults its pages in either way
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    touch()
print(applied, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
"""


def _faults(mode: str) -> tuple[str, int]:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True).stdout.split()
    return out[0], int(out[1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_batch_heap_reuses_freed_temporaries():
    applied, with_setting = _faults("batch")
    _, without = _faults("default")
    assert applied == "True"
    # without: every 64 MiB temporary is a fresh mmap (faulted in again); with: the heap's pages
    assert without >= 5 * 16 and with_setting * 10 <= without, (with_setting, without)


def test_serving_code_never_applies_it():
    """Only the batch CLI commands call it: not attach, the light collector or the agent."""
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[2] / "graphmon"
    users = sorted(str(p.relative_to(root)) for p in root.rglob("*.py")
                   if "reuse_heap_for_batch()" in p.read_text() and p.name != "heap.py")
    assert users == ["cli.py"]
