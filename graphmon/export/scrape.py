"""What a scrape adds to the pre-rendered /metrics body: the process_* self-metrics, and gzip.

The graphmon families are rendered once per set of snapshots (export.exposition). The exporting
process's own ``process_*`` families (prometheus_client's ProcessCollector: CPU, RSS, open fds,
start time) change between snapshots, and an agent with no process attached publishes none, so
they are rendered per scrape (~0.3 ms, reading /proc/self) and appended.

gzip when the client accepts it (Prometheus sends ``Accept-Encoding: gzip``): the bundled demo's
178.6 kB text body (1,372 series) is 11.0 kB at level 6, 16x smaller
(bench/results/metrics-gzip.json). Compressing the whole body on each scrape would cost ~2 ms of CPU; instead the snapshot's body is compressed once and the compressor's
state kept (zlib ``compressobj.copy()``), so a scrape compresses only its ~1 kB of process_*
families and the end of the stream: one valid gzip member, whatever Prometheus's scrape interval.
Written here rather than taken from Starlette's GZipMiddleware, which would compress every
response (the 15-30 MB /trace bodies included) on every request.
"""

from __future__ import annotations

import threading
import zlib
from typing import Optional

from graphmon.export.exposition import OPENMETRICS, render

GZIP_LEVEL = 6  # the demo's body: 10.7 kB in 2.3 ms (level 9: 9.8 kB in 17 ms; level 1: 13.4 kB in 0.9 ms)
EOF_LINE = b"# EOF\n"


def accepts_gzip(header: Optional[str]) -> bool:
    """True when ``Accept-Encoding`` allows gzip (``gzip;q=0`` refuses it; ``*`` allows it)."""
    allowed = None
    for part in (header or "").split(",")[:32]:
        coding, _, params = part.strip().partition(";")
        coding = coding.strip().lower()
        if coding not in ("gzip", "x-gzip", "*"):
            continue
        q = 1.0
        for p in params.split(";"):
            k, _, v = p.strip().partition("=")
            if k.strip().lower() == "q":
                try:
                    q = float(v)
                except ValueError:
                    q = 0.0
        if coding == "*" and allowed is not None:
            continue  # an explicit gzip entry wins over the wildcard
        allowed = q > 0
    return bool(allowed)


def process_registry():
    """A registry with prometheus_client's ProcessCollector only (empty where /proc is absent)."""
    from prometheus_client import ProcessCollector
    from prometheus_client.registry import CollectorRegistry

    reg = CollectorRegistry(auto_describe=False)
    ProcessCollector(registry=reg)
    return reg


class ScrapeBodies:
    """The /metrics answer for one format: the pre-rendered body plus this process's families,
    optionally gzipped, with the compressor state of the body kept per format."""

    def __init__(self, on_error=None) -> None:
        self._proc = process_registry()
        self._on_error = on_error
        self._gz: dict[str, tuple[bytes, bytes, object]] = {}  # fmt -> (body, compressed head, compressor)
        self._lock = threading.Lock()

    def _split(self, body: bytes, fmt: str) -> tuple[bytes, bytes]:
        """(body before the end marker, end marker): OpenMetrics ends with "# EOF"."""
        if fmt == OPENMETRICS and body.endswith(EOF_LINE):
            return body[: -len(EOF_LINE)], EOF_LINE
        return body, b""

    def _process_text(self, fmt: str) -> bytes:
        try:
            text = render(self._proc, fmt)
        except Exception as e:  # noqa: BLE001 - contained: the graphmon families still go out
            if self._on_error is not None:
                self._on_error("scrape", e)
            return b""
        return text[: -len(EOF_LINE)] if fmt == OPENMETRICS and text.endswith(EOF_LINE) else text

    def plain(self, body: bytes, fmt: str) -> bytes:
        head, end = self._split(body, fmt)
        return head + self._process_text(fmt) + end

    def gzip_ready(self, body: bytes, fmt: str) -> bool:
        """True when ``body`` is compressed already (a scrape then costs only its own part)."""
        hit = self._gz.get(fmt)
        return hit is not None and hit[0] is body

    def gzipped(self, body: bytes, fmt: str) -> bytes:
        """The same bytes as :meth:`plain`, gzipped (one member)."""
        with self._lock:
            hit = self._gz.get(fmt)
            if hit is None or hit[0] is not body:
                head, _ = self._split(body, fmt)
                c = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
                hit = self._gz[fmt] = (body, c.compress(head) + c.flush(zlib.Z_SYNC_FLUSH), c)
            _, gz_head, c = hit
            tail = c.copy()
        _, end = self._split(body, fmt)
        return gz_head + tail.compress(self._process_text(fmt) + end) + tail.flush()
