"""graphmon.export.detail: which graphs keep series of their own at the default level (stably),
and graph signatures computed once per graph."""

from __future__ import annotations

from graphmon.export.aggregator import Aggregator
from graphmon.export.detail import DETAIL_HALF_LIFE_S, DetailGraphs
from graphmon.export.snapshot import GraphSeries
from helpers import synthetic_trace, window


def _g(mode="lazy"):
    return GraphSeries(graph="x", graph_key="", label="", upload_mode=mode, upload_stream_is_launch_stream="unknown")


def test_free_slots_go_to_the_most_gpu_time_ties_by_name():
    d = DetailGraphs(2)
    graphs = {("0", n): _g() for n in "abcd"}
    for n, t in zip("abcd", (10, 30, 30, 20)):
        d.replayed(("0", n), t, 0.0)
    assert d.pick(graphs, 0.0) == {("0", "b"), ("0", "c")}


def test_a_graph_takes_a_slot_only_with_twice_the_gpu_time():
    d = DetailGraphs(1)
    graphs = {("0", "a"): _g(), ("0", "b"): _g()}
    d.replayed(("0", "a"), 100, 0.0)
    assert d.pick(graphs, 0.0) == {("0", "a")}
    for t in range(1, 20):  # b a little busier every window: no flapping
        d.replayed(("0", "a"), 100, float(t))
        d.replayed(("0", "b"), 190, float(t))
        assert d.pick(graphs, float(t)) == {("0", "a")}
    for t in range(20, 200):  # b twice as busy for long enough: it takes the slot, and keeps it
        d.replayed(("0", "a"), 100, float(t))
        d.replayed(("0", "b"), 300, float(t))
        d.pick(graphs, float(t))
    assert d.pick(graphs, 200.0) == {("0", "b")}


def test_a_graph_that_stopped_gives_way_and_an_expired_one_frees_its_slot():
    d = DetailGraphs(1)
    graphs = {("0", "old"): _g(), ("0", "new"): _g()}
    d.replayed(("0", "old"), 10_000, 0.0)
    assert d.pick(graphs, 0.0) == {("0", "old")}
    t = 0.0
    while d.pick(graphs, t) == {("0", "old")}:
        t += 10.0
        d.replayed(("0", "new"), 10, t)
    assert t < 20 * DETAIL_HALF_LIFE_S
    d2 = DetailGraphs(1)
    d2.replayed(("0", "old"), 10_000, 0.0)
    d2.replayed(("0", "new"), 1, 0.0)
    assert d2.pick({("0", "new"): _g()}, 0.0) == {("0", "new")}  # "old" expired


def test_the_best_graph_of_each_upload_mode_first():
    d = DetailGraphs(2)
    graphs = {("0", "a"): _g("lazy"), ("0", "b"): _g("lazy"), ("0", "c"): _g("uploaded")}
    for n, t in zip("abc", (100, 90, 10)):
        d.replayed(("0", n), t, 0.0)
    assert d.pick(graphs, 0.0) == {("0", "a"), ("0", "c")}


def test_the_aggregator_names_its_detail_graphs_in_every_snapshot():
    agg = Aggregator(detail_graphs=1)
    short = synthetic_trace(n_graphs=2, replays=3)
    agg.ingest(window(short))
    assert len(agg.snapshot().detail_graphs) == 1 and len(agg.snapshot().graphs) == 2
    agg = Aggregator(detail_graphs=0)
    agg.ingest(window(short))
    assert agg.snapshot().detail_graphs == frozenset()
