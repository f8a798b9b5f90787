"""graphmon ab's statistics and reporting on synthetic arm data (no GPU)."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest

from graphmon.analysis.ab import ArmData, analyze_ab, offset_correlation, split_arms, step_ratio_ci
from graphmon.cli import main
from graphmon.report.ab_files import load_raw, save_raw
from graphmon.report.jsonsafe import json_safe
from graphmon.report.plots import plot_ab
from graphmon.formats.read import read_trace
from graphmon.model.trace import TraceError, concat
from helpers import KINETO


@pytest.fixture(scope="module")
def kineto():
    return read_trace(KINETO, progress=False)


def arm_trace(kineto, graph_name, arm, add_gap_ns=0):
    """One graph of the real Kineto trace relabelled as instance 0 of ``arm`` (optionally widened)."""
    from helpers import widen

    g = kineto.graph_names().index(graph_name)
    t = widen(kineto, g, add_gap_ns) if add_gap_ns else kineto
    t = t.select(t.graph == g)
    return t.with_graphs([replace(gi, label=f"{arm}{'#'}0") for gi in t.graphs])


def synthetic_steps(rng, instances, replays, base_us, instance_sd_us, replay_sd_us):
    inst = base_us + rng.normal(0, instance_sd_us, (instances, 1))
    return inst + rng.normal(0, replay_sd_us, (instances, replays))


def test_ratio_ci_covers_a_known_effect_and_resamples_instances():
    rng = np.random.default_rng(3)
    a = synthetic_steps(rng, 8, 300, 1500, 8, 2)
    b = synthetic_steps(rng, 8, 300, 1500 * 1.02, 8, 2)
    r, lo, hi = step_ratio_ci(np.median(a, 1), np.median(b, 1))
    assert lo < r < hi and lo < 1.02 < hi and lo > 1.0
    # The CI reflects instance-to-instance spread, not the 2400 replays: with sd 8 µs per
    # instance it is far wider than a replay-level interval would be.
    assert hi - lo > 0.005
    # one instance per arm: no CI rather than a fake one
    r1, lo1, hi1 = step_ratio_ci(np.median(a, 1)[:1], np.median(b, 1)[:1])
    assert math.isnan(lo1) and math.isnan(hi1) and r1 > 1


def test_ratio_ci_straddles_one_when_arms_are_the_same():
    rng = np.random.default_rng(4)
    hits = 0
    for _ in range(40):
        a = synthetic_steps(rng, 6, 50, 1400, 10, 3)
        b = synthetic_steps(rng, 6, 50, 1400, 10, 3)
        _, lo, hi = step_ratio_ci(np.median(a, 1), np.median(b, 1), n_resamples=1000)
        hits += lo <= 1.0 <= hi
    assert hits >= 32  # ~95% nominal; percentile bootstrap with 6 instances is a bit narrow


def test_analyze_ab_real_gaps_and_widened_arm(kineto):
    rng = np.random.default_rng(5)
    base = ArmData("lazy", synthetic_steps(rng, 6, 100, 1500, 5, 2), synthetic_steps(rng, 6, 10, 1680, 5, 2),
                   arm_trace(kineto, "shapeA/no_upload", "lazy"))
    cur = ArmData("uploaded", synthetic_steps(rng, 6, 100, 1520, 5, 2), synthetic_steps(rng, 6, 10, 1700, 5, 2),
                  arm_trace(kineto, "shapeA/no_upload", "uploaded", add_gap_ns=320))
    res = analyze_ab([base, cur])
    a, b = res.arms
    assert a.kernels_per_replay == 960 and len(a.streams) == 4
    assert [s.median_gap_ns + 320 for s in a.streams] == [s.median_gap_ns for s in b.streams]
    assert a.observer_slowdown == pytest.approx(a.traced_step_median_us / a.step_median_us - 1)
    assert 0.05 < a.observer_slowdown < 0.2
    (c,) = res.comparisons
    assert c.ci_low < c.step_ratio < c.ci_high
    assert [s["verdict"] for s in c.streams] == ["regression"] * 4
    # idle grows with the gaps; busy is the kernels' own time and barely moves
    assert b.idle_median_us > a.idle_median_us
    doc = json_safe(res.as_dict())
    json.dumps(doc, allow_nan=False)
    assert doc["comparisons"][0]["current"] == "uploaded" and "_step_us" not in doc["meta"]
    assert "uploaded / lazy: step time ratio" in res.format_table()


def test_same_gaps_not_flagged(kineto):
    rng = np.random.default_rng(6)
    arms = [ArmData(n, synthetic_steps(rng, 4, 50, 1500, 5, 2), None, arm_trace(kineto, g, n))
            for n, g in (("lazy", "shapeA/no_upload"), ("uploaded", "shapeA/upload"))]
    res = analyze_ab(arms)
    assert all(s["verdict"] == "unchanged" for s in res.comparisons[0].streams)
    assert math.isnan(res.arms[0].observer_slowdown)


def test_plot_and_raw_round_trip(kineto, tmp_path):
    rng = np.random.default_rng(7)
    arms = [ArmData(n, synthetic_steps(rng, 3, 20, 1500, 5, 2), synthetic_steps(rng, 3, 4, 1600, 5, 2),
                    arm_trace(kineto, g, n)) for n, g in (("lazy", "shapeA/no_upload"), ("uploaded", "shapeA/upload"))]
    save_raw(arms, tmp_path, {"note": "synthetic"})
    back, meta = load_raw(tmp_path)
    assert meta["note"] == "synthetic" and [a.name for a in back] == ["lazy", "uploaded"]
    assert np.array_equal(back[1].step_us, arms[1].step_us) and len(back[1].trace) == len(arms[1].trace)
    png = tmp_path / "ab.png"
    plot_ab(analyze_ab(back), png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000
    # the CLI redoes the report from the raw folder without a GPU
    out = tmp_path / "report"
    assert main(["ab", "--from", str(tmp_path), "--out", str(out), "--format", "json"]) == 0
    doc = json.loads((out / "ab.json").read_text())
    assert [a["name"] for a in doc["arms"]] == ["lazy", "uploaded"] and (out / "ab.png").exists()


def test_windows_from_separate_profiler_sessions_concatenate(kineto):
    """Correlation ids restart per profiler session: offsetting keeps replays apart."""
    t = arm_trace(kineto, "shapeA/upload", "uploaded")
    t = t.with_graphs([replace(g, key=g.label or g.key) for g in t.graphs])
    both = concat([t, offset_correlation(t, int(t.correlation_id.max()) + 1)])
    from graphmon.analysis.replays import analyze

    assert len(analyze(both).replays) == 2 * len(analyze(t).replays)
    naive = concat([t, t])  # same ids: replays merge (what the offset prevents)
    assert len(analyze(naive).replays) == len(analyze(t).replays)


def test_split_arms_by_label(kineto):
    t = kineto.with_graphs([replace(g, label=f"{'a' if i == 0 else 'b'}#{i}") for i, g in enumerate(kineto.graphs)])
    parts = split_arms(t, ["a", "b"])
    assert len(parts["a"]) + len(parts["b"]) == int((t.graph >= 0).sum())
    assert set(np.unique(parts["a"].graph)) == {0}


def test_bad_arms_rejected():
    with pytest.raises(TraceError):
        ArmData("x", np.array([[1.0, -2.0]]))
    with pytest.raises(TraceError):
        analyze_ab([ArmData("x", np.ones((2, 3)))])
    with pytest.raises(TraceError):
        analyze_ab([ArmData("x", np.ones((2, 3))), ArmData("x", np.ones((2, 3)))])


def test_from_without_out_refuses_and_keeps_the_committed_report(kineto, tmp_path, monkeypatch, capsys):
    rng = np.random.default_rng(8)
    arms = [ArmData(n, synthetic_steps(rng, 3, 20, 1500, 5, 2), None, arm_trace(kineto, g, n))
            for n, g in (("lazy", "shapeA/no_upload"), ("uploaded", "shapeA/upload"))]
    raw = tmp_path / "raw"
    save_raw(arms, raw)
    (raw / "ab.json").write_text("committed")
    monkeypatch.chdir(tmp_path)
    assert main(["ab", "--from", str(raw)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("graphmon: error:") and "--out" in err[0]
    assert (raw / "ab.json").read_text() == "committed" and not (raw / "ab.png").exists()
    # asked for explicitly, the report goes into the raw folder
    assert main(["ab", "--from", str(raw), "--out", str(raw)]) == 0
    assert (raw / "ab.json").read_text() != "committed"
