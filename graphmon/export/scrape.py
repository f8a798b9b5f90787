"""What a scrape adds to the pre-rendered /metrics body: the process_* self-metrics, and gzip.

The graphmon families are rendered once per set of snapshots (graphmon.export.body). The exporting
process's own ``process_*`` families (prometheus_client's ProcessCollector: CPU, RSS, open fds,
start time) change between snapshots, and an agent with no process attached publishes none, so
they are rendered per scrape (~0.3 ms, reading /proc/self) and appended.

gzip when the client accepts it (Prometheus sends ``Accept-Encoding: gzip``): the bundled demo's
178.6 kB text body (1,372 series) is 11.0 kB at level 6, 16x smaller
(bench/results/metrics-gzip.json). The body comes compressed from its render, family by family
(graphmon.export.body), so a scrape compresses only its ~1 kB of process_* families and the end
of the stream: one valid gzip member, whatever Prometheus's scrape interval. Written here rather
than taken from Starlette's GZipMiddleware, which would compress every response (the 15-30 MB
/trace bodies included) on every request.
"""

from __future__ import annotations

from typing import Optional

from graphmon.export.body import GZIP_LEVEL, Body, gzip_with
from graphmon.export.exposition import OPENMETRICS, render

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
    optionally gzipped (the body's part compressed at its render)."""

    def __init__(self, on_error=None, level: int = GZIP_LEVEL) -> None:
        self._proc = process_registry()
        self._on_error = on_error
        self.level = level

    def _process_text(self, fmt: str) -> bytes:
        try:
            text = render(self._proc, fmt)
        except Exception as e:  # noqa: BLE001 - contained: the graphmon families still go out
            if self._on_error is not None:
                self._on_error("scrape", e)
            return b""
        return text[: -len(EOF_LINE)] if fmt == OPENMETRICS and text.endswith(EOF_LINE) else text

    def plain(self, body: Body, fmt: str) -> bytes:
        return body.text[: body.size] + self._process_text(fmt) + body.text[body.size:]

    def gzipped(self, body: Body, fmt: str) -> bytes:
        """The same bytes as :meth:`plain`, gzipped (one member); ``body`` rendered with gzip."""
        return gzip_with(body, self._process_text(fmt) + body.text[body.size:], self.level)
