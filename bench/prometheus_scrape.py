"""scrape_duration_seconds as a real Prometheus sees it: `graphmon serve` scraped at a normal interval.

Starts `graphmon serve` (the synthetic trace of bench/scrape_latency.py, ~1,000 series; a window
every second) and a `prometheus` that scrapes it every --scrape-interval-s, waits --seconds, then
reads every sample of scrape_duration_seconds back through the HTTP API and writes p50/p90/p99/max
to bench/results/prometheus-scrape.json. Prometheus negotiates the format itself (OpenMetrics).

    python bench/prometheus_scrape.py [--seconds 120] [--scrape-interval-s 1]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from agentload import free_port  # noqa: E402
from scrape_latency import trace_for_series  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--series", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=120.0)
    ap.add_argument("--scrape-interval-s", type=float, default=1.0)
    ap.add_argument("--out", default=str(ROOT / "bench/results/prometheus-scrape.json"))
    args = ap.parse_args()
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        raise SystemExit("prometheus not found")
    tmp = Path(tempfile.mkdtemp())
    from graphmon.formats.native import write_trace

    write_trace(trace_for_series(max(1, round(args.series / 250))), tmp / "bench.graphmon.npz")
    port, prom_port = free_port(), free_port()
    procs = [subprocess.Popen([sys.executable, "-m", "graphmon.cli", "serve", "--replay", str(tmp / "bench.graphmon.npz"),
                               "--port", str(port), "--speed", "0.05"], stderr=subprocess.DEVNULL)]
    iv = f"{args.scrape_interval_s:g}s"
    (tmp / "prometheus.yml").write_text(yaml.safe_dump({
        "global": {"scrape_interval": iv, "scrape_timeout": iv},
        "scrape_configs": [{"job_name": "graphmon", "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}]}))
    procs.append(subprocess.Popen([prometheus, f"--config.file={tmp / 'prometheus.yml'}",
                                   f"--storage.tsdb.path={tmp / 'data'}", f"--web.listen-address=127.0.0.1:{prom_port}",
                                   "--log.level=warn"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    base = f"http://127.0.0.1:{prom_port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(base + "/-/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("prometheus did not come up")
            time.sleep(0.2)
        time.sleep(args.seconds)
        rng = f"{int(args.seconds)}s"
        res = httpx.get(base + "/api/v1/query", params={"query": f"scrape_duration_seconds[{rng}]"}).json()
        vals = np.array([float(v) for _, v in res["data"]["result"][0]["values"]]) * 1e3
        series = httpx.get(base + "/api/v1/query", params={"query": "scrape_samples_scraped"}).json()
        n_series = int(float(series["data"]["result"][0]["value"][1]))
        up = httpx.get(base + "/api/v1/query", params={"query": f"min_over_time(up[{rng}])"}).json()
    finally:
        for p in procs:
            p.terminate()
            p.wait(10)
    doc = {
        "what": "scrape_duration_seconds of a real Prometheus scraping `graphmon serve` (the synthetic trace of "
                "scrape_latency.py for --series, at the default cardinality level; a window every second); every "
                "sample over the run",
        "command": "python bench/prometheus_scrape.py " + " ".join(sys.argv[1:]),
        "prometheus": subprocess.run([prometheus, "--version"], capture_output=True, text=True).stdout.split("\n")[0],
        "scrape_interval_s": args.scrape_interval_s, "seconds": args.seconds, "samples_per_scrape": n_series,
        "scrapes": len(vals), "up_min": float(up["data"]["result"][0]["value"][1]),
        "scrape_duration_ms": {q: round(float(np.percentile(vals, p)), 2) for q, p in
                               (("p50", 50), ("p90", 90), ("p99", 99))} | {"max": round(float(vals.max()), 2)},
        "machine": {"cpus": os.cpu_count(), "load_average_1m_at_end": round(os.getloadavg()[0], 2)},
    }
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
