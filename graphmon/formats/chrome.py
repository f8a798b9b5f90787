"""A trace window as Chrome / Perfetto trace JSON: one track per (device, stream), kernels as slices.

Kernel names are demangled for display (formats.demangle; mangled when that fails).
Gaps are the empty space between slices on a track; each slice also carries its gap to the
previous kernel on the same stream in ``args.gap_ns`` so it shows up when a slice is selected.
"""

from __future__ import annotations

import numpy as np

from graphmon.formats.demangle import demangle_all
from graphmon.model.trace import Trace


def to_chrome_trace(trace: Trace, max_events: int = 500_000) -> dict:
    """Chrome trace dict. ``ts``/``dur`` are microseconds (the format's unit), to 1 ns precision."""
    n = len(trace)
    truncated = n > max_events
    idx = np.lexsort((trace.start_ns, trace.stream, trace.device))[:max_events]
    start, end = trace.start_ns[idx], trace.end_ns[idx]
    dev, stream = trace.device[idx], trace.stream[idx]
    same = np.r_[False, (dev[1:] == dev[:-1]) & (stream[1:] == stream[:-1])]
    gap = np.where(same, start - np.r_[0, end[:-1]], 0)
    t0 = int(start.min()) if len(start) else 0
    used = [i for i in np.unique(trace.name_id[idx]).tolist() if 0 <= i < len(trace.names)]  # -1: no name
    names = dict(zip(used, demangle_all(trace.names[i] for i in used)))
    gnames = trace.graph_names()
    graphs = trace.graph[idx]
    name_ids = trace.name_id[idx]
    corr = trace.correlation_id[idx]
    events: list[dict] = []
    for d in np.unique(dev).tolist():
        events.append({"ph": "M", "name": "process_name", "pid": d, "tid": 0, "args": {"name": f"GPU {d}"}})
    for d, s in sorted(set(zip(dev.tolist(), stream.tolist()))):
        events.append({"ph": "M", "name": "thread_name", "pid": d, "tid": s, "args": {"name": f"stream {s}"}})
    for i in range(len(idx)):
        nid = int(name_ids[i])
        g = int(graphs[i])
        events.append({
            "ph": "X",
            "cat": "kernel",
            "name": names.get(nid, "kernel"),
            "pid": int(dev[i]),
            "tid": int(stream[i]),
            "ts": (int(start[i]) - t0) / 1e3,
            "dur": (int(end[i]) - int(start[i])) / 1e3,
            "args": {
                "graph": gnames[g] if g >= 0 else "",
                "correlation": int(corr[i]),
                "gap_ns": int(gap[i]) if same[i] else None,
            },
        })
    return {
        "traceEvents": events,
        "displayTimeUnit": "ns",
        "otherData": {"generator": "graphmon", "base_time_ns": t0, "kernels": n, "truncated": truncated},
    }
