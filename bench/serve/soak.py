"""Soak: `graphmon serve` replays the real H200 trace for --minutes while 8 scrapers hit it.

The exporter runs in its own process (as in production, where it lives inside the serving
process), so what is measured is graphmon alone: RSS, thread count and open file descriptors
(psutil) at start, every --sample-s and at the end. Scraper threads in this process hit
/metrics and /status and, now and then, POST /capture + GET /trace/{id}.

    python bench/serve/soak.py [--minutes 10] [--window-interval-s 0.25] [--out bench/results/soak.json]

Writes the JSON (all samples + summary) and a short .md next to it. tests/system/test_soak_short.py
calls run_soak() for a one-minute version with assertions.
"""

from __future__ import annotations

import json
import os
import platform
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Optional

import httpx
import psutil

if not __package__:  # run as a file: import bench.* and graphmon from this checkout (bench/README.md)
    sys.path[0] = str(Path(__file__).resolve().parents[2])

from bench.common import cli  # noqa: E402
from bench.common.agentload import free_port, quantile  # noqa: E402
from bench.common.clients import Hostile, Scrapers, get_retrying  # noqa: E402
from bench.common.paths import NATIVE as TRACE, RESULTS, ROOT, MiB  # noqa: E402


def proc_sample(p: psutil.Process, t0: float) -> dict:
    with p.oneshot():
        return {
            "t_s": round(time.monotonic() - t0, 2),
            "rss_bytes": p.memory_info().rss,
            "threads": p.num_threads(),
            "fds": p.num_fds(),
        }


def series_count(metrics_text: str) -> int:
    return sum(1 for line in metrics_text.splitlines() if line and not line.startswith("#"))


def run_soak(minutes: float = 10.0, window_interval_s: float = 0.25, sample_s: float = 10.0,
             warmup_s: Optional[float] = None, trace_store_count: int = 16, trace_store_mib: int = 64,
             scrapers: int = 8, trace: Path = TRACE, max_graphs: int = 64, log=print,
             slow_readers: int = 0, idle_connections: int = 0) -> dict:
    """Run the soak; returns the result document (no assertions here)."""
    port = free_port()
    token = "soak-token"
    # every graph it keeps (and "other") with series of its own: the soak exercises the caps
    env = dict(os.environ, GRAPHMON_TOKEN=token, GRAPHMON_TRACE_STORE_COUNT=str(trace_store_count),
               GRAPHMON_TRACE_STORE_BYTES=str(trace_store_mib * MiB), GRAPHMON_MAX_GRAPHS=str(max_graphs),
               GRAPHMON_DETAIL_GRAPHS=str(max_graphs + 1), PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "graphmon.cli", "serve", "--replay", str(trace), "--port", str(port),
           "--window-interval-s", str(window_interval_s)]
    duration_s = minutes * 60.0
    warmup_s = min(60.0, duration_s / 5) if warmup_s is None else warmup_s
    proc = subprocess.Popen(cmd, env=env, cwd=str(ROOT), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output: list[str] = []
    reader = threading.Thread(target=lambda: output.extend(proc.stdout), daemon=True)  # never let the pipe fill
    reader.start()
    base = f"http://127.0.0.1:{port}"
    p = psutil.Process(proc.pid)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(base + "/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("graphmon serve did not come up:\n" + "".join(output))
            time.sleep(0.1)
        t0 = time.monotonic()
        samples = [dict(proc_sample(p, t0), phase="start", windows_total=0, requests=0)]
        sc = Scrapers(base, n=scrapers, token=token)
        sc.start()
        hostile = Hostile(port, token, slow=slow_readers, idle=idle_connections)
        if slow_readers or idle_connections:
            hostile.start()
        warm: Optional[dict] = None
        next_sample = t0 + min(sample_s, warmup_s) if warmup_s > 0 else t0 + sample_s
        while True:
            now = time.monotonic()
            end = now - t0 >= duration_s
            if now >= next_sample or end:
                s = proc_sample(p, t0)
                st = get_retrying(base + "/status").json()
                mt = get_retrying(base + "/metrics").text
                lat = sc.take_latencies()
                s.update(
                    phase="end" if end else "run",
                    windows_total=st["windows_total"],
                    trace_store_windows=len(st["windows"]),
                    errors_total=st["errors_total"],
                    metrics_series=series_count(mt),
                    metrics_graphs=len(set(re.findall(r'graph="([^"]*)"', mt))),
                    series_folded_total=st["series_folded_total"],
                    metrics_bytes=len(mt),
                    requests=sc.requests,
                    metrics_p50_ms=None if not lat else round(quantile(lat, 0.5) * 1e3, 2),
                    metrics_p99_ms=None if not lat else round(quantile(lat, 0.99) * 1e3, 2),
                )
                if warm is None and s["t_s"] >= warmup_s:
                    warm = s
                    s["phase"] = "warm"
                samples.append(s)
                log(f"soak t={s['t_s']:7.1f}s rss={s['rss_bytes'] / MiB:7.1f} MiB threads={s['threads']} "
                    f"fds={s['fds']} windows={s['windows_total']} requests={s['requests']} "
                    f"series={s['metrics_series']} p99={s['metrics_p99_ms']} ms")
                next_sample = now + sample_s
                if end:
                    break
            if proc.poll() is not None:
                raise RuntimeError("graphmon serve died during the soak:\n" + "".join(output))
            time.sleep(min(0.5, max(0.0, next_sample - time.monotonic())))
        sc.join()
        hostile.join()
        # SIGTERM: the same path as a pod shutdown; time the clean exit.
        t_term = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(30)
        exit_s = time.monotonic() - t_term
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(5)
    warm = warm or samples[1]
    last = samples[-1]
    rss = [s["rss_bytes"] for s in samples]
    series = [s["metrics_series"] for s in samples if "metrics_series" in s]
    store = [s["trace_store_windows"] for s in samples if "trace_store_windows" in s]
    summary = {
        "duration_s": last["t_s"],
        "windows_total": last["windows_total"],
        "requests_total": sc.requests,
        "requests_by_status": sc.by_status,
        "failures": sc.failures,
        "captures": sc.captures,
        "traces_downloaded": sc.traces_ok,
        "trace_download_bytes_max": sc.trace_bytes_max,
        "rss_start_mib": round(samples[0]["rss_bytes"] / MiB, 1),
        "rss_warm_mib": round(warm["rss_bytes"] / MiB, 1),
        "rss_end_mib": round(last["rss_bytes"] / MiB, 1),
        "rss_max_mib": round(max(rss) / MiB, 1),
        "rss_growth_after_warmup_mib": round((last["rss_bytes"] - warm["rss_bytes"]) / MiB, 1),
        "threads_start_warm_end": [samples[0]["threads"], warm["threads"], last["threads"]],
        "threads_max": max(s["threads"] for s in samples),
        "fds_start_warm_end": [samples[0]["fds"], warm["fds"], last["fds"]],
        "fds_max": max(s["fds"] for s in samples),
        "metrics_series_warm_end_max": [warm.get("metrics_series"), last.get("metrics_series"), max(series)],
        "trace_store_windows_max": max(store),
        "metrics_graphs_max": max(s["metrics_graphs"] for s in samples if "metrics_graphs" in s),
        "series_folded_total_end": last.get("series_folded_total"),
        "errors_total_end": last.get("errors_total", {}),
        "slow_readers": slow_readers,
        "slow_trace_requests": hostile.slow_requests,
        "idle_connections": idle_connections,
        "idle_closed_by_server": hostile.idle_closed_by_server,
        "healthz_probes": len(hostile.healthz_s),
        "healthz_failures": hostile.healthz_failures,
        "healthz_p99_ms": None if not hostile.healthz_s else round(quantile(hostile.healthz_s, 0.99) * 1e3, 2),
        "healthz_max_ms": None if not hostile.healthz_s else round(max(hostile.healthz_s) * 1e3, 2),
        "sigterm_exit_code": rc,
        "sigterm_exit_s": round(exit_s, 2),
    }
    return {
        "what": "graphmon serve replaying the real H200 trace; 8 scraper threads (/metrics, /status, "
                "/capture + /trace); psutil samples of the serve process",
        "command": " ".join(cmd[1:]).replace(str(ROOT) + "/", ""),
        "config": {"minutes": minutes, "window_interval_s": window_interval_s, "sample_s": sample_s,
                   "warmup_s": warmup_s, "trace_store_count": trace_store_count,
                   "trace_store_mib": trace_store_mib, "scrapers": scrapers, "max_graphs": max_graphs,
                   "trace": str(trace.relative_to(ROOT)), "slow_readers": slow_readers,
                   "idle_connections": idle_connections},
        "environment": {"python": platform.python_version(), "platform": platform.platform(),
                        "cpus": os.cpu_count()},
        "summary": summary,
        "samples": samples,
    }


def write_md(doc: dict, path: Path) -> None:
    s, c = doc["summary"], doc["config"]
    lines = [
        "# Soak: bounded resources",
        "",
        f"`{doc['command']}` for {s['duration_s'] / 60:.1f} min (window every {c['window_interval_s']} s, "
        f"{c['scrapers']} scrapers, trace store {c['trace_store_count']} windows / {c['trace_store_mib']} MiB), "
        f"Python {doc['environment']['python']}, {doc['environment']['cpus']} CPUs. Raw samples: `{path.with_suffix('.json').name}`.",
        "",
        "| | start | after warm-up | end | max |",
        "|---|---|---|---|---|",
        f"| RSS (MiB) | {s['rss_start_mib']} | {s['rss_warm_mib']} | {s['rss_end_mib']} | {s['rss_max_mib']} |",
        f"| threads | {' | '.join(map(str, s['threads_start_warm_end']))} | {s['threads_max']} |",
        f"| open fds | {' | '.join(map(str, s['fds_start_warm_end']))} | {s['fds_max']} |",
        f"| /metrics series | - | {s['metrics_series_warm_end_max'][0]} | {s['metrics_series_warm_end_max'][1]} "
        f"| {s['metrics_series_warm_end_max'][2]} |",
        "",
        f"- RSS growth after warm-up: {s['rss_growth_after_warmup_mib']} MiB",
        f"- windows ingested: {s['windows_total']}; requests: {s['requests_total']} {s['requests_by_status']}; "
        f"failures: {len(s['failures'])}",
        f"- captures: {s['captures']}, traces downloaded: {s['traces_downloaded']} "
        f"(largest {s['trace_download_bytes_max'] / MiB:.1f} MiB); trace store held at most "
        f"{s['trace_store_windows_max']} windows",
        f"- contained errors at the end: {s['errors_total_end'] or 'none'}",
        f"- hostile clients: {s.get('slow_readers', 0)} slow /trace readers at a time "
        f"({s.get('slow_trace_requests', 0)} requests, never read), {s.get('idle_connections', 0)} idle connections "
        f"({s.get('idle_closed_by_server', 0)} closed by the server); /healthz every 0.2 s: "
        f"p99 {s.get('healthz_p99_ms')} ms, max {s.get('healthz_max_ms')} ms, {s.get('healthz_failures', 0)} failures",
        f"- SIGTERM: exit code {s['sigterm_exit_code']} after {s['sigterm_exit_s']} s",
        "",
    ]
    path.write_text("\n".join(lines))


def main(argv=None) -> int:
    ap = cli.parser(__doc__)
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--window-interval-s", type=float, default=0.25)
    ap.add_argument("--sample-s", type=float, default=10.0)
    ap.add_argument("--scrapers", type=int, default=8)
    ap.add_argument("--slow-readers", type=int, default=24, help="/trace requests that are never read")
    ap.add_argument("--idle-connections", type=int, default=100, help="sockets that connect and send nothing")
    ap.add_argument("--out", type=Path, help="default: bench/results/soak.json")
    args = ap.parse_args(argv)
    if args.smoke:  # 6 s, a few clients of each kind
        args.minutes, args.sample_s, args.scrapers, args.slow_readers, args.idle_connections = 0.1, 2.0, 2, 2, 4
    out = cli.out_path(args.out, RESULTS / "soak.json", args.smoke)
    doc = run_soak(minutes=args.minutes, window_interval_s=args.window_interval_s, sample_s=args.sample_s,
                   scrapers=args.scrapers, log=lambda m: print(m, flush=True), warmup_s=2.0 if args.smoke else None,
                   slow_readers=args.slow_readers, idle_connections=args.idle_connections)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    write_md(doc, out.with_suffix(".md"))
    print(json.dumps(doc["summary"], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
