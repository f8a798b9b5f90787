"""The HTTP server's own limits on a real uvicorn (issue 18: 1, 3, 7, 20)."""

import socket
import time

import httpx
import psutil
import pytest

from graphmon.export.exporter import Exporter
from graphmon.export.limits import ConnectionStats, limited_protocol
from graphmon.settings import Settings
from graphmon.sources.replay import ReplaySource

from helpers import synthetic_trace, window

TOKEN = "tok"


def serve(**kw):
    ex = Exporter(ReplaySource(synthetic_trace(), name="t"), Settings(port=0, token=TOKEN, **kw))
    ex.serve_background()
    return ex, f"http://127.0.0.1:{ex.bound_port}"


def _connect(port):
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    return s


def _closed_by_server(s, within_s):
    s.settimeout(within_s)
    try:
        return s.recv(1) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        return False


def test_idle_and_slowloris_sockets_are_capped_and_timed_out_and_scrapes_keep_working():
    ex, base = serve(max_connections=16, header_timeout_s=1.0)
    socks = []
    try:
        for i in range(100):  # idle sockets and a slowloris header, far beyond the cap
            s = _connect(ex.bound_port)
            if i % 2:
                s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
            socks.append(s)
        t0 = time.monotonic()
        r = httpx.get(base + "/metrics", timeout=5)  # a fresh scrape still gets through
        assert r.status_code == 200 and time.monotonic() - t0 < 2
        conns = ex._server.server_state.connections
        assert len(conns) <= 17
        stats: ConnectionStats = ex._server.graphmon_stats
        assert stats.evicted + stats.refused >= 80
        # the sockets still open are closed once the header timeout passes
        survivors = [s for s in socks if not _closed_by_server(s, 0.01)]
        assert survivors and all(_closed_by_server(s, 3.0) for s in survivors)
        assert stats.header_timeouts >= 1
    finally:
        for s in socks:
            s.close()
        ex.stop()


def test_slow_trace_readers_share_one_body_and_healthz_answers_in_a_second():
    big = synthetic_trace(n_graphs=1, n_streams=4, replays=100, kernels_per_stream=200, base_ns=10**12)
    ex, base = serve(max_trace_downloads=4)
    ex.aggregator.ingest(window(big, capture_id="big"))
    proc = psutil.Process()
    socks = []
    try:
        warm = httpx.get(base + "/trace/big", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)
        assert warm.status_code == 200
        body_mib = len(warm.content) / 2**20
        assert body_mib > 5
        rss0 = proc.memory_info().rss
        req = f"GET /trace/big HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n\r\n".encode()
        for _ in range(48):  # 48 concurrent downloads whose clients never read
            s = _connect(ex.bound_port)
            s.sendall(req)
            socks.append(s)
        time.sleep(1.0)
        t0 = time.monotonic()
        h = httpx.get(base + "/healthz", timeout=5)
        assert h.status_code == 200 and time.monotonic() - t0 < 1.0  # old code: 12-16 s
        grown_mib = (proc.memory_info().rss - rss0) / 2**20
        assert grown_mib < 2 * body_mib, grown_mib  # old code: one rendered body per reader
        traces = ex.app.state.traces
        assert traces.renders == 1 and traces.active <= 4 and traces.refused["busy"] >= 40
    finally:
        for s in socks:
            s.close()
        ex.stop()


def test_busy_port_is_one_clear_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        ex = Exporter(ReplaySource(synthetic_trace()), Settings(port=s.getsockname()[1]))
        with pytest.raises(OSError):
            ex.serve_background()


def test_limited_protocol_wraps_whatever_uvicorn_picks():
    from uvicorn.protocols.http.h11_impl import H11Protocol

    cls = limited_protocol(H11Protocol, 4, 1.0, ConnectionStats())
    assert issubclass(cls, H11Protocol) and cls.__name__ == "LimitedH11Protocol"
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:
        return  # httptools not installed here; the mixin uses only attributes both share
    assert issubclass(limited_protocol(HttpToolsProtocol, 4, 1.0, ConnectionStats()), HttpToolsProtocol)


