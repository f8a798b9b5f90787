"""/metrics bytes with and without gzip on the bundled demo (`graphmon serve`'s replay), both formats.

Runs the demo's exporter in this process (the bundled H200 capture replayed at its pace), waits
for a few windows, then for each format: the plain body's bytes, the gzipped body's bytes as sent
(Content-Encoding: gzip, one member), and the scrape time of each way through the ASGI app,
median of --scrapes (the first gzip scrape of a snapshot compresses the whole body; later ones only
the process_* part). Writes bench/results/metrics-gzip.json.

    python bench/serve/metrics_gzip.py [--scrapes 50]
"""

from __future__ import annotations

import gzip
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
from bench.common.agentload import PROMETHEUS_ACCEPT  # noqa: E402
from bench.common.paths import RESULTS  # noqa: E402


def main(argv=None) -> int:
    ap = cli.parser(__doc__)
    ap.add_argument("--scrapes", type=int, default=50)
    ap.add_argument("--out", help="default: bench/results/metrics-gzip.json")
    args = ap.parse_args(argv)
    windows = 5  # every graph of the demo has series by then
    if args.smoke:  # 3 scrapes each way of the first windows' snapshot
        args.scrapes, windows = 3, 1
    out_file = cli.out_path(args.out, RESULTS / "metrics-gzip.json", args.smoke)

    from fastapi.testclient import TestClient

    from graphmon.cli import bundled_trace_path
    from graphmon.export.exporter import Exporter
    from graphmon.export.scrape import GZIP_LEVEL
    from graphmon.formats.read import read_trace
    from graphmon.settings import Settings
    from graphmon.sources.replay import ReplaySource

    settings = Settings()
    ex = Exporter(ReplaySource(read_trace(bundled_trace_path()), interval_s=settings.window_interval_s,
                               name=bundled_trace_path()), settings)
    ex.start()
    try:
        while ex.snapshot().windows_total < windows:
            time.sleep(0.1)
        ex.source.stop()  # one snapshot from here on: every scrape measures the same body
        c = TestClient(ex.app)
        out = {}
        for name, accept in (("text", "text/plain;version=0.0.4"), ("openmetrics", PROMETHEUS_ACCEPT)):
            def scrape(enc):
                t0 = time.perf_counter()
                with c.stream("GET", "/metrics", headers={"Accept": accept, "Accept-Encoding": enc}) as r:
                    body = b"".join(r.iter_raw())
                return time.perf_counter() - t0, body, r.headers.get("content-encoding")

            first_gzip_s, _, _ = scrape("gzip")  # compresses the snapshot's body once
            plain = [scrape("identity") for _ in range(args.scrapes)]
            zipped = [scrape("gzip") for _ in range(args.scrapes)]
            body, wire = plain[-1][1], zipped[-1][1]
            assert zipped[-1][2] == "gzip" and plain[-1][2] is None
            assert gzip.decompress(wire).count(b"\n# HELP") == body.count(b"\n# HELP")
            out[name] = {
                "plain_bytes": len(body), "gzip_bytes": len(wire), "ratio": round(len(body) / len(wire), 1),
                "series": sum(1 for ln in body.splitlines() if ln and not ln.startswith(b"#")),
                "scrape_ms_median": {"plain": round(statistics.median(s for s, _, _ in plain) * 1e3, 3),
                                     "gzip": round(statistics.median(s for s, _, _ in zipped) * 1e3, 3),
                                     "gzip_first_of_a_snapshot": round(first_gzip_s * 1e3, 3)},
            }
    finally:
        ex.stop()
    res = {"what": "/metrics of the bundled demo (graphmon serve), plain vs gzip (Accept-Encoding: gzip)",
           "gzip_level": GZIP_LEVEL, "scrapes": args.scrapes, "formats": out,
           "machine": {"python": platform.python_version(), "cpu_count": os.cpu_count(),
                       "load_average_at_end": list(os.getloadavg()),
                       "shared": "2-core machine shared with other work"},
           "command": f"python bench/serve/metrics_gzip.py --scrapes {args.scrapes}"}
    out_file.parent.mkdir(parents=True, exist_ok=True)
    out_file.write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
