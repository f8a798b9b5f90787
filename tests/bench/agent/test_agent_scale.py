"""bench/agent/agent_scale.py and bench/common/agentload.py end to end on a real agent process (no GPU)."""

from bench.agent import agent_scale
from bench.common.agentload import metric_sum, window_records


def test_a_benchmark_window_is_whole_replays_of_the_real_trace():
    from graphmon.model.edges import assemble

    r = window_records(20_000)
    w = assemble(r)  # what the agent does with it
    assert 19_000 <= len(w.trace) == len(r) <= 21_000 and dict(w.trace.invalid) == {}


def test_one_case_counts_every_window_it_sent():
    doc = agent_scale.run_case(2, 2.0, seconds=3.0, records=2_000, log=lambda m: None)
    assert doc["processes_lost"] == 0 and doc["link_reconnects"] == 0, doc
    assert doc["windows_sent"] >= 10 and doc["windows_ingested"] == doc["windows_sent"]
    assert doc["records_ingested"] == doc["windows_sent"] * len(window_records(2_000))  # whole replays, all kept
    assert doc["agent_cpu_cores"] > 0 and doc["scrape_prometheus_accept"]["failures"] == 0


def test_metric_sum_reads_exact_sample_names_and_labels():
    text = ('graphmon_windows_total{rank="0"} 3.0\ngraphmon_windows_total{rank="1"} 4.0\n'
            'graphmon_windows_total_x 9.0\ngraphmon_agent_windows_dropped_total{rank="0",reason="memory"} 2.0\n')
    assert metric_sum(text, "graphmon_windows_total") == 7.0
    assert metric_sum(text, "graphmon_agent_windows_dropped_total", reason="memory") == 2.0
