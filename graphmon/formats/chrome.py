"""A trace window as Chrome / Perfetto trace JSON: one track per (device, stream), kernels as slices.

Kernel names are demangled for display (formats.demangle; mangled when that fails).
Gaps are the empty space between slices on a track; each slice also carries its gap to the
previous kernel on the same stream in ``args.gap_ns`` so it shows up when a slice is selected.

The file is also a trace graphmon reads back (``graphmon analyze``, through the Kineto reader),
with the same analysis as the native form of the window: kernels carry
``args.stream``/``device``/``correlation`` as Kineto writes them, and each graph replay has a
``cudaGraphLaunch`` event inside a ``user_annotation`` range named after its graph (on a "graph
launches" track), which is how a Kineto reader tells replays and graphs apart. graphmon's own
additions: the launch event's ``args.graph`` (index into the top-level ``graphmonTrace.graphs``,
each graph's key, upload mode, label and the rest of its metadata), ``args.stream`` (the launch
stream, when known) and ``args.launch_time: "unknown"`` where CUPTI recorded no launch time (the
event then sits at the replay's first kernel for display, and the reader counts no launch
latency for it); ``graphmonTrace.invalid_records``, the records the window excluded;
``graphmonTrace.untraced`` (when the window has any), its replays timed with kernel tracing off:
``{"graph": [...], "duration_ns": [...]}``, one entry per replay, ``graph`` indexing
``graphmonTrace.graphs`` (-1 unknown). They are not drawn: a row has no start time to place it. Past
``max_events`` kernels the file keeps whole replays, the earliest first, and says so in a top-level
``graphmonTruncated`` object (the reader puts it in ``meta["truncated"]``, analyze reports it).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Mapping, Optional

import numpy as np

from graphmon.formats.demangle import demangle_all
from graphmon.formats.kineto import GRAPHMON_KEY, TRUNCATED_KEY, UNKNOWN_LAUNCH
from graphmon.model.trace import Trace, replay_key
from graphmon.model.window import UNTRACED_COLUMNS

HOST_PID, LAUNCH_TID = "host", "graph launches"


def kept_rows(trace: Trace, max_events: int) -> np.ndarray:
    """Rows of whole replays (kernels of one (device, correlation id)), the earliest replays
    first, at most ``max_events`` kernels: a cut never leaves part of a replay."""
    n = len(trace)
    if n <= max_events:
        return np.arange(n)
    key = replay_key(trace.device, trace.correlation_id)
    ukey, inv = np.unique(key, return_inverse=True)
    inv = inv.reshape(-1)
    first = np.full(len(ukey), np.iinfo(np.int64).max)
    np.minimum.at(first, inv, trace.start_ns)
    counts = np.bincount(inv, minlength=len(ukey))
    order = np.lexsort((ukey, first))
    keep = np.zeros(len(ukey), bool)
    keep[order[np.cumsum(counts[order]) <= max_events]] = True
    return np.flatnonzero(keep[inv])


def to_chrome_trace(trace: Trace, max_events: int = 500_000, untraced: Optional[Mapping[str, np.ndarray]] = None) -> dict:
    """Chrome trace dict. ``ts``/``dur`` are microseconds (the format's unit), to 1 ns precision.
    ``untraced``: the window's untraced replay durations (graphmonTrace.untraced, whole: a cut
    keeps every row)."""
    n = len(trace)
    rows = kept_rows(trace, max_events)
    truncated = len(rows) < n
    idx = rows[np.lexsort((trace.start_ns[rows], trace.stream[rows], trace.device[rows]))]
    start, end = trace.start_ns[idx], trace.end_ns[idx]
    dev, stream = trace.device[idx], trace.stream[idx]
    same = np.r_[False, (dev[1:] == dev[:-1]) & (stream[1:] == stream[:-1])]
    gap = np.where(same, start - np.r_[0, end[:-1]], 0)
    launches = _replay_launches(trace, idx)
    # ts 0 is 1 µs before the first event: a kernel at ts 0 would read back as an incomplete
    # CUPTI record (zero start), and ts stay small enough for exact 3-decimal floats
    t0 = min(int(start.min()), min((r[3] for r in launches if r[3] > 0), default=int(start.min()))) - 1000 if len(start) else 0
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
    if launches:
        events.append({"ph": "M", "name": "process_name", "pid": HOST_PID, "tid": 0, "args": {"name": "host"}})
        events.append({"ph": "M", "name": "thread_name", "pid": HOST_PID, "tid": LAUNCH_TID,
                       "args": {"name": LAUNCH_TID}})
    for c, g, first, at, last, lstream in launches:
        args = {"correlation": c, "graph": g}
        if lstream >= 0:
            args["stream"] = lstream
        if at <= 0:  # no launch time recorded: drawn at the first kernel, read back as unknown
            args["launch_time"] = UNKNOWN_LAUNCH
            at = first
        opens = min(at, first)  # a skewed launch clock may put the launch after the first kernel
        events.append({"ph": "X", "cat": "user_annotation", "name": gnames[g], "pid": HOST_PID, "tid": LAUNCH_TID,
                       "ts": (opens - t0) / 1e3, "dur": (max(last, at) - opens) / 1e3})
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "pid": HOST_PID,
                       "tid": LAUNCH_TID, "ts": (at - t0) / 1e3, "dur": 0, "args": args})
    for i in range(len(idx)):
        nid = int(name_ids[i])
        g = int(graphs[i])
        d, s = int(dev[i]), int(stream[i])
        events.append({
            "ph": "X",
            "cat": "kernel",
            "name": names.get(nid, "kernel"),
            "pid": d,
            "tid": s,
            "ts": (int(start[i]) - t0) / 1e3,
            "dur": (int(end[i]) - int(start[i])) / 1e3,
            "args": {
                "device": d,
                "stream": s,
                "correlation": int(corr[i]),
                "graph": gnames[g] if g >= 0 else "",
                "gap_ns": int(gap[i]) if same[i] else None,
            },
        })
    doc = {
        "traceEvents": events,
        "displayTimeUnit": "ns",
        "otherData": {"generator": "graphmon", "base_time_ns": t0, "kernels": n, "truncated": truncated},
        # what `graphmon analyze` needs to answer as for the native form (formats.kineto reads it)
        GRAPHMON_KEY: {"graphs": [asdict(g) for g in trace.graphs], "invalid_records": dict(trace.invalid),
                       **({"untraced": {k: np.asarray(untraced[k]).tolist() for k in UNTRACED_COLUMNS}}
                          if untraced is not None and len(untraced["duration_ns"]) else {})},
    }
    if truncated:
        doc[TRUNCATED_KEY] = {"kernels": n, "kernels_kept": int(len(idx)),
                              "why": f"graphmon's Chrome JSON holds at most {max_events} kernels (whole replays, "
                                     "earliest first); the native format (?format=graphmon) holds them all"}
    return doc


def _replay_launches(trace: Trace, idx: np.ndarray) -> list[tuple[int, int, int, int, int, int]]:
    """(correlation, graph, first start, launch time, last end, launch stream) per graph replay
    among the kept kernels. The launch time is the CPU launch call (same clock as kernels), -1
    when unknown; the launch stream -1 when unknown. The host track gets a ``cudaGraphLaunch``
    there inside a range named after the graph, as torch.profiler's record_function gives."""
    sel = idx[trace.graph[idx] >= 0]
    if not len(sel):
        return []
    key = replay_key(trace.device[sel], trace.correlation_id[sel])
    o = np.lexsort((trace.start_ns[sel], key))
    sel, key = sel[o], key[o]
    heads = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    first = trace.start_ns[sel][heads].tolist()
    last = np.maximum.reduceat(trace.end_ns[sel], heads).tolist()
    lc = trace.launches
    lkeys = replay_key(lc["device"], lc["correlation_id"]).tolist()
    launch = dict(zip(lkeys, zip(lc["launch_ns"].tolist(), lc["stream"].tolist())))
    out = []
    for k, c, g, s0, s1 in zip(key[heads].tolist(), trace.correlation_id[sel][heads].tolist(),
                               trace.graph[sel][heads].tolist(), first, last):
        at, lstream = launch.get(k, (-1, -1))
        out.append((c, g, s0, at if at > 0 else -1, s1, lstream))
    return out
