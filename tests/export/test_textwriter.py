"""graphmon.export.textwriter: the hand-written exposition of a rank's series is the bytes
prometheus_client writes for the same series, at every level, in both formats."""

from __future__ import annotations

import subprocess

import pytest
from prometheus_client.exposition import generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

from graphmon.export import families
from graphmon.export.aggregator import Aggregator
from graphmon.export.body import Blocks, RankPieces, skeleton
from graphmon.export.collector import make_registry
from graphmon.export.exposition import OPENMETRICS, TEXT
from graphmon.formats.read import read_trace
from graphmon.model.trace import GraphInfo

from _promutil import require_binary
from helpers import KINETO, NATIVE, synthetic_trace, untraced, window


def _snapshots():
    a = Aggregator(rank="0", backend_info={"backend": "replay", "source": 'a "quoted"\nname\\'})
    a.ingest(window(read_trace(NATIVE, progress=False), observer_slowdown=1.25,
                    untraced=untraced([0, 1, 1, 2, -1], [52_000, 640_000, 1_250_001, 99_000_000, 700])))
    # the same backend keys: the adapter merges graphmon_collector_info label sets across snapshots
    # (one registry), the writer writes each rank's own (per-rank pieces, as the agent always did)
    b = Aggregator(rank="1", backend_info={"backend": "replay", "source": "kineto"})
    b.ingest(window(read_trace(KINETO, progress=False)))
    t = synthetic_trace(n_graphs=3, n_streams=2, gap_ns=-50)
    t = t.with_graphs([GraphInfo(key=f"g{i}", graph_id=i, label=f'we"ird\\lab\nel \u00fc{i}', upload_mode="lazy")
                       for i in (1, 2, 3)])
    c = Aggregator(rank="2", backend_info={"backend": "none", "source": ""})
    c.ingest(window(t, untraced=untraced([0, 2, 2], [30_000, 100_000, 100_001])))
    return [a.snapshot(), b.snapshot(), c.snapshot()]


SNAPS = _snapshots()


def _written(level, fmt, snaps=SNAPS):
    parts = RankPieces(level).parts([(str(i), s) for i, s in enumerate(snaps)], dict)
    return Blocks().build(fmt, [skeleton(level, fmt), *parts]).text


@pytest.mark.parametrize("fmt", [TEXT, OPENMETRICS])
@pytest.mark.parametrize("level", families.LEVELS)
def test_written_bytes_are_prometheus_clients(level, fmt):
    """Label values that need escaping (quote, backslash, newline, UTF-8), three ranks from three
    sources (the bundled CUPTI trace, Kineto with launch times, a synthetic one with overlaps), two
    with untraced replay times (values on bucket bounds, an unknown graph)."""
    reg = make_registry(lambda: SNAPS, cardinality=level)
    want = generate_latest(reg) if fmt == TEXT else generate_openmetrics(reg)
    assert _written(level, fmt) == want


def test_a_constant_label_more_is_one_change(monkeypatch):
    """Per-rank constant labels (a pod's identity, later) come from families.rank_labels only: the
    writer and the prometheus_client adapter follow, and promtool accepts the body."""
    monkeypatch.setattr(families, "rank_labels", lambda s: (("namespace", "ns"), ("pod", f"p{s.rank}"), ("rank", s.rank)))
    import graphmon.export.collector as collector_mod
    import graphmon.export.textwriter as writer_mod

    monkeypatch.setattr(writer_mod, "rank_labels", families.rank_labels)
    monkeypatch.setattr(collector_mod, "rank_labels", families.rank_labels)
    body = _written("standard", TEXT)
    assert body == generate_latest(make_registry(lambda: SNAPS))
    assert 'graphmon_up{namespace="ns",pod="p1",rank="1"} 1.0' in body.decode()
    assert 'graphmon_build_info{cuda_driver_version=""' in body.decode()  # one per build: no rank labels
    r = subprocess.run([require_binary("promtool"), "check", "metrics"], input=body.decode(), capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
