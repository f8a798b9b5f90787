"""HTTP clients of the soaks (serve/soak.py, agent/soak_agent.py): well-behaved scrapers, and
what careless or hostile clients do to an HTTP port."""

from __future__ import annotations

import socket
import threading
import time
from typing import Optional

import httpx

class Threads:
    """Daemon threads that run until ``stop`` is set: start() them, join() sets stop and waits
    for each that was started."""

    threads: list[threading.Thread]
    stop: threading.Event

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def join(self, timeout_s: float = 30.0) -> None:
        self.stop.set()
        for t in self.threads:
            if t.ident is not None:  # started
                t.join(timeout_s)


class Scrapers(Threads):
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


class Hostile(Threads):
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

    def _sock(self) -> socket.socket:
        s = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a reader that takes nothing
        return s

    def _slow(self) -> None:
        socks: list[socket.socket] = []
        while not self.stop.is_set():
            try:
                ids = get_retrying(f"http://127.0.0.1:{self.port}/status").json()["windows"]
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


def get_retrying(url: str, tries: int = 5) -> httpx.Response:
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
