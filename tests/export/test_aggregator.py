import threading

import numpy as np
import pytest

from graphmon.export.aggregator import Aggregator
from graphmon.export.buckets import GAP_BUCKETS_NS, bucket_counts
from graphmon.export.tracestore import TraceStore
from graphmon.model.window import SourceHealth
from graphmon.formats.read import read_trace

from helpers import NATIVE, synthetic_trace, window


def test_bucket_counts_le_semantics():
    v = np.array([-5, 32, 33, 64, 10**9], dtype=np.int64)
    c = bucket_counts(v, np.zeros(5, dtype=np.int64), 1, GAP_BUCKETS_NS)[0]
    assert c[0] == 2  # -5 and 32 are <= 32 ns (negatives land in the lowest bucket)
    assert c[1] == 2  # 33 and 64
    assert c[-1] == 1  # +Inf
    assert c.sum() == 5


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


def test_snapshot_is_immutable():
    agg = Aggregator()
    agg.ingest(window(synthetic_trace()))
    s = agg.snapshot()
    with pytest.raises(TypeError):
        s.gap_hist[("x",)] = None  # type: ignore[index]
    with pytest.raises(Exception):
        s.windows_total = 5  # type: ignore[misc]


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


def test_trace_store_bounds_count_and_bytes():
    t = synthetic_trace()
    size = TraceStore.size_of(t)
    st = TraceStore(max_count=3, max_bytes=size * 2)
    for i in range(5):
        st.put(f"w{i}", t)
    assert st.ids() == ["w3", "w4"]
    assert st.nbytes <= size * 2
    assert st.evicted == 3
    st0 = TraceStore(max_count=0, max_bytes=10**9)
    st0.put("a", t)
    assert st0.get("a") is None


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
