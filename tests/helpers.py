"""Small builders shared by the exporter tests (real trace fixtures live in tests/data/)."""

from pathlib import Path

import numpy as np

from graphmon.sources.base import Window
from graphmon.trace import GraphInfo, Trace

DATA = Path(__file__).parent / "data"
NATIVE = DATA / "h200-cupti-decode-v1.graphmon.npz"
KINETO = DATA / "h200-kineto-decode-shapeA.json.gz"


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
