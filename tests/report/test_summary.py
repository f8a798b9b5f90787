"""report.summary: /status dicts from a snapshot, and the one graph-family rule."""

import re

import pytest

from graphmon.export.aggregator import Aggregator
from graphmon.report.summary import graph_family, snapshot_graphs, upload_mode_comparison
from graphmon.report.tables import format_table

from helpers import DATA, synthetic_trace, window

REPO_ROOT = DATA.parents[1]


def _family_regex() -> str:
    src = (REPO_ROOT / "dashboards" / "generate.py").read_text()
    m = re.search(r'^FAMILY_REGEX = "(.*)"$', src, re.M)
    if m is None:
        pytest.skip("dashboards/generate.py has no FAMILY_REGEX any more (upload_mode label instead)")
    return m.group(1)


@pytest.mark.parametrize("graph", ["decode_bs1/upload", "decode_bs1/no_upload", "a/b/lazy", "plain", "x/uploaded",
                                   "x/instantiate_upload", "x/other", "x/upload/extra", ""])
def test_graph_family_agrees_with_the_dashboards(graph):
    rx = _family_regex()  # Prometheus anchors label_replace regexes: fullmatch
    assert graph_family(graph) == re.fullmatch(rx, graph).group(1)


def test_status_graphs_are_formatted_from_the_snapshot():
    agg = Aggregator()
    assert snapshot_graphs(agg.snapshot()) == []
    agg.ingest(window(synthetic_trace(n_graphs=2, n_streams=2)))
    g = snapshot_graphs(agg.snapshot())
    assert [x["graph"] for x in g] == ["graph0", "graph1"] and len(g[0]["streams"]) == 2


def test_upload_mode_comparison_groups_by_family():
    from dataclasses import replace

    a = synthetic_trace(gap_ns=400)
    b = synthetic_trace(gap_ns=800, upload_mode="lazy", base_ns=10**8)
    a = replace(a, graphs=tuple(replace(g, label="dec/upload") for g in a.graphs))
    b = replace(b, graphs=tuple(replace(g, key="g9", label="dec/no_upload") for g in b.graphs))
    agg = Aggregator()
    agg.ingest(window(a))
    agg.ingest(window(b))
    (row,) = upload_mode_comparison(agg.snapshot())
    assert row["graph_family"] == "dec" and row["median_gap_ns_by_upload_mode"] == {"uploaded": 400.0, "lazy": 800.0}


def test_format_table_lives_in_tables():
    doc = {"kernels": 1, "replays": 0, "non_graph_kernels": 0, "invalid_records": {}, "graphs": []}
    assert format_table(doc).startswith("1 kernels, 0 replays")
