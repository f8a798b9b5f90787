"""The FastAPI app through a real ASGI client: endpoints, capture flow, security defaults, faults."""

import io
import json
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
from helpers import NATIVE, synthetic_trace, untraced, window


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
        # every graph in /graphs; at the default level two have series of their own
        assert sum(g["detail"] for g in graphs) == min(2, len(graphs))
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
        slices = [e for e in ev if e["ph"] == "X" and e["cat"] == "kernel"]
        tracks = {(e["pid"], e["tid"]) for e in slices}
        names = {(e["pid"], e["tid"]) for e in ev if e["ph"] == "M" and e["name"] == "thread_name" and e["pid"] != "host"}
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


@pytest.mark.parametrize("body", [{"replays": 0}, {"replays": -1}, {"duration_ms": 0}, {"replays": "x"},
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


def test_status_and_graphs_give_untraced_quantiles_numpy_would_and_null_before_any():
    """/status (per graph of the last window) and /graphs (every graph, the unknown one too): count,
    mean, p10/p50/p90/p99 in seconds of the untraced replays, equal to numpy's on the same rows;
    null for a graph with none yet, never a 0."""
    ex, c = make(synthetic_trace())
    t = synthetic_trace(n_graphs=2)
    ex.aggregator.ingest(window(t))
    assert [g["untraced_replay_seconds"] for g in c.get("/status").json()["graphs"]] == [None, None]
    assert [g["untraced_replay_seconds"] for g in c.get("/graphs").json()] == [None, None]
    rng = np.random.default_rng(7)
    dur = rng.integers(40_000, 3_000_000, 1_001)
    ex.aggregator.ingest(window(t, ended_s=1_800_000_001.0, untraced=untraced([1] * 1_000 + [-1], dur)))
    want = dict(zip(("p10", "p50", "p90", "p99"), np.quantile(dur[:1_000], [0.1, 0.5, 0.9, 0.99]) * 1e-9))
    want.update(count=1_000, mean=dur[:1_000].mean() * 1e-9)
    st = {g["graph"]: g["untraced_replay_seconds"] for g in c.get("/status").json()["graphs"]}
    assert st["graph0"] is None and st["graph1"] == pytest.approx(want, rel=1e-12)
    listed = {g["graph"]: g for g in c.get("/graphs").json()}
    assert listed["graph1"]["untraced_replay_seconds"] == st["graph1"] and listed["graph0"]["untraced_replay_seconds"] is None
    unknown = listed["unknown"]
    assert unknown["untraced_replay_seconds"]["count"] == 1 and unknown["detail"] is False
    assert unknown["untraced_replay_seconds"]["p50"] == pytest.approx(dur[-1] * 1e-9)


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


# ---------------------------------------------------------------- issue 28 items 4, 5, 7; issue 31 item 9
def _kernel_gap_medians(doc):
    return {(g["graph"], s["stream"]): (s["gaps"], s["gap_ns"]["p50"]) for g in doc["graphs"] for s in g["streams"]}


def test_trace_chrome_json_reads_back_with_the_windows_gap_medians(real_trace, tmp_path, capsys):
    """serve -> /trace/<id> -> graphmon analyze: the same graphs, replays and per-stream gap medians
    as the window itself (before: "no valid kernel records (invalid: {'missing_field': ...})")."""
    from graphmon.analysis.replays import analyze
    from graphmon.cli import main
    from graphmon.report.summary import analysis_json

    ex, c = make(real_trace)
    ex.start()
    try:
        wait_windows(ex, 3)
        wid = ex.snapshot().windows[-1]
        tr = c.get(f"/trace/{wid}")
        assert tr.status_code == 200 and "x-graphmon-truncated" not in tr.headers
        window = ex.store.get(wid)
    finally:
        ex.stop()
    path = tmp_path / f"{wid}.json"
    path.write_bytes(tr.content)
    assert main(["analyze", "--format", "json", "--no-progress", str(path)]) == 0
    got = json.loads(capsys.readouterr().out)
    want = analysis_json(analyze(window))
    assert got["invalid_records"] == {} and got["kernels"] == len(window) > 0
    assert {g["graph"]: g["replays"] for g in got["graphs"]} == {g["graph"]: g["replays"] for g in want["graphs"]}
    assert _kernel_gap_medians(got) == _kernel_gap_medians(want) and len(_kernel_gap_medians(want)) >= 4
    assert "truncated" not in got


def test_a_cut_chrome_trace_says_so_in_a_header_the_file_and_analyze(real_trace, tmp_path, capsys, monkeypatch):
    from graphmon.cli import main
    from graphmon.export import tracebodies

    monkeypatch.setattr(tracebodies, "MAX_TRACE_EVENTS", 5_000)
    ex, c = make(real_trace)
    ex.start()
    try:
        wait_windows(ex, 2)
        wid = ex.snapshot().windows[-1]
        n = len(ex.store.get(wid))
        assert n > 5_000
        tr = c.get(f"/trace/{wid}")
    finally:
        ex.stop()
    kept, total = tr.headers["x-graphmon-truncated"].split(" kernels")[0].split(" of ")
    assert int(total) == n and 0 < int(kept) <= 5_000
    assert tr.headers["link"] == f'<{wid}?format=graphmon>; rel="alternate"; type="application/octet-stream"'
    assert tr.content.startswith(b'{"graphmonTruncated":{"kernels":' + total.encode())  # first in the file
    path = tmp_path / "cut.json"
    path.write_bytes(tr.content)
    assert main(["analyze", "--no-progress", str(path)]) == 0
    table = capsys.readouterr().out
    assert f"cut trace: {kept} of {total} kernels" in table and "?format=graphmon" in table
    assert main(["analyze", "--format", "json", "--no-progress", str(path)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["truncated"]["kernels"] == n and doc["truncated"]["kernels_kept"] == int(kept) == doc["kernels"]
    assert all(g["replays"] * g["kernels_per_replay"] == g["replays"] * g["kernels_per_replay_max"]
               for g in doc["graphs"])  # whole replays only: no replay lost kernels to the cut


@pytest.mark.parametrize("content,ctype", [
    (b"", None),  # README: curl -X POST localhost:9479/capture
    (b"{}", "application/json"),
    (b'{"duration_ms":50}', "application/x-www-form-urlencoded"),  # curl -d '{"duration_ms":50}'
    (b"duration_ms=50&wait_s=0", "application/x-www-form-urlencoded"),  # curl -d duration_ms=50
    (b'{"replays": 3}', "text/plain"),
])
def test_capture_takes_no_body_a_json_body_whatever_its_type_and_form_fields(content, ctype):
    from graphmon.export.server import DEFAULT_CAPTURE_MS, DEFAULT_CAPTURE_REPLAYS

    got = []

    class Src(Source):
        backend = "test"

        def start(self, sink):
            pass

        def stop(self, timeout_s=5.0):
            pass

        def request_capture(self, req):
            got.append(req)

    ex = Exporter(Src(), Settings())
    c = TestClient(ex.app, client=LOCAL)
    r = c.post("/capture", content=content, headers={"content-type": ctype} if ctype else {})
    assert r.status_code == 200, r.text
    (req,) = got
    if content in (b"", b"{}"):
        assert (req.replays, req.duration_ms) == (DEFAULT_CAPTURE_REPLAYS, DEFAULT_CAPTURE_MS)
    elif b"duration_ms" in content:
        assert (req.replays, req.duration_ms) == (None, 50.0)
    else:
        assert (req.replays, req.duration_ms) == (3, None)


@pytest.mark.parametrize("content,ctype,why", [
    (b"duration_ms=x", "application/x-www-form-urlencoded", "duration_ms: Input should be a valid number"),
    (b"replays=1&replays=2", "application/x-www-form-urlencoded", "given twice"),
    (b'{"replays": 0}', "application/x-www-form-urlencoded", "replays: Input should be greater than or equal to 1"),
    (b"nonsense", "application/json", "body must be JSON"),
])
def test_bad_capture_bodies_are_one_clear_422(content, ctype, why):
    ex, c = make(synthetic_trace())
    r = c.post("/capture", content=content, headers={"content-type": ctype})
    assert r.status_code == 422 and why in r.json()["detail"], r.text
    assert "https://" not in r.json()["detail"]


def test_metrics_gzip_when_accepted_with_process_families_in_every_format(real_trace):
    """Prometheus's Accept-Encoding gets gzip (one member, the same families as the plain body,
    process_* of this process included, checked by the official parser); q=0 and no header do not."""
    import gzip
    import zlib

    from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_parse
    from prometheus_client.parser import text_string_to_metric_families as text_parse

    ex, c = make(real_trace)
    ex.start()
    try:
        wait_windows(ex, 2)
        for accept, parse in (("text/plain", text_parse), (PROMETHEUS_ACCEPT, om_parse)):
            plain = c.get("/metrics", headers={"Accept": accept, "Accept-Encoding": "identity"})
            assert "content-encoding" not in plain.headers and plain.headers["vary"] == "Accept-Encoding"
            zipped = c.stream("GET", "/metrics", headers={"Accept": accept, "Accept-Encoding": "gzip"})
            with zipped as resp:
                wire = b"".join(resp.iter_raw())
            # compressed family by family at its render: within 10% of compressing the body at once
            assert len(wire) < 1.1 * len(gzip.compress(plain.content, 6)) and len(wire) * 5 < len(plain.content)
            text = gzip.decompress(wire).decode()
            one = zlib.decompressobj(16 + zlib.MAX_WBITS)  # one member: what httpx and curl read
            assert one.decompress(wire).decode() == text and one.eof and not one.unused_data
            fams = {f.name: f for f in parse(text)}
            assert {"process_cpu_seconds", "process_resident_memory_bytes", "process_open_fds",
                    "graphmon_up", "graphmon_kernel_gap_seconds"} <= set(fams)
            assert fams["process_resident_memory_bytes"].samples[0].value > 0
            assert {f.name for f in parse(plain.text)} == set(fams)
        assert "content-encoding" not in c.get("/metrics", headers={"Accept-Encoding": "gzip;q=0"}).headers
        assert "content-encoding" not in c.get("/metrics", headers={"Accept-Encoding": ""}).headers
        assert c.get("/metrics").headers["content-encoding"] == "gzip"  # httpx's default: gzip, deflate
    finally:
        ex.stop()


def test_process_families_move_between_scrapes_of_one_snapshot():
    """An exporter whose snapshot never changes (an agent with no process) still reports its own
    CPU time as it grows: process_* are rendered per scrape, not cached with the snapshot."""
    ex, c = make(synthetic_trace())  # not started: one snapshot, forever

    def cpu():
        line = next(ln for ln in c.get("/metrics").text.splitlines() if ln.startswith("process_cpu_seconds_total "))
        return float(line.split()[1])

    before = cpu()
    t_end = time.process_time() + 0.3
    while time.process_time() < t_end:
        pass
    assert cpu() >= before + 0.2


@pytest.mark.parametrize("name", ["/srv/private/traces/secret.graphmon.npz", "traces/secret.graphmon.npz"])
def test_collector_info_names_a_replayed_trace_by_its_base_name(name):
    src = ReplaySource(synthetic_trace(), interval_s=0.05, name=name)
    ex = Exporter(src, Settings())
    text = TestClient(ex.app).get("/metrics").text
    (line,) = [ln for ln in text.splitlines() if ln.startswith("graphmon_collector_info{")]
    assert 'source="secret.graphmon.npz"' in line and "traces" not in text and "/srv" not in text


def test_the_agent_alone_serves_its_process_families_gzipped():
    """`graphmon agent` with no process attached: process_* of the agent itself (its RSS against the
    sidecar's memory limit), and gzip for Prometheus, through the same app as serve."""
    import gzip

    from graphmon.export.agent import Agent
    from graphmon.export.agent_http import create_agent_app

    agent = Agent(Settings(port=0), tick_s=0.02, heartbeat_lost_s=60).start()
    try:
        c = TestClient(create_agent_app(agent))
        with c.stream("GET", "/metrics", headers={"Accept": PROMETHEUS_ACCEPT, "Accept-Encoding": "gzip"}) as r:
            assert r.headers["content-encoding"] == "gzip"
            text = gzip.decompress(b"".join(r.iter_raw())).decode()
        rss = [ln for ln in text.splitlines() if ln.startswith("process_resident_memory_bytes ")]
        assert len(rss) == 1 and float(rss[0].split()[1]) > 10e6 and text.endswith("# EOF\n")
    finally:
        agent.stop()


@pytest.mark.parametrize("source", ["h200-graphmon-decode.graphmon.npz", "bundled"])
def test_trace_chrome_export_analyzes_as_the_native_form_of_the_window(source, tmp_path, capsys):
    """`graphmon analyze` of GET /trace/<id> (Chrome JSON, gzipped as asked) gives the same answer as
    of ?format=graphmon, the native form of the same window: graph keys, upload modes, launch
    latency (known from CUPTI's launch times in the first trace; unknown, not 0, in the bundled
    one, which has none), inter-replay gaps, every per-stream figure, the excluded records."""
    import gzip

    from helpers import DATA
    from graphmon.cli import bundled_trace_path, main

    trace = read_trace(bundled_trace_path() if source == "bundled" else DATA / source)
    ex, c = make(trace)
    ex.start()
    try:
        wait_windows(ex, 2)
        wid = ex.snapshot().windows[-1]
        chrome = c.get(f"/trace/{wid}", headers={"Accept-Encoding": "gzip"})
        native = c.get(f"/trace/{wid}?format=graphmon", headers={"Accept-Encoding": "gzip"})
        plain = c.get(f"/trace/{wid}", headers={"Accept-Encoding": "identity"})
    finally:
        ex.stop()
    assert chrome.headers["content-encoding"] == "gzip" and chrome.headers["vary"] == "Accept-Encoding"
    assert "content-encoding" not in native.headers and "content-encoding" not in plain.headers  # npz: compressed already
    assert int(chrome.headers["content-length"]) * 10 < int(plain.headers["content-length"])  # measured 36x on a full window
    assert chrome.content == plain.content  # httpx decoded the gzip: the same document
    (tmp_path / "w.json").write_bytes(gzip.compress(chrome.content))  # analyze reads .json.gz too
    (tmp_path / "w.graphmon.npz").write_bytes(native.content)
    docs = {}
    for name in ("w.json", "w.graphmon.npz"):
        for by in ("graph", "stream"):
            assert main(["analyze", "--format", "json", "--by", by, "--no-progress", str(tmp_path / name)]) == 0
            docs[name, by] = json.loads(capsys.readouterr().out)
    for by in ("graph", "stream"):
        assert docs["w.json", by] == docs["w.graphmon.npz", by], by
    graphs = docs["w.json", "graph"]["graphs"]
    assert len(graphs) >= 2 and all(g["upload_mode"] != "unknown" for g in graphs)
    if source == "bundled":  # no launch time was recorded: unknown, never a 0 ns latency
        assert all(g.get("launch_latency_ns") is None for g in graphs)
    else:
        assert all(g["launch_latency_ns"]["p50"] > 0 for g in graphs)


def test_native_downloads_carry_the_windows_untraced_rows_and_compare_uses_them(real_trace, tmp_path, capsys):
    """GET /trace/<id>?format=graphmon writes the window's untraced replay durations (issue 36), so
    ``graphmon compare`` of two downloads applies the untraced rule: +1.2% untraced alone fails
    (kind untraced), a traced widening whose untraced time fell is observer_only (exit 0)."""
    from graphmon.cli import main
    from graphmon.formats.read import read_trace_untraced
    from helpers import HELD_OUT_GRAPH, held_out_concentrated, untraced_rows

    _, widened = held_out_concentrated(real_trace)
    ex, c = make(real_trace)
    rows = {"w1": untraced_rows(real_trace, 1.0, which=0), "w2": untraced_rows(real_trace, 1.012, which=1),
            "w3": untraced_rows(real_trace, 0.8, which=1)}
    for t, wid in ((real_trace, "w1"), (real_trace, "w2"), (widened, "w3")):
        ex.aggregator.ingest(window(t, untraced=rows[wid]))
    paths = {}
    for wid in rows:
        r = c.get(f"/trace/{wid}?format=graphmon")
        assert r.status_code == 200
        paths[wid] = tmp_path / f"{wid}.graphmon.npz"
        paths[wid].write_bytes(r.content)
    _, u = read_trace_untraced(paths["w1"], progress=False)
    assert all(np.array_equal(u[k], rows["w1"][k]) for k in u)
    assert main(["compare", "--format", "json", str(paths["w1"]), str(paths["w2"])]) == 1
    doc = json.loads(capsys.readouterr().out)["verdict"]
    assert doc["untraced"] == "measured" and {g["kind"] for g in doc["graphs"]} == {"untraced"}
    assert main(["compare", str(paths["w1"]), str(paths["w3"])]) == 0
    out = capsys.readouterr().out
    assert f"graph {HELD_OUT_GRAPH} (device 0): widened" in out and "observer_only, not a regression" in out
