"""bench/observer/hf_decode.py's analysis on synthetic generate calls: per-token events, the traced
calls' records (graph replays and eager kernels). No GPU."""

import numpy as np
import pytest

from bench.observer import hf_decode as H


def call(step_ns, tokens, first_extra_ns=0.0):
    steps = np.full(tokens - 1, float(step_ns))
    steps[0] += first_extra_ns
    return np.concatenate(([0.0], np.cumsum(steps))) / 1e6  # ms from the first event


def replays(calls, tokens, kernels=20, d=2000, gap=500, eager=3):
    """Records of traced calls: per decode step one graph replay (one correlation id) + eager kernels."""
    rows, kcall, corr = [], [], 1
    for c in range(calls):
        t = c * 10**9
        for _ in range(tokens):
            for j in range(kernels):
                rows.append((t, t + d, 7, 3, j, corr, 0, 0))
                t += d + gap
            corr += 1
            for _ in range(eager):
                rows.append((t, t + 1000, 7, 0, 0, corr, 0, 0))
                t += 1500
                corr += 1
            kcall.extend([c] * (kernels + eager))
    return np.array(rows, np.int64), np.array(kcall)


def test_truth_analysis_recovers_the_step_inflation_and_cuptis_replays():
    tokens = 12
    k, kcall = replays(3, tokens)
    raw = {"ev_untraced": np.array([call(1_300_000, tokens) for _ in range(3)]),
           "ev_traced": np.array([call(1_340_000, tokens, first_extra_ns=900_000) for _ in range(3)]),
           "host_untraced": np.array([np.arange(tokens) * 1.3e-3 for _ in range(3)]),
           "host_traced": np.array([np.arange(tokens) * 1.35e-3 for _ in range(3)]),
           "kernels": k, "kcall": kcall}
    res = H.analyze_truth(raw, n_boot=200)
    assert res["step_gpu_ns"]["diff"] == pytest.approx(40_000)  # the first steps apart: no 900 us in it
    assert res["step_host_ns"]["diff"] == pytest.approx(50_000, rel=1e-6)
    assert res["replays_per_call"] == [tokens] * 3 and res["kernels_per_replay"] == 20
    assert res["eager_kernels_per_call"] == [3 * tokens] * 3
    assert res["cupti_replay_span_ns"][0] == 20 * 2000 + 19 * 500
    assert res["cupti_replay_idle_ns"][0] == 19 * 500 and res["cupti_gap_ns"]["median"] == 500
    assert res["kernels_per_step"] == pytest.approx(23 * tokens / (tokens - 1))
    assert res["inflation_per_kernel_ns"] == pytest.approx(40_000 / res["kernels_per_step"])


def test_pairs_compare_every_arm_with_the_first():
    tokens = 8
    raw = {f"ev_{a}": np.array([call(s, tokens)] * 2) for a, s in (("x", 1_000_000), ("y", 1_010_000), ("z", 990_000))}
    raw.update({f"host_{a}": np.array([np.arange(tokens) * 1e-3] * 2) for a in "xyz"})
    res = H.analyze_pairs(raw, ("x", "y", "z"), n_boot=100)
    assert res["y_step_gpu_ns"]["pct"] == pytest.approx(1.0) and res["z_step_gpu_ns"]["pct"] == pytest.approx(-1.0)
    assert res["y_step_host_ns"]["diff"] == pytest.approx(0, abs=1e-6)


def test_cli_refuses_too_few_tokens(tmp_path):
    with pytest.raises(SystemExit):
        H.main(["--out", str(tmp_path), "--new-tokens", "3"])
