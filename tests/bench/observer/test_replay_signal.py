"""bench/observer/replay_signal.py's pure parts: arm order, cost tables (each block's first replay apart),
records per graph, a candidate's durations against the in-graph events. No GPU."""

import numpy as np
import pytest

from bench.observer import replay_signal as S


def test_rotations_put_every_arm_first_equally_often():
    orders = S.rotations(("a", "b", "c"), 6)
    assert [o[0] for o in orders] == ["a", "b", "c", "a", "b", "c"]
    assert all(sorted(o) == ["a", "b", "c"] for o in orders)


def test_cost_table_recovers_a_known_cost_and_keeps_first_replays_apart():
    rng = np.random.default_rng(0)

    def blocks(base_us, first_extra):
        out = []
        for _ in range(8):
            b = base_us + rng.normal(0, 0.5, 20)
            b[0] += first_extra
            out.append(b)
        return out

    arms = {"off": {"gpu_us": blocks(1500, 0)}, "on": {"gpu_us": blocks(1501.5, 300)}}
    t = S.cost_table(arms, "off", n_boot=300)
    assert t["off"]["gpu_us"]["diff"] == 0
    on = t["on"]["gpu_us"]
    assert on["diff"] == pytest.approx(1.5, abs=0.2) and on["diff_ci"][0] > 0.5
    assert on["pct"] == pytest.approx(0.1, abs=0.02)
    assert on["first_of_block_median"] == pytest.approx(1801.5, abs=2)


def test_per_graph_counts_split_records_by_graph_and_launch():
    gt = np.array([[0, 9, 7, 5, 100], [10, 19, 7, 5, 101], [20, 29, 7, 6, 102], [30, 39, 7, 9, 103]])
    c = S.per_graph_counts(gt, 3, 4, {"pre": 4, "post": 5, "other_post": 6})
    assert c == {"pre": {"records": 0, "launches": 0}, "post": {"records": 2, "launches": 2},
                 "other_post": {"records": 1, "launches": 1}, "_other": 1}
    assert S.per_graph_counts(np.empty(0), 3, 4, {"g": 1}) == {"g": {"records": 0, "launches": 0}, "_other": 0}


def test_duration_accuracy_pairs_in_order():
    inner = np.arange(10) * 100.0 + 1000
    acc = S.duration_accuracy(inner + 250, inner, inner + 400)
    assert acc["minus_inner_span_ns"]["median"] == 250 and acc["minus_outer_ns"]["median"] == -150
    short = S.duration_accuracy(inner[:4] + 5, inner, inner)
    assert short["n_candidate"] == 4 and short["minus_inner_span_ns"]["n"] == 4


@pytest.mark.parametrize("args", [["--stages", "nope"], ["--block", "2"], ["--rounds", "0"]])
def test_cli_refuses_bad_arguments(tmp_path, args):
    with pytest.raises(SystemExit):
        S.main(["--out", str(tmp_path)] + args)
