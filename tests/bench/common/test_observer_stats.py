"""bench/common/observer_stats.py: intervals, a replay cut at event boundaries, the ground-truth
comparison and the stage runner, on synthetic timelines whose answers are known. No GPU."""

import json
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "observer"))
from observer_synth import chain_replay  # noqa: E402

from bench.common import observer_stats as C  # noqa: E402

from graphmon.analysis.replays import analyze  # noqa: E402
from graphmon.model.trace import GraphInfo, Trace  # noqa: E402


def test_boot_ci_holds_the_median_and_narrows_with_n():
    rng = np.random.default_rng(1)
    small = C.boot_ci(rng.normal(100, 5, 30))
    big = C.boot_ci(rng.normal(100, 5, 3000))
    assert small[1] < 100 < small[2] and big[1] < 100 < big[2]
    assert big[2] - big[1] < (small[2] - small[1]) / 4


def test_boot_diff_recovers_a_known_shift_and_its_percent():
    rng = np.random.default_rng(2)
    base = rng.normal(1000, 10, 400)
    d = C.boot_diff(base, base + 30 + rng.normal(0, 1, 400))
    assert d["diff"] == pytest.approx(30, abs=2) and d["diff_ci"][0] < 30 < d["diff_ci"][1] + 2
    assert d["pct"] == pytest.approx(3.0, abs=0.2) and d["pct_ci"][0] < d["pct"] < d["pct_ci"][1]
    none = C.boot_diff(base, rng.normal(1000, 10, 400))
    assert none["diff_ci"][0] < 0 < none["diff_ci"][1]  # no shift: the interval holds 0


def test_paired_is_the_difference_of_the_same_replays():
    x = np.arange(100.0) * 10
    p = C.paired(x, x + 7)
    assert p["median"] == 7 and p["median_ci"] == [7, 7] and p["median_abs"] == 7 and p["n"] == 100


def test_union_busy_merges_overlaps_across_streams_per_group():
    start = np.array([0, 5, 20, 100, 100, 150])
    end = np.array([10, 12, 30, 110, 130, 160])
    group = np.array([0, 0, 0, 1, 1, 1])
    assert C.union_busy(start, end, group, 2).tolist() == [22, 40]  # [0,12] + [20,30]; [100,130] + [150,160]


def test_replay_metrics_windows_equal_the_event_groups_on_a_chain():
    layout = [("add", 2), ("add", 8), ("sleep", 32)]
    k, ev = chain_replay(layout, d_ns=1000, gap_ns=300, ev_ns=500)
    m = C.replay_metrics(k[:, 0], k[:, 1], k[:, 2], k[:, 4], [2, 8, 32, 1])
    assert np.allclose(m["window_ns"], C.group_times_ns(ev[None])[0])  # CUPTI's window = the event time
    assert m["busy_ns"].tolist() == [2000, 8000, 32000]
    assert m["gaps"].tolist() == [2, 8, 32]
    # every gap is 300 except the one into the next group, which holds the event node too
    assert m["gap_sum_ns"].tolist() == [2 * 300 + 500, 8 * 300 + 500, 32 * 300 + 500]
    assert np.allclose(m["window_ns"], m["busy_ns"] + m["gap_sum_ns"])  # one stream
    assert m["span_ns"] == m["busy_total_ns"] + m["idle_ns"]
    with pytest.raises(C.LayoutError):
        C.replay_metrics(k[:, 0], k[:, 1], k[:, 2], k[:, 4], [2, 8, 31, 1])
    shuffled = np.random.default_rng(0).permutation(len(k))  # record order does not matter, node ids do
    m2 = C.replay_metrics(k[shuffled, 0], k[shuffled, 1], k[shuffled, 2], k[shuffled, 4], [2, 8, 32, 1])
    assert m2["window_ns"].tolist() == m["window_ns"].tolist()


def test_replay_metrics_cuts_layers_by_node_order_whatever_their_stream_ids():
    # two layers, each: norm (0-10), side (12-30), matmul (32-50), captured on one "main" stream
    # and a side stream; as on the H200, the main stream's kernels come back on two stream ids
    rows = [(0, 10, 1, 0), (12, 30, 2, 1), (32, 50, 3, 2), (60, 70, 3, 3), (72, 100, 2, 4), (102, 120, 1, 5),
            (130, 131, 1, 6)]
    k = np.array(rows)
    m = C.replay_metrics(k[:, 0], k[:, 1], k[:, 2], k[:, 3], [3, 3, 1])
    assert m["kernels"].tolist() == [3, 3]
    assert m["window_ns"].tolist() == [60, 70]
    assert m["busy_ns"].tolist() == [46, 56]
    assert m["span_ns"] == 120 and m["busy_total_ns"] == 102 and m["idle_ns"] == 18
    swapped = np.array([0, 4, 2, 3, 1, 5, 6])  # node ids that would put a kernel of layer 2 into layer 1
    with pytest.raises(C.LayoutError):
        C.replay_metrics(k[:, 0], k[:, 1], k[:, 2], swapped, [3, 3, 1])


def test_span_busy_idle_and_gaps_match_graphmons_analysis():
    """The bench measures what graphmon exports: its definitions, on the same records."""
    rng = np.random.default_rng(3)
    rows = []
    for corr in range(1, 4):
        t = corr * 1_000_000
        for s in (1, 2, 3):
            tt = t + int(rng.integers(0, 500))
            for _ in range(6):
                d = int(rng.integers(500, 3000))
                rows.append((tt, tt + d, s, corr))
                tt += d + int(rng.integers(100, 900))
    a = np.array(rows, np.int64)
    tr = Trace.build(start_ns=a[:, 0], end_ns=a[:, 1], stream=a[:, 2], correlation_id=a[:, 3],
                     graph_id=np.ones(len(a)), device=np.zeros(len(a)),
                     graphs=[GraphInfo(key="g1", graph_id=1, upload_mode="uploaded")])
    ref = analyze(tr)
    for i, corr in enumerate(ref.replays.correlation_id):
        m = a[:, 3] == corr
        s = C.replay_summary(a[m, 0], a[m, 1], a[m, 2])
        assert (s["span_ns"], s["busy_ns"], s["idle_ns"]) == (ref.replays.span_ns[i], ref.replays.busy_ns[i], ref.replays.idle_ns[i])
    mine = np.sort(np.concatenate([C.stream_gaps(a[a[:, 3] == c, 0], a[a[:, 3] == c, 1], a[a[:, 3] == c, 2])[0]
                                   for c in (1, 2, 3)]))
    assert mine.tolist() == np.sort(ref.gaps.values).tolist()


def synthetic_arms(layout, gap_u, gap_t, ev_ns=600, d_ns=1200, replays=40, seed=0):
    rng = np.random.default_rng(seed)
    inner_u, inner_t, metrics = [], [], []
    types = [f"{k}x{n}" for k, n in layout]
    counts = [n for _, n in layout] + [1]
    for r in range(replays):
        _, ev = chain_replay(layout, d_ns, gap_u + int(rng.integers(-20, 20)), ev_ns)
        inner_u.append(ev)
        k, ev = chain_replay(layout, d_ns, gap_t + int(rng.integers(-20, 20)), ev_ns, t0=r * 10**7, corr=r)
        inner_t.append(ev)
        metrics.append(C.replay_metrics(k[:, 0], k[:, 1], k[:, 2], k[:, 4], counts))
    return np.array(inner_u), np.array(inner_t), metrics, types


def test_compare_groups_recovers_the_inflation_per_gap():
    layout = [("add", 2), ("add", 8), ("add", 32)] * 2
    iu, it, metrics, types = synthetic_arms(layout, gap_u=300, gap_t=700)
    out = C.compare_groups(C.group_times_ns(iu), C.group_times_ns(it), metrics, types, n_boot=300)
    for n in (2, 8, 32):
        g = out[f"addx{n}"]
        assert g["event_ns"]["diff"] == pytest.approx(400 * n, rel=0.05)  # every gap +400 ns
        assert abs(g["cupti_minus_event_ns"]["median"]) < 1  # CUPTI shows what the events see
        assert g["idle_per_kernel_ns"]["untraced"] == pytest.approx(300 + 600 / n, rel=0.05)
        assert g["idle_per_kernel_ns"]["traced_cupti"] == pytest.approx(700 + 600 / n, rel=0.05)
        assert g["cupti_gap_mean_ns"][0] == pytest.approx(700 + 600 / n, rel=0.05)
        assert g["idle_inflation"]["diff"] == pytest.approx(400 * n, rel=0.05)
    rep = C.compare_replays(iu[:, -1] * 1e6, it[:, -1] * 1e6, metrics, n_boot=300)
    kernels = 2 * (2 + 8 + 32)
    assert rep["event_span_ns"]["diff"] == pytest.approx(400 * kernels, rel=0.05)
    assert rep["implied_untraced"]["busy_ns"] == kernels * 1200
    # traced idle minus the inflation = the idle CUPTI would have shown untraced (its span runs from
    # the first kernel to the last: without the first event node and the gap into the last event),
    # up to that last gap's inflation
    untraced_idle = np.median(iu[:, -1] * 1e6) - 600 - 300 - kernels * 1200
    assert abs(rep["implied_untraced"]["idle_ns"] - untraced_idle) <= 400 + 40


def test_regression_splits_per_kernel_from_per_boundary_cost():
    layout = [("add", 2), ("add", 8), ("add", 32)] * 2
    iu, it, _, _ = synthetic_arms(layout, gap_u=300, gap_t=550)
    fit = C.regression_by_size(C.group_times_ns(iu), C.group_times_ns(it), [n for _, n in layout],
                               [k for k, _ in layout], n_boot=200)
    assert fit["add"]["per_kernel_ns"]["diff"] == pytest.approx(250, abs=10)
    assert abs(fit["add"]["per_boundary_ns"]["diff"]) < 60


def test_stages_record_a_failure_and_run_the_next(tmp_path):
    path = tmp_path / "r.json"
    st = C.Stages(str(path), {"x": 1})

    def boom():
        raise RuntimeError("no GPU here")

    st.run("a", boom)
    st.run("b", lambda: {"v": np.float64(2.5), "arr": np.arange(3)})
    doc = json.loads(path.read_text())
    assert "RuntimeError: no GPU here" in doc["errors"]["a"]
    assert doc["stages"]["b"] == {"v": 2.5, "arr": [0, 1, 2]} and set(doc["seconds"]) == {"a", "b"}
