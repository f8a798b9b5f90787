"""bench/agent/soak_agent.py for 30 s: every hostile peer at once beside the well-behaved collectors
(the 10-minute run's figures are in bench/results/soak-agent.md)."""

import pytest

from bench.agent import soak_agent


@pytest.mark.slow
def test_hostile_peers_cost_the_well_behaved_nothing():
    doc = soak_agent.run(minutes=0.5, sample_s=5.0, warmup_s=10.0, log=lambda m: None)
    s = doc["summary"]
    assert s["well_behaved_windows_sent"] >= 8 * 25
    assert s["well_behaved_records_lost"] == 0 and s["well_behaved_dropped_anywhere"] == 0, s["well_behaved"]
    assert s["well_behaved_reconnects"] == 0
    assert s["healthz_failures"] == 0 and s["healthz_p99_ms"] < 1000
    # the hostile peers were there, and each was refused or counted
    rej, bad = s["connections_rejected"], s["frames_rejected"]
    assert rej["unidentified_evicted"] + rej["hello_timeout"] > 0 and rej["bad_hello"] > 0
    assert bad["status"] > 0 and bad["window"] > 0 and bad["too_large"] > 0
    assert s["sigterm_exit_code"] == 0
