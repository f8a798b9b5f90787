"""The Prometheus collector: metric families from the latest snapshots (one per attached process).

A scrape calls ``collect()``, which reads the snapshot references and formats them: no CUPTI, no
analysis, no lock shared with the collecting threads. Each family is yielded once, with samples
from every snapshot. What each level exports is graphmon.export.families; graphmon's own
/metrics bodies are written from the same series by graphmon.export.textwriter (the same
bytes), this class serves prometheus_client registries (a host's own, and the tests).
"""

from __future__ import annotations

from typing import Callable, Iterable, Mapping, Optional, Sequence

from prometheus_client.core import Metric
from prometheus_client.registry import CollectorRegistry

from graphmon.export.families import (  # noqa: F401 (re-exported: the names callers know)
    BUILD, DEFAULT_LEVEL, HEALTH, INFO, INVALID_REASONS, KNOWN_STAGES, LEVELS, STATES, VALUE_KINDS, Fam, build_info,
    families, rank_labels, rank_series,
)
from graphmon.export.snapshot import Snapshot

CARDINALITIES = LEVELS


def _samples(m: Metric, fam: Fam, row: tuple, const: tuple) -> None:
    names = (tuple(n for n, _ in const) if fam.per_rank else ())
    vals = (tuple(v for _, v in const) if fam.per_rank else ())
    if fam.labels is None:
        names, vals = names + tuple(n for n, _ in row[0]), vals + tuple(v for _, v in row[0])
    else:
        names, vals = names + fam.labels, vals + row[0]
    labels = dict(zip(names, vals))
    if fam.type == "histogram":
        for le, c in zip(row[1], row[2]):
            m.add_sample(fam.name + "_bucket", {**labels, "le": le}, c)
        m.add_sample(fam.name + "_count", labels, row[2][-1])
        m.add_sample(fam.name + "_sum", labels, row[3])
    elif fam.type == "summary":
        for q, v in row[1]:
            m.add_sample(fam.name, {**labels, "quantile": q}, v)
        if row[2] is not None:
            m.add_sample(fam.name + "_count", labels, row[2])
            m.add_sample(fam.name + "_sum", labels, row[3])
    else:
        m.add_sample(fam.name + "_total" if fam.type == "counter" else fam.name, labels, row[1])


class SnapshotCollector:
    """A prometheus_client collector (the one-method ``collect`` protocol).

    ``health_only``: only the health families (up, state, info, counters), for a fallback when a
    full render fails or for a deployment that wants no per-graph series. ``cardinality``: the
    level (graphmon.export.families). ``extra_errors``: contained errors counted outside the
    snapshots (the HTTP layer), added to the first snapshot's rank.
    """

    def __init__(self, get_snapshots: Callable[[], Sequence[Snapshot]], *, health_only: bool = False,
                 cardinality: str = DEFAULT_LEVEL, extra_errors: Optional[Callable[[], Mapping[str, int]]] = None):
        if cardinality not in CARDINALITIES:
            raise ValueError(f"cardinality must be one of {CARDINALITIES}")
        self._get = get_snapshots
        self.health_only, self.cardinality = health_only, cardinality
        self._extra_errors = extra_errors

    def collect(self) -> Iterable[Metric]:
        snaps = tuple(self._get())
        extra = dict(self._extra_errors()) if self._extra_errors is not None else {}
        per: dict[str, list] = {}
        for n, s in enumerate(snaps):
            const = rank_labels(s)
            for fam, rows in rank_series(s, self.cardinality, extra if n == 0 else None, self.health_only):
                per.setdefault(fam.name, []).extend((row, const) for row in rows)
        for fam in (HEALTH if self.health_only else families(self.cardinality)):
            rows = per.get(fam.name, [])
            if fam is BUILD:  # one series per distinct build, whoever exports it
                rows = [((b, 1), ()) for b in sorted({r[0] for r, _ in rows})]
            if fam is INFO and len({tuple(n for n, _ in r[0]) for r, _ in rows}) > 1:
                # label sets differ per backend: one family with the union of label names
                names = sorted({n for r, c in rows for n, _ in (*c, *r[0])})
                rows = [((tuple((k, dict((*c, *r[0])).get(k, "")) for k in names), 1), ()) for r, c in rows]
            m = Metric(fam.name, fam.help, fam.type)
            for row, const in rows:
                _samples(m, fam, row, const)
            yield m


class HealthCollector:
    """The health families only: up, state, info and the counters (no per-graph series). A public
    option for deployments that want no per-graph series, and the /metrics fallback when a full
    render fails (its own class, so a fault in the full collector cannot take it down too)."""

    def __init__(self, get_snapshots: Callable[[], Sequence[Snapshot]], **kw):
        self._c = SnapshotCollector(get_snapshots, **{**kw, "health_only": True})

    def collect(self) -> Iterable[Metric]:
        return self._c.collect()


def make_registry(get_snapshots: Callable[[], Sequence[Snapshot]], *, health_only: bool = False,
                  extra: Sequence = (), **kw) -> CollectorRegistry:
    """graphmon's own registry (not the global default): only graphmon's families, plus ``extra``
    collectors (the agent's process-health families)."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(HealthCollector(get_snapshots, **kw) if health_only else SnapshotCollector(get_snapshots, **kw))
    for c in extra:
        reg.register(c)
    return reg

