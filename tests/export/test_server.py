"""The FastAPI app through a real ASGI client: endpoints, capture flow, security defaults, faults."""

import io
import threading
import time

import numpy as np
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from graphmon.export.exporter import Exporter
from graphmon.settings import Settings
from graphmon.sources.base import Source
from graphmon.formats.native import read_native
from graphmon.formats.read import read_trace
from graphmon.sources.replay import ReplaySource

PROMETHEUS_ACCEPT = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
                     "text/plain;version=0.0.4;q=0.5,*/*;q=0.1")
LOCAL = ("127.0.0.1", 50000)  # TestClient as a loopback client (/capture and /trace need loopback or a token)
from helpers import NATIVE, synthetic_trace, window


@pytest.fixture(scope="module")
def real_trace():
    return read_trace(NATIVE)


def make(trace, **settings):
    src = ReplaySource(trace, interval_s=0.05, name="test")
    ex = Exporter(src, Settings(**settings))
    return ex, TestClient(ex.app, client=LOCAL)


def wait_windows(ex, n, timeout=20):
    deadline = time.monotonic() + timeout
    while ex.snapshot().windows_total < n:
        assert time.monotonic() < deadline, "no windows arrived"
        time.sleep(0.02)


def test_metrics_status_graphs_healthz(real_trace):
    ex, c = make(real_trace)
    ex.start()
    try:
        wait_windows(ex, 2)
        r = c.get("/metrics")
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
        assert 'graphmon_kernel_gap_seconds_bucket{device="0",graph="decode_bs1/upload"' in r.text
        om = c.get("/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"})
        assert om.headers["content-type"].startswith("application/openmetrics-text") and om.text.rstrip().endswith("# EOF")
        st = c.get("/status").json()
        for k in ("backend", "state", "up", "last_window_timestamp_s", "graphs", "records_dropped_total",
                  "records_invalid_total", "errors_total", "config", "upload_mode_comparison", "windows"):
            assert k in st
        assert st["state"] == "running" and st["up"] is True
        assert "token" not in st["config"] and st["config"]["token_set"] is False
        g0 = st["graphs"][0]
        assert {"graph", "upload_mode", "replays", "kernels_per_replay", "span_ns", "busy_ns", "idle_ns", "streams"} <= set(g0)
        assert {"stream", "gaps", "gap_ns", "negative_gaps"} <= set(g0["streams"][0])
        fams = {c_["graph_family"] for c_ in st["upload_mode_comparison"]}
        assert "decode_bs1" in fams
        graphs = c.get("/graphs").json()
        assert {g["upload_mode"] for g in graphs} >= {"uploaded", "lazy"}
        assert c.get("/healthz").json()["status"] == "ok"
        assert c.get("/openapi.json").status_code == 200
    finally:
        ex.stop()


def test_capture_then_trace_download_is_valid_chrome_json(real_trace):
    ex, c = make(real_trace)
    ex.start()
    try:
        r = c.post("/capture", json={"replays": 3, "wait_s": 10})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["ready"] is True
        tr = c.get(f"/trace/{body['id']}")
        assert tr.status_code == 200
        doc = tr.json()
        ev = doc["traceEvents"]
        slices = [e for e in ev if e["ph"] == "X"]
        tracks = {(e["pid"], e["tid"]) for e in slices}
        names = {(e["pid"], e["tid"]) for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
        assert tracks == names and len(tracks) >= 1  # one named track per stream
        assert len({e["args"]["correlation"] for e in slices}) == 3  # three replays
        for e in slices:
            assert e["dur"] >= 0 and isinstance(e["ts"], float)
        # slices on one track do not go back in time; gap_ns matches the slice positions
        by_track = {}
        for e in slices:
            by_track.setdefault((e["pid"], e["tid"]), []).append(e)
        for evs in by_track.values():
            for a, b in zip(evs, evs[1:]):
                assert b["ts"] >= a["ts"]
                assert b["args"]["gap_ns"] == pytest.approx((b["ts"] - a["ts"] - a["dur"]) * 1e3, abs=1)
        native = c.get(f"/trace/{body['id']}?format=graphmon")
        assert native.status_code == 200
        t = read_native(dict(np.load(io.BytesIO(native.content))))
        assert len({int(x) for x in t.correlation_id}) == 3
    finally:
        ex.stop()


@pytest.mark.parametrize("path,code", [
    ("/trace/..%2F..%2Fetc%2Fpasswd", (400, 404)),  # decoded slashes never reach the handler
    ("/trace/a.b", 400),
    ("/trace/%00x", 400),
    ("/trace/" + "a" * 65, 400),
    ("/trace/nosuchid", 404),
    ("/trace/w1?format=xml", 400),
])
def test_trace_ids_are_validated(path, code):
    ex, c = make(synthetic_trace())
    r = c.get(path)
    assert r.status_code in (code if isinstance(code, tuple) else (code,))
    assert "root:" not in r.text


@pytest.mark.parametrize("body", [{}, {"replays": 0}, {"replays": -1}, {"duration_ms": 0}, {"replays": "x"},
                                  {"replays": 10**9}, {"duration_ms": 10**9}, {"replays": 1, "wait_s": 1000}])
def test_bad_capture_requests_get_4xx_with_a_message(body):
    ex, c = make(synthetic_trace())
    r = c.post("/capture", json=body)
    assert 400 <= r.status_code < 500
    assert r.json()["detail"]


def test_request_size_is_bounded():
    ex, c = make(synthetic_trace())
    r = c.post("/capture", content=b"{" + b" " * 100_000 + b"}", headers={"content-type": "application/json"})
    assert r.status_code == 413


def test_token_required_when_configured():
    ex, c = make(synthetic_trace(), token="s3cret")
    assert c.post("/capture", json={"replays": 1}).status_code == 401
    assert c.post("/capture", json={"replays": 1}, headers={"Authorization": "Bearer wrong"}).status_code == 401
    ok = c.post("/capture", json={"replays": 1}, headers={"Authorization": "Bearer s3cret"})
    assert ok.status_code == 200
    assert "s3cret" not in c.get("/status").text


def test_public_bind_without_token_refuses_capture():
    ex, c = make(synthetic_trace(), host="0.0.0.0")
    r = c.post("/capture", json={"replays": 1})
    assert r.status_code == 403 and "GRAPHMON_TOKEN" in r.json()["detail"]


def test_default_bind_is_loopback():
    assert Settings().host == "127.0.0.1"


class RaisingSource(Source):
    backend = "raising"

    def start(self, sink):
        self.set_state("error", "source raised: RuntimeError('boom')")
        self.count_error("source")

    def stop(self, timeout_s=5.0):
        pass

    def info(self):
        raise RuntimeError("info is broken too")


def test_source_that_raises_metrics_still_answer_with_up_0():
    ex = Exporter(RaisingSource(), Settings())
    c = TestClient(ex.app, client=LOCAL)
    ex.start()
    try:
        ex.aggregator.refresh()
        r = c.get("/metrics")
        assert r.status_code == 200
        assert 'graphmon_up{rank="0"} 0.0' in r.text
        assert 'graphmon_collector_errors_total{rank="0",stage="source"} 1.0' in r.text
        assert c.post("/capture", json={"replays": 1}).status_code == 409  # this source cannot capture
    finally:
        ex.stop()


def test_mountable_in_an_existing_app():
    ex, _ = make(synthetic_trace())
    ex.aggregator.ingest(window(synthetic_trace()))
    host = FastAPI()
    host.mount("/graphmon", ex.app)
    c = TestClient(host, client=LOCAL)
    assert "graphmon_windows_total" in c.get("/graphmon/metrics").text


def test_eight_parallel_scrapers_while_ingesting(real_trace):
    ex, c = make(real_trace)
    ex.start()
    errors, latencies = [], []
    stop = time.monotonic() + 3.0

    def scrape():
        while time.monotonic() < stop:
            t0 = time.perf_counter()
            r = c.get("/metrics")
            latencies.append(time.perf_counter() - t0)
            if r.status_code != 200 or "graphmon_up" not in r.text:
                errors.append(r.status_code)

    try:
        ths = [threading.Thread(target=scrape) for _ in range(8)]
        for t in ths:
            t.start()
        for t in ths:
            t.join()
    finally:
        ex.stop()
    assert not errors
    assert len(latencies) > 8
    assert ex.snapshot().windows_total >= 2  # windows were being ingested meanwhile


def test_background_server_listens_and_stops():
    import httpx

    src = ReplaySource(synthetic_trace(), interval_s=0.05)
    ex = Exporter(src, Settings(port=0))
    ex.start()
    ex.serve_background()
    try:
        r = httpx.get(f"http://127.0.0.1:{ex.bound_port}/healthz", timeout=5)
        assert r.status_code == 200
    finally:
        t0 = time.monotonic()
        ex.stop(timeout_s=5)
        assert time.monotonic() - t0 < 5.5
    assert not ex._server_thread.is_alive()


def test_every_negotiable_format_is_served_from_the_prerendered_body(monkeypatch):
    """Prometheus's real Accept header (OpenMetrics first) and a plain scrape: both answered from
    the body rendered when the snapshot was published, none rendered on the request path."""
    import graphmon.export.exposition as expo

    ex, c = make(synthetic_trace())
    ex.aggregator.ingest(window(synthetic_trace()))

    def no_render(*a, **k):  # a cache miss would render on the request path
        raise AssertionError("scrape rendered instead of using the pre-rendered body")

    monkeypatch.setattr(expo, "render", no_render)
    for accept, ctype in ((PROMETHEUS_ACCEPT, "application/openmetrics-text; version=1.0.0; charset=utf-8"),
                          ("", "text/plain; version=0.0.4; charset=utf-8")):
        r = c.get("/metrics", headers={"accept": accept})
        assert r.status_code == 200 and "graphmon_kernel_gap_seconds_bucket" in r.text
        assert r.headers["content-type"] == ctype


def test_status_is_formatted_outside_the_ingest_lock():
    """The aggregator formats nothing: /status builds its per-graph summary from the snapshot
    data, so it answers while an ingest holds the lock (the old ingest built it under the lock)."""
    ex, c = make(synthetic_trace(n_graphs=2))
    ex.aggregator.ingest(window(synthetic_trace(n_graphs=2)))
    with ex.aggregator._lock:
        doc = c.get("/status").json()
    assert [g["graph"] for g in doc["graphs"]] == ["graph0", "graph1"]
    assert doc["graphs"][0]["streams"][0]["gap_ns"]["p50"] == 400.0
