"""One-minute soak (bench/serve/soak.py): `graphmon serve` replays the real H200 trace at 10 windows/s
under 8 scrapers (+ captures and trace downloads). Bounds after a 20 s warm-up: RSS grows
< 64 MiB, threads and open fds stay within a handful, every request answers, the trace store
and the graph series cap hold. The 10-minute run's figures are in bench/results/soak.md."""

import pytest

from bench.common.paths import MiB
from bench.serve.soak import run_soak

RSS_GROWTH_BOUND_MIB = 64
THREADS_SLACK = 4  # uvicorn's worker threads for sync handlers come and go
FDS_SLACK = 4  # a scraper connection being accepted or closed at the sample instant
STORE_COUNT = 8
MAX_GRAPHS = 3  # the trace has 6 graphs: the cap must fold the other 3 into graph="other"


@pytest.mark.slow
def test_one_minute_soak_stays_bounded():
    doc = run_soak(minutes=1.0, window_interval_s=0.1, sample_s=10.0, warmup_s=20.0,
                   trace_store_count=STORE_COUNT, trace_store_mib=64, max_graphs=MAX_GRAPHS, log=lambda m: None)
    s, samples = doc["summary"], doc["samples"]
    assert s["duration_s"] >= 60
    assert s["failures"] == [] and set(s["requests_by_status"]) == {"200"}, s["requests_by_status"]
    assert s["requests_total"] > 500 and s["windows_total"] > 100
    assert s["captures"] >= 1 and s["traces_downloaded"] >= 1
    assert s["rss_growth_after_warmup_mib"] < RSS_GROWTH_BOUND_MIB, samples
    _, warm_t, end_t = s["threads_start_warm_end"]
    assert abs(end_t - warm_t) <= THREADS_SLACK and s["threads_max"] <= warm_t + 2 * THREADS_SLACK
    _, warm_f, end_f = s["fds_start_warm_end"]
    assert abs(end_f - warm_f) <= FDS_SLACK and s["fds_max"] <= warm_f + 2 * FDS_SLACK
    assert s["trace_store_windows_max"] == STORE_COUNT  # filled, never exceeded
    assert s["metrics_graphs_max"] == MAX_GRAPHS + 1  # 3 own series + "other"
    assert s["series_folded_total_end"] == 6 - MAX_GRAPHS
    warm_series, end_series, max_series = s["metrics_series_warm_end_max"]
    assert end_series == warm_series == max_series  # no series growth over time
    assert s["errors_total_end"] == {}
    assert s["sigterm_exit_code"] == 0 and s["sigterm_exit_s"] < 10
    assert max(x["rss_bytes"] for x in samples) < 1024 * MiB
