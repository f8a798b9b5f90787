"""Wires a source to the aggregator, the Prometheus registry and the FastAPI app."""

from __future__ import annotations

import logging
import threading
import time
from typing import Optional

from graphmon.export.collector import TEXT_CONTENT_TYPE, make_registry, render_text
from graphmon.settings import Settings
from graphmon.export.snapshot import Aggregator, Snapshot, TraceStore
from graphmon.sources.base import Source

log = logging.getLogger("graphmon")


class Exporter:
    """Source -> Aggregator -> snapshot; plus the HTTP app. One per process."""

    def __init__(self, source: Source, settings: Optional[Settings] = None):
        self.settings = settings or Settings()
        self.source = source
        self.store = TraceStore(self.settings.trace_store_count, self.settings.trace_store_bytes)
        self.aggregator = Aggregator(
            rank=self.settings.rank,
            max_graphs=self.settings.max_graphs,
            max_streams=self.settings.max_streams,
            trace_store=self.store,
            health=source.health,
            backend_info=lambda: _safe_info(source),
        )
        # /metrics text rendered once per snapshot, by the thread that published it, so a scrape
        # only copies bytes: content type -> (snapshot, body).
        self.rendered: dict = {}
        self.aggregator.on_publish.append(self._prerender)
        from graphmon.export.server import create_app  # FastAPI import stays off the analysis path

        self.app = create_app(self)
        self._stop = threading.Event()
        self._refresher: Optional[threading.Thread] = None
        self._server = None
        self._server_thread: Optional[threading.Thread] = None
        self.started = False

    def snapshot(self) -> Snapshot:
        return self.aggregator.snapshot()

    def _prerender(self, snap: Snapshot) -> None:
        time.sleep(0)  # yield the GIL between building the snapshot and rendering it
        self.rendered[TEXT_CONTENT_TYPE] = (snap, render_text(make_registry(lambda: snap)))

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
        """Run uvicorn on settings.host:port in a daemon thread; return once it listens."""
        import uvicorn

        config = uvicorn.Config(self.app, host=self.settings.host, port=self.settings.port,
                                log_level="warning", access_log=False, lifespan="off")
        self._server = uvicorn.Server(config)
        self._server_thread = threading.Thread(target=self._server.run, name="graphmon-http", daemon=True)
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
