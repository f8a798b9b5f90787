"""Scrape latency: 8 concurrent scrapers against a real uvicorn server while windows are ingested.

Serves a replayed trace whose /metrics has about --series sample lines, runs 8 scraper threads for
--seconds with Prometheus's own Accept header (OpenMetrics first), and writes p50/p90/p99/max latency of all
scrapes and of the first scrape after each new snapshot to bench/results/scrape-latency.json.

    python bench/serve/scrape_latency.py [--series 1000] [--seconds 20]
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np

if not __package__:  # run as a file: import bench.* and graphmon from this checkout (bench/README.md)
    sys.path[0] = str(Path(__file__).resolve().parents[2])

from bench.common import cli  # noqa: E402
from bench.common.agentload import PROMETHEUS_ACCEPT, free_port  # noqa: E402
from bench.common.paths import RESULTS  # noqa: E402
from graphmon.formats.native import write_trace  # noqa: E402
from graphmon.model.trace import GraphInfo, Trace  # noqa: E402
WINDOWS_LINE = re.compile(rb'^graphmon_windows_total\{rank="0"\} ([0-9.e+]+)$', re.M)


def trace_for_series(n_graphs: int, n_streams: int = 4, replays: int = 10, kernels: int = 240) -> Trace:
    """Decode-like replays: n_graphs graphs x n_streams streams, 0.4 µs gaps with jitter."""
    rng = np.random.default_rng(0)
    rows = []
    t, corr = 1_000_000, 1
    graphs = []
    for g in range(n_graphs):
        graphs.append(GraphInfo(key=f"g{g + 1}", graph_id=g + 1, upload_mode=("uploaded", "lazy")[g % 2],
                                label=f"decode_bs{g // 2 + 1}/{('upload', 'no_upload')[g % 2]}"))
    for r in range(replays):
        for g in range(n_graphs):
            for s in range(n_streams):
                st = t + np.cumsum(np.r_[0, 1_000 + 32 * rng.integers(10, 16, kernels - 1)])
                rows.append(np.stack([st, st + 1_000, np.full(kernels, s), np.full(kernels, corr),
                                      np.full(kernels, g + 1)], axis=1))
            t += kernels * 1_500 + 20_000
            corr += 1
    a = np.concatenate(rows)
    return Trace.build(start_ns=a[:, 0], end_ns=a[:, 1], stream=a[:, 2], correlation_id=a[:, 3],
                       graph_id=a[:, 4], graphs=graphs)


def render_ms(trace: Trace, repeats: int = 20) -> dict:
    """Time to render one snapshot of this trace per format, in this process (no HTTP, no other
    load of the server): graphmon's renderers against prometheus_client's encoders."""
    from prometheus_client.exposition import generate_latest
    from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

    from graphmon.export.aggregator import Aggregator
    from graphmon.export.collector import make_registry
    from graphmon.export.exposition import OPENMETRICS, TEXT, render
    from graphmon.model.window import Window

    agg = Aggregator()
    agg.ingest(Window(trace=trace, started_s=time.time() - 1, ended_s=time.time()))
    reg = make_registry(agg.snapshots)
    out = {}
    for name, fn in (("graphmon_openmetrics", lambda: render(reg, OPENMETRICS)), ("graphmon_text", lambda: render(reg, TEXT)),
                     ("prometheus_client_openmetrics", lambda: generate_openmetrics(reg)),
                     ("prometheus_client_text", lambda: generate_latest(reg))):
        ts = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t0) * 1e3)
        out[name] = round(float(np.median(ts)), 2)
    return out


def main(argv=None) -> None:
    ap = cli.parser(__doc__)
    ap.add_argument("--series", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--scrapers", type=int, default=8)
    ap.add_argument("--window-interval-s", type=float, default=1.0, help="the demo's default; live CUPTI: 10 s")
    ap.add_argument("--scrape-interval-ms", type=float, default=100.0,
                    help="each scraper's pause between scrapes: 8 scrapers every 100 ms is 80 scrapes/s, "
                         "hundreds of times a real Prometheus, without saturating the server")
    ap.add_argument("--out", help="default: bench/results/scrape-latency.json")
    args = ap.parse_args(argv)
    if args.smoke:  # 2 s of 2 scrapers on a one-graph trace, windows every 0.25 s; no wrk
        args.series, args.seconds, args.scrapers, args.window_interval_s = 250, 2.0, 2, 0.25
    out = cli.out_path(args.out, RESULTS / "scrape-latency.json", args.smoke)
    # ~ (27 buckets + 2) gap lines + 6 quantile lines + neg per (graph, stream), ~ 180 per graph for replays
    n_graphs = max(1, round(args.series / 250))  # ~250 sample lines per 4-stream graph
    trace = trace_for_series(n_graphs)
    render_median_ms = render_ms(trace)
    # The server runs in its own process (as in production), so scraper threads don't share its GIL.
    tmp = Path(tempfile.mkdtemp()) / "bench.graphmon.npz"
    write_trace(trace, tmp)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "graphmon.cli", "serve", "--replay", str(tmp), "--port", str(port),
                             "--window-interval-s", str(args.window_interval_s), "--speed", "0.05"], stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/metrics"
    status = f"http://127.0.0.1:{port}/status"
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(status).json()["windows_total"] >= 3:
                break
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline or proc.poll() is not None:
            raise SystemExit("graphmon serve did not come up")
        time.sleep(0.1)
    body = httpx.get(url).text
    series = sum(1 for line in body.splitlines() if line and not line.startswith("#"))
    lat: list[float] = []
    first: list[float] = []  # the first scrape (of any scraper) that saw each new snapshot
    seen: set = set()
    seen_lock = threading.Lock()
    errors = 0
    stop = time.monotonic() + args.seconds
    w0 = httpx.get(status).json()["windows_total"]

    def scrape(k):
        nonlocal errors
        with httpx.Client(timeout=10, headers={"Accept": PROMETHEUS_ACCEPT}) as c:
            time.sleep(k * args.scrape_interval_ms / 1e3 / args.scrapers)  # spread the scrapers out
            while time.monotonic() < stop:
                t0 = time.perf_counter()
                r = c.get(url)
                dt = time.perf_counter() - t0
                lat.append(dt)
                errors += r.status_code != 200 or not r.headers.get("content-type", "").startswith(
                    "application/openmetrics-text")
                m = WINDOWS_LINE.search(r.content)
                with seen_lock:
                    if m and m.group(1) not in seen:
                        seen.add(m.group(1))
                        first.append(dt)
                time.sleep(max(0.0, args.scrape_interval_ms / 1e3 - (time.perf_counter() - t0)))

    ths = [threading.Thread(target=scrape, args=(k,)) for k in range(args.scrapers)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    windows = httpx.get(status).json()["windows_total"] - w0
    saturation = None
    if shutil.which("wrk") and not args.smoke:
        # Throughput ceiling: the same scrapers back to back (wrk is C: its own cost stays out).
        r = subprocess.run(["wrk", "-t1", f"-c{args.scrapers}", "-d10s", "--latency", "--timeout", "10s",
                            "-H", f"Accept: {PROMETHEUS_ACCEPT}", url],
                           capture_output=True, text=True)
        pct = dict(re.findall(r"^\s+(50|99)%\s+([\d.]+\w+)", r.stdout, re.M))
        rps = re.search(r"Requests/sec:\s+([\d.]+)", r.stdout)
        saturation = {"scrapes_per_s": float(rps.group(1)) if rps else None, "latency": pct,
                      "note": "closed loop: latency here is queueing behind the other connections"}
    proc.terminate()
    proc.wait(10)
    def pct(values):
        ms = np.array(values) * 1e3
        return {"n": len(values), "p50": round(float(np.percentile(ms, 50)), 2),
                "p90": round(float(np.percentile(ms, 90)), 2), "p99": round(float(np.percentile(ms, 99)), 2),
                "max": round(float(ms.max()), 2)}

    lat_ms = pct(lat)
    nreq = len(lat)
    res = {
        "series_in_metrics": series,
        "scrapers": args.scrapers,
        "seconds": args.seconds,
        "scrape_interval_ms": args.scrape_interval_ms,
        "scrapes": nreq,
        "errors": errors,
        "windows_ingested_during_run": windows,
        "accept": PROMETHEUS_ACCEPT,
        "latency_ms": lat_ms,
        "first_scrape_after_new_snapshot_ms": pct(first),
        "render_one_snapshot_median_ms": render_median_ms,
        "saturation_wrk": saturation,
        "machine": {"cpu": platform.machine(), "python": platform.python_version(), "cpus": os.cpu_count(),
                    "load_average_1m_at_end": round(os.getloadavg()[0], 2)},
        "command": f"python bench/serve/scrape_latency.py --series {args.series} --seconds {args.seconds:g} "
                   f"--window-interval-s {args.window_interval_s:g} --scrape-interval-ms {args.scrape_interval_ms:g}",
        "window_interval_s": args.window_interval_s,
        "note": "Prometheus's Accept header (OpenMetrics); server in its own process, ingesting windows meanwhile; the scraper threads (httpx) share "
                "the machine's 2 cores with it; latency includes the client's HTTP handling",
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
