"""bench/observer/truth.py's analysis on synthetic raw data (what a GPU run saves), including the
--reanalyze path from the saved npz: known inflation per gap, the first traced replay of each
block kept apart, a block whose records miss a launch. No GPU."""

import json
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from observer_synth import chain_replay  # noqa: E402

from bench.common import observer_stats as C  # noqa: E402
from bench.observer import truth as T  # noqa: E402

LAYOUT = [("add", 2), ("sleep", 2), ("add", 8), ("sleep", 8), ("add", 32), ("sleep", 32)]


def raw_run(pairs=4, block=6, gap_u=300, gap_t=800, first_extra_ns=50_000, drop_block=None, seed=0):
    """What run_graph saves for a chain: in-graph events of untraced and traced replays, the
    traced replays' kernel records (block by block), positions in the block."""
    rng = np.random.default_rng(seed)
    inner = {"untraced": [], "traced": []}
    kernels, kblock, corr = [], [], 1
    for b in range(pairs):
        for arm in ("untraced", "traced"):
            for pos in range(block):
                gap = (gap_t if arm == "traced" else gap_u) + int(rng.integers(-10, 10))
                k, ev = chain_replay(LAYOUT, 1500, gap, 500, t0=corr * 10**7, corr=corr)
                if arm == "traced" and pos == 0:
                    ev = ev + np.r_[0, np.full(len(ev) - 1, first_extra_ns / 1e6)]  # the first after enable
                inner[arm].append(ev)
                if arm == "traced" and b != drop_block:
                    kernels.append(k)
                    kblock.append(np.full(len(k), b))
                corr += 1
    n = pairs * block
    raw = {"block": block, "blocks_traced": pairs, "types": np.array([f"{k}x{n_}" for k, n_ in LAYOUT]),
           "counts": np.array([n_ for _, n_ in LAYOUT] + [1]), "kernels": np.concatenate(kernels),
           "kblock": np.concatenate(kblock), "sizes": np.array([n_ for _, n_ in LAYOUT]),
           "kinds": np.array([k for k, _ in LAYOUT]), "sleep_cycles": 2000, "sm_clock_khz": 1_980_000}
    for arm in ("untraced", "traced"):
        raw[f"inner_{arm}"] = np.array(inner[arm])
        raw[f"pos_{arm}"] = np.tile(np.arange(block), pairs)
        for key in ("outer_us", "launch_us", "step_us"):
            raw[f"{key}_{arm}"] = np.full(n, 100.0 if arm == "untraced" else 130.0)
    return raw


def test_analysis_recovers_tracings_cost_per_gap_and_keeps_first_replays_apart():
    res = T.analyze_truth(raw_run(), n_boot=300)
    g = res["groups"]
    assert g["replays"] == {"untraced": 20, "traced": 20, "traced_with_records": 20}  # 4 blocks x 5 (first apart)
    for kind in ("add", "sleep"):
        for n in (2, 8, 32):
            r = g[f"{kind}x{n}"]
            assert r["event_ns"]["diff"] == pytest.approx(500 * n, rel=0.05)
            assert abs(r["cupti_minus_event_ns"]["median"]) < 1
            assert r["idle_per_kernel_ns"]["traced_cupti"] - r["idle_per_kernel_ns"]["untraced"] == pytest.approx(500, rel=0.05)
        assert res["fit"][kind]["per_kernel_ns"]["diff"] == pytest.approx(500, abs=15)
    assert res["kernel_ns"]["add"]["median"] == 1500
    assert res["kernel_ns"]["sleep_expected_at_max_clock"] == pytest.approx(2000 / 1.98, rel=1e-6)
    assert res["outer_us"]["diff"] == pytest.approx(30)
    # the first traced replay's extra cost is reported apart, not mixed into the medians
    assert res["first_traced_event_span_ns"] - res["replay"]["event_span_ns"]["other"] == pytest.approx(50_000, rel=0.05)


def test_a_block_without_its_records_is_counted_not_misassigned():
    res = T.analyze_truth(raw_run(drop_block=1), n_boot=200)
    assert res["records"]["blocks_wrong_launch_count"] == 1
    assert res["groups"]["replays"]["traced_with_records"] == 15
    assert abs(res["groups"]["addx8"]["cupti_minus_event_ns"]["median"]) < 1


def test_counts_are_inferred_for_alike_groups_and_refused_otherwise():
    assert T.infer_counts(961, 48) == [20] * 48 + [1]
    with pytest.raises(C.LayoutError):
        T.infer_counts(960, 48)


def test_reanalyze_reads_the_saved_raw_without_a_gpu(tmp_path):
    C.save_raw(str(tmp_path), "truth-chain", **raw_run(pairs=2, block=4))
    assert T.main(["--out", str(tmp_path), "--stages", "chain", "--reanalyze"]) == 0
    doc = json.loads((tmp_path / "truth-reanalyzed.json").read_text())
    assert not doc["errors"] and doc["stages"]["chain"]["groups"]["addx2"]["event_ns"]["diff"] > 0


@pytest.mark.parametrize("args", [["--stages", "nope"], ["--block", "2"], ["--pairs", "0"]])
def test_cli_refuses_bad_arguments(tmp_path, args):
    with pytest.raises(SystemExit):
        T.main(["--out", str(tmp_path)] + args)
