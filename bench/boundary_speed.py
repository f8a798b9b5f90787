"""Time boundary_gaps() and attribute() on the bundled H200 capture (467k kernels, 6 graphs, 480 replays).

Writes bench/results/boundary_speed.json. Best of 3 runs, one process, this machine.
"""

import json
import platform
import time
from pathlib import Path

from graphmon.analysis.boundaries import attribute, boundary_gaps
from graphmon.formats.read import read_trace

ROOT = Path(__file__).resolve().parents[1]
trace = read_trace(ROOT / "tests" / "data" / "h200-cupti-decode-v1.graphmon.npz", progress=False)


def best(fn, n=3):
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


res = {
    "kernels": len(trace),
    "boundaries": len(boundary_gaps(trace)),
    "boundary_gaps_s": best(lambda: boundary_gaps(trace)),
    "attribute_s": best(lambda: attribute(trace, trace)),
    "machine": platform.processor() or platform.machine(),
}
(ROOT / "bench" / "results").mkdir(exist_ok=True)
(ROOT / "bench" / "results" / "boundary_speed.json").write_text(json.dumps(res, indent=1))
print(json.dumps(res))
