"""FastAPI app: /metrics /status /healthz /graphs /capture /trace/{id} (+ OpenAPI at /docs).

Mount it into an existing FastAPI/Starlette app (``app.mount("/graphmon", exporter.app)``) or run
it standalone. Handlers read the latest snapshot; none of them touches CUPTI.
"""

from __future__ import annotations

import dataclasses
import hmac
import io
import re
import threading
import time
import uuid
from typing import TYPE_CHECKING, Optional

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool
from prometheus_client.exposition import choose_encoder, generate_latest
from prometheus_client.registry import CollectorRegistry
from pydantic import BaseModel, Field, model_validator

from graphmon import __version__
from graphmon.export.collector import SnapshotCollector, make_registry, render_text
from graphmon.model.window import CaptureRequest

if TYPE_CHECKING:
    from graphmon.export.exporter import Exporter

MAX_BODY_BYTES = 16 * 1024
TRACE_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
# Chrome JSON of a window is capped at this many kernels (~15 MiB, ~0.5 s of host CPU; the
# rest is flagged otherData.truncated). ?format=graphmon serves the whole window.
MAX_TRACE_EVENTS = 100_000


class CaptureBody(BaseModel):
    replays: Optional[int] = Field(None, ge=1, description="close the window after this many replays")
    duration_ms: Optional[float] = Field(None, gt=0, description="close the window after this long")
    wait_s: float = Field(0.0, ge=0, le=30, description="wait up to this long for the window before answering")

    @model_validator(mode="after")
    def _one_bound(self):
        if self.replays is None and self.duration_ms is None:
            raise ValueError("give replays or duration_ms")
        return self


class CaptureAnswer(BaseModel):
    id: str
    ready: bool
    trace_url: str


def create_app(exporter: "Exporter") -> FastAPI:
    app = FastAPI(
        title="graphmon",
        version=__version__,
        description="Live CUDA-graph kernel-gap metrics. Prometheus scrapes /metrics.",
    )
    settings = exporter.settings
    capture_lock = threading.Lock()
    trace_render_lock = threading.Lock()
    # Rendered /metrics per content type: (snapshot, body). The exporter pre-renders the text format
    # when it publishes a snapshot; other formats are rendered on first request and cached.
    rendered = exporter.rendered
    # Fallback when rendering the full snapshot fails: graphmon_up, collector info and counters,
    # with the scrape errors counted so far (the snapshot itself predates them).
    health_registry = CollectorRegistry(auto_describe=False)
    health_registry.register(_HealthOnly(exporter))

    @app.middleware("http")
    async def limit_body(request: Request, call_next):
        # Bounded request size: reject before reading a large body.
        cl = request.headers.get("content-length")
        if cl is not None and (not cl.isdigit() or int(cl) > MAX_BODY_BYTES):
            return JSONResponse({"detail": f"request body larger than {MAX_BODY_BYTES} bytes"}, status_code=413)
        if request.method in ("POST", "PUT", "PATCH") and cl is None and "chunked" in request.headers.get("transfer-encoding", ""):
            return JSONResponse({"detail": "chunked request bodies are not accepted"}, status_code=411)
        try:
            return await call_next(request)
        except Exception as e:  # contained: a handler bug is a counted 500, logged rate limited, never re-raised
            exporter.aggregator.count_error("http", e)
            return JSONResponse({"detail": "internal error (counted in graphmon_collector_errors_total)"},
                                status_code=500)

    @app.get("/metrics", summary="Prometheus metrics (OpenMetrics when asked via Accept)")
    async def metrics(request: Request) -> Response:
        # async: a cached body is answered on the event loop, with no thread-pool hop.
        encoder, content_type = choose_encoder(request.headers.get("accept", ""))
        snap = exporter.snapshot()
        cached = rendered.get(content_type)
        if cached is not None and cached[0] is snap:
            return Response(content=cached[1], media_type=content_type)
        return await run_in_threadpool(render_metrics, encoder, content_type, snap)

    def render_metrics(encoder, content_type: str, snap) -> Response:
        try:
            if encoder is generate_latest:  # the text format: graphmon's faster, identical renderer
                encoder = render_text
            body = encoder(make_registry(lambda: snap))
            rendered[content_type] = (snap, body)
        except Exception as e:  # contained: count, and still answer with health metrics
            exporter.aggregator.count_error("scrape", e)
            try:
                body = encoder(health_registry)
            except Exception:
                raise HTTPException(500, "metrics rendering failed (counted in graphmon_collector_errors_total)")
        return Response(content=body, media_type=content_type)

    @app.get("/healthz", summary="Liveness of the exporter itself")
    def healthz() -> dict:
        s = exporter.snapshot()
        return {"status": "ok", "collector_up": s.up, "state": s.health.state}

    @app.get("/status", summary="Collector state and per-graph, per-stream gap summary")
    def status() -> dict:
        s = exporter.snapshot()
        return {
            "version": __version__,
            "backend": dict(s.backend_info),
            "state": s.health.state,
            "up": s.up,
            "reason": s.health.reason,
            "rank": s.rank,
            "last_window_timestamp_s": s.last_window_s,
            "last_window_age_s": None if s.last_window_s is None else max(0.0, time.time() - s.last_window_s),
            "windows_total": s.windows_total,
            "records_total": s.records_total,
            "records_dropped_total": s.records_dropped_total,
            "records_invalid_total": dict(s.records_invalid_total),
            "errors_total": dict(s.errors_total),
            "series_folded_total": s.series_folded_total,
            "observer_slowdown_ratio": s.observer_slowdown,
            "graphs": list(s.last_window_summary),
            "upload_mode_comparison": upload_mode_comparison(s),
            "config": {  # no secrets: the token is reported as set/unset only
                "host": settings.host,
                "port": settings.port,
                "token_set": settings.token is not None,
                "max_graphs": settings.max_graphs,
                "max_streams": settings.max_streams,
                "trace_store_count": settings.trace_store_count,
                "window_interval_s": settings.window_interval_s,
            },
            "windows": list(s.windows),
        }

    @app.get("/graphs", summary="Monitored graphs and their upload modes")
    def graphs() -> list:
        s = exporter.snapshot()
        out = []
        for (d, graph), g in sorted(s.graphs.items()):
            key = (d, graph, g.upload_mode)
            out.append({
                "device": d, "graph": graph, "graph_key": g.graph_key, "label": g.label,
                "upload_mode": g.upload_mode, "upload_stream_is_launch_stream": g.upload_stream_is_launch_stream,
                "replays_sampled": s.replays_total.get(key, 0),
                "kernels_per_replay": s.kernels_per_replay.get(key),
            })
        return out

    def check_token(request: Request) -> None:
        if settings.token is None:
            if settings.is_public:
                raise HTTPException(403, "POST /capture is refused on a public bind without GRAPHMON_TOKEN")
            return
        auth = request.headers.get("authorization", "")
        if not auth.startswith("Bearer ") or not hmac.compare_digest(auth[7:].encode(), settings.token.encode()):
            raise HTTPException(401, "missing or wrong bearer token", headers={"WWW-Authenticate": "Bearer"})

    @app.post("/capture", response_model=CaptureAnswer, summary="Open an on-demand window; returns its trace id")
    def capture(body: CaptureBody, request: Request) -> CaptureAnswer:
        check_token(request)
        if body.replays is not None and body.replays > settings.max_capture_replays:
            raise HTTPException(422, f"replays must be <= {settings.max_capture_replays}")
        if body.duration_ms is not None and body.duration_ms > settings.max_capture_ms:
            raise HTTPException(422, f"duration_ms must be <= {settings.max_capture_ms:g}")
        cid = "c" + uuid.uuid4().hex[:16]
        with capture_lock:
            try:
                exporter.source.request_capture(CaptureRequest(id=cid, replays=body.replays, duration_ms=body.duration_ms))
            except NotImplementedError as e:
                raise HTTPException(409, str(e))
            except RuntimeError as e:
                raise HTTPException(429, str(e))
        ready = exporter.aggregator.wait_for(cid, body.wait_s) if body.wait_s > 0 else False
        return CaptureAnswer(id=cid, ready=ready, trace_url=f"trace/{cid}")

    @app.get("/trace/{trace_id}", summary="A window as Chrome/Perfetto trace JSON (or graphmon's native format)")
    def trace(trace_id: str, format: str = "chrome") -> Response:
        if not TRACE_ID.fullmatch(trace_id):  # fullmatch: "$" alone lets a trailing newline through
            raise HTTPException(400, "trace id must be 1-64 characters of [A-Za-z0-9_-]")
        if format not in ("chrome", "graphmon"):
            raise HTTPException(400, "format must be 'chrome' or 'graphmon'")
        t = exporter.store.get(trace_id)
        if t is None:
            raise HTTPException(404, f"no trace {trace_id!r} (not captured yet, or evicted; see /status windows)")
        # One rendering at a time: each is a transient copy of a window (up to ~150 bytes per
        # event as JSON), so parallel downloads must not multiply the host's memory.
        with trace_render_lock:
            if format == "graphmon":
                buf = io.BytesIO()
                from graphmon.formats.native import write_trace_to

                write_trace_to(t, buf)
                return Response(buf.getvalue(), media_type="application/octet-stream",
                                headers={"Content-Disposition": f'attachment; filename="{trace_id}.graphmon.npz"'})
            from graphmon.formats.chrome import to_chrome_trace

            return JSONResponse(to_chrome_trace(t, max_events=MAX_TRACE_EVENTS))

    return app


class _HealthOnly:
    """Collector of the health families only (see the /metrics fallback)."""

    def __init__(self, exporter: "Exporter"):
        self.exporter = exporter

    def collect(self):
        s = self.exporter.snapshot()
        errors = dict(s.errors_total)
        errors["scrape"] = max(errors.get("scrape", 0), self.exporter.aggregator._errors.get("scrape", 0))
        yield from SnapshotCollector(lambda: s)._health(dataclasses.replace(s, errors_total=errors))


def upload_mode_comparison(s) -> list[dict]:
    """Per device and stream position: median gap by upload mode across graphs (last windows)."""
    by: dict[tuple, dict[str, list[float]]] = {}
    for (d, graph, stream, mode), qs in s.gap_quantiles.items():
        if len(qs) > 1 and qs[1] == qs[1]:
            by.setdefault((d, graph.rsplit("/", 1)[0]), {}).setdefault(mode, []).append(qs[1])
    out = []
    for (d, family), modes in sorted(by.items()):
        if len(modes) < 2:
            continue
        med = {m: sorted(v)[len(v) // 2] for m, v in modes.items()}
        out.append({"device": d, "graph_family": family, "median_gap_ns_by_upload_mode": med})
    return out
