#!/usr/bin/env python3
"""Regenerate the test fixtures and the demo's bundled trace from ../shared/traces/.

    .venv/bin/python scripts/convert_shared_traces.py [--shared ../shared/traces]

Writes:
- tests/data/h200-kineto-decode-shapeA.json.gz   (copied as is)
- tests/data/h200-cupti-decode-v1.npz            (raw CUPTI npz, copied as is: the raw reader's fixture)
- tests/data/h200-cupti-decode-v1.graphmon.npz   (native conversion of the raw npz)
- graphmon/data/h200-decode.graphmon.npz         (the same native trace, for the demo)

The native conversion keeps every kernel when the file fits MAX_BUNDLED_BYTES; otherwise it keeps
only the first KEEP_REPLAYS replays per graph key (and says so in the trace's meta).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from graphmon.formats.read import read_trace, write_trace  # noqa: E402
from graphmon.model.trace import Trace  # noqa: E402

MAX_BUNDLED_BYTES = 4_000_000
KEEP_REPLAYS = 40


def first_replays(trace: Trace, keep: int) -> Trace:
    """Kernels of the first ``keep`` launches (by correlation id) of each graph."""
    mask = np.zeros(len(trace), dtype=bool)
    for g in range(len(trace.graphs)):
        corr = np.unique(trace.correlation_id[trace.graph == g])[:keep]
        mask |= (trace.graph == g) & np.isin(trace.correlation_id, corr)
    kept = trace.select(mask)
    meta = dict(kept.meta, truncated_to_replays_per_graph=keep, kernels_in_source=len(trace))
    # Keep only the launch rows whose kernels are kept, so no launch reads as "kernels lost".
    lmask = np.isin(trace.launches["correlation_id"], kept.correlation_id)
    launches = {k: v[lmask] for k, v in trace.launches.items()}
    return Trace.build(
        **{k: getattr(kept, k) for k in ("start_ns", "end_ns", "device", "stream", "graph_id", "graph_node_id", "correlation_id", "name_id")},
        names=kept.names,
        launches=launches,
        graphs=kept.graphs,
        labels=kept.labels,
        invalid=kept.invalid,
        meta=meta,
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shared", default=os.path.join(ROOT, "..", "shared", "traces"))
    a = ap.parse_args()
    data = os.path.join(ROOT, "tests", "data")
    bundled = os.path.join(ROOT, "graphmon", "data")
    os.makedirs(data, exist_ok=True)
    os.makedirs(bundled, exist_ok=True)
    for f in ("h200-kineto-decode-shapeA.json.gz", "h200-cupti-decode-v1.npz"):
        shutil.copyfile(os.path.join(a.shared, f), os.path.join(data, f))
        print("copied", f)

    raw = os.path.join(data, "h200-cupti-decode-v1.npz")
    trace = read_trace(raw, progress=False)
    # The fixture names the file it came from, not this machine's path.
    trace = Trace.build(
        **{k: getattr(trace, k) for k in ("start_ns", "end_ns", "device", "stream", "graph_id", "graph_node_id", "correlation_id", "name_id")},
        names=trace.names,
        launches=trace.launches,
        graphs=trace.graphs,
        labels=trace.labels,
        invalid=trace.invalid,
        meta=dict(trace.meta, source="shared/traces/h200-cupti-decode-v1.npz"),
    )
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "t.graphmon.npz")
        write_trace(trace, out)
        if os.path.getsize(out) > MAX_BUNDLED_BYTES:
            print(f"full conversion is {os.path.getsize(out)} bytes; keeping the first {KEEP_REPLAYS} replays per graph")
            trace = first_replays(trace, KEEP_REPLAYS)
            write_trace(trace, out)
        for dst in (os.path.join(data, "h200-cupti-decode-v1.graphmon.npz"), os.path.join(bundled, "h200-decode.graphmon.npz")):
            shutil.copyfile(out, dst)
            print(f"wrote {os.path.relpath(dst, ROOT)}: {len(trace)} kernels, {os.path.getsize(dst)} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
