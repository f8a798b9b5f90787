"""bench/observer/shared_probe.py: its pure parts on synthetic phases and records, and the figures it
draws from the real H200 probe trace in tests/data (a copy of the shared npz). No GPU."""

import numpy as np
import pytest
from helpers import DATA

from bench.observer import shared_probe as S

NPZ = DATA / "h200-cupti-decode-v1.npz"


def test_steady_phase_drops_each_blocks_first_replay():
    ms = np.tile(np.r_[5.0, np.ones(149)], 2)
    assert np.all(S.steady_phase(ms, 150) == 1000.0) and len(S.steady_phase(ms, 150)) == 298


def test_phase_table_gives_each_phase_against_plain0():
    rng = np.random.default_rng(0)
    base = 1.0 + rng.normal(0, 1e-3, (1, 300))
    ev = {"plain0": base, "traced": base[:, :80] * 1.12}
    t = S.phase_table(ev, ["g"], n_boot=200)
    assert t["g"]["plain0"]["vs_plain0_pct"] == 0
    assert t["g"]["traced"]["vs_plain0_pct"] == pytest.approx(12, abs=0.3)
    assert t["g"]["traced"]["n"] == 78  # 2 blocks of 40, each one's first apart


def test_traced_replays_pair_each_replay_with_its_event_interval():
    rows, lc, ev = [], [], []
    for i in range(80):
        corr = 100 + i
        lc.append((corr, 0))
        t = i * 10**6
        for j in range(5):  # 5 kernels, 1000 long, 200 apart: span 5800, busy 5000
            rows.append((t + j * 1200, t + j * 1200 + 1000, 7, corr))
        ev.append((5800 + 3000) / 1e6)  # + 3 us to the next replay
    r = np.array(rows)
    out = S.traced_replays(r[:, 0], r[:, 1], r[:, 2], r[:, 3], np.array(lc), ["g"], np.array([ev]), n_boot=100)
    g = out["g"]
    assert g["replays"] == 78 and g["cupti_span_ns"][0] == 5800 and g["cupti_idle_ns"][0] == 800
    assert g["event_minus_span_ns"]["median"] == pytest.approx(3000, abs=1e-6)
    short = S.traced_replays(r[:, 0], r[:, 1], r[:, 2], r[:, 3], np.array(lc), ["g"], np.array([ev[:70]]), n_boot=10)
    assert "error" in short["g"]  # never paired out of step


@pytest.mark.skipif(not NPZ.exists(), reason="tests/data/h200-cupti-decode-v1.npz missing")
def test_the_h200_probe_says_tracing_slows_replays_and_graph_trace_matches_events():
    res = S.run(str(NPZ), n_boot=200)
    for key in res["keys"]:
        p = res["phases"][key]
        assert p["traced"]["pct_ci"][0] > 5  # kernel tracing: +11 to +33% by events
        assert abs(p["after_disable"]["vs_plain0_pct"]) < 1
        t = res["traced_replays"][key]
        assert t["replays"] == 78 and 0 < t["idle_share"] < 0.5
        assert t["event_minus_span_ns"]["median"] > 0  # the event interval holds the span and more
    g = res["graph_trace"]
    assert g["records"] == 20 and list(g["graph_ids"]) == [20]  # only the graph instantiated after enabling it
    assert abs(g["vs_graph_trace_chain/no_upload"]["pct"]) < 1.5  # within instance-to-instance variance


@pytest.mark.skipif(not NPZ.exists(), reason="tests/data/h200-cupti-decode-v1.npz missing")
def test_real_decode_replays_cut_into_layers_by_node_order():
    """The H200's records of the 4-stream decode graph: stream ids do not keep the capture stream
    (the first kernel's stream holds 214 of 960 kernels), node ids do keep capture order, and the
    48 layers cut in node order follow each other in time (the last layer stands in for the marker)."""
    from bench.common import observer_stats as C

    z = np.load(NPZ)
    c = z["correlation_id"]
    key_of = dict(map(tuple, z["launch_correlation"].tolist()))
    for key in range(4):
        corrs = [x for x in np.unique(c) if key_of.get(int(x)) == key]
        assert len(corrs) == 80
        for corr in corrs[:20]:
            m = c == corr
            first_stream = z["stream_id"][m][np.argmin(z["start"][m])]
            assert (z["stream_id"][m] == first_stream).sum() % 48 != 0
            r = C.replay_metrics(z["start"][m], z["end"][m], z["stream_id"][m], z["graph_node_id"][m], [20] * 48)
            assert len(r["window_ns"]) == 47 and (r["busy_ns"] > 0).all() and (r["window_ns"] >= r["busy_ns"]).all()
