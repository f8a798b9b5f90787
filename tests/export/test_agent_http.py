"""The agent's HTTP side (graphmon.export.agent_http): /metrics from per-rank pieces rendered at
most once per interval off the connection threads, the shared trace-memory cap, serve's
connection limits, and an agent with no process that is still visible."""

import socket
import time

import httpx
import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text

from graphmon.export.agent import Agent
from graphmon.export.agent_http import AgentMetrics, render_metrics, serve_background
from graphmon.export.collector import make_registry
from graphmon.export.exposition import OPENMETRICS, TEXT, render
from graphmon.settings import Settings

from helpers import AgentClient, wait_until


@pytest.fixture
def agent():
    a = Agent(Settings(port=0), tick_s=0.05, heartbeat_lost_s=60).start()
    yield a
    a.stop()


def _attach(agent, n, records=8):
    clients = [AgentClient(agent.socket_path, rank=str(r), pid=100 + r) for r in range(n)]
    assert wait_until(lambda: len(agent.processes) == n)
    for c in clients:
        c.window(records)
    assert wait_until(lambda: all(s.records_total == records for s in agent.snapshots()))
    return clients


def _samples(text, fmt):
    fams = (parse_openmetrics if fmt == OPENMETRICS else parse_text)(text)
    return sorted((s.name, tuple(sorted(s.labels.items())), s.value) for f in fams for s in f.samples)


@pytest.mark.parametrize("fmt", [TEXT, OPENMETRICS])
def test_the_body_from_pieces_is_what_one_registry_renders(agent, fmt):
    """Per-rank pieces joined family by family: the same samples as rendering every snapshot in
    one registry (the code before pieces), plus one build_info line for the agent itself, in a
    body the strict parsers accept."""
    from graphmon.export.agent_http import health_families

    class WithoutOwnBuild:  # the agent's families as the registry had them (no build_info of its own)
        def collect(self):
            return (m for m in health_families(agent, device_info=False) if m.name != "graphmon_build_info")

    clients = _attach(agent, 3)  # noqa: F841 (kept open)
    body = render_metrics(agent, fmt).decode()
    got = _samples(body, fmt)
    want = _samples(render(make_registry(agent.snapshots, extra=[WithoutOwnBuild()]), fmt).decode(), fmt)
    assert [s for s in got if s[0] != "graphmon_build_info"] == [s for s in want if s[0] != "graphmon_build_info"]
    builds = [s for s in got if s[0] == "graphmon_build_info"]
    assert {s for s in want if s[0] == "graphmon_build_info"} <= set(builds) and len(builds) == len(set(builds)) <= 2
    assert body.count("# HELP graphmon_up ") == 1


def test_only_the_rank_whose_snapshot_changed_is_rendered_again(agent):
    clients = _attach(agent, 8)
    m = AgentMetrics(agent)
    m.render([TEXT])
    assert m.piece_renders == 8
    clients[5].window(8)
    assert wait_until(lambda: agent.attached()[5].aggregator.snapshot().records_total == 16)
    m.render([TEXT])
    assert m.piece_renders == 9  # rank 5 only
    m.render([TEXT])
    assert m.piece_renders == 9  # nothing changed: nothing rendered, the body joined again
    assert 'graphmon_records_total{rank="5"} 16.0' in m.body(TEXT).text.decode()


def test_metrics_are_rendered_once_per_interval_off_the_request_path(agent):
    clients = _attach(agent, 2)  # noqa: F841 (kept open)
    server, thread, port = serve_background(agent, "127.0.0.1", 0, render_interval_s=0.5)
    m = server.config.app.state.agent_metrics
    try:
        accept = {"accept": "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"}
        n = 0
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=accept, timeout=5) as http:
            t0 = time.monotonic()
            while time.monotonic() - t0 < 2.0:
                r = http.get("/metrics")
                assert r.status_code == 200 and r.text.endswith("# EOF\n")
                n += 1
        # the first scrape rendered (there was no body yet); the render thread, once per interval
        assert m.renders <= 2.0 / 0.5 + 2 < n
        assert all(t == "graphmon-agent-render" or "AnyIO" in t for t in m.render_threads)
    finally:
        server.should_exit = True
        thread.join(5)


def test_one_rank_failing_to_render_leaves_the_others_whole(agent, monkeypatch):
    import graphmon.export.families as families_mod

    clients = _attach(agent, 2)  # noqa: F841 (kept open)
    real = families_mod.graph_series

    def broken(snap, level):
        if snap.rank == "1":
            raise KeyError("injected")
        return real(snap, level)

    monkeypatch.setattr(families_mod, "graph_series", broken)
    counted = []
    m = AgentMetrics(agent, on_error=lambda stage, e: counted.append(stage))
    m.render([TEXT])
    text = m.body(TEXT).text.decode()
    assert 'graphmon_kernel_gap_seconds_count{device="0",graph="g1",rank="0"' in text
    assert 'graphmon_up{rank="1"} 1.0' in text and 'graphmon_kernel_gap_seconds_count{device="0",graph="g1",rank="1"' not in text
    assert counted == ["scrape"]
    parse_text(text)


def test_one_collector_failing_leaves_the_other_agent_collectors_whole(agent):
    from graphmon.export.agent_http import AgentHealthCollector

    class Broken:
        def collect(self):
            raise AttributeError("injected")

    clients = _attach(agent, 1)  # noqa: F841 (kept open)
    counted = []
    m = AgentMetrics(agent, collectors=[Broken(), AgentHealthCollector(agent)],
                     on_error=lambda stage, e: counted.append(stage))
    m.render([TEXT])
    text = m.body(TEXT).text.decode()
    assert "graphmon_agent_connections_rejected_total" in text
    assert 'graphmon_kernel_gap_seconds_count{device="0",graph="g1",rank="0"' in text
    assert counted == ["scrape"]
    parse_text(text)


def test_one_process_failing_its_status_entry_leaves_status_whole(agent, monkeypatch):
    from graphmon.export.agent_http import status

    clients = _attach(agent, 2)  # noqa: F841 (kept open)
    real = agent._status_graphs

    def broken(tag, snap):
        if snap.rank == "1":
            raise KeyError("injected")
        return real(tag, snap)

    monkeypatch.setattr(agent, "_status_graphs", broken)
    procs = status(agent)["processes"]
    assert [p["rank"] for p in procs] == ["0", "1"]
    assert "graphs" in procs[0] and "KeyError('injected')" in procs[1]["error"]
    assert agent.errors["status"] == 1


def test_trace_memory_has_one_cap_for_all_processes():
    """Old code: one trace store per process, each up to trace_store_bytes (RSS grew with the
    number of collectors: 607-711 MB at 64)."""
    from graphmon.export.tracestore import TraceStore

    one = None
    ag = Agent(Settings(port=0, trace_store_count=16), tick_s=0.05, heartbeat_lost_s=60).start()
    try:
        clients = _attach(ag, 1, records=2000)
        one = ag.traces.nbytes
        ag.stop()
        cap = 5 * one
        ag = Agent(Settings(port=0, trace_store_count=16, trace_store_bytes=cap), tick_s=0.05, heartbeat_lost_s=60).start()
        clients = _attach(ag, 4, records=2000)
        for _ in range(3):
            for c in clients:
                c.window(2000)
            time.sleep(0.2)
        assert wait_until(lambda: sum(s.windows_total for s in ag.snapshots()) == 16, timeout=20)
        assert ag.traces.nbytes <= cap and ag.traces.evicted == 11
        assert TraceStore.size_of(ag.attached()[3].store.get(ag.attached()[3].store.ids()[-1])) == one
        # the newest window of every rank is still there
        assert all(a.store.get(a.aggregator.snapshot().windows[-1]) is not None for a in ag.attached())
    finally:
        ag.stop()


def test_the_agent_http_server_has_the_limits_of_serve():
    """Old code built a plain uvicorn server: idle and slowloris connections were kept forever
    (300 of them under RLIMIT_NOFILE 256 took /healthz and /metrics down)."""
    ag = Agent(Settings(port=0, max_connections=8, header_timeout_s=0.5), tick_s=0.05).start()
    server, thread, port = serve_background(ag, "127.0.0.1", 0)
    try:
        idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(30)]
        t0 = time.monotonic()
        r = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5)
        assert r.status_code == 200 and time.monotonic() - t0 < 2
        closed = 0
        for s in idle:
            s.settimeout(3)
            try:
                closed += s.recv(1) == b""
            except TimeoutError:
                pass  # still open
            except OSError:
                closed += 1  # reset by the server
            s.close()
        assert closed == 30  # evicted over the cap or timed out without a request head
        assert server.graphmon_stats.evicted + server.graphmon_stats.header_timeouts >= 30
    finally:
        server.should_exit = True
        thread.join(5)
        ag.stop()


def test_an_agent_with_no_process_is_visible():
    """Old code: an agent alone exported only graphmon_processes and graphmon_processes_lost_total,
    so dashboards had no variables and nothing could page for a sidecar nobody attached to."""
    ag = Agent(Settings(port=0), tick_s=0.05).start()
    try:
        text = render_metrics(ag).decode()
        assert "graphmon_agent_up 1.0" in text
        (bi,) = [x for x in text.splitlines() if x.startswith("graphmon_build_info{")]
        from graphmon import __version__

        assert f'graphmon_version="{__version__}"' in bi
        assert 'graphmon_processes{state="running"} 0.0' in text
        parse_text(text)
        parse_openmetrics(render_metrics(ag, OPENMETRICS).decode())
    finally:
        ag.stop()


def test_agent_level_collectors_are_rendered_at_every_render(agent):
    """The deploy verdict's families join /metrics as an agent-level collector."""
    from prometheus_client.core import GaugeMetricFamily

    from graphmon.export.agent_http import AgentHealthCollector

    value = [1.0]

    class Verdict:
        def collect(self):
            g = GaugeMetricFamily("graphmon_test_verdict", "A family of another part of the agent.")
            g.add_metric([], value[0])
            yield g

    m = AgentMetrics(agent, collectors=[AgentHealthCollector(agent), Verdict()])
    m.render([TEXT])
    assert "graphmon_test_verdict 1.0" in m.body(TEXT).text.decode() and "graphmon_agent_up 1.0" in m.body(TEXT).text.decode()
    value[0] = 2.0  # no rank changed: the next render shows it anyway
    m.render([TEXT])
    assert "graphmon_test_verdict 2.0" in m.body(TEXT).text.decode()


def test_head_metrics_and_healthz_answer_200_with_headers_and_no_body(agent):
    """A load balancer or probe that asks HEAD gets the GET's status and headers (uvicorn drops
    the body), not 405."""
    server, thread, port = serve_background(agent, "127.0.0.1", 0)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=5) as http:
            for path, ctype in (("/metrics", "text/plain"), ("/healthz", "application/json"), ("/", "text/html")):
                r = http.head(path)
                assert r.status_code == 200 and r.content == b"" and r.headers["content-type"].startswith(ctype), path
                assert int(r.headers["content-length"]) > 0
            assert http.head("/metrics", headers={"accept-encoding": "gzip"}).headers["content-encoding"] == "gzip"
            assert "head" not in str(http.get("/openapi.json").json()["paths"]["/metrics"]).lower()
    finally:
        server.should_exit = True
        thread.join(5)
