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
from typing import Callable, Optional, Protocol, Sequence

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


Family = tuple  # (name, "# HELP ...\n# TYPE ...\n", sample lines): one metric family, rendered


def render_families(registry: CollectorRegistry, fmt: str = TEXT) -> list[Family]:
    """Each family of ``registry`` rendered apart, in collection order (:func:`join_families`
    puts families of several registries together)."""
    om = fmt == OPENMETRICS
    out: list[Family] = []
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
        lines: list[str] = []
        for smp in m.samples:
            if smp.labels:
                parts = []
                for k, v in sorted(smp.labels.items()):
                    e = esc.get(v)
                    if e is None:
                        e = esc[v] = _escape_label_value(v)
                    parts.append(f'{k}="{e}"')
                lines.append(f"{smp.name}{{{','.join(parts)}}} {floatToGoString(smp.value)}\n")
            else:
                lines.append(f"{smp.name} {floatToGoString(smp.value)}\n")
        out.append((m.name, f"# HELP {name} {doc}\n# TYPE {name} {typ}\n", "".join(lines)))
    return out


def join_families(parts: Sequence[Sequence[Family]], fmt: str = TEXT, dedupe: frozenset = frozenset()) -> bytes:
    """One body from the families of several renders: a family that several parts have is
    written once (the first part's header), its samples in part order; in families named in
    ``dedupe`` a sample line that is there already is left out (e.g. one build_info line for
    many processes of one build)."""
    order: dict[str, list] = {}
    for part in parts:
        for name, header, samples in part:
            got = order.get(name)
            if got is None:
                order[name] = [header, [samples]]
            else:
                got[1].append(samples)
    out: list[str] = []
    for name, (header, samples) in order.items():
        out.append(header)
        if name in dedupe:
            seen: dict[str, None] = {}
            for chunk in samples:
                for line in chunk.splitlines(keepends=True):
                    seen.setdefault(line, None)
            out.extend(sorted(seen))
        else:
            out.extend(samples)
    if fmt == OPENMETRICS:
        out.append("# EOF\n")
    return "".join(out).encode("utf-8")


def render(registry: CollectorRegistry, fmt: str = TEXT) -> bytes:
    """The text (0.0.4) or OpenMetrics (1.0.0) body of ``registry``, byte-identical to
    prometheus_client's ``generate_latest`` of each format (tested)."""
    fams = render_families(registry, fmt)
    body = "".join(h + smp for _, h, smp in fams)
    return (body + "# EOF\n" if fmt == OPENMETRICS else body).encode("utf-8")


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
        self._provider: Optional[BodySource] = None
        self._get = get_snapshots
        self._make = make_registry
        self._fallback = fallback_registry
        self._on_error = on_error
        self._cache: dict[str, tuple[tuple, bytes]] = {}  # format -> (snapshots, body)
        self._lock = threading.Lock()  # one render at a time: bounded transient memory and CPU
        self.renders = 0

    @staticmethod
    def _same(a: Sequence, b: Sequence) -> bool:
        return len(a) == len(b) and all(x is y for x, y in zip(a, b))

    def serve_from(self, provider: "BodySource") -> None:
        """Answer /metrics from ``provider`` (its ``cached(fmt)`` and ``body(fmt)``) from now on:
        the agent renders on a thread of its own, at most once per interval."""
        self._provider = provider

    def invalidate(self) -> None:
        """Forget the cached bodies, after any render in progress stored its body (that one is
        forgotten too): the next body is rendered from what is current now."""
        with self._lock:
            self._cache.clear()

    def cached(self, fmt: str) -> Optional[bytes]:
        """The body if it is current (no rendering): cheap enough for the event loop."""
        if self._provider is not None:
            return self._provider.cached(fmt)
        snaps = tuple(self._get())
        hit = self._cache.get(fmt)
        return hit[1] if hit is not None and self._same(hit[0], snaps) else None

    def body(self, fmt: str, stage: str = "scrape") -> bytes:
        if self._provider is not None:
            return self._provider.body(fmt)
        if not self._lock.acquire(blocking=False):
            # A render is in progress (normally the pre-render of a snapshot published a moment
            # ago): answer with the body before it rather than queue behind it. It is at most one
            # snapshot older, and counters in it are never ahead of what the next scrape shows.
            hit = self._cache.get(fmt)
            if hit is not None and stage == "scrape":
                return hit[1]
            self._lock.acquire()
        try:
            snaps = tuple(self._get())
            hit = self._cache.get(fmt)
            if hit is not None and self._same(hit[0], snaps):
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
            self._cache[fmt] = (snaps, data)
            return data
        finally:
            self._lock.release()

    def prerender(self, *_: object) -> None:
        if self._provider is not None:
            return
        for fmt in FORMATS:
            self.body(fmt, stage="publish")


class BodySource(Protocol):
    def cached(self, fmt: str) -> Optional[bytes]: ...

    def body(self, fmt: str) -> bytes: ...
