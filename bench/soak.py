"""Soak: `graphmon serve` replays the real H200 trace for --minutes while 8 scrapers hit it.

The exporter runs in its own process (as in production, where it lives inside the serving
process), so what is measured is graphmon alone: RSS, thread count and open file descriptors
(psutil) at start, every --sample-s and at the end. Scraper threads in this process hit
/metrics and /status and, now and then, POST /capture + GET /trace/{id}.

    python bench/soak.py [--minutes 10] [--window-interval-s 0.25] [--out bench/results/soak.json]

Writes the JSON (all samples + summary) and a short .md next to it. tests/test_soak_short.py
calls run_soak() for a one-minute version with assertions.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Optional

import httpx
import psutil

from agentload import free_port

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "tests" / "data" / "h200-cupti-decode-v1.graphmon.npz"
MiB = 2**20


def proc_sample(p: psutil.Process, t0: float) -> dict:
    with p.oneshot():
        return {
            "t_s": round(time.monotonic() - t0, 2),
            "rss_bytes": p.memory_info().rss,
            "threads": p.num_threads(),
            "fds": p.num_fds(),
        }


class Scrapers:
    """8 threads against the server; every thread counts its own requests, statuses and latencies."""

    def __init__(self, base: str, n: int = 8, capture_every: int = 50, token: Optional[str] = None):
        self.base, self.n, self.capture_every = base, n, capture_every
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.requests = 0
        self.by_status: dict[str, int] = {}
        self.failures: list[str] = []  # non-2xx (other than 404 of an evicted trace) and transport errors
        self.latencies_s: list[float] = []  # /metrics only, since the last take_latencies()
        self.captures = self.traces_ok = 0
        self.trace_bytes_max = 0
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(n)]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def join(self, timeout_s: float = 30.0) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout_s)

    def take_latencies(self) -> list[float]:
        with self.lock:
            out, self.latencies_s = self.latencies_s, []
        return out

    def _count(self, path: str, r: Optional[httpx.Response], err: Optional[str] = None, ok=(200,)) -> None:
        with self.lock:
            self.requests += 1
            key = str(r.status_code) if r is not None else "error"
            self.by_status[key] = self.by_status.get(key, 0) + 1
            if r is None or r.status_code not in ok:
                if len(self.failures) < 50:
                    self.failures.append(f"{path}: {err or r.status_code}")

    def _run(self, i: int) -> None:
        k = 0
        with httpx.Client(base_url=self.base, timeout=30.0) as c:
            while not self.stop.is_set():
                k += 1
                try:
                    if k % self.capture_every == i % self.capture_every and i % 2 == 0:
                        self._capture(c)
                    elif k % 4 == 0:
                        r = c.get("/status")
                        self._count("/status", r)
                    else:
                        t = time.perf_counter()
                        r = c.get("/metrics")
                        dt = time.perf_counter() - t
                        self._count("/metrics", r)
                        with self.lock:
                            self.latencies_s.append(dt)
                except httpx.HTTPError as e:
                    self._count("?", None, repr(e))
                    self.stop.wait(0.2)

    def _capture(self, c: httpx.Client) -> None:
        r = c.post("/capture", json={"replays": 5, "wait_s": 10}, headers=self.headers)
        self._count("/capture", r)
        if r.status_code != 200:
            return
        with self.lock:
            self.captures += 1
        tid = r.json()["id"]
        t = c.get(f"/trace/{tid}", headers=self.headers)
        # 404: evicted before we asked (the store is bounded); 503/429: the download cap and the
        # render budget (slow readers hold the slots); anything else is a failure
        self._count("/trace", t, ok=(200, 404, 429, 503))
        if t.status_code == 200:
            with self.lock:
                self.traces_ok += 1
                self.trace_bytes_max = max(self.trace_bytes_max, len(t.content))


class Hostile:
    """What a careless or hostile client does (issue 18): ``slow`` sockets that request a trace
    and never read the answer, ``idle`` sockets that connect and send nothing (reopened when the
    server closes them), and a /healthz probe every 0.2 s whose latency is recorded."""

    def __init__(self, port: int, token: str, slow: int = 24, idle: int = 100):
        self.port, self.token, self.n_slow, self.n_idle = port, token, slow, idle
        self.stop = threading.Event()
        self.healthz_s: list[float] = []
        self.healthz_failures = 0
        self.idle_closed_by_server = 0
        self.slow_requests = 0
        self.threads = [threading.Thread(target=f, daemon=True) for f in (self._slow, self._idle, self._probe)]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def join(self) -> None:
        self.stop.set()
        for t in self.threads:
            if t.ident is not None:  # started
                t.join(30)

    def _sock(self) -> socket.socket:
        s = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a reader that takes nothing
        return s

    def _slow(self) -> None:
        socks: list[socket.socket] = []
        while not self.stop.is_set():
            try:
                ids = _get(f"http://127.0.0.1:{self.port}/status").json()["windows"]
                for s in socks:
                    s.close()
                socks = []
                for k in range(self.n_slow if ids else 0):
                    s = self._sock()
                    s.sendall(f"GET /trace/{ids[-1 - k % len(ids)]} HTTP/1.1\r\nHost: x\r\n"
                              f"Authorization: Bearer {self.token}\r\n\r\n".encode())
                    socks.append(s)
                    self.slow_requests += 1
            except (OSError, httpx.HTTPError, KeyError):
                pass
            self.stop.wait(10.0)  # hold them, then open a fresh set on newer windows
        for s in socks:
            s.close()

    def _idle(self) -> None:
        socks: list[socket.socket] = []
        while not self.stop.is_set():
            alive = []
            for s in socks:
                s.setblocking(False)
                try:
                    if s.recv(1) == b"":
                        self.idle_closed_by_server += 1
                        s.close()
                        continue
                except BlockingIOError:
                    pass
                except OSError:
                    self.idle_closed_by_server += 1
                    s.close()
                    continue
                alive.append(s)
            socks = alive
            try:
                while len(socks) < self.n_idle:
                    socks.append(self._sock())
            except OSError:
                pass
            self.stop.wait(0.5)
        for s in socks:
            s.close()

    def _probe(self) -> None:
        with httpx.Client(timeout=30) as c:
            while not self.stop.is_set():
                t = time.perf_counter()
                try:
                    ok = c.get(f"http://127.0.0.1:{self.port}/healthz").status_code == 200
                except httpx.HTTPError:
                    ok = False
                self.healthz_s.append(time.perf_counter() - t)
                self.healthz_failures += not ok
                self.stop.wait(0.2)


def _get(url: str, tries: int = 5) -> httpx.Response:
    # The sampler's own requests retry: with the idle-connection flood on, the server's connection
    # cap may evict a fresh connection before its request head arrives (a reset, by design).
    for k in range(tries):
        try:
            return httpx.get(url, timeout=30)
        except httpx.TransportError:
            if k == tries - 1:
                raise
            time.sleep(0.2)
    raise AssertionError("unreachable")


def series_count(metrics_text: str) -> int:
    return sum(1 for line in metrics_text.splitlines() if line and not line.startswith("#"))


def quantile(xs: list[float], q: float) -> Optional[float]:
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


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
                st = _get(base + "/status").json()
                mt = _get(base + "/metrics").text
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
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--window-interval-s", type=float, default=0.25)
    ap.add_argument("--sample-s", type=float, default=10.0)
    ap.add_argument("--scrapers", type=int, default=8)
    ap.add_argument("--slow-readers", type=int, default=24, help="/trace requests that are never read")
    ap.add_argument("--idle-connections", type=int, default=100, help="sockets that connect and send nothing")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "soak.json")
    args = ap.parse_args(argv)
    doc = run_soak(minutes=args.minutes, window_interval_s=args.window_interval_s, sample_s=args.sample_s,
                   scrapers=args.scrapers, log=lambda m: print(m, flush=True),
                   slow_readers=args.slow_readers, idle_connections=args.idle_connections)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    write_md(doc, args.out.with_suffix(".md"))
    print(json.dumps(doc["summary"], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
