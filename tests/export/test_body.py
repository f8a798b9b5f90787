"""graphmon.export.body: bodies from family blocks, compressed only where a family changed, one
gzip member per scrape."""

from __future__ import annotations

import gzip
import zlib

from graphmon.export.aggregator import Aggregator
from graphmon.export.body import Blocks, RankPieces, gzip_with, skeleton
from graphmon.export.exposition import OPENMETRICS, TEXT
from helpers import synthetic_trace, window


def _ranks(n, ingest=1):
    out = []
    for r in range(n):
        a = Aggregator(rank=str(r), detail_graphs=2)
        for i in range(ingest):
            a.ingest(window(synthetic_trace(n_graphs=2, n_streams=4, replays=4), ended_s=1.8e9 + i))
        out.append(a)
    return out


def test_a_render_compresses_only_what_changed_and_gzip_is_one_member():
    aggs = _ranks(16)
    pieces, blocks, errors = RankPieces(), Blocks(), {}

    def body():
        parts = pieces.parts([(str(i), a.snapshot()) for i, a in enumerate(aggs)], lambda: errors)
        return blocks.build(OPENMETRICS, [skeleton("standard", OPENMETRICS), *parts], gzip=True)

    first = body()
    full = blocks.compressed_bytes
    assert full >= first.size and pieces.renders == 16
    same = body()
    assert same.gz == first.gz and blocks.compressed_bytes == full and pieces.renders == 16  # nothing changed
    errors["http"] = 1  # one family of rank 0 changes (graphmon_collector_errors)
    body()
    assert pieces.renders == 17 and 0 < blocks.compressed_bytes - full < 0.2 * full  # that family's run only
    aggs[3].ingest(window(synthetic_trace(n_graphs=2, n_streams=4, replays=4), ended_s=1.8e9 + 9))
    changed = body()
    assert pieces.renders == 18  # rank 3 only
    tail = b"# process_x 1.0\n" + changed.text[changed.size:]
    wire = gzip_with(changed, tail)
    one = zlib.decompressobj(16 + zlib.MAX_WBITS)
    assert one.decompress(wire) == changed.text[: changed.size] + tail and one.eof and not one.unused_data
    assert gzip.decompress(wire).endswith(b"# EOF\n")
    assert len(wire) < 1.1 * len(gzip.compress(changed.text))  # compressed apart, yet as small


def test_a_format_nobody_asked_gzipped_is_not_compressed():
    blocks = Blocks()
    parts = RankPieces().parts([("0", _ranks(1)[0].snapshot())], dict)
    b = blocks.build(TEXT, [skeleton("standard", TEXT), *parts])
    assert b.gz is None and blocks.compressed_bytes == 0 and b.size == len(b.text)
