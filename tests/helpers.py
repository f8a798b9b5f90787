"""Small builders shared by the exporter tests (real trace fixtures live in tests/data/)."""

from pathlib import Path

import numpy as np

from graphmon.model.window import Window
from graphmon.model.trace import GraphInfo, Trace

DATA = Path(__file__).parent / "data"
NATIVE = DATA / "h200-cupti-decode-v1.graphmon.npz"
KINETO = DATA / "h200-kineto-decode-shapeA.json.gz"
WIDEN_NS = 320  # the motivating regression: median gap 0.19 -> 0.51 us


def synthetic_trace(n_graphs=1, n_streams=1, replays=3, kernels_per_stream=4, gap_ns=400, dur_ns=1000,
                    upload_mode="uploaded", base_ns=1_000_000, device=0):
    """A regular trace: every replay of every graph runs kernels_per_stream kernels on each stream."""
    rows = []
    graphs = []
    corr = 1
    t = base_ns
    for g in range(n_graphs):
        graphs.append(GraphInfo(key=f"g{g + 1}", graph_id=g + 1, upload_mode=upload_mode, label=f"graph{g}"))
        for _ in range(replays):
            for s in range(n_streams):
                for k in range(kernels_per_stream):
                    st = t + k * (dur_ns + gap_ns)
                    rows.append((st, st + dur_ns, s, corr, g + 1))
            t += kernels_per_stream * (dur_ns + gap_ns) + 10_000
            corr += 1
    a = np.array(rows, dtype=np.int64)
    return Trace.build(start_ns=a[:, 0], end_ns=a[:, 1], stream=a[:, 2], correlation_id=a[:, 3],
                       graph_id=a[:, 4], device=np.full(len(a), device), graphs=graphs)


def window(trace, ended_s=1_800_000_000.0, **kw):
    return Window(trace=trace, started_s=ended_s - 1.0, ended_s=ended_s, **kw)


def widen(trace: Trace, graph_index: int, add_ns: int = WIDEN_NS) -> Trace:
    """Shift kernels so every gap on every stream of one graph grows by exactly ``add_ns``.

    Within each (replay, stream), the k-th kernel by start moves later by k * add_ns.
    """
    start, end = trace.start_ns.copy(), trace.end_ns.copy()
    sel = np.flatnonzero(trace.graph == graph_index)
    o = np.lexsort((start[sel], trace.stream[sel], trace.correlation_id[sel], trace.device[sel]))
    rows = sel[o]
    key = np.stack([trace.device[rows], trace.correlation_id[rows], trace.stream[rows]])
    head = np.r_[True, (key[:, 1:] != key[:, :-1]).any(axis=0)]
    idx = np.arange(len(rows))
    k = idx - np.maximum.accumulate(np.where(head, idx, 0))
    start[rows] += k * add_ns
    end[rows] += k * add_ns
    return Trace.build(start_ns=start, end_ns=end, stream=trace.stream, correlation_id=trace.correlation_id,
                       device=trace.device, graph_id=trace.graph_id, graph_node_id=trace.graph_node_id,
                       name_id=trace.name_id, names=trace.names, launches=trace.launches, graphs=trace.graphs,
                       labels=trace.labels, meta=trace.meta)


def only(trace: Trace, name: str) -> Trace:
    return trace.select(trace.graph == trace.graph_names().index(name))


def half(trace: Trace, which: int) -> Trace:
    """The first (0) or second (1) half of each graph's replays, by time."""
    from graphmon.analysis.replays import analyze

    r = analyze(trace).replays
    keep_corr = []
    for g in np.unique(r.graph):
        rows = np.flatnonzero(r.graph == g)
        rows = rows[np.argsort(r.first_start_ns[rows])]
        keep_corr.append(r.correlation_id[np.array_split(rows, 2)[which]])
    return trace.select(np.isin(trace.correlation_id, np.concatenate(keep_corr)) & (trace.graph >= 0))


def wait_until(pred, timeout=5.0, step_s=0.01):
    """Poll ``pred`` until it is true (True) or ``timeout`` seconds passed (False)."""
    import time

    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if pred():
            return True
        time.sleep(step_s)
    return False
