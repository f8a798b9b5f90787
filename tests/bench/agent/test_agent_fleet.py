"""bench/agent/agent_fleet.py end to end on a real agent process (no GPU), and its window shape."""

from bench.agent import agent_fleet


def test_the_window_is_the_held_out_shape_and_the_agent_keeps_all_of_it():
    from graphmon.analysis.replays import analyze
    from graphmon.model.edges import assemble

    w = assemble(agent_fleet.held_out_window())  # what the agent does with it
    a = analyze(w.trace)
    assert len(w.trace) == 4 * 4 * 240 and dict(w.trace.invalid) == {}
    assert len(a.replays) == 16 and len(a.gaps) == 4 * 4  # 4 graphs x 4 streams
    assert {g.upload_mode for g in w.trace.graphs} == {"uploaded", "lazy"}


def test_a_short_case_loses_nothing_and_counts_series_per_rank():
    doc = agent_fleet.run_case(2, 3.0, None, log=lambda m: None)
    assert doc["windows_lost"] == 0 and doc["windows_made"] >= 4 and doc["scrape_failures"] == 0, doc
    assert 200 < doc["series_per_rank_max"] <= agent_fleet.TARGETS["series_per_rank"]
    assert doc["agent_cpu_cores"] > 0 and doc["scrapes"] >= 3
