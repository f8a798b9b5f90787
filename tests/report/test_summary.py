"""report.summary: /status dicts from a snapshot, and the one graph-family rule."""

import pytest

from graphmon.export.aggregator import Aggregator
from graphmon.report.summary import graph_family, snapshot_graphs, upload_mode_comparison
from graphmon.report.tables import format_table

from helpers import DATA, synthetic_trace, window

REPO_ROOT = DATA.parents[1]


@pytest.mark.parametrize("graph,family", [
    ("decode_bs1/upload", "decode_bs1"), ("decode_bs1/no_upload", "decode_bs1"), ("a/b/lazy", "a/b"),
    ("plain", "plain"), ("x/uploaded", "x"), ("x/instantiate_upload", "x"), ("x/other", "x/other"),
    ("x/upload/extra", "x/upload/extra"), ("", ""),
])
def test_graph_family_strips_only_a_trailing_upload_suffix(graph, family):
    # /status pairs a graph's upload modes by family; dashboards and alerts use the upload_mode
    # label instead (dashboards/generate.py parses no graph names)
    assert graph_family(graph) == family
    assert "FAMILY_REGEX" not in (REPO_ROOT / "dashboards" / "generate.py").read_text()


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
