import threading

import numpy as np

from graphmon.export.aggregator import Aggregator
from graphmon.model.window import SourceHealth
from graphmon.formats.read import read_trace

from helpers import NATIVE, synthetic_trace, untraced, window


def test_cumulative_across_windows_and_last_window_quantiles():
    agg = Aggregator()
    agg.ingest(window(synthetic_trace(gap_ns=200)))
    agg.ingest(window(synthetic_trace(gap_ns=500, base_ns=10**8)))
    s = agg.snapshot()
    (key,) = s.gap_hist
    h = s.gap_hist[key]
    assert h.count == 2 * 3 * 3  # 2 windows x 3 replays x (4 kernels - 1)
    assert h.sum_ns == 9 * 200 + 9 * 500
    assert s.gap_quantiles[key] == (500.0, 500.0, 500.0, 500.0)  # the last window only
    assert s.windows_total == 2 and s.records_total == 24
    rk = (key[0], key[1], key[3])
    assert s.replays_total[rk] == 6
    assert s.kernels_per_replay[rk] == 4
    assert s.replay_hist[rk]["gpu"].count == 6


def test_a_kind_missing_from_the_last_window_keeps_its_quantiles():
    """A window with one replay of a graph has no gap between replays: that kind keeps the
    previous window's quantiles, so its series do not vanish and come back window by window."""
    agg = Aggregator()
    agg.ingest(window(synthetic_trace(replays=3)))
    (rk,) = agg.snapshot().replay_quantiles
    before = agg.snapshot().replay_quantiles[rk]
    assert "inter_replay_gap" in before
    agg.ingest(window(synthetic_trace(replays=1, gap_ns=900, base_ns=10**8)))
    after = agg.snapshot().replay_quantiles[rk]
    assert after["inter_replay_gap"] == before["inter_replay_gap"]  # kept
    assert after["gpu"] != before["gpu"]  # the kinds the window has are its own


def test_graph_and_stream_caps_fold_into_other_and_count():
    agg = Aggregator(max_graphs=2, max_streams=3)
    agg.ingest(window(synthetic_trace(n_graphs=5, n_streams=6)))
    s = agg.snapshot()
    graphs = {k[1] for k in s.gap_hist}
    assert graphs == {"graph0", "graph1", "other"}
    streams_g0 = {k[2] for k in s.gap_hist if k[1] == "graph0"}
    assert streams_g0 == {"0", "1", "2", "other"}
    # folded: 3 graphs + (3 extra streams for each of graph0, graph1, other)
    assert s.series_folded_total == 3 + 3 * 3
    # nothing is lost: total gap count equals the unfolded total
    assert sum(h.count for h in s.gap_hist.values()) == 5 * 6 * 3 * 3


def test_ten_thousand_streams_are_capped():
    agg = Aggregator(max_streams=16)
    agg.ingest(window(synthetic_trace(n_streams=10_000, replays=1, kernels_per_stream=2)))
    s = agg.snapshot()
    assert len(s.gap_hist) == 17
    assert s.series_folded_total == 10_000 - 16
    assert sum(h.count for h in s.gap_hist.values()) == 10_000


def test_traced_time_is_summed_into_a_counter_that_never_decreases():
    agg = Aggregator()
    assert agg.snapshot().kernel_tracing_s_total == 0.0  # exported as 0 before any window
    agg.ingest(window(synthetic_trace(), traced_s=0.0125))
    agg.ingest(window(synthetic_trace(base_ns=10**8), traced_s=0.0075))
    assert agg.snapshot().kernel_tracing_s_total == 0.02
    assert agg.ingest(window(synthetic_trace(base_ns=2 * 10**8), traced_s=-1.0)) is None  # refused, counted
    s = agg.snapshot()
    assert s.kernel_tracing_s_total == 0.02 and s.windows_total == 2 and s.errors_total["analysis"] == 1


def test_a_failing_window_is_counted_and_the_next_proceeds():
    agg = Aggregator()

    class Boom:
        def __getattr__(self, name):
            raise RuntimeError("broken trace")

    assert agg.ingest(window(synthetic_trace())) is not None
    assert agg.ingest(window(Boom())) is None
    assert agg.ingest(window(synthetic_trace(base_ns=10**8))) is not None
    s = agg.snapshot()
    assert s.errors_total["analysis"] == 1
    assert s.windows_total == 2


def test_health_and_errors_come_from_the_source():
    agg = Aggregator(health=lambda: SourceHealth(up=False, state="blocked", reason="profiler", errors={"callback": 3}))
    s = agg.snapshot()
    assert not s.up and s.health.reason == "profiler"
    assert s.errors_total["callback"] == 3


def test_real_trace_upload_modes_and_medians():
    t = read_trace(NATIVE)
    agg = Aggregator()
    agg.ingest(window(t))
    s = agg.snapshot()
    modes = {(k[1], k[3]) for k in s.gap_hist}
    assert ("decode_bs1/upload", "uploaded") in modes and ("decode_bs1/no_upload", "lazy") in modes
    # main stream 7 median gap in the decode graphs from the raw columns, independently
    for (d, graph, stream, mode), q in s.gap_quantiles.items():
        if graph.startswith("decode") and stream == "7":
            assert 300 <= q[1] <= 500


def test_scrape_never_waits_for_ingest():
    agg = Aggregator()
    agg.ingest(window(synthetic_trace()))
    got = []
    with agg._lock:  # an ingest in progress holds this lock
        th = threading.Thread(target=lambda: got.append(agg.snapshot()))
        th.start()
        th.join(1.0)
    assert got, "snapshot() blocked on the ingest lock"


def test_backend_info_learned_after_start_reaches_the_snapshot():
    # the CUPTI source knows which libcupti it loaded only once it runs
    info = {"backend": "cupti"}
    agg = Aggregator(backend_info=lambda: info)
    assert agg.snapshot().backend_info == {"backend": "cupti"}
    info = {"backend": "cupti", "cupti_lib_version": "13.4.92"}
    agg.refresh()
    assert agg.snapshot().backend_info["cupti_lib_version"] == "13.4.92"


def test_refresh_if_changed_rebuilds_only_on_change():
    state = {"s": "running", "errors": {}}
    agg = Aggregator(health=lambda: SourceHealth(up=state["s"] == "running", state=state["s"], errors=dict(state["errors"])))
    agg.refresh()
    first = agg.snapshot()
    assert agg.refresh_if_changed() is False and agg.snapshot() is first  # nothing changed: no rebuild
    state["s"] = "blocked"
    assert agg.refresh_if_changed() is True and agg.snapshot().health.state == "blocked"
    assert agg.refresh_if_changed() is False
    state["errors"] = {"callback": 1}  # a source error counted between windows
    assert agg.refresh_if_changed() is True and agg.snapshot().errors_total == {"callback": 1}
    agg.count_error("http", RuntimeError("x"))  # the aggregator's own count (e.g. a failed request)
    assert agg.refresh_if_changed() is True and agg.snapshot().errors_total["http"] == 1
    agg.ingest(window(synthetic_trace()))  # a window publishes what it saw: no extra rebuild after
    assert agg.refresh_if_changed() is False


# ---------------------------------------------------------------- issue 18 items 11-15, issue 14 items 3-4
def _concat(*traces):
    from graphmon.model.trace import Trace

    cols = ("start_ns", "end_ns", "stream", "correlation_id", "graph_id", "device")
    a = {c: np.concatenate([getattr(t, c) for t in traces]) for c in cols}
    graphs = {g.graph_id: g for t in traces for g in t.graphs}
    return Trace.build(**a, graphs=list(graphs.values()))


def test_negative_gaps_stay_out_of_the_histogram_and_sum_never_decreases():
    agg = Aggregator()
    sums = []
    for i, gap in enumerate((400, -300, -300, 200)):  # overlaps (PDL) in two windows
        agg.ingest(window(synthetic_trace(gap_ns=gap, base_ns=10**9 * (i + 1))))
        h = next(iter(agg.snapshot().gap_hist.values()))
        sums.append(h.sum_ns)
        assert h.count == sum(h.counts)
    assert sums == sorted(sums) and sums[0] > 0  # old code: the sum went negative and decreased
    assert next(iter(agg.snapshot().gap_negative_total.values())) == 2 * 3 * 3  # counted apart


def test_long_label_values_are_cut_distinct_and_counted():
    from dataclasses import replace

    t = synthetic_trace(n_graphs=2)
    long = "x" * 300_000
    t = replace(t, graphs=tuple(replace(g, label=long + str(i)) for i, g in enumerate(t.graphs)))
    agg = Aggregator(max_label_length=64)
    agg.ingest(window(t))
    s = agg.snapshot()
    labels = {g.label for g in s.graphs.values()}
    assert len(labels) == 2 and all(len(v) <= 64 for v in labels)  # distinct after the cut
    assert s.label_values_truncated_total == 4  # graph name and label of both graphs, once each
    agg.ingest(window(t, ended_s=1_800_000_001.0))
    assert agg.snapshot().label_values_truncated_total == 4


def test_devices_are_capped_and_folded_devices_counted():
    agg = Aggregator(max_graphs=2, max_streams=2, max_devices=3)
    agg.ingest(window(_concat(*[synthetic_trace(device=d, base_ns=10**6 * (d + 1)) for d in range(10)])))
    s = agg.snapshot()
    assert {k[0] for k in s.gap_hist} == {"0", "1", "2", "other"}
    assert s.series_folded_total == 7  # old code: 0 folded, one series set per device


def test_timestamps_beyond_the_horizon_are_excluded_and_counted_no_overflow():
    from graphmon.export.buckets import MAX_VALUE_NS

    huge = 6 * 10**18
    t = synthetic_trace(kernels_per_stream=3, replays=1, gap_ns=400)
    start, end = t.start_ns.copy(), t.end_ns.copy()
    start[1:] += np.array([huge // 2, huge])  # two gaps of ~3e18 ns
    end[1:] += np.array([huge // 2, huge])
    from graphmon.model.trace import Trace

    t = Trace.build(start_ns=start, end_ns=end, stream=t.stream, correlation_id=t.correlation_id,
                    graph_id=t.graph_id, graphs=t.graphs)
    agg = Aggregator()
    agg.ingest(window(t))
    s = agg.snapshot()
    h = next(iter(s.gap_hist.values()))
    assert h.count == 0 and h.sum_ns == 0  # old code: negative sum, negative mean
    assert s.values_out_of_range_total["gap"] == 2
    assert all(0 <= hh.sum_ns for kinds in s.replay_hist.values() for hh in kinds.values())
    assert MAX_VALUE_NS < 2**63 // 10**6  # a window of a million values at the horizon cannot overflow


def test_folded_identity_memory_is_bounded(monkeypatch):
    import graphmon.export.aggregator as mod

    monkeypatch.setattr(mod, "FOLDED_MEMORY", 8)
    agg = Aggregator(max_graphs=1)
    for i in range(40):
        tr = synthetic_trace(base_ns=10**6 * (i + 1))
        from dataclasses import replace

        tr = replace(tr, graphs=tuple(replace(g, key=f"k{i}", label=f"l{i}") for g in tr.graphs))
        agg.ingest(window(tr))
    assert len(agg._folded) <= 8
    assert agg.snapshot().series_folded_total == 39


def test_stale_graphs_expire_and_last_sampled_is_exported():
    import time as _time

    agg = Aggregator(stale_after_s=30)
    now = _time.time()
    agg.ingest(window(synthetic_trace(n_graphs=1), ended_s=now - 60))  # sampled a minute ago
    assert agg.snapshot().graphs == {}  # expired at once: older than stale_after_s
    agg.ingest(window(synthetic_trace(n_graphs=1), ended_s=now))
    s = agg.snapshot()
    assert list(s.graph_last_sampled_s.values()) == [now] and len(s.gap_hist) == 1
    agg.stale_after_s = 1e-3
    _time.sleep(0.01)
    assert agg.refresh_if_changed()  # a stale series is a change
    s = agg.snapshot()
    assert not s.gap_hist and not s.replay_hist and not s.graphs and not s.graph_last_sampled_s


def test_batch_size_reaches_the_graph_series():
    from dataclasses import replace

    t = synthetic_trace()
    t = replace(t, graphs=tuple(replace(g, batch_size=8) for g in t.graphs))
    agg = Aggregator()
    agg.ingest(window(t))
    assert [g.batch_size for g in agg.snapshot().graphs.values()] == ["8"]


def test_negative_invalid_counts_are_refused_not_subtracted():
    from dataclasses import replace

    agg = Aggregator()
    agg.ingest(window(replace(synthetic_trace(), invalid={"duplicate": -13000})))
    s = agg.snapshot()
    assert s.records_invalid_total.get("duplicate", 0) == 0 and s.errors_total["analysis"] == 1


def test_negative_launch_latencies_are_counted_apart():
    from graphmon.model.trace import GraphInfo, Trace

    # launch latencies 50, -1, -30 ns (CPU clock ahead of the GPU's) and one replay without a launch record
    rows = np.array([(100, 200, 1, 7), (220, 300, 2, 7), (400, 500, 1, 8), (600, 700, 1, 9), (800, 900, 1, 10)])
    t = Trace.build(start_ns=rows[:, 0], end_ns=rows[:, 1], stream=rows[:, 2], correlation_id=rows[:, 3],
                    graph_id=np.ones(5, dtype=np.int64), graphs=[GraphInfo(key="g1", graph_id=1)],
                    launches={"correlation_id": [7, 8, 9], "graph": [0, 0, 0], "launch_ns": [50, 401, 630],
                              "stream": [5, 5, 5]})
    agg = Aggregator()
    agg.ingest(window(t))
    s = agg.snapshot()
    (kinds,) = s.replay_hist.values()
    assert kinds["launch_latency"].count == 1 and kinds["launch_latency"].sum_ns == 50
    # old code: -1 was taken for "no launch record" and dropped uncounted; -30 went under "launch_latency"
    assert s.values_out_of_range_total["negative_launch_latency"] == 2
    assert s.values_out_of_range_total.get("launch_latency", 0) == 0


def test_graph_info_signature_follows_a_changed_graph(monkeypatch):
    """The signature is a label beside the name: a successor's changed graph keeps its name. It
    is computed once per graph exec of a process (old code: on every window, a fifth of the
    agent's ingest thread at 64 ranks), again for the graphs of a new process on the rank."""
    from dataclasses import replace

    import graphmon.export.detail as detail_mod

    calls = []
    real = detail_mod.graph_signatures
    monkeypatch.setattr(detail_mod, "graph_signatures", lambda t: calls.append(1) or real(t))
    t = read_trace(NATIVE, progress=False)
    agg = Aggregator(rank="0", process={"pid": "1"})
    agg.ingest(window(t))
    agg.ingest(window(t, ended_s=1_800_000_005.0))
    assert len(calls) == 1
    before = {g: s.signature for (_, g), s in agg.snapshot().graphs.items()}
    assert before["decode_bs1/upload"].startswith("k960-s4-o0-")
    agg.process = {"pid": "2"}  # a successor took the rank over (the agent sets its identity)
    node = t.graph_node_id
    agg.ingest(window(replace(t, graph_node_id=(node >> 32 << 32) | ((node & 0xFFFFFFFF) * 2)), ended_s=1_800_000_010.0))
    after = {g: s.signature for (_, g), s in agg.snapshot().graphs.items()}
    assert set(after) == set(before) and len(calls) == 2
    assert after["decode_bs1/upload"].startswith("k960-s4-o959-")


def _mixed_gaps_trace(base_ns=10**9):
    """One replay on one stream whose gaps are -300, -300, 100, 200, 400 ns (two overlaps)."""
    from graphmon.model.trace import Trace

    starts, ends, t = [], [], base_ns
    for gap in (None, -300, -300, 100, 200, 400):
        if gap is not None:
            t = ends[-1] + gap
        starts.append(t)
        ends.append(t + 1000)
    n = len(starts)
    return Trace.build(start_ns=np.array(starts), end_ns=np.array(ends), stream=np.zeros(n, np.int64),
                       correlation_id=np.ones(n, np.int64), graph_id=np.ones(n, np.int64))


def test_gap_summary_quantiles_count_and_sum_have_one_definition():
    """Overlaps (negative gaps) are excluded from the quantiles as from _count and _sum: old
    code exported p10 = -300 ns beside a _count of the 3 non-negative gaps, and the negative
    quantile made prometheus_client's OpenMetrics parser refuse the whole scrape."""
    from prometheus_client.openmetrics.parser import text_string_to_metric_families

    from graphmon.export.collector import make_registry
    from graphmon.export.exposition import OPENMETRICS, render

    agg = Aggregator()
    agg.ingest(window(_mixed_gaps_trace()))
    s = agg.snapshot()
    (key,) = s.gap_hist
    h = s.gap_hist[key]
    assert (h.count, h.sum_ns) == (3, 700)
    assert s.gap_quantiles[key] == tuple(float(x) for x in np.quantile([100, 200, 400], (0.1, 0.5, 0.9, 0.99)))
    body = render(make_registry(agg.snapshots, cardinality="full"), OPENMETRICS).decode()
    fams = {f.name: f for f in text_string_to_metric_families(body)}  # old code: ValueError, negative quantile
    q = [smp for smp in fams["graphmon_kernel_gap_quantile_seconds"].samples if "quantile" in smp.labels]
    assert len(q) == 4 and min(smp.value for smp in q) > 0


def test_a_series_with_only_overlaps_exports_no_quantile():
    from graphmon.export.collector import make_registry
    from graphmon.export.exposition import TEXT, render

    agg = Aggregator()
    agg.ingest(window(synthetic_trace(gap_ns=-300)))
    (qs,) = agg.snapshot().gap_quantiles.values()
    assert all(q != q for q in qs)  # NaN: no non-negative gap in the window
    body = render(make_registry(agg.snapshots, cardinality="full"), TEXT).decode()
    assert 'graphmon_kernel_gap_quantile_seconds{' not in body
    assert "graphmon_kernel_gap_quantile_seconds_count{" in body


# ---------------------------------------------------------------- untraced replay times (issue 36)
def _plus_graph(t, label="burst_only"):
    """``t`` with one more graph that has no kernels in it (a graph timed only untraced)."""
    from dataclasses import replace

    from graphmon.model.trace import GraphInfo

    return replace(t, graphs=(*t.graphs, GraphInfo(key="g99", graph_id=99, upload_mode="lazy", label=label)))


def test_untraced_histogram_counts_and_sum_are_the_rows_sent():
    from graphmon.export.buckets import UNTRACED_BUCKETS_NS

    rng = np.random.default_rng(36)
    graph = rng.integers(0, 2, 5_000)
    dur = rng.lognormal(np.log(700_000), 1.0, 5_000).astype(np.int64) + 1  # ~50 us .. ~20 ms, some beyond
    agg = Aggregator()
    agg.ingest(window(synthetic_trace(n_graphs=2), untraced=untraced(graph[:3_000], dur[:3_000])))
    agg.ingest(window(synthetic_trace(n_graphs=2), untraced=untraced(graph[3_000:], dur[3_000:])))
    s = agg.snapshot()
    assert set(s.untraced_hist) == {("0", "graph0", "uploaded"), ("0", "graph1", "uploaded")}
    for gi in (0, 1):
        v = dur[graph == gi]
        h = s.untraced_hist[("0", f"graph{gi}", "uploaded")]
        assert h.count == len(v) and h.sum_ns == int(v.sum())  # exact, two windows cumulated
        cum = np.cumsum(h.counts)
        assert cum.tolist() == [int((v <= b).sum()) for b in UNTRACED_BUCKETS_NS] + [len(v)]
    assert s.values_out_of_range_total.get("untraced", 0) == 0


def test_untraced_rows_of_an_unknown_graph_are_counted_under_unknown_and_bad_durations_counted():
    agg = Aggregator()
    t = synthetic_trace(n_graphs=1)
    # -1 and an index past the window's graphs are unknown graphs; 0 and < 0 ns are not replay times
    agg.ingest(window(t, untraced=untraced([-1, -1, 7, 0, 0, 0], [500_000, 600_000, 700_000, 800_000, 0, -5])))
    s = agg.snapshot()
    unknown = s.untraced_hist[("0", "unknown", "unknown")]
    assert unknown.count == 3 and unknown.sum_ns == 1_800_000
    assert s.untraced_hist[("0", "graph0", "uploaded")].count == 1
    assert s.values_out_of_range_total["untraced"] == 2
    assert s.graphs[("0", "unknown")].graph_key == ""  # listed in /graphs, never a detail graph
    assert ("0", "unknown") not in s.detail_graphs


def test_an_empty_untraced_window_changes_nothing():
    from prometheus_client.exposition import generate_latest

    from graphmon.export.collector import make_registry

    a, b = Aggregator(), Aggregator()
    a.ingest(window(synthetic_trace(n_graphs=2)))
    b.ingest(window(synthetic_trace(n_graphs=2), untraced=untraced([], [])))
    sa, sb = a.snapshot(), b.snapshot()
    assert not sb.untraced_hist and not sb.untraced_summary and sa.graphs == sb.graphs
    for level in ("low", "standard", "full"):
        assert generate_latest(make_registry(lambda: [sa], cardinality=level)) == generate_latest(
            make_registry(lambda: [sb], cardinality=level))
    b.ingest(window(synthetic_trace(n_graphs=2), ended_s=1_800_000_001.0, untraced=untraced([1, 1], [3_000, 4_000])))
    before = b.snapshot()
    b.ingest(window(synthetic_trace(n_graphs=2), ended_s=1_800_000_002.0))
    after = b.snapshot()
    assert after.untraced_hist == before.untraced_hist and after.untraced_summary == before.untraced_summary


def test_untraced_rows_of_a_graph_without_kernels_take_its_device_and_keep_the_traced_timestamp():
    import time as _time
    from dataclasses import replace

    now = _time.time()
    t = _plus_graph(synthetic_trace(n_graphs=1, device=2))
    agg = Aggregator()
    agg.ingest(window(t, ended_s=now, untraced=untraced([1, 1], [90_000, 110_000])))
    s = agg.snapshot()
    # no replay and no launch of it in the window: the device of the rank's series
    assert s.untraced_hist[("2", "burst_only", "lazy")].count == 2
    assert ("2", "burst_only") in s.graphs and ("2", "burst_only", "lazy") not in s.graph_last_sampled_s
    # a launch record of the graph on another device says where it ran
    launches = {**{k: np.asarray(v)[:0] for k, v in t.launches.items()}}
    launches.update(correlation_id=np.array([999], np.int64), device=np.array([5], np.int32),
                    graph=np.array([1], np.int32), launch_ns=np.array([-1], np.int64),
                    stream=np.array([-1], np.int64), label=np.array([-1], np.int32))
    agg2 = Aggregator()
    agg2.ingest(window(replace(t, launches=launches), ended_s=now, untraced=untraced([1], [90_000])))
    assert set(agg2.snapshot().untraced_hist) == {("5", "burst_only", "lazy")}


def test_untraced_series_expire_on_their_own_clock():
    """A graph timed untraced keeps its untraced series and its slot while its traced series
    expire (the alert rules read the traced last-sampled time: untraced rows never refresh it)."""
    import time as _time

    now = _time.time()
    agg = Aggregator(stale_after_s=30)
    t = synthetic_trace(n_graphs=2)
    agg.ingest(window(t, ended_s=now - 20))
    agg.ingest(window(t.select(t.graph == 1), ended_s=now, untraced=untraced([0], [500_000])))
    s = agg.snapshot()
    assert s.graph_last_sampled_s[("0", "graph0", "uploaded")] == now - 20
    agg.stale_after_s = 10
    assert agg.refresh_if_changed()
    s = agg.snapshot()
    assert ("0", "graph0", "uploaded") not in s.replay_hist and ("0", "graph0", "uploaded") not in s.graph_last_sampled_s
    assert s.untraced_hist[("0", "graph0", "uploaded")].count == 1 and ("0", "graph0") in s.graphs
    agg.stale_after_s = 1e-3
    _time.sleep(0.01)
    assert agg.refresh_if_changed()
    s = agg.snapshot()
    assert not s.untraced_hist and not s.untraced_summary and not s.graphs
