"""FastAPI app: / /metrics /status /healthz /graphs /capture /trace/{id} /baseline (+ /openapi.json).

Mount it into an existing FastAPI/Starlette app (``app.mount("/graphmon", exporter.app)``) or run
it standalone. It gets narrow arguments (a snapshot getter, a capture function, a trace lookup,
settings); handlers read snapshots and never touch CUPTI. Nothing is loaded from outside: the
Swagger UI (which pulls its assets from a CDN) is off; ``/`` links what there is.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
import uuid
from typing import Any, Callable, Mapping, Optional, Sequence

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, PlainTextResponse, Response
from pydantic import BaseModel, Field, ValidationError, model_validator
from starlette.concurrency import run_in_threadpool

from graphmon.version import __version__
from graphmon.export.baseline import Baseline
from graphmon.export.body import MetricsRenderer
from graphmon.export.exposition import CONTENT_TYPES, negotiate, render_families
from graphmon.export.guard import ErrorCounts, Guard, authorized, base_names
from graphmon.export.scrape import ScrapeBodies, accepts_gzip
from graphmon.export.snapshot import Snapshot
from graphmon.export.tracebodies import TraceBodies
from graphmon.export.untraced import status_graphs
from graphmon.model.window import CaptureRequest
from graphmon.report.summary import upload_mode_comparison

log = logging.getLogger("graphmon")
TRACE_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
LANDING = """<!doctype html><html><head><meta charset="utf-8"><title>graphmon</title></head><body>
<h1>graphmon {version}</h1><p>Live CUDA-graph kernel-gap metrics.</p><ul>
<li><a href="metrics">metrics</a> (Prometheus; OpenMetrics when asked)</li>
<li><a href="status">status</a> (collector state, per-graph gap summary)</li>
<li><a href="graphs">graphs</a></li><li><a href="healthz">healthz</a></li>
<li><a href="baseline">baseline</a> (pinned window of the boundary attribution in status)</li>
<li><a href="openapi.json">openapi.json</a> (POST capture, GET trace/&lt;id&gt;, POST/DELETE baseline)</li></ul></body></html>"""


DEFAULT_CAPTURE_REPLAYS = 8  # POST /capture without a bound: 8 replays or 1 s, whichever ends first
DEFAULT_CAPTURE_MS = 1000.0


class CaptureBody(BaseModel):
    """The body of POST /capture: JSON whatever its Content-Type (``curl -d '{...}'`` sends it as a
    form), or form fields (``-d duration_ms=50``); no body or no bound: the defaults."""

    replays: Optional[int] = Field(None, ge=1, description=f"close the window after this many replays "
                                   f"(neither bound given: {DEFAULT_CAPTURE_REPLAYS} replays or "
                                   f"{DEFAULT_CAPTURE_MS:g} ms)")
    duration_ms: Optional[float] = Field(None, gt=0, allow_inf_nan=False, description="close the window after this long")
    wait_s: float = Field(0.0, ge=0, le=30, description="wait up to this long for the window before answering")

    @model_validator(mode="after")
    def _default_bound(self):
        if self.replays is None and self.duration_ms is None:
            self.replays, self.duration_ms = DEFAULT_CAPTURE_REPLAYS, DEFAULT_CAPTURE_MS
        return self

    @classmethod
    def from_request(cls, raw: bytes, content_type: str) -> "CaptureBody":
        """Raises ValueError (pydantic's ValidationError is one) with what is wrong."""
        if not raw.strip():
            return cls()
        if raw.lstrip()[:1] != b"{" and "application/x-www-form-urlencoded" in content_type.lower():
            from urllib.parse import parse_qs

            try:
                fields = parse_qs(raw.decode("utf-8"), keep_blank_values=True, strict_parsing=True, max_num_fields=8)
            except (UnicodeDecodeError, ValueError) as e:
                raise ValueError(f"not JSON and not form fields: {e}") from None
            if any(len(v) != 1 for v in fields.values()):
                raise ValueError("a form field was given twice")
            return cls.model_validate({k: v[0] for k, v in fields.items()}, strict=False)
        return cls.model_validate_json(raw)


class BaselineBody(BaseModel):
    trace_id: Optional[str] = Field(None, description="the window to pin; absent: the last window")


class CaptureAnswer(BaseModel):
    id: str
    ready: bool
    trace_url: str


def create_app(*, snapshots: Callable[[], Sequence[Snapshot]], capture: Callable[[CaptureRequest], None],
               trace_lookup: Callable[[str], Any], settings, extra_status: Optional[Callable[[], Mapping]] = None,
               window_lookup: Optional[Callable[[str], Any]] = None,
               health_only: bool = False, extra_collectors: Sequence = (),
               last_window: Optional[Callable[[], Optional[str]]] = None, baseline: Any = None) -> FastAPI:
    """``snapshots()``: the current snapshots (one per process); ``capture(request)`` raises
    NotImplementedError (409) or RuntimeError (429) to refuse; ``trace_lookup(id)``: a Trace or
    None; ``window_lookup(id)``: (Trace, untraced rows) or None (the trace store's ``entry``:
    ``?format=graphmon`` writes the rows; default: none). ``last_window()``: the newest window's
    id as ``trace_lookup`` knows it (default: the last of the first snapshot's ``windows``). ``baseline``: what /baseline pins (default: one window,
    graphmon.export.baseline.Baseline; the agent pools). ``app.state.renderer.prerender()`` renders
    /metrics ahead (call it on publish)."""
    app = FastAPI(title="graphmon", version=__version__, docs_url=None, redoc_url=None,
                  description="Live CUDA-graph kernel-gap metrics. Prometheus scrapes /metrics.")
    errors = ErrorCounts()
    extra = None
    if extra_collectors:
        from prometheus_client.registry import CollectorRegistry

        reg = CollectorRegistry(auto_describe=False)
        for c in extra_collectors:
            reg.register(c)
        extra = lambda fmt: render_families(reg, fmt)  # noqa: E731
    renderer = MetricsRenderer(snapshots, level=settings.cardinality, health_only=health_only, extra=extra,
                               extra_errors=errors.snapshot, on_error=errors.count)
    scrape = ScrapeBodies(errors.count)
    baseline = baseline if baseline is not None else Baseline(trace_lookup)
    if last_window is None:
        def last_window() -> Optional[str]:
            return next((s.windows[-1] for s in snapshots() if s.windows), None)

    def boundaries_extra(trace_id: str):  # computed attribution only: the download path never computes
        if hasattr(baseline, "trace_extra"):  # the agent's: the pinned and the deploy verdict's boundaries
            return baseline.trace_extra(trace_id)
        got = baseline.for_window(trace_id)
        return None if got is None else (got[0], {"boundaries": {"baseline": got[0], "window": trace_id, "graphs": got[1]}})

    if window_lookup is None:
        def window_lookup(trace_id: str):
            t = trace_lookup(trace_id)
            return None if t is None else (t, None)

    traces = TraceBodies(window_lookup, settings.trace_cache_bytes, settings.max_trace_downloads, boundaries_extra)
    app.state.renderer, app.state.errors, app.state.traces = renderer, errors, traces
    app.state.baseline = baseline
    from graphmon.export.webconfig import WebAccess

    web = app.state.web = WebAccess(settings)  # basic auth, headers and TLS of --web.config.file (make_server)
    app.add_middleware(Guard, settings=settings, errors=errors, web=web)
    status_cache: list = [(), []]  # (snapshots, graphs) of the last /status: formatted once per snapshot

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def landing() -> HTMLResponse:
        return HTMLResponse(LANDING.format(version=__version__))

    @app.get("/metrics", response_class=PlainTextResponse, summary="Prometheus metrics (OpenMetrics when asked via Accept)",
             responses={200: {"content": {CONTENT_TYPES["text"]: {}, CONTENT_TYPES["openmetrics"]: {}}}})
    async def metrics(request: Request) -> Response:
        fmt = negotiate(request.headers.get("accept", ""))
        gz = accepts_gzip(request.headers.get("accept-encoding"))
        body = renderer.cached(fmt, gz)  # async: a pre-rendered body is answered with no thread hop
        if body is None:
            body = await run_in_threadpool(renderer.body, fmt, gz)
        # + this process's process_* families (per scrape); gzip when asked: the body comes
        # compressed from its render (graphmon.export.body), a scrape compresses only its own part
        headers = {"Vary": "Accept-Encoding"}
        if not gz:
            return Response(content=scrape.plain(body, fmt), media_type=CONTENT_TYPES[fmt], headers=headers)
        return Response(content=scrape.gzipped(body, fmt), media_type=CONTENT_TYPES[fmt],
                        headers={**headers, "Content-Encoding": "gzip"})

    @app.get("/healthz", summary="Liveness of the exporter itself")
    async def healthz() -> dict:
        # On the event loop, no lock, no thread pool: answers whatever /trace or /metrics do.
        snaps = snapshots()
        s = snaps[0] if snaps else None
        return {"status": "ok", "collector_up": bool(s and s.up), "state": s.health.state if s else "none"}

    def one_status(s: Snapshot, graphs: list, full_paths: bool) -> dict:
        clean = (lambda v: v) if full_paths else base_names
        doc = {
            "state": s.health.state, "up": s.up, "reason": clean(s.health.reason), "rank": s.rank,
            "backend": {k: clean(str(v)) for k, v in s.backend_info.items()},
            "process": dict(s.process),
            "last_window_timestamp_s": s.last_window_s,
            "last_window_age_s": None if s.last_window_s is None else max(0.0, time.time() - s.last_window_s),
            "windows_total": s.windows_total, "records_total": s.records_total,
            "records_dropped_total": s.records_dropped_total,
            "records_invalid_total": dict(s.records_invalid_total),
            "errors_total": dict(s.errors_total), "series_folded_total": s.series_folded_total,
            "label_values_truncated_total": s.label_values_truncated_total,
            "values_out_of_range_total": dict(s.values_out_of_range_total),
            "observer_slowdown_ratio": s.observer_slowdown,
            "graphs": graphs, "upload_mode_comparison": upload_mode_comparison(s),
            "windows": list(s.windows),
        }
        return doc

    # HEAD as well as GET where a probe or a load balancer may ask: 200 with the GET's headers and
    # no body (uvicorn drops it); out of the OpenAPI schema, which would list each operation twice
    for path, fn in (("/", landing), ("/metrics", metrics), ("/healthz", healthz)):
        app.add_api_route(path, fn, methods=["HEAD"], include_in_schema=False)

    @app.get("/status", summary="Collector state and per-graph, per-stream gap summary")
    def status(request: Request) -> dict:
        snaps = tuple(snapshots())
        if not (len(snaps) == len(status_cache[0]) and all(a is b for a, b in zip(snaps, status_cache[0]))):
            status_cache[:] = [snaps, [status_graphs(s) for s in snaps]]
        graphs = status_cache[1]
        full = authorized(request.scope, settings, need_token=True) is None
        per = [one_status(s, g, full) for s, g in zip(snaps, graphs)]
        doc: dict = {"version": __version__, **(per[0] if per else {})}
        if len(per) > 1:
            doc["processes"] = per
        doc["http_errors_total"] = errors.snapshot()
        doc["config"] = {  # no secrets: the token is reported as set/unset only
            "host": settings.host, "port": settings.port, "token_set": settings.token is not None,
            "tls": web.tls is not None, "basic_auth": web.basic is not None, "protect_status": settings.protect_status,
            "max_graphs": settings.max_graphs, "max_streams": settings.max_streams,
            "max_devices": settings.max_devices, "cardinality": settings.cardinality,
            "trace_store_count": settings.trace_store_count, "window_interval_s": settings.window_interval_s,
            "stale_after_s": settings.stale_after_s,
        }
        doc["boundaries"] = baseline.status(last_window())  # never blocks: a computation runs on its own thread
        if extra_status is not None:
            doc.update(extra_status())
        return doc

    @app.get("/graphs", summary="Monitored graphs and their upload modes")
    def graphs() -> list:
        out = []
        for s in snapshots():
            for (d, graph), g in sorted(s.graphs.items()):
                key = (d, graph, g.upload_mode)
                out.append({
                    "rank": s.rank, "device": d, "graph": graph, "graph_key": g.graph_key, "label": g.label,
                    "upload_mode": g.upload_mode, "upload_stream_is_launch_stream": g.upload_stream_is_launch_stream,
                    "batch_size": g.batch_size, "replays_sampled": s.replays_total.get(key, 0),
                    "kernels_per_replay": s.kernels_per_replay.get(key),
                    "last_sampled_timestamp_s": s.graph_last_sampled_s.get(key),
                    "detail": (d, graph) in s.detail_graphs,  # series of its own at the default level
                    "untraced_replay_seconds": None if (u := s.untraced_summary.get(key)) is None else dict(u),
                })
        return out

    @app.post("/capture", response_model=CaptureAnswer, summary="Open an on-demand window; returns its trace id "
              f"(bearer token; without one, loopback clients only). No body: {DEFAULT_CAPTURE_REPLAYS} replays or "
              f"{DEFAULT_CAPTURE_MS:g} ms",
              openapi_extra={"requestBody": {"required": False, "content": {
                  "application/json": {"schema": CaptureBody.model_json_schema()},
                  "application/x-www-form-urlencoded": {"schema": CaptureBody.model_json_schema()}}}})
    async def capture_window(request: Request) -> CaptureAnswer:
        # Authentication happened in the Guard, before the body was read.
        try:
            body = CaptureBody.from_request(await request.body(), request.headers.get("content-type", ""))
        except ValidationError as e:
            why = "; ".join(f"{'.'.join(map(str, x['loc'])) or 'body'}: {x['msg']}" for x in e.errors()[:4])
            raise HTTPException(422, f"body must be JSON like {{\"replays\": 8}} or {{\"duration_ms\": 50}} "
                                     f"(or empty: the defaults): {why[:400]}")
        except ValueError as e:
            raise HTTPException(422, f"body must be JSON or form fields (or empty: the defaults): {str(e)[:400]}")
        if body.replays is not None and body.replays > settings.max_capture_replays:
            raise HTTPException(422, f"replays must be <= {settings.max_capture_replays}")
        if body.duration_ms is not None and body.duration_ms > settings.max_capture_ms:
            raise HTTPException(422, f"duration_ms must be <= {settings.max_capture_ms:g}")
        cid = "c" + uuid.uuid4().hex[:16]
        try:
            capture(CaptureRequest(id=cid, replays=body.replays, duration_ms=body.duration_ms))
        except NotImplementedError as e:
            raise HTTPException(409, str(e))
        except RuntimeError as e:
            raise HTTPException(429, str(e))
        deadline = time.monotonic() + body.wait_s
        ready = trace_lookup(cid) is not None
        while not ready and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
            ready = trace_lookup(cid) is not None
        return CaptureAnswer(id=cid, ready=ready, trace_url=f"trace/{cid}")

    @app.get("/baseline", summary="The pinned baseline window of the live boundary attribution")
    def get_baseline() -> dict:
        return baseline.describe()

    @app.post("/baseline", summary="Pin a window (body {\"trace_id\": id}; empty: the last window) as the baseline "
              "of the per-boundary attribution in /status and /trace (bearer token; without one, loopback only)")
    async def pin_baseline(request: Request) -> dict:
        raw = await request.body()
        try:
            body = BaselineBody.model_validate_json(raw) if raw.strip() else BaselineBody()
        except ValueError as e:
            raise HTTPException(422, f"body must be {{\"trace_id\": \"<id>\"}} or empty: {e}")
        trace_id = body.trace_id
        if trace_id is None:
            trace_id = last_window()
            if trace_id is None:
                raise HTTPException(404, "no window yet to pin")
        if not TRACE_ID.fullmatch(trace_id):
            raise HTTPException(400, "trace id must be 1-64 characters of [A-Za-z0-9_-]")
        if not baseline.pin(trace_id):
            raise HTTPException(404, f"no trace {trace_id!r} (not captured yet, or evicted; see /status windows)")
        return baseline.describe()

    @app.delete("/baseline", summary="Unpin the baseline (bearer token; without one, loopback only)")
    def unpin_baseline() -> dict:
        return {"pinned": False, "unpinned": baseline.unpin()}

    @app.get("/trace/{trace_id}", summary="A window as Chrome/Perfetto trace JSON (or graphmon's native format); "
             "bearer token (without one, loopback clients only)",
             responses={200: {"content": {"application/json": {}, "application/octet-stream": {}}}})
    async def trace(request: Request, trace_id: str, format: str = "chrome") -> Response:
        if not TRACE_ID.fullmatch(trace_id):  # fullmatch: "$" alone lets a trailing newline through
            raise HTTPException(400, "trace id must be 1-64 characters of [A-Za-z0-9_-]")
        if format not in ("chrome", "graphmon"):
            raise HTTPException(400, "format must be 'chrome' or 'graphmon'")
        return await traces.response(trace_id, format, gzip=accepts_gzip(request.headers.get("accept-encoding")))

    return app

