"""Agent scale: 1, 8 and 64 fake collectors against one `graphmon agent`, at 1 window/s each
(20k real H200 records per window) and at their maximum rate.

Each collector is graphmon's own link (bench/common/agentload.py: real Unix socket, real wire format,
heartbeats); the collectors run in a process apart from this one, which scrapes /metrics once a
second with Prometheus's Accept header and samples the agent with psutil. Per case: processes
lost, windows sent / ingested / dropped (by the collector's link and by the agent, with the
reason), records ingested, the agent's CPU (cores) and RSS, scrape p50/p99.

    python bench/agent/agent_scale.py [--seconds 60] [--max-seconds 30] [--out bench/results/agent-scale.json]
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from pathlib import Path

import httpx

if not __package__:  # run as a file: import bench.* and graphmon from this checkout (bench/README.md)
    sys.path[0] = str(Path(__file__).resolve().parents[2])

from bench.common import cli  # noqa: E402
from bench.common.agentload import AgentProcess, CollectorProcess, Scraper, load_average, metric_sum  # noqa: E402
from bench.common.paths import RESULTS, MiB  # noqa: E402

CASES = [(1, 1.0), (8, 1.0), (64, 1.0), (1, 0.0), (8, 0.0), (64, 0.0)]


def run_case(n: int, rate_hz: float, seconds: float, records: int = 20_000, log=print, tree=None) -> dict:
    agent = AgentProcess(tree=tree)
    try:
        start = agent.sample()
        load0 = load_average()
        senders = CollectorProcess(agent.socket, n, rate_hz, seconds, records)
        # Prometheus scrapes every 15-60 s; once a second here, so the p99 has enough samples
        scraper = Scraper(agent.base, every_s=1.0).start()
        samples, t0 = [start], time.monotonic()
        while senders.proc.poll() is None and time.monotonic() - t0 < seconds + 60:
            time.sleep(5)
            samples.append(agent.sample())
        links = senders.result(timeout_s=120)
        time.sleep(2.0)  # the agent ingests what is queued
        scrape = scraper.join()
        text = httpx.get(agent.base + "/metrics", timeout=30).text
        status = httpx.get(agent.base + "/status", timeout=30).json()
        end = agent.sample()
        samples.append(end)
        busy_s = max(1e-9, samples[-2]["t_s"] - start["t_s"]) if len(samples) > 2 else end["t_s"]
        cpu_busy = samples[-2]["cpu_s"] - start["cpu_s"] if len(samples) > 2 else end["cpu_s"]
        sent = sum(c["windows_sent"] for c in links)
        doc = {
            "collectors": n, "rate_per_s": rate_hz or "max", "seconds": seconds, "records_per_window": records,
            "processes_attached_end": sum(p["state"] != "lost" and p["state"] != "stopped" for p in status["processes"]),
            "processes_lost": metric_sum(text, "graphmon_processes_lost_total"),
            "windows_made": sum(c["windows"] for c in links),
            "windows_sent": sent,
            "windows_dropped_by_link": sum(c["windows_dropped"] for c in links),
            "link_reconnects": sum(c["reconnects"] for c in links),
            "windows_ingested": metric_sum(text, "graphmon_windows_total"),
            "windows_dropped_by_agent": {r: metric_sum(text, "graphmon_agent_windows_dropped_total", reason=r)
                                         for r in ("queue_full", "memory", "invalid")},
            "records_ingested": metric_sum(text, "graphmon_records_total"),
            "ingested_windows_per_s": round(metric_sum(text, "graphmon_windows_total") / seconds, 1),
            "agent_cpu_cores": round(cpu_busy / busy_s, 3),
            "agent_rss_mib_start_end_max": [round(start["rss_bytes"] / MiB, 1), round(end["rss_bytes"] / MiB, 1),
                                            round(max(s["rss_bytes"] for s in samples) / MiB, 1)],
            "agent_threads_max": max(s["threads"] for s in samples),
            "agent_fds_max": max(s["fds"] for s in samples),
            "trace_store_mib": round(metric_sum(text, "graphmon_agent_trace_store_bytes") / MiB, 1),
            "scrape_prometheus_accept": scrape,
            "metrics_bytes": len(text.encode()),
            "load_average_start_end": [load0, load_average()],
            "samples": samples,
        }
        doc["code"] = "this tree" if tree is None else str(tree)
        log(f"[{doc['code']}] {n:3d} collectors @ {doc['rate_per_s']}/s: lost {doc['processes_lost']:.0f}, sent {sent}, "
            f"ingested {doc['windows_ingested']:.0f}, agent dropped {doc['windows_dropped_by_agent']}, link dropped "
            f"{doc['windows_dropped_by_link']}, cpu {doc['agent_cpu_cores']} cores, rss {doc['agent_rss_mib_start_end_max']} "
            f"MiB, scrape p50 {scrape['p50_ms']} p99 {scrape['p99_ms']} ms, load {doc['load_average_start_end']}")
        return doc
    finally:
        rc, _ = agent.stop()


def main(argv=None) -> int:
    ap = cli.parser(__doc__)
    ap.add_argument("--seconds", type=float, default=60.0, help="length of each 1 window/s case")
    ap.add_argument("--max-seconds", type=float, default=30.0, help="length of each maximum-rate case")
    ap.add_argument("--records", type=int, default=20_000)
    ap.add_argument("--cases", default="", help="e.g. 1:1,64:max (default: 1, 8, 64 at 1/s and at max)")
    ap.add_argument("--compare-tree", type=Path, default=None,
                    help="a checkout of an older graphmon: each case runs its agent too, right before this one's")
    ap.add_argument("--out", type=Path, help="default: bench/results/agent-scale.json")
    args = ap.parse_args(argv)
    if args.smoke:  # one collector, 3 s, small windows
        args.cases, args.seconds, args.records = "1:1", 3.0, 2_000
    out = cli.out_path(args.out, RESULTS / "agent-scale.json", args.smoke)
    cases = CASES if not args.cases else [(int(n), 0.0 if r == "max" else float(r))
                                          for n, r in (c.split(":") for c in args.cases.split(","))]
    results = []
    for n, rate in cases:
        for tree in ([args.compare_tree] if args.compare_tree else []) + [None]:
            results.append(run_case(n, rate, args.seconds if rate else args.max_seconds, args.records,
                                    log=lambda m: print(m, flush=True), tree=tree))
    doc = {
        "what": "one `graphmon agent` (its own process) and N fake collectors (graphmon.host.link.Link over the real "
                "Unix socket and wire format, windows of whole replays of the real H200 trace) in another process; "
                "/metrics scraped once a second with Prometheus's Accept header; psutil samples of the agent",
        "command": "python bench/agent/agent_scale.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": "a shared 2-core machine with other work running (load averages per case below): the agent, "
                   "the collectors' process and the scraper share the two cores",
        "environment": {"python": platform.python_version(), "platform": platform.platform(), "cpus": os.cpu_count()},
        "cases": results,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
