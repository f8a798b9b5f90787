"""The Prometheus collector: golden /metrics for a fixed replayed real trace, checked by promtool."""

import subprocess

import numpy as np
import pytest
from prometheus_client.exposition import generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.parser import text_string_to_metric_families

from graphmon.export.collector import make_registry
from graphmon.export.exposition import render_text
from graphmon.model.trace import GraphInfo
from graphmon.export.aggregator import Aggregator
from graphmon.model.window import SourceHealth, Window, no_untraced
from graphmon.formats.read import read_trace
from graphmon.sources.replay import ReplaySource

from _promutil import require_binary
from helpers import DATA, NATIVE, synthetic_trace, window

GOLDEN = DATA / "golden-metrics.txt"


def golden_text() -> str:
    src = ReplaySource(read_trace(NATIVE), interval_s=0.5, name="golden")
    agg = Aggregator(backend_info={"backend": "replay", "version": "1", "source": "golden"})
    for i in range(2):
        w = src.next_window()
        # the second window carries untraced replay times of a detail graph (and one of an unknown graph)
        gi = w.trace.graph_names().index("decode_bs2/upload")
        untraced = {"graph": np.array([gi, gi, gi, -1], np.int32),
                    "duration_ns": np.array([612_000, 648_500, 2_250_000, 700_000], np.int64)} if i else no_untraced()
        agg.ingest(Window(trace=w.trace, started_s=1_800_000_000.0 + i, ended_s=1_800_000_000.5 + i, untraced=untraced))
    return generate_latest(make_registry(agg.snapshots)).decode()


def test_golden_metrics(regen_golden):
    text = golden_text()
    if regen_golden:
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text(), "metrics changed: review, then run pytest --regen-golden"


def test_golden_passes_promtool_check_metrics():
    promtool = require_binary("promtool")
    r = subprocess.run([promtool, "check", "metrics"], input=GOLDEN.read_text(), capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def _families(text):
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_histogram_values_match_snapshot():
    agg = Aggregator()
    agg.ingest(window(synthetic_trace(gap_ns=500, replays=2, kernels_per_stream=3)))
    fams = _families(generate_latest(make_registry(agg.snapshots, cardinality="full")).decode())
    h = fams["graphmon_kernel_gap_seconds"]
    buckets = {s.labels["le"]: s.value for s in h.samples if s.name.endswith("_bucket")}
    assert buckets["4.48e-07"] == 0 and buckets["5.12e-07"] == 4 and buckets["+Inf"] == 4
    total = [s.value for s in h.samples if s.name.endswith("_sum")][0]
    assert total == pytest.approx(4 * 500e-9)
    q = {s.labels["quantile"]: s.value for s in fams["graphmon_kernel_gap_quantile_seconds"].samples if "quantile" in s.labels}
    assert q == {"0.1": pytest.approx(5e-7), "0.5": pytest.approx(5e-7), "0.9": pytest.approx(5e-7), "0.99": pytest.approx(5e-7)}
    counts = [s.value for s in fams["graphmon_kernel_gap_quantile_seconds"].samples if s.name.endswith("_count")]
    assert counts == [4]
    assert fams["graphmon_up"].samples[0].value == 1


def test_down_source_still_renders_health():
    agg = Aggregator(health=lambda: SourceHealth(up=False, state="blocked", reason="another CUPTI subscriber"))
    fams = _families(generate_latest(make_registry(agg.snapshots)).decode())
    assert fams["graphmon_up"].samples[0].value == 0
    info = fams["graphmon_collector_info"].samples[0].labels
    assert info["state"] == "blocked" and "CUPTI" in info["reason"]


def test_openmetrics_output_parses():
    agg = Aggregator()
    agg.ingest(window(synthetic_trace()))
    text = generate_openmetrics(make_registry(agg.snapshots)).decode()
    assert text.rstrip().endswith("# EOF")
    assert "graphmon_kernel_gap_seconds_bucket" in text


def test_observer_slowdown_exported_when_known():
    agg = Aggregator()
    agg.ingest(window(synthetic_trace(), observer_slowdown=1.125))
    fams = _families(generate_latest(make_registry(agg.snapshots)).decode())
    assert fams["graphmon_observer_slowdown_ratio"].samples[0].value == 1.125


def test_render_text_is_byte_identical_to_prometheus_client():
    # The golden snapshot, and label values that need escaping (quote, backslash, newline, UTF-8).
    src = ReplaySource(read_trace(NATIVE), interval_s=0.5, name="golden")
    agg = Aggregator()
    agg.ingest(src.next_window())
    reg = make_registry(agg.snapshots)
    assert render_text(reg) == generate_latest(reg)
    t = synthetic_trace(n_streams=3)
    t = t.with_graphs([GraphInfo(key="g1", graph_id=1, label='we"ird\\lab\nel \u00fc', upload_mode="lazy")])
    agg = Aggregator(backend_info={"backend": 'a"b\\c'})
    agg.ingest(window(t, observer_slowdown=1.5))
    reg = make_registry(agg.snapshots)
    assert render_text(reg) == generate_latest(reg)
    assert '\\"' in render_text(reg).decode()


# ---------------------------------------------------------------- issue 14 items 2, 4, 5, 11
def _text(snaps, **kw):
    return generate_latest(make_registry(lambda: snaps, **kw)).decode()


def test_known_reasons_and_stages_have_zero_samples_from_the_start():
    from graphmon.export.collector import INVALID_REASONS, KNOWN_STAGES

    fams = _families(_text(Aggregator().snapshots()))
    reasons = {s.labels["reason"]: s.value for s in fams["graphmon_records_invalid"].samples}
    stages = {s.labels["stage"]: s.value for s in fams["graphmon_collector_errors"].samples}
    assert set(reasons) == set(INVALID_REASONS) and set(reasons.values()) == {0}
    assert set(stages) >= set(KNOWN_STAGES) and set(stages.values()) == {0}


@pytest.mark.parametrize("state", ["starting", "running", "degraded", "blocked", "stopped", "error"])
def test_collector_state_distinguishes_blocked_from_failing(state):
    agg = Aggregator(health=lambda: SourceHealth(up=state == "running", state=state, reason="r"))
    fams = _families(_text(agg.snapshots()))
    vals = {s.labels["state"]: s.value for s in fams["graphmon_collector_state"].samples}
    assert vals == {s: float(s == state) for s in vals} and len(vals) == 6


def test_build_and_device_info_join_keys():
    agg = Aggregator(backend_info={"backend": "cupti", "cupti_version": "13.4.92", "cuda_driver_version": "580"},
                     process={"device": "0", "uuid": "GPU-abc", "pci_bus_id": "00000000:19:00.0", "host": "n1"})
    agg.ingest(window(synthetic_trace()))
    fams = _families(_text(agg.snapshots()))
    (b,) = fams["graphmon_build_info"].samples
    assert b.labels["cupti_version"] == "13.4.92" and b.labels["cuda_driver_version"] == "580"
    assert set(b.labels) == {"graphmon_version", "torch_version", "cuda_driver_version", "cuda_runtime_version",
                             "cupti_version", "engine", "engine_version"}
    (d,) = fams["graphmon_device_info"].samples
    assert d.labels == {"rank": "0", "device": "0", "UUID": "GPU-abc", "pci_bus_id": "00000000:19:00.0",
                        "gpu_name": "", "host": "n1"}


def test_one_family_with_samples_from_every_snapshot():
    a, b = Aggregator(rank="0"), Aggregator(rank="1")
    for agg in (a, b):
        agg.ingest(window(synthetic_trace()))
    text = _text((a.snapshot(), b.snapshot()))
    assert text.count("# TYPE graphmon_kernel_gap_seconds histogram") == 1
    ranks = {s.labels["rank"] for s in _families(text)["graphmon_up"].samples}
    assert ranks == {"0", "1"}
    assert subprocess.run([require_binary("promtool"), "check", "metrics"], input=text,
                          capture_output=True, text=True).returncode == 0
