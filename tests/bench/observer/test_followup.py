"""bench/observer/followup.py's pure parts: the contrast of graph instances (against a hand-computed
t interval, and against the replay bootstrap when instances differ), GRAPH_TRACE's cost blocks
and phases from synthetic npz contents, and the CLI on bad folders. No GPU."""

import json

import numpy as np
import pytest

from bench.common import observer_stats as C
from bench.observer import followup as F


def test_instance_contrast_is_a_t_interval_over_instance_medians():
    res = F.instance_contrast({"a": [10, 10, 9], "b": [12, 12, 13]}, {"c": [14], "d": [16]})
    # medians 10, 12 against 14, 16: diff 4, pooled variance (2 + 2) / 2, se = sqrt(2 * (1/2 + 1/2))
    half = 4.302652729911275 * np.sqrt(2.0)
    assert res["diff"] == pytest.approx(4.0)
    assert res["df"] == 2
    assert res["diff_ci"] == pytest.approx([4 - half, 4 + half])
    assert res["pct"] == pytest.approx(100 * 4 / 11)
    assert res["base_instances"] == {"a": 10.0, "b": 12.0}


def test_instance_spread_widens_what_the_replay_bootstrap_calls_a_cost():
    rng = np.random.default_rng(1)

    def inst(us):
        return us + rng.normal(0, 0.5, 150)

    base = {"pre1": inst(1605), "pre2": inst(1591)}  # no cost at all: instances differ by ~1%
    other = {"post1": inst(1610), "post2": inst(1619)}
    by_replay = C.boot_diff(np.concatenate(list(base.values())), np.concatenate(list(other.values())), n_boot=300)
    by_instance = F.instance_contrast(base, other)
    assert by_replay["pct_ci"][0] > 0.3  # the replay bootstrap "finds" a cost
    assert by_instance["pct_ci"][0] < 0 < by_instance["pct_ci"][1]  # the instances do not
    assert by_instance["diff"] == pytest.approx(16.5, abs=0.3)


def test_one_instance_a_side_has_no_interval():
    res = F.instance_contrast({"a": [1.0]}, {"b": [2.0]})
    assert res["diff"] == 1.0 and res["df"] == 0 and np.isnan(res["diff_ci"]).all()


def _blocks(us, first_extra=300.0, n=8, size=20, seed=0):
    b = us + np.random.default_rng(seed).normal(0, 0.3, (n, size))
    b[:, 0] += first_extra
    return b


def synthetic_signal_npz() -> dict:
    raw = {}
    for name, before, on in (("decode_pre1", 1414, 1604), ("decode_pre2", 1406, 1591)):
        raw[f"cost_before_{name}_gpu_us"], raw[f"cost_{name}_gpu_us"] = _blocks(before), _blocks(on, seed=1)
        raw[f"cost_before_{name}_launch_us"], raw[f"cost_{name}_launch_us"] = _blocks(700, 0), _blocks(345, 0)
    for name, on in (("decode_post1", 1610), ("decode_post2", 1619)):
        raw[f"cost_{name}_gpu_us"], raw[f"cost_{name}_launch_us"] = _blocks(on, seed=2), _blocks(350, 0)
    for name in ("decode_pre1", "decode_post1"):
        for ph, us in (("gt_on", 1600), ("kernel_window", 1930), ("gt_again", 1728)):
            spans = np.full(6, us * 1e3) + np.arange(6)
            spans[0] += 50e3  # the first replay after a switch: left out
            raw[f"{ph}_{name}_inner_span_ns"] = spans
    return raw


def test_graph_trace_costs_by_instance_and_levels():
    c = F.graph_trace_costs(synthetic_signal_npz())
    assert list(c) == ["decode"]
    g = c["decode"]["records_cost_by_instance_gpu_us"]
    assert g["diff"] == pytest.approx((1610 + 1619) / 2 - (1604 + 1591) / 2, abs=0.2)
    assert g["df"] == 2
    lv = c["decode"]["levels"]["decode_pre1"]
    assert min(lv["before_block_medians_us"]) > 1413 and max(lv["before_block_medians_us"]) < 1415  # first replays out
    assert lv["gt_on_block_medians_us"][0] == pytest.approx(1604, abs=0.5)
    assert lv["before_launch_us"] == pytest.approx(700, abs=0.5) and lv["gt_on_launch_us"] == pytest.approx(345, abs=0.5)
    assert "decode_post1" not in c["decode"]["levels"]  # no blocks before enabling: none reported


def test_phase_table_against_gt_on():
    t = F.phase_table(synthetic_signal_npz(), n_boot=200)
    assert sorted(t) == ["decode_post1", "decode_pre1"]
    row = t["decode_pre1"]
    assert row["gt_on"]["median_us"] == pytest.approx(1600.003)
    assert row["gt_again"]["vs_gt_on"]["pct"] == pytest.approx(8.0, abs=0.01)
    assert "both_on" not in row and "vs_gt_on" not in row["gt_on"]


def test_cli_writes_json_and_refuses_bad_folders(tmp_path, capsys):
    np.savez(tmp_path / "signal-graph_trace.npz", **synthetic_signal_npz())
    assert F.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "GRAPH_TRACE records, decode, by instance: GPU +" in out and "gt_again 1728.0 (+8.00%" in out
    doc = json.loads((tmp_path / "followup.json").read_text())
    assert set(doc) == {"graph_trace"}
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(SystemExit):
        F.main([str(empty)])
    with pytest.raises(SystemExit):
        F.main([str(tmp_path / "missing")])
