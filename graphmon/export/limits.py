"""The HTTP server's own limits: connection cap, header-read timeout, rate-limited logs, bind.

uvicorn (0.55) offers ``timeout_keep_alive`` (idle time *between* requests),
``h11_max_incomplete_event_size`` (header size) and ``limit_concurrency`` (a 503 once a request
arrives while too many connections are open). It has no header-read timeout and no cap on open
connections: a socket that sends nothing, or a header a byte at a time, is kept forever, and
300 of them exhaust a 256-descriptor limit. So graphmon subclasses uvicorn's protocol (h11 or
httptools, whichever uvicorn picks) with two rules:

* a connection must deliver a complete request head within ``header_timeout_s`` of connecting
  (or of its first byte after a finished response), else it is closed;
* at most ``max_connections`` are open: a new one evicts the connection idle the longest (one
  waiting for a request head), and is closed itself only when every other one is busy. So
  slowloris sockets cannot lock a scraper out.
"""

from __future__ import annotations

import logging
import resource
import socket
import threading
import time
from typing import Any

log = logging.getLogger("graphmon")

HEADER_LIMIT_BYTES = 16 * 1024  # request line + headers; h11 refuses more (431)
LOG_WINDOW_S = 10.0
LOG_PER_WINDOW = 5


class ConnectionStats:
    def __init__(self) -> None:
        self.header_timeouts = 0
        self.evicted = 0
        self.refused = 0


def limited_protocol(base: type, max_connections: int, header_timeout_s: float, stats: ConnectionStats) -> type:
    class Limited(base):  # type: ignore[misc, valid-type]
        _gm_timer: Any = None
        _gm_last = 0.0
        _gm_served = False

        def connection_made(self, transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._gm_last = time.monotonic()
            self._gm_arm()
            conns = self.server_state.connections
            if sum(1 for c in conns if c.transport is not None and not c.transport.is_closing()) > max_connections:
                idle = [c for c in conns if c is not self and getattr(c, "_gm_idle", lambda: False)()
                        and c.transport is not None and not c.transport.is_closing()]
                if idle:
                    # a connection that never completed a request goes first (idle or slowloris), then
                    # the keep-alive one idle longest: scrapers that reuse connections survive floods
                    min(idle, key=lambda c: (c._gm_served, c._gm_last))._gm_close()
                    stats.evicted += 1
                else:
                    stats.refused += 1
                    self._gm_close()

        def _gm_idle(self) -> bool:
            c = self.cycle
            return c is None or c.response_complete

        def _gm_arm(self) -> None:
            if self._gm_timer is None:
                self._gm_timer = self.loop.call_later(header_timeout_s, self._gm_expire)

        def _gm_disarm(self) -> None:
            if self._gm_timer is not None:
                self._gm_timer.cancel()
                self._gm_timer = None

        def _gm_expire(self) -> None:
            self._gm_timer = None
            if self._gm_idle():
                stats.header_timeouts += 1
                self._gm_close()

        def _gm_close(self) -> None:
            self._gm_disarm()
            if self.transport is not None and not self.transport.is_closing():
                self.transport.close()

        def data_received(self, data: bytes) -> None:
            self._gm_last = time.monotonic()
            if self._gm_idle():
                self._gm_arm()  # a new request head starts: it has header_timeout_s to complete
            super().data_received(data)
            if not self._gm_idle():
                self._gm_served = True
                self._gm_disarm()

        def connection_lost(self, exc) -> None:
            self._gm_disarm()
            super().connection_lost(exc)

    Limited.__name__ = f"Limited{base.__name__}"
    return Limited


class RateLimitFilter(logging.Filter):
    """At most LOG_PER_WINDOW records per message template per LOG_WINDOW_S (e.g. asyncio's
    "Too many open files" accept tracebacks, several MB/s under a descriptor exhaustion)."""

    def __init__(self) -> None:
        super().__init__()
        self._seen: dict[str, tuple[float, int]] = {}
        self._lock = threading.Lock()
        self.suppressed = 0

    def filter(self, record: logging.LogRecord) -> bool:
        key = f"{record.name}:{record.msg}"[:200]
        now = time.monotonic()
        with self._lock:
            start, n = self._seen.get(key, (now, 0))
            if now - start > LOG_WINDOW_S:
                start, n = now, 0
            self._seen[key] = (start, n + 1)
            if len(self._seen) > 1000:
                self._seen.clear()
        if n < LOG_PER_WINDOW:
            return True
        self.suppressed += 1
        return False


LOG_FILTER = RateLimitFilter()


def install_log_limits() -> None:
    for name in ("asyncio", "uvicorn.error", "uvicorn"):
        lg = logging.getLogger(name)
        if LOG_FILTER not in lg.filters:
            lg.addFilter(LOG_FILTER)


def connection_cap(requested: int) -> int:
    """The cap, kept well under the process's descriptor limit (a host shares it with us)."""
    try:
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ValueError, OSError):
        return requested
    if soft == resource.RLIM_INFINITY:
        return requested
    return max(4, min(requested, soft // 4))


def bind(host: str, port: int) -> socket.socket:
    """Bind and listen before uvicorn starts, so a busy port is one clear OSError here."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def make_server(app, settings, stats: ConnectionStats | None = None):
    """A uvicorn.Server for ``app`` with graphmon's limits (see the module docstring), and TLS when
    the app's web config (``app.state.web``, graphmon.export.webconfig) has tls_server_config.
    uvicorn configures no logging of its own (log_config=None): its records go to the root
    handler graphmon.logs installs, in the one log format."""
    import uvicorn

    web = getattr(getattr(app, "state", None), "web", None)
    cfg = uvicorn.Config(app, host=settings.host, port=settings.port, log_level="warning", access_log=False,
                         log_config=None, lifespan="off", timeout_keep_alive=settings.keep_alive_timeout_s,
                         h11_max_incomplete_event_size=HEADER_LIMIT_BYTES, server_header=False,
                         **(web.uvicorn_options() if web is not None else {}))
    cfg.load()  # resolves "auto" to the protocol class uvicorn would use; makes the SSL context
    if web is not None:
        web.attach_ssl(cfg.ssl)
    stats = stats or ConnectionStats()
    cfg.http_protocol_class = limited_protocol(cfg.http_protocol_class, connection_cap(settings.max_connections),
                                               settings.header_timeout_s, stats)
    install_log_limits()
    server = uvicorn.Server(cfg)
    server.graphmon_stats = stats
    server.graphmon_web = web
    return server
