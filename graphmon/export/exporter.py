"""Wiring for the in-process and replay cases: source -> aggregator -> snapshot -> app (+ uvicorn)."""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import threading
import time
from typing import Optional

from graphmon.export.aggregator import Aggregator
from graphmon.export.snapshot import Snapshot
from graphmon.export.tracestore import TraceStore
from graphmon.model.window import SourceHealth
from graphmon.settings import Settings
from graphmon.sources.base import Source

log = logging.getLogger("graphmon")


class Exporter:
    """Source -> Aggregator -> snapshot; plus the HTTP app. One per process."""

    def __init__(self, source: Source, settings: Optional[Settings] = None, *, health_only: bool = False):
        self.settings = s = settings or Settings()
        self.source = source
        self.store = TraceStore(s.trace_store_count, s.trace_store_bytes)
        self.aggregator = Aggregator(
            rank=s.rank, max_graphs=s.max_graphs, max_streams=s.max_streams, trace_store=self.store,
            health=self._health, backend_info=lambda: _safe_info(source),
            process={"rank": s.rank, "pid": str(os.getpid()), "host": socket.gethostname()},
            max_devices=s.max_devices, max_label_length=s.max_label_length, stale_after_s=s.stale_after_s,
            detail_graphs=s.detail_graphs,
        )
        from graphmon.export.server import create_app  # FastAPI import stays off the analysis path

        self.app = create_app(snapshots=self.aggregator.snapshots, capture=source.request_capture,
                              trace_lookup=self.store.get, window_lookup=self.store.entry, settings=s, health_only=health_only)
        # /metrics rendered in every format once per snapshot, by the thread that published it,
        # so a scrape only copies bytes.
        self.aggregator.on_publish.append(self._prerender)
        self._stop = threading.Event()
        self._refresher: Optional[threading.Thread] = None
        self._server = None
        self._server_thread: Optional[threading.Thread] = None
        self.started = False

    def snapshot(self) -> Snapshot:
        return self.aggregator.snapshot()

    def _prerender(self, snap: Snapshot) -> None:
        time.sleep(0)  # yield the GIL between building the snapshot and rendering it
        self.app.state.renderer.prerender()

    def _health(self) -> SourceHealth:
        h = self.source.health()
        # A worker thread that died (an exception its loop did not contain) must show, not leave
        # "running" with no windows.
        t = getattr(self.source, "_thread", None)
        if h.state == "running" and t is not None and not t.is_alive() and not self._stop.is_set():
            return dataclasses.replace(h, up=False, state="error", reason=f"{t.name} thread died")
        return h

    def start(self) -> None:
        if self.started:
            return
        self.started = True
        self.source.start(self.aggregator.ingest)
        # Health changes (blocked, stopped) must show up between windows too.
        self._refresher = threading.Thread(target=self._refresh_loop, name="graphmon-refresh", daemon=True)
        self._refresher.start()

    def _refresh_loop(self) -> None:
        while not self._stop.wait(1.0):
            self.aggregator.refresh_if_changed()

    def serve_background(self, timeout_s: float = 10.0) -> None:
        """Run uvicorn on settings.host:port in a daemon thread; return once it listens.
        A busy port raises OSError here."""
        from graphmon.export.limits import bind, make_server

        sock = bind(self.settings.host, self.settings.port)
        self._server = make_server(self.app, self.settings)
        self._server_thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]},
                                               name="graphmon-http", daemon=True)
        self._server_thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._server_thread.is_alive():
                raise RuntimeError(f"graphmon HTTP server failed to start on {self.settings.host}:{self.settings.port}")
            if time.monotonic() > deadline:
                raise RuntimeError("graphmon HTTP server did not start in time")
            time.sleep(0.01)

    @property
    def bound_port(self) -> Optional[int]:
        """The port actually bound (useful with port=0)."""
        if self._server is None or not self._server.started:
            return None
        for s in self._server.servers:
            for sock in s.sockets:
                return sock.getsockname()[1]
        return None

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the source (flushing its pending window), the refresher and the HTTP thread."""
        deadline = time.monotonic() + timeout_s
        self._stop.set()
        try:
            self.source.stop(timeout_s=max(0.1, deadline - time.monotonic()))
        except Exception as e:
            self.aggregator.count_error("stop", e)
        if self._server is not None:
            self._server.should_exit = True
            if self._server_thread is not None:
                self._server_thread.join(max(0.1, deadline - time.monotonic()))
        if self._refresher is not None:
            self._refresher.join(max(0.1, deadline - time.monotonic()))
        # bounded: an ingest stuck past the deadline must not hold stop() (and the host's exit)
        self.aggregator.refresh(timeout_s=max(0.1, deadline - time.monotonic()))


def _safe_info(source: Source) -> dict[str, str]:
    try:
        return {k: str(v) for k, v in source.info().items()}
    except Exception:
        return {"backend": getattr(source, "backend", "unknown")}
