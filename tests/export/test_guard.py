"""Request guard: body limits and authentication before the body is read; /status paths (issue 18: 2, 8, 9, 10)."""

import pytest
from fastapi import FastAPI
from starlette.testclient import TestClient

from graphmon.export.exporter import Exporter
from graphmon.export.guard import base_names
from graphmon.settings import Settings
from graphmon.sources.replay import ReplaySource

from helpers import synthetic_trace, window

LOCAL = ("127.0.0.1", 40000)
REMOTE = ("10.1.2.3", 40000)


def make(token=None, client=LOCAL, name="/srv/secret/models/run-7/trace.graphmon.npz", **kw):
    ex = Exporter(ReplaySource(synthetic_trace(), name=name), Settings(token=token, **kw))
    ex.aggregator.ingest(window(synthetic_trace()))
    return ex, TestClient(ex.app, client=client)


def test_chunked_body_any_case_is_refused_before_reading_it():
    ex, c = make(token="t")
    read = []

    def body():
        for _ in range(1024):  # 64 MiB if it were all read
            read.append(1)
            yield b"x" * 65536

    r = c.post("/capture", content=body(), headers={"Transfer-Encoding": "Chunked"})
    assert r.status_code in (401, 411)
    assert len(read) <= 2  # old code: all 64 MiB read, then 422


def test_auth_is_decided_before_the_body_is_parsed():
    ex, c = make(token="t")
    assert c.post("/capture", content=b"{not json", headers={"content-type": "application/json"}).status_code == 401
    assert c.post("/capture", json={"bogus": 1}).status_code == 401  # old code: 422 before 401


@pytest.mark.parametrize("scheme", ["Bearer", "bearer", "BEARER"])
def test_bearer_scheme_is_case_insensitive(scheme):
    ex, c = make(token="t0k")
    r = c.post("/capture", json={"replays": 1}, headers={"Authorization": f"{scheme} t0k"})
    assert r.status_code == 200, r.text


def test_non_ascii_token_can_match():
    ex, c = make(token="jeton-é-✓")
    ok = c.post("/capture", json={"replays": 1}, headers=[(b"authorization", "Bearer jeton-é-✓".encode())])
    assert ok.status_code == 200, ok.text
    bad = c.post("/capture", json={"replays": 1}, headers=[(b"authorization", "Bearer jeton-e-✓".encode())])
    assert bad.status_code == 401


def test_mounted_app_judges_public_by_the_client_address():
    ex, _ = make()  # attach(serve=False): loopback settings, no token
    host = FastAPI()
    host.mount("/graphmon", ex.app)
    remote = TestClient(host, client=REMOTE)
    assert remote.post("/graphmon/capture", json={"replays": 1}).status_code == 403  # old code: 200
    assert remote.get("/graphmon/trace/w1").status_code == 403
    assert remote.get("/graphmon/metrics").status_code == 200  # metrics stay open
    local = TestClient(host, client=LOCAL)
    assert local.post("/graphmon/capture", json={"replays": 1}).status_code == 200


def test_trace_needs_the_token_when_one_is_set():
    ex, c = make(token="t")
    assert c.get("/trace/w1").status_code == 401
    assert c.get("/trace/w1", headers={"Authorization": "Bearer t"}).status_code == 200


def test_status_shows_base_names_to_unauthenticated_clients():
    ex, c = make(token="t")
    doc = c.get("/status").json()
    assert doc["backend"]["source"] == "trace.graphmon.npz"  # old code: the absolute path
    assert "/srv/secret" not in c.get("/status").text
    full = c.get("/status", headers={"Authorization": "Bearer t"}).json()
    assert full["backend"]["source"] == "/srv/secret/models/run-7/trace.graphmon.npz"


def test_base_names():
    assert base_names("loaded /usr/local/cuda/lib64/libcupti.so.13 ok") == "loaded libcupti.so.13 ok"
    assert base_names("C:\\x\\y.npz") == "y.npz"
    assert base_names("no path 1/2") == "no path 1/2"


def test_landing_page_no_swagger_and_honest_openapi():
    ex, c = make()
    r = c.get("/")
    assert r.status_code == 200 and 'href="metrics"' in r.text and "http" not in r.text.split("<body>")[1].split("graphmon")[0]
    assert c.get("/docs").status_code == 404 and c.get("/redoc").status_code == 404  # no CDN assets
    spec = c.get("/openapi.json").json()
    content = spec["paths"]["/metrics"]["get"]["responses"]["200"]["content"]
    assert "application/json" not in content and "text/plain; version=0.0.4; charset=utf-8" in content


def test_protect_status_puts_status_graphs_and_baseline_behind_the_token():
    """/status shows pids, host names and the configuration: --protect-status asks for the token
    there too (or a loopback client when no token is set), while /metrics and /healthz stay open."""
    ex, c = make(token="t0k", protect_status=True, client=REMOTE)
    for path in ("/status", "/graphs", "/baseline"):
        r = c.get(path)
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer", path
        assert c.get(path, headers={"Authorization": "Bearer t0k"}).status_code == 200, path
    assert c.get("/status", headers={"Authorization": "Bearer t0k"}).json()["config"]["protect_status"] is True
    for path in ("/metrics", "/healthz", "/"):
        assert c.get(path).status_code == 200, path
    ex, c = make(protect_status=True, client=REMOTE)  # no token: remote clients are refused
    assert c.get("/status").status_code == 403
    ex, c = make(protect_status=True, client=LOCAL)  # ... loopback ones on a loopback bind are not
    assert c.get("/status").status_code == 200
    ex, c = make(client=REMOTE)  # without the option /status stays open (paths reduced to base names)
    assert c.get("/status").status_code == 200
