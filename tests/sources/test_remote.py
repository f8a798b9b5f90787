"""The agent's socket under hostile and clumsy peers (graphmon.sources.remote): connections are
keyed by connection, forgotten when closed, bounded before hello, and what they buffer is
bounded together. Each test failed on the code before these bounds."""

import logging
import socket
import struct
import time

import pytest

from graphmon.export.agent import Agent
from graphmon.model.wire import encode_message
from graphmon.settings import Settings

from helpers import AgentClient, wait_until


@pytest.fixture
def agent():
    a = Agent(Settings(port=0), tick_s=0.05, heartbeat_lost_s=60).start()
    yield a
    a.stop()


def _live(agent):
    return [a for a in agent.attached() if a.gone_s is None]


def test_closed_connections_are_forgotten_and_the_cap_counts_live_ones(agent):
    """Old code: 256 clean exits filled the process cap forever, and every later process was
    refused with no log line and no metric."""
    for i in range(260):  # an engine that restarts workers, a week of deploys
        c = AgentClient(agent.socket_path, rank=str(i % 4), pid=1000 + i)
        c.bye()
        c.close()
        if i % 64 == 63:
            assert wait_until(lambda: not agent.listener.procs, timeout=10)
    assert wait_until(lambda: not agent.listener.procs, timeout=10)
    late = AgentClient(agent.socket_path, rank="9", pid=5)
    assert wait_until(lambda: any(a.rank == "9" and a.gone_s is None for a in agent.attached()))
    assert agent.listener.rejected["too_many_processes"] == 0
    assert len(agent.listener.procs) == 1
    late.close()


def test_a_refusal_over_the_cap_is_counted_and_logged(caplog):
    caplog.set_level(logging.WARNING, logger="graphmon.agent")
    ag = Agent(Settings(port=0), tick_s=0.05, heartbeat_lost_s=60, listener_kwargs={"max_processes": 2}).start()
    try:
        kept = [AgentClient(ag.socket_path, rank=str(r), pid=10 + r) for r in range(2)]
        assert wait_until(lambda: len(_live(ag)) == 2)
        over = AgentClient(ag.socket_path, rank="2", pid=12)
        assert over.closed_by_peer()
        assert ag.listener.rejected["too_many_processes"] == 1
        assert any("too_many_processes" in r.getMessage() and "2 processes are attached" in r.getMessage()
                   for r in caplog.records)
        from graphmon.export.agent_http import render_metrics

        assert 'graphmon_agent_connections_rejected_total{reason="too_many_processes"} 1.0' in render_metrics(ag).decode()
        kept[0].bye()
        kept[0].close()
        assert wait_until(lambda: len(ag.listener.procs) == 1)
        again = AgentClient(ag.socket_path, rank="2", pid=12)
        assert wait_until(lambda: any(a.rank == "2" and a.gone_s is None for a in ag.attached()))
        again.close()
    finally:
        ag.stop()


def test_two_processes_with_one_pid_number_keep_their_own_series(agent):
    """Containers in their own pid namespaces are all pid 1: old code keyed processes by the
    announced pid, so the two evicted each other and records went missing."""
    a, b = AgentClient(agent.socket_path, rank="0", pid=1), AgentClient(agent.socket_path, rank="1", pid=1)
    assert wait_until(lambda: len(_live(agent)) == 2)
    for _ in range(5):
        a.window(8)
        b.window(6)
        a.heartbeat()
        b.heartbeat()
    assert wait_until(lambda: sorted(s.records_total for s in agent.snapshots()) == [30, 40], timeout=10)
    assert len(_live(agent)) == 2 and agent.lost_total == 0
    assert sorted((p["rank"], p["pid"]) for p in agent.process_status()) == [("0", "1"), ("1", "1")]
    # a sender naming a live process's pid displaces nobody
    c = AgentClient(agent.socket_path, rank="7", pid=1)
    assert wait_until(lambda: len(_live(agent)) == 3)
    assert not a.closed_by_peer(0.2) and not b.closed_by_peer(0.2)
    for x in (a, b, c):
        x.close()


def test_connections_that_never_say_hello_time_out_and_are_capped(caplog):
    """Old code: a connection that said nothing lived forever with a blocking reader thread,
    outside the process cap; 300 of them took the agent's HTTP down under RLIMIT_NOFILE 256."""
    caplog.set_level(logging.WARNING, logger="graphmon.agent")
    ag = Agent(Settings(port=0), tick_s=0.05, heartbeat_lost_s=60,
               listener_kwargs={"hello_timeout_s": 0.5, "max_unidentified": 8}).start()
    try:
        silent = []
        for _ in range(40):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(ag.socket_path)
            silent.append(s)
        real = AgentClient(ag.socket_path, rank="0")  # a real process says hello at once: never evicted
        assert wait_until(lambda: len(_live(ag)) == 1)
        assert wait_until(lambda: ag.listener.counts()["unidentified"] == 0, timeout=5)
        for s in silent:
            s.settimeout(2)
            assert s.recv(1) == b""  # closed by the agent
            s.close()
        r = ag.listener.rejected
        assert r["unidentified_evicted"] + r["hello_timeout"] == 40 and r["unidentified_evicted"] >= 32
        # a slow hello (a byte at a time) gets no more time than the timeout
        slow = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        slow.connect(ag.socket_path)
        t0 = time.monotonic()
        hello = encode_message("hello", identity={"rank": "5"})
        try:
            for i in range(len(hello)):
                slow.sendall(hello[i:i + 1])
                time.sleep(0.05)
        except OSError:
            pass
        assert time.monotonic() - t0 < 2.0 and not any(a.rank == "5" for a in ag.attached())
        slow.close()
        lines = [x for x in caplog.records if "without hello" in x.getMessage() or "no hello" in x.getMessage()]
        assert 1 <= len(lines) <= 2 * 5  # rate limited: at most 5 lines per reason a minute
        assert not real.closed_by_peer(0.1)
        real.close()
    finally:
        ag.stop()


def test_a_frame_before_hello_is_bounded_to_what_a_hello_needs(agent):
    """Old code buffered up to 512 MiB per connection before hello: 4 x 96 MiB raised the
    agent's RSS by 389 MiB."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(agent.socket_path)
    s.sendall(struct.pack("<I", 96 * 2**20) + b"\0" * 65536)
    s.settimeout(2)
    try:
        got = s.recv(1)
    except ConnectionResetError:
        got = b""
    assert got == b""  # closed at once, nothing buffered
    assert agent.listener.rejected["bad_hello"] == 1 and agent.listener.frames_rejected["too_large"] == 1
    s.close()


def test_buffered_frames_share_one_budget_and_a_frame_that_does_not_fit_is_dropped_counted():
    budget = 4 * 2**20
    ag = Agent(Settings(port=0), tick_s=0.05, heartbeat_lost_s=60,
               listener_kwargs={"max_buffered_bytes": budget}).start()
    try:
        clients = [AgentClient(ag.socket_path, rank=str(r), pid=20 + r) for r in range(4)]
        assert wait_until(lambda: len(_live(ag)) == 4)
        for c in clients:  # each announces a 3 MiB frame and sends half of it
            c.s.sendall(struct.pack("<I", 3 * 2**20) + b"\0" * (3 * 2**19))
        assert wait_until(lambda: sum(sum(a.series.dropped.values()) for a in ag.attached()) == 3)
        assert ag.listener.budget.used <= budget and ag.listener.budget.high_water <= budget
        assert sum(a.series.dropped["memory"] for a in ag.attached()) == 3
        for c in clients:  # the rest of each frame
            c.s.sendall(b"\0" * (3 * 2**19))
        # the one frame that fitted is no frame (zeros): refused, its connection closed, its bytes released
        assert wait_until(lambda: ag.listener.frames_rejected["header"] == 1)
        assert wait_until(lambda: ag.listener.budget.used == 0)
        for c in clients[1:]:  # the streams of the dropped frames are still in step: their next window is ingested
            c.window(8)
        assert wait_until(lambda: sum(s.records_total for s in ag.snapshots()) == 24)
        for c in clients:
            c.close()
    finally:
        ag.stop()


def test_a_window_queue_is_bounded_per_process_and_drops_are_counted(agent, monkeypatch):
    import threading

    gate, held = threading.Event(), threading.Event()
    real_ingest = agent._ingest
    monkeypatch.setattr(agent, "_ingest", lambda a, w: (held.set(), gate.wait(10), real_ingest(a, w)))
    c = AgentClient(agent.socket_path, rank="0")
    assert wait_until(lambda: len(_live(agent)) == 1)
    a = agent.attached()[0]
    c.window(8)
    assert held.wait(5)  # the ingest thread holds this one
    n = a.proc.max_queued_windows + 10
    for _ in range(n):
        c.window(8)
    c.heartbeat()
    # max_queued_windows wait in the queue, the oldest others are dropped
    assert wait_until(lambda: a.series.dropped["queue_full"] == n - a.proc.max_queued_windows)
    assert a.proc.queued == a.proc.max_queued_windows
    gate.set()
    assert wait_until(lambda: agent.snapshots()[0].windows_total == 1 + a.proc.max_queued_windows)
    c.close()
