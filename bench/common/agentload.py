"""Shared by the agent benchmarks (agent/agent_scale.py, agent/soak_agent.py): a real `graphmon agent` in
a process of its own, fake collectors that speak to it through the real light collector's link
(graphmon.host.link.Link: the Unix socket, the wire format, heartbeats, its bounded queue) with
windows cut from the real H200 trace, scrapers with Prometheus's Accept header, and psutil
samples of the agent's CPU, RSS, threads and descriptors.

    python bench/common/agentload.py --socket S --collectors 8 --rate 1 --duration 60 --out stats.json

runs the collectors alone (the benchmarks start them in a process apart from the one that
scrapes, so the two do not share a GIL).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Optional

if not __package__:  # run as a file (the collectors' process): import bench.* and graphmon from this checkout
    sys.path[0] = str(Path(__file__).resolve().parents[2])

from bench.common.paths import NATIVE as TRACE, ROOT  # noqa: E402

# What Prometheus sends (scrape.go): OpenMetrics first. A scrape with this header takes the path
# real scrapes take; `Accept: */*` (text) is not what a real scrape measures.
PROMETHEUS_ACCEPT = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
                     "text/plain;version=0.0.4;q=0.5,*/*;q=0.1")


def quantile(xs: list[float], q: float) -> Optional[float]:
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


# ---------------------------------------------------------------------- windows and collectors
def window_records(n_records: int = 20_000, trace_path: Path = TRACE):
    """A light collector's window (unfiltered records) of whole replays of the real H200 trace,
    about ``n_records`` kernels, as graphmon.host.link ships it."""
    import numpy as np

    from graphmon.formats.read import read_trace
    from graphmon.model.trace import KERNEL_COLUMNS
    from graphmon.model.window import WindowRecords

    t = read_trace(str(trace_path))
    corr, counts = np.unique(t.correlation_id, return_counts=True)  # replays in launch order
    take = corr[: max(1, int(np.searchsorted(np.cumsum(counts), n_records)) + 1)]
    rows = np.flatnonzero(np.isin(t.correlation_id, take))
    lrows = np.flatnonzero(np.isin(t.launches["correlation_id"], take))
    now = time.time()
    return WindowRecords(kernels={k: np.ascontiguousarray(getattr(t, k)[rows]) for k in KERNEL_COLUMNS},
                         launches={k: np.ascontiguousarray(v[lrows]) for k, v in t.launches.items()},
                         names=list(t.names), graphs=list(t.graphs), started_s=now - 0.02, ended_s=now)


class FakeCollector:
    """One process's light collector as the agent sees it: graphmon's own Link, an identity
    with a rank, a status, and windows of real records at ``rate_hz`` (0: as fast as the link's
    socket takes them)."""

    def __init__(self, path: str, rank: str, records, rate_hz: float, pid: int = 0) -> None:
        from graphmon.host.link import Link

        self.rank, self.records, self.rate_hz = rank, records, rate_hz
        self.pid = pid or os.getpid()
        self.windows = 0
        self.link = Link(path, hello=self._hello, status=self._status, on_capture=lambda req: None,
                         reconnect_max_s=1.0)

    def _hello(self) -> dict:
        return {"rank": self.rank, "rank_source": "RANK", "pid": str(self.pid), "host": socket.gethostname(),
                "device": "0", "interval_s": 1.0 if self.rate_hz == 0 else 1.0 / self.rate_hz, "first_window_s": 0.0}

    def _status(self) -> dict:
        return {"state": "running", "reason": "", "errors": {}, "windows": self.windows, "empty_windows": 0}

    def start(self) -> None:
        self.link.start()

    def run(self, stop: threading.Event) -> None:
        import dataclasses

        period = 1.0 / self.rate_hz if self.rate_hz else 0.0
        next_t = time.monotonic()
        while not stop.is_set():
            if period:
                wait = next_t - time.monotonic()
                if wait > 0 and stop.wait(wait):
                    break
                next_t += period
            elif len(self.link.queue) >= 2:  # as fast as the socket takes windows, never churning the queue
                stop.wait(0.001)
                continue
            now = time.time()
            self.link.send_window(dataclasses.replace(self.records, started_s=now - 0.02, ended_s=now),
                                  status=self._status())
            self.windows += 1

    def stats(self) -> dict:
        return {"rank": self.rank, "windows": self.windows, **{k: v for k, v in self.link.stats.items()}}


def run_collectors(path: str, n: int, rate_hz: float, duration_s: float, n_records: int, rank_prefix: str = "",
                   stop: Optional[threading.Event] = None) -> list[dict]:
    records = window_records(n_records)
    stop = stop or threading.Event()
    cols = [FakeCollector(path, f"{rank_prefix}{i}", records, rate_hz, pid=100_000 + i) for i in range(n)]
    for c in cols:
        c.start()
    threads = [threading.Thread(target=c.run, args=(stop,), daemon=True) for c in cols]
    for t in threads:
        t.start()
    stop.wait(duration_s)
    stop.set()
    for t in threads:
        t.join(10)
    time.sleep(1.5)  # the links send what is queued
    for c in cols:
        c.link.stop(timeout_s=3)
    return [c.stats() for c in cols]


class CollectorProcess:
    """run_collectors in a process of its own (python bench/common/agentload.py ...)."""

    def __init__(self, path: str, n: int, rate_hz: float, duration_s: float, n_records: int = 20_000,
                 rank_prefix: str = "") -> None:
        self.out = Path(tempfile.mkstemp(prefix="graphmon-agentload-", suffix=".json")[1])
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__)), "--socket", path, "--collectors", str(n),
                                      "--rate", str(rate_hz), "--duration", str(duration_s), "--records", str(n_records),
                                      "--rank-prefix", rank_prefix, "--out", str(self.out)], cwd=str(ROOT))

    def result(self, timeout_s: float) -> list[dict]:
        self.proc.wait(timeout_s)
        try:
            return json.loads(self.out.read_text())
        finally:
            self.out.unlink(missing_ok=True)


# ---------------------------------------------------------------------- the agent under test
class AgentProcess:
    """`graphmon agent` as shipped, in a process of its own; psutil samples of it."""

    def __init__(self, env: Optional[dict] = None, tree: Optional[Path] = None) -> None:
        """``tree``: a checkout of another graphmon version to run instead (side-by-side runs)."""
        import psutil

        self.dir = tempfile.mkdtemp(prefix="graphmon-agent-bench-")
        self.socket = os.path.join(self.dir, "agent.sock")
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.output: list[str] = []
        cmd = [sys.executable, "-m", "graphmon.cli", "agent", "--socket", self.socket, "--port", str(self.port)]
        extra = {"PYTHONPATH": str(tree)} if tree is not None else {}
        self.proc = subprocess.Popen(cmd, cwd=str(tree or ROOT), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1", **extra, **(env or {})}, text=True)
        threading.Thread(target=lambda: self.output.extend(self.proc.stdout), daemon=True).start()
        self.ps = psutil.Process(self.proc.pid)
        deadline = time.monotonic() + 60
        import httpx

        while True:
            try:
                if httpx.get(self.base + "/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("graphmon agent did not come up:\n" + "".join(self.output))
            time.sleep(0.1)
        self._cpu0, self._t0 = self.cpu_s(), time.monotonic()

    def cpu_s(self) -> float:
        t = self.ps.cpu_times()
        return t.user + t.system

    def sample(self) -> dict:
        with self.ps.oneshot():
            return {"t_s": round(time.monotonic() - self._t0, 2), "cpu_s": round(self.cpu_s() - self._cpu0, 3),
                    "rss_bytes": self.ps.memory_info().rss, "threads": self.ps.num_threads(), "fds": self.ps.num_fds()}

    def stop(self) -> tuple[int, float]:
        t = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        try:
            os.rmdir(self.dir)
        except OSError:
            pass
        return rc, time.monotonic() - t


class Scraper:
    """A Prometheus-like scraper: /metrics with Prometheus's Accept header every ``every_s``,
    latency of each; 0: back to back."""

    def __init__(self, base: str, every_s: float = 1.0, path: str = "/metrics", accept: str = PROMETHEUS_ACCEPT):
        self.base, self.every_s, self.path, self.accept = base, every_s, path, accept
        self.latencies_s: list[float] = []
        self.failures = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> "Scraper":
        self.thread.start()
        return self

    def _run(self) -> None:
        import httpx

        with httpx.Client(base_url=self.base, timeout=30, headers={"accept": self.accept}) as c:
            while not self.stop.is_set():
                t = time.perf_counter()
                try:
                    ok = c.get(self.path).status_code == 200
                except httpx.HTTPError:
                    ok = False
                self.latencies_s.append(time.perf_counter() - t)
                self.failures += not ok
                if self.every_s:
                    self.stop.wait(self.every_s)

    def join(self) -> dict:
        self.stop.set()
        self.thread.join(60)
        lat = self.latencies_s
        return {"scrapes": len(lat), "failures": self.failures,
                "p50_ms": None if not lat else round(quantile(lat, 0.5) * 1e3, 1),
                "p99_ms": None if not lat else round(quantile(lat, 0.99) * 1e3, 1),
                "max_ms": None if not lat else round(max(lat) * 1e3, 1)}


def metric_sum(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` (exact sample name) whose labels include ``labels``."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name) or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        sample = head.split("{", 1)[0]
        if sample != name or not all(f'{k}="{v}"' in head for k, v in labels.items()):
            continue
        total += float(value)
    return total


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="fake collectors against a graphmon agent's socket")
    ap.add_argument("--socket", required=True)
    ap.add_argument("--collectors", type=int, default=8)
    ap.add_argument("--rate", type=float, default=1.0, help="windows per second per collector; 0: as fast as possible")
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--records", type=int, default=20_000)
    ap.add_argument("--rank-prefix", default="")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    stats = run_collectors(args.socket, args.collectors, args.rate, args.duration, args.records, args.rank_prefix, stop)
    args.out.write_text(json.dumps(stats))
    return 0


if __name__ == "__main__":
    sys.exit(main())
