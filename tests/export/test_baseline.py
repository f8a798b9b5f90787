"""Live per-boundary attribution: POST/GET/DELETE /baseline, /status "boundaries", /trace otherData."""

import threading
import time

import numpy as np
import pytest
from fastapi.testclient import TestClient

from graphmon.analysis.boundaries import boundary_gaps
from graphmon.export.exporter import Exporter
from graphmon.formats.read import read_trace
from graphmon.settings import Settings
from graphmon.sources.replay import ReplaySource
from helpers import NATIVE, half, widen_at, window

LOCAL = ("127.0.0.1", 5000)
GRAPH = "decode_bs2/no_upload"


@pytest.fixture(scope="module")
def real_trace():
    return read_trace(NATIVE, progress=False)


def make(trace, **settings):
    """An Exporter over the real trace whose source is never started: windows are fed by hand."""
    ex = Exporter(ReplaySource(trace, interval_s=0.05, name="test"), Settings(**settings))
    return ex, TestClient(ex.app, client=LOCAL)


def picks(trace, g):
    """Three (stream, position) boundaries with small gaps on three streams of graph ``g``."""
    b = boundary_gaps(trace)
    med = b.quantile(0.5)
    out = []
    for s in np.unique(b.stream[b.graph == g]).tolist()[:3]:
        rows = np.flatnonzero((b.graph == g) & (b.stream == s) & (med < 1_000) & (b.position >= 5))
        out.append((int(s), int(b.position[rows[len(rows) // 2]])))
    return out


def widened(trace):
    g = trace.graph_names().index(GRAPH)
    chosen = picks(trace, g)
    cur = trace
    for s, p in chosen:
        cur = widen_at(cur, g, s, [p], 5_000)
    return chosen, cur


def wait_ready(c, window_id, timeout=30, headers=None):
    deadline = time.monotonic() + timeout
    while True:
        b = c.get("/status", headers=headers).json()["boundaries"]
        if b["state"] == "ready" and b["window"] == window_id:
            return b
        assert time.monotonic() < deadline, b
        time.sleep(0.05)


def test_status_names_exactly_the_widened_boundaries(real_trace):
    ex, c = make(real_trace)
    assert c.get("/status").json()["boundaries"] == {"state": "no baseline"}
    assert c.get("/baseline").json() == {"pinned": False}
    base_id = ex.aggregator.ingest(window(half(real_trace, 0), ended_s=1_800_000_000.0))
    assert c.post("/baseline", json={"trace_id": base_id}).json()["trace_id"] == base_id
    chosen, cur = widened(real_trace)
    win_id = ex.aggregator.ingest(window(half(cur, 1), ended_s=1_800_000_001.0))
    st = c.get("/status").json()
    assert st["boundaries"]["state"] == "computing" and st["boundaries"]["computing_window"] == win_id
    b = wait_ready(c, win_id)
    assert b["baseline"] == base_id and b["computed_age_s"] >= 0
    d = {x["graph"]: x for x in b["graphs"]}
    assert d[GRAPH]["verdict"] == "concentrated"
    widened_top = {(t["stream_baseline"], t["position"]) for t in d[GRAPH]["top"] if t["flagged"]}
    assert d[GRAPH]["flagged"] == 3
    assert widened_top == set(chosen)
    assert all(x["verdict"] == "none" for n, x in d.items() if n != GRAPH)
    # never a metric label: kernel names stay out of /metrics
    kernel = d[GRAPH]["top"][0]["kernel_after"]
    assert kernel and kernel not in c.get("/metrics").text
    # /trace carries the computed attribution; no recomputation on the download path
    n = ex.app.state.baseline.computations
    tr = c.get(f"/trace/{win_id}").json()
    assert tr["otherData"]["boundaries"] == {"baseline": base_id, "window": win_id, "graphs": b["graphs"]}
    assert "boundaries" not in c.get(f"/trace/{base_id}").json()["otherData"]  # not computed for that window
    for _ in range(5):
        assert c.get("/status").json()["boundaries"]["state"] == "ready"
    assert ex.app.state.baseline.computations == n == 1
    # a new window: one more computation, the old result still served meanwhile
    win2 = ex.aggregator.ingest(window(half(real_trace, 1), ended_s=1_800_000_002.0))
    b2 = wait_ready(c, win2)
    assert all(x["verdict"] == "none" for x in b2["graphs"])
    assert ex.app.state.baseline.computations == 2
    # DELETE unpins; /trace no longer carries boundaries
    assert c.delete("/baseline").json() == {"pinned": False, "unpinned": base_id}
    assert c.get("/status").json()["boundaries"] == {"state": "no baseline"}
    assert "boundaries" not in c.get(f"/trace/{win2}").json()["otherData"]


def test_empty_body_pins_the_last_window_and_survives_eviction(real_trace):
    ex, c = make(real_trace, trace_store_count=2)
    assert c.post("/baseline").status_code == 404  # no window yet
    first = ex.aggregator.ingest(window(half(real_trace, 0), ended_s=1_800_000_000.0))
    r = c.post("/baseline")
    assert r.status_code == 200 and r.json()["trace_id"] == first
    for i in range(3):  # the store keeps 2: the pinned window is evicted from it
        last = ex.aggregator.ingest(window(half(real_trace, 1), ended_s=1_800_000_001.0 + i))
    assert ex.store.get(first) is None
    b = wait_ready(c, last)
    assert b["baseline"] == first and b["graphs"]


def test_baseline_auth_and_errors(real_trace):
    ex, c = make(real_trace, token="s3cret")
    wid = ex.aggregator.ingest(window(half(real_trace, 0)))
    assert c.post("/baseline", json={"trace_id": wid}).status_code == 401
    assert c.delete("/baseline").status_code == 401
    auth = {"Authorization": "Bearer s3cret"}
    assert c.post("/baseline", json={"trace_id": "nope"}, headers=auth).status_code == 404
    assert c.post("/baseline", json={"trace_id": "a/b"}, headers=auth).status_code == 400
    assert c.post("/baseline", content=b"{bad", headers=auth).status_code == 422
    assert c.get("/baseline").json() == {"pinned": False}
    assert c.post("/baseline", json={"trace_id": wid}, headers=auth).status_code == 200
    assert c.get("/baseline").json()["trace_id"] == wid
    assert c.delete("/baseline", headers=auth).json()["unpinned"] == wid
    # without a token: loopback clients only, as for POST /capture
    ex2, _ = make(real_trace)
    remote = TestClient(ex2.app, client=("10.1.2.3", 5000))
    assert remote.post("/baseline").status_code == 403


def test_healthz_and_status_do_not_wait_for_a_computation(real_trace):
    ex, c = make(real_trace)
    gate, started = threading.Event(), threading.Event()
    bl = ex.app.state.baseline

    def slow(b, w):
        started.set()
        gate.wait(30)
        return []

    bl._compute = slow
    a = ex.aggregator.ingest(window(half(real_trace, 0)))
    c.post("/baseline", json={"trace_id": a})
    w = ex.aggregator.ingest(window(half(real_trace, 1), ended_s=1_800_000_001.0))
    try:
        assert c.get("/status").json()["boundaries"]["state"] == "computing"
        assert started.wait(10)
        t0 = time.monotonic()
        assert c.get("/healthz").json()["status"] == "ok"
        for _ in range(3):
            assert c.get("/status").json()["boundaries"]["state"] == "computing"
        # identity: this bound is about the computation, not the gzip of a 38 MB body (0.3 s more)
        assert "boundaries" not in c.get(f"/trace/{w}", headers={"Accept-Encoding": "identity"}).json()["otherData"]
        assert time.monotonic() - t0 < 5
        # a newer window while one computation runs starts no second one
        ex.aggregator.ingest(window(half(real_trace, 1), ended_s=1_800_000_002.0))
        assert c.get("/status").json()["boundaries"]["computing_window"] == w
    finally:
        gate.set()
    deadline = time.monotonic() + 10
    while bl.computations < 1:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert bl.computations == 1


def test_a_failing_computation_is_reported_not_raised(real_trace):
    ex, c = make(real_trace)
    bl = ex.app.state.baseline
    bl._compute = lambda b, w: 1 / 0
    a = ex.aggregator.ingest(window(half(real_trace, 0)))
    c.post("/baseline", json={"trace_id": a})
    w = ex.aggregator.ingest(window(half(real_trace, 1), ended_s=1_800_000_001.0))
    c.get("/status")
    deadline = time.monotonic() + 10
    while True:
        b = c.get("/status").json()["boundaries"]
        if b["state"] == "ready":
            break
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert "ZeroDivisionError" in b["error"] and b["graphs"] == [] and bl.failures == 1
    assert "boundaries" not in c.get(f"/trace/{w}").json()["otherData"]


def test_agent_windows_get_the_same_attribution(real_trace, tmp_path):
    import os
    import socket

    from graphmon.export.agent import Agent
    from graphmon.export.agent_http import create_agent_app
    from graphmon.model.wire import encode_message, encode_window
    from helpers import wait_until

    agent = Agent(Settings(port=0), tick_s=0.02, heartbeat_lost_s=60).start()
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(agent.socket_path)
        ident = {"rank": "0", "rank_source": "RANK", "pid": "4242", "host": "h", "device": "0", "uuid": "GPU-1",
                 "pci_bus_id": "00000000:10:00.0", "interval_s": 10.0, "first_window_s": 0.0}
        s.sendall(encode_message("hello", identity=ident, status={"state": "running"}))
        c = TestClient(create_agent_app(agent), client=LOCAL)
        now = time.time()
        s.sendall(encode_window(window(half(real_trace, 0), ended_s=now)))
        assert wait_until(lambda: c.get("/status").json()["processes"][0]["windows"] == ["r1-w1"], timeout=20)
        assert c.post("/baseline", json={"trace_id": "r1-w1"}).status_code == 200
        chosen, cur = widened(real_trace)
        s.sendall(encode_window(window(half(cur, 1), ended_s=now + 1)))
        b = wait_ready(c, "r1-w2")
        d = {x["graph"]: x for x in b["graphs"]}
        assert b["baseline"] == "r1-w1" and d[GRAPH]["verdict"] == "concentrated"
        assert {(t["stream_baseline"], t["position"]) for t in d[GRAPH]["top"] if t["flagged"]} == set(chosen)
        assert c.get("/trace/r1-w2").json()["otherData"]["boundaries"]["baseline"] == "r1-w1"
    finally:
        s.close()
        agent.stop()
