"""GET /trace bodies: rendered once per window and format, shared, streamed, bounded.

A window rendered as Chrome JSON is 15-30 MB and ~0.5 s of CPU. So: one render thread (never the
event loop, never the request thread pool that /status uses), one body per (window, format) shared
by every download of it, a byte-bounded LRU of bodies, at most ``max_downloads`` downloads at once
(more get 503), render time of at most 1/4 of one core over time after a 2 s burst (requests wait for
it, or get 429 beyond 10 s: the host keeps its time), and bodies streamed in chunks so a client that does not read pins no copy.

gzip when the client accepts it (Chrome JSON only: the native format is a compressed npz
already): the Chrome body compressed once, on the render thread and within the render budget,
and kept beside it in the same byte-bounded cache, so every download of a window shares one
compression. The bundled demo's 47.6 MB window is 1.3 MB at level 6 (36x) in 0.27 s, against
1.2 s for its render (one run on the shared 2-core machine).
"""

from __future__ import annotations

import asyncio
import io
import json
import time
import zlib
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Mapping, Optional

from fastapi import HTTPException
from starlette.responses import StreamingResponse

from graphmon.formats.native import write_trace_to

# Chrome JSON of a window is capped at this many kernels (~15 MiB, ~0.5 s of host CPU): whole
# replays, the earliest first; the document then starts with a graphmonTruncated object and the
# response carries TRUNCATED_HEADER and a Link to ?format=graphmon, which serves the whole window.
MAX_TRACE_EVENTS = 100_000
TRUNCATED_HEADER = "X-Graphmon-Truncated"
_TRUNCATED_PREFIX = b'{"graphmonTruncated":'
CHUNK_BYTES = 256 * 1024
ENCODE_BATCH = 2_000  # events per json.dumps call
SEND_TIMEOUT_S = 10.0  # a download whose client takes no chunk for this long is cut (frees its slot)
RENDER_DUTY = 0.25  # renders use at most this share of one core over time
RENDER_BURST_S = 2.0  # render time allowed at once before the duty cycle applies
MAX_RENDER_WAIT_S = 10.0  # a request waits this long at most for the render budget, else 429
GZIP_LEVEL = 6


def render_trace(t: Any, fmt: str, other: Optional[dict] = None, untraced: Optional[Mapping] = None) -> bytes:
    """``other``: extra ``otherData`` entries of the Chrome JSON (e.g. the boundary attribution);
    ``untraced``: the window's untraced replay durations (the native format's ``u_`` members, the
    Chrome JSON's ``graphmonTrace.untraced``)."""
    if fmt == "graphmon":
        buf = io.BytesIO()
        write_trace_to(t, buf, untraced)
        return buf.getvalue()
    from graphmon.formats.chrome import to_chrome_trace

    from graphmon.formats.chrome import TRUNCATED_KEY

    doc = to_chrome_trace(t, max_events=MAX_TRACE_EVENTS, untraced=untraced)
    events = doc.pop("traceEvents")
    cut = doc.pop(TRUNCATED_KEY, None)
    if other:
        doc.setdefault("otherData", {}).update(other)
    # Encoded in slices with a GIL yield between them: one json.dumps of 100,000 events holds the
    # GIL for hundreds of ms, and the event loop (/healthz, /metrics) would wait that long.
    # A cut document says so first (what `head` of the file shows).
    parts = [(_TRUNCATED_PREFIX.decode() + _dumps(cut) + ",") if cut else "{", '"traceEvents":[']
    for i in range(0, len(events), ENCODE_BATCH):
        if i:
            parts.append(",")
        parts.append(_dumps(events[i : i + ENCODE_BATCH])[1:-1])
        time.sleep(0)
    rest = _dumps(doc)
    parts.append("]" + ("," + rest[1:] if len(rest) > 2 else "}"))
    return "".join(parts).encode("utf-8")


def gzip_body(body: bytes) -> bytes:
    c = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, 16 + zlib.MAX_WBITS)  # zlib releases the GIL while it works
    return c.compress(body) + c.flush()


def truncation(body: bytes, gzipped: bool = False) -> Optional[dict]:
    """The graphmonTruncated object a rendered Chrome body starts with, or None (not cut). A
    gzipped body: read from its first few kB, decompressed."""
    if gzipped:
        body = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(body, len(_TRUNCATED_PREFIX) + 4096)
    if not body.startswith(_TRUNCATED_PREFIX):
        return None
    head = body[len(_TRUNCATED_PREFIX) : len(_TRUNCATED_PREFIX) + 4096].decode("utf-8", "replace")
    try:
        return json.JSONDecoder().raw_decode(head)[0]
    except ValueError:
        return None


def _dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


class TraceBodies:
    def __init__(self, lookup: Callable[[str], Any], max_bytes: int, max_downloads: int,
                 extras: Optional[Callable[[str], Optional[tuple[str, dict]]]] = None):
        """``lookup(id)``: (Trace, untraced rows or None) of a kept window, or None. ``extras(id)``: (version, otherData entries) for a window's Chrome JSON, or None; a body
        is kept per version, so a new baseline gives a new body and an old one is never served."""
        self._lookup = lookup
        self._extras = extras
        self.max_bytes, self.max_downloads = max_bytes, max_downloads
        self._bodies: OrderedDict[tuple, bytes] = OrderedDict()
        self._bytes = 0
        self._pending: dict[tuple, asyncio.Future] = {}
        self._executor: Optional[ThreadPoolExecutor] = None
        self._budget_s, self._budget_at = RENDER_BURST_S, time.monotonic()  # render-time token bucket
        self._render_lock = asyncio.Lock()
        self.active = 0
        self.renders = 0
        self.compressions = 0
        self.refused = {"busy": 0, "rate": 0}

    def _keep(self, key: tuple, body: bytes) -> None:
        if len(body) > self.max_bytes:
            return  # served to this request only
        self._bodies[key] = body
        self._bytes += len(body)
        while self._bytes > self.max_bytes:
            _, old = self._bodies.popitem(last=False)
            self._bytes -= len(old)

    async def _body(self, trace_id: str, fmt: str, gzip: bool = False) -> bytes:
        extra = self._extras(trace_id) if (self._extras is not None and fmt == "chrome") else None
        key = (trace_id, fmt, extra[0] if extra else None) + (("gzip",) if gzip else ())
        body = self._bodies.get(key)
        if body is not None:
            self._bodies.move_to_end(key)
            return body
        fut = self._pending.get(key)
        if fut is not None:  # being rendered for another request: share it
            return await asyncio.shield(fut)
        if not gzip:
            e = self._lookup(trace_id)
            if e is None:
                raise HTTPException(404, f"no trace {trace_id!r} (not captured yet, or evicted; see /status windows)")
            work, work_args = render_trace, (e[0], fmt, extra[1] if extra else None, e[1])
        loop = asyncio.get_running_loop()
        fut = self._pending[key] = loop.create_future()
        try:
            if gzip:  # the plain body first (shared with plain downloads), then its compression
                work, work_args = gzip_body, (await self._body(trace_id, fmt),)
            async with self._render_lock:  # one render at a time
                # Duty cycle: wait for the render budget (bounded) rather than refuse at once.
                now = time.monotonic()
                self._budget_s = min(RENDER_BURST_S, self._budget_s + (now - self._budget_at) * RENDER_DUTY)
                self._budget_at = now
                wait_s = -self._budget_s / RENDER_DUTY
                if wait_s > MAX_RENDER_WAIT_S:
                    self.refused["rate"] += 1
                    raise HTTPException(429, "trace rendering is rate limited", {"Retry-After": str(int(wait_s) + 1)})
                if wait_s > 0:
                    await asyncio.sleep(wait_s)
                if self._executor is None:
                    self._executor = ThreadPoolExecutor(1, thread_name_prefix="graphmon-trace")
                t0 = time.monotonic()
                try:
                    body = await loop.run_in_executor(self._executor, work, *work_args)
                finally:
                    self._budget_s -= time.monotonic() - t0
            if gzip:
                self.compressions += 1
            else:
                self.renders += 1
            self._keep(key, body)
            fut.set_result(body)
            return body
        except BaseException as e:
            fut.set_exception(e)
            fut.exception()  # retrieved: no "never retrieved" warning when nobody else waits
            raise
        finally:
            self._pending.pop(key, None)

    async def response(self, trace_id: str, fmt: str, gzip: bool = False):
        """``gzip``: the client accepts it (Chrome JSON only; the npz is compressed already)."""
        gzip = gzip and fmt == "chrome"
        if self.active >= self.max_downloads:
            self.refused["busy"] += 1
            raise HTTPException(503, f"{self.max_downloads} trace downloads in progress; retry", {"Retry-After": "1"})
        self.active += 1
        try:
            body = await self._body(trace_id, fmt, gzip)
        except BaseException:
            self.active -= 1
            raise
        if fmt == "graphmon":
            media, headers = "application/octet-stream", {"Content-Disposition": f'attachment; filename="{trace_id}.graphmon.npz"'}
        else:
            media, headers = "application/json", {"Vary": "Accept-Encoding"}
            if gzip:
                headers["Content-Encoding"] = "gzip"
            cut = truncation(body, gzip)
            if cut is not None:  # what a client sees before it reads the body, and where the rest is
                headers[TRUNCATED_HEADER] = f"{cut.get('kernels_kept')} of {cut.get('kernels')} kernels"
                headers["Link"] = f'<{trace_id}?format=graphmon>; rel="alternate"; type="application/octet-stream"'
        headers["Content-Length"] = str(len(body))
        return _Download(body, self._release, media_type=media, headers=headers)

    def _release(self) -> None:
        self.active -= 1


class _Download(StreamingResponse):
    """Streams a shared body (memoryview chunks: no copy per client) and frees its slot however
    the response ends; a client that takes no chunk for SEND_TIMEOUT_S is cut."""

    def __init__(self, body: bytes, release: Callable[[], None], **kw):
        view = memoryview(body)

        async def chunks():
            for i in range(0, len(view), CHUNK_BYTES):
                yield view[i : i + CHUNK_BYTES]

        super().__init__(chunks(), **kw)
        self._release = release

    async def __call__(self, scope, receive, send):
        async def timed_send(msg):
            await asyncio.wait_for(send(msg), SEND_TIMEOUT_S)

        try:
            await super().__call__(scope, receive, timed_send)
        except asyncio.TimeoutError:
            pass  # the connection is closed by the server once the app returns mid-response
        finally:
            self._release()
