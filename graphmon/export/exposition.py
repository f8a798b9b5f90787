"""/metrics formats: content negotiation, headers, and a registry's families rendered apart.

Prometheus asks for OpenMetrics first. :func:`render_families` writes a prometheus_client
registry's families (the agent's own, the deploy verdict's, process_*) in either format, the
same bytes as prometheus_client's encoders (tested), 2.0-3.3x faster than they are for the same
Metric objects (bench/results/exposition-speed.json); graphmon's per-rank series skip the
registry altogether (graphmon.export.textwriter: 4.7-13x). Bodies: graphmon.export.body.
"""

from __future__ import annotations

from typing import Sequence

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


def escape_label_value(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def header(name: str, typ: str, doc: str, fmt: str = TEXT) -> str:
    """A family's HELP and TYPE lines, as prometheus_client writes them in ``fmt`` (a counter's
    text-format name carries _total; its OpenMetrics family name does not)."""
    if fmt == OPENMETRICS:
        doc = escape_label_value(doc)
    else:
        doc = doc.replace("\\", "\\\\").replace("\n", "\\n")
        if typ == "counter":
            name += "_total"
        elif typ == "unknown":
            typ = "untyped"
    return f"# HELP {name} {doc}\n# TYPE {name} {typ}\n"


Family = tuple  # (name, "# HELP ...\n# TYPE ...\n", sample lines): one metric family, rendered


def render_families(registry: CollectorRegistry, fmt: str = TEXT) -> list[Family]:
    """Each family of ``registry`` rendered apart, in collection order (graphmon.export.body
    puts families of several parts together)."""
    return render_formats(registry, (fmt,))[fmt]


def render_formats(registry: CollectorRegistry, formats: Sequence[str]) -> dict[str, list[Family]]:
    """:func:`render_families` in several formats from one collection (sample lines are the
    same in both formats; headers differ)."""
    out: dict[str, list[Family]] = {fmt: [] for fmt in formats}
    esc: dict[str, str] = {}
    for m in registry.collect():
        lines: list[str] = []
        for smp in m.samples:
            if smp.labels:
                parts = []
                for k, v in sorted(smp.labels.items()):
                    e = esc.get(v)
                    if e is None:
                        e = esc[v] = escape_label_value(v)
                    parts.append(f'{k}="{e}"')
                lines.append(f"{smp.name}{{{','.join(parts)}}} {floatToGoString(smp.value)}\n")
            else:
                lines.append(f"{smp.name} {floatToGoString(smp.value)}\n")
        text = "".join(lines)
        for fmt in formats:
            out[fmt].append((m.name, header(m.name, m.type, m.documentation, fmt), text))
    return out


def render(registry: CollectorRegistry, fmt: str = TEXT) -> bytes:
    """The text (0.0.4) or OpenMetrics (1.0.0) body of ``registry``, byte-identical to
    prometheus_client's ``generate_latest`` of each format (tested)."""
    fams = render_families(registry, fmt)
    body = "".join(h + smp for _, h, smp in fams)
    return (body + "# EOF\n" if fmt == OPENMETRICS else body).encode("utf-8")


def render_text(registry: CollectorRegistry) -> bytes:
    return render(registry, TEXT)
