"""/metrics bodies: content negotiation and graphmon's own text and OpenMetrics renderers.

Prometheus asks for OpenMetrics first; prometheus_client's OpenMetrics encoder takes 20-33 ms for
1,000+ series (holding the GIL of the process that serves). The renderers here write the same
bytes (tested against prometheus_client) about 10x faster: graphmon's metric and label names are
valid by construction, so only label values need escaping. :class:`MetricsRenderer` renders each
format once per set of snapshots, and keeps exactly one body per format (never keyed by what a
client sends).
"""

from __future__ import annotations

import threading
from typing import Callable, Optional, Sequence

from prometheus_client.registry import CollectorRegistry
from prometheus_client.utils import floatToGoString

TEXT = "text"
OPENMETRICS = "openmetrics"
CONTENT_TYPES = {
    TEXT: "text/plain; version=0.0.4; charset=utf-8",
    OPENMETRICS: "application/openmetrics-text; version=1.0.0; charset=utf-8",
}
FORMATS = (TEXT, OPENMETRICS)
_OM_VERSIONS = ("", "1.0.0", "0.0.1")  # what Prometheus asks for; both are answered with 1.0.0
_TEXT_VERSIONS = ("", "0.0.4")


def negotiate(accept: str) -> str:
    """The format to answer an Accept header with: the highest-q media range graphmon serves
    (first wins on a tie); anything else (unknown versions, garbage) gets the text format."""
    best, best_q = TEXT, -1.0
    for part in (accept or "").split(",")[:32]:  # bounded work per header
        toks = [t.strip() for t in part.split(";")]
        media = toks[0].lower()
        params = {}
        for t in toks[1:]:
            k, _, v = t.partition("=")
            params[k.strip().lower()] = v.strip().strip('"')
        try:
            q = float(params.get("q", "1"))
        except ValueError:
            continue
        if not 0 < q <= 1:
            continue
        version = params.get("version", "")
        if media == "application/openmetrics-text" and version in _OM_VERSIONS:
            fmt = OPENMETRICS
        elif media == "text/plain" and version in _TEXT_VERSIONS:
            fmt = TEXT
        elif media in ("*/*", "text/*"):
            fmt = TEXT
        else:
            continue
        if q > best_q:
            best, best_q = fmt, q
    return best


def _escape_label_value(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def render(registry: CollectorRegistry, fmt: str = TEXT) -> bytes:
    """The text (0.0.4) or OpenMetrics (1.0.0) body of ``registry``, byte-identical to
    prometheus_client's ``generate_latest`` of each format (tested)."""
    om = fmt == OPENMETRICS
    out: list[str] = []
    esc: dict[str, str] = {}
    for m in registry.collect():
        name, typ = m.name, m.type
        if om:
            doc = _escape_label_value(m.documentation)
        else:
            doc = m.documentation.replace("\\", "\\\\").replace("\n", "\\n")
            if typ == "counter":
                name += "_total"
            elif typ == "unknown":
                typ = "untyped"
        out.append(f"# HELP {name} {doc}\n# TYPE {name} {typ}\n")
        for smp in m.samples:
            if smp.labels:
                parts = []
                for k, v in sorted(smp.labels.items()):
                    e = esc.get(v)
                    if e is None:
                        e = esc[v] = _escape_label_value(v)
                    parts.append(f'{k}="{e}"')
                out.append(f"{smp.name}{{{','.join(parts)}}} {floatToGoString(smp.value)}\n")
            else:
                out.append(f"{smp.name} {floatToGoString(smp.value)}\n")
    if om:
        out.append("# EOF\n")
    return "".join(out).encode("utf-8")


def render_text(registry: CollectorRegistry) -> bytes:
    return render(registry, TEXT)


class MetricsRenderer:
    """One cached body per format for the current snapshots.

    ``prerender()`` (called by whoever publishes snapshots, off the request path) renders every
    format; ``body(fmt)`` answers from the cache when the snapshots are the same objects, answers
    the previous body while a render is in progress, else renders (one render at a time) and
    caches. Memory: at most one body per format.
    """

    def __init__(self, get_snapshots: Callable[[], Sequence], make_registry: Callable[[Callable], CollectorRegistry],
                 fallback_registry: Optional[CollectorRegistry] = None, on_error: Optional[Callable] = None):
        self._get = get_snapshots
        self._make = make_registry
        self._fallback = fallback_registry
        self._on_error = on_error
        self._cache: dict[str, tuple[tuple, bytes, int]] = {}  # format -> (snapshots, body, generation)
        self._gen = 0  # bumped by invalidate(): something beside the snapshots changed (the deploy verdict)
        self._lock = threading.Lock()  # one render at a time: bounded transient memory and CPU
        self.renders = 0

    @staticmethod
    def _same(a: Sequence, b: Sequence) -> bool:
        return len(a) == len(b) and all(x is y for x, y in zip(a, b))

    def cached(self, fmt: str) -> Optional[bytes]:
        """The body if it is current (no rendering): cheap enough for the event loop."""
        snaps = tuple(self._get())
        hit = self._cache.get(fmt)
        return hit[1] if hit is not None and hit[2] == self._gen and self._same(hit[0], snaps) else None

    def invalidate(self) -> None:
        """The next body is rendered anew (call prerender() after it to render it off the request path)."""
        self._gen += 1

    def body(self, fmt: str, stage: str = "scrape") -> bytes:
        if not self._lock.acquire(blocking=False):
            # A render is in progress (normally the pre-render of a snapshot published a moment
            # ago): answer with the body before it rather than queue behind it. It is at most one
            # snapshot older, and counters in it are never ahead of what the next scrape shows.
            hit = self._cache.get(fmt)
            if hit is not None and stage == "scrape":
                return hit[1]
            self._lock.acquire()
        try:
            snaps, gen = tuple(self._get()), self._gen
            hit = self._cache.get(fmt)
            if hit is not None and hit[2] == gen and self._same(hit[0], snaps):
                return hit[1]
            try:
                data = render(self._make(lambda: snaps), fmt)
            except Exception as e:  # contained: count, and still answer with the health families
                if self._on_error is not None:
                    self._on_error(stage, e)
                if self._fallback is None:
                    raise
                return render(self._fallback, fmt)
            self.renders += 1
            self._cache[fmt] = (snaps, data, gen)
            return data
        finally:
            self._lock.release()

    def prerender(self, *_: object) -> None:
        for fmt in FORMATS:
            self.body(fmt, stage="publish")
