"""How much faster than prometheus_client does graphmon write /metrics, for the same series?

One rank's snapshot (64 graphs on 4 streams, from the agent's synthetic held-out window shape),
at the default level (standard) and at full, in both formats, in this process, side by side:

- graphmon's path: each rank's sample lines written directly (graphmon.export.textwriter) and
  joined into a body (graphmon.export.body), what the agent and `serve` do;
- prometheus_client's path: the same series as prometheus_client Metric objects
  (graphmon.export.collector, the adapter) encoded by ``generate_latest``;
- between them: the same Metric objects encoded by graphmon's registry encoder
  (graphmon.export.exposition.render, used for the agent's own families).

Median of ``--repeats`` runs each. Writes bench/results/exposition-speed.json.

    python bench/serve/exposition_speed.py [--repeats 20] [--smoke]
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

if not __package__:  # run as a file: import bench.* and graphmon from this checkout (bench/README.md)
    sys.path[0] = str(Path(__file__).resolve().parents[2])

from bench.common import cli  # noqa: E402
from bench.common.paths import ROOT  # noqa: E402


def snapshot(n_graphs: int):
    import numpy as np

    from graphmon.export.aggregator import Aggregator
    from graphmon.model.trace import GraphInfo, Trace
    from graphmon.model.window import Window

    rng = np.random.default_rng(0)
    rows, t, corr = [], 10**12, 0
    for g in range(n_graphs):
        for _ in range(4):
            corr += 1
            for s in range(4):
                st = t + np.cumsum(rng.integers(1_200, 6_600, 60))
                rows += [(a, a + 1_000, 7 + s, corr, g + 1) for a in st.tolist()]
            t += 500_000
    a = np.array(rows, dtype=np.int64)
    graphs = [GraphInfo(key=f"g{g + 1}", graph_id=g + 1, label=f"decode_bs{g + 1}",
                        upload_mode="uploaded" if g % 2 else "lazy") for g in range(n_graphs)]
    trace = Trace.build(start_ns=a[:, 0], end_ns=a[:, 1], stream=a[:, 2], correlation_id=a[:, 3], graph_id=a[:, 4],
                        graphs=graphs)
    agg = Aggregator(rank="0")
    for i in range(2):
        agg.ingest(Window(trace=trace, started_s=time.time() - 1, ended_s=time.time()))
    return agg.snapshot()


def median_ms(fn, repeats: int) -> float:
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t0) * 1e3)
    return round(statistics.median(ts), 3)


def main(argv=None) -> int:
    from prometheus_client.exposition import generate_latest
    from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

    from graphmon.export.body import Blocks, RankPieces, skeleton
    from graphmon.export.collector import make_registry
    from graphmon.export.exposition import OPENMETRICS, TEXT, render

    ap = cli.parser(__doc__)  # --smoke: 4 graphs, 3 repeats, nothing written
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--graphs", type=int, default=64)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "exposition-speed.json")
    a = ap.parse_args(argv)
    if a.smoke:
        a.graphs, a.repeats = 4, 3
    snap = snapshot(a.graphs)
    load0 = os.getloadavg()
    cases = {}
    for level in ("standard", "full"):
        reg = make_registry(lambda: (snap,), cardinality=level)
        for fmt, reference in ((TEXT, generate_latest), (OPENMETRICS, generate_openmetrics)):
            def writer():
                parts = RankPieces(level).parts([("0", snap)], dict)  # a new snapshot: written again
                return Blocks().build(fmt, [skeleton(level, fmt), *parts]).text

            assert writer() == reference(reg), (level, fmt)  # the same bytes
            c = {"prometheus_client_ms": median_ms(lambda: reference(reg), a.repeats),
                 "graphmon_encoder_ms": median_ms(lambda: render(reg, fmt), a.repeats),
                 "graphmon_writer_ms": median_ms(writer, a.repeats),
                 "series": sum(1 for ln in writer().splitlines() if ln and not ln.startswith(b"#"))}
            c["writer_speedup"] = round(c["prometheus_client_ms"] / c["graphmon_writer_ms"], 2)
            c["encoder_speedup"] = round(c["prometheus_client_ms"] / c["graphmon_encoder_ms"], 2)
            cases[f"{level}/{fmt}"] = c
            print(level, fmt, c, flush=True)
    doc = {"question": __doc__.split("\n\n")[0], "command": "python bench/serve/exposition_speed.py " + " ".join(
        sys.argv[1:] if argv is None else argv), "graphs": a.graphs, "repeats": a.repeats, "cases": cases,
           "load_average_start_end": [round(x, 2) for x in load0] + [round(x, 2) for x in os.getloadavg()],
           "python": platform.python_version(), "cpus": os.cpu_count()}
    if not a.smoke:
        a.out.write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
