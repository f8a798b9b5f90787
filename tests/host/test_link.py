"""The process side of the agent link (light collector) against a real agent on a Unix socket."""

import logging
import os
import shutil
import socket
import subprocess
import sys
import time

import pytest

from graphmon.export.agent import Agent
from graphmon.host.link import LightCollector, Link, identity
from graphmon.model.wire import encode_message, encode_window
from graphmon.settings import Settings

from helpers import wait_until
from graphmon.sources import remote

from fake_cupti import FakeCupti, FakeEvents, decode_like

FAST = dict(window_launches=4, window_duration_ms=200, interval_s=0.05, first_window_s=0.0, max_traced_share=1.0)




@pytest.fixture
def agent():
    a = Agent(Settings(port=0), tick_s=0.05).start()
    yield a
    a.stop()


def test_link_imports_no_http_or_prometheus(tmp_path):
    code = ("import sys, graphmon.host.link, graphmon.host.trigger, graphmon.model.wire, graphmon.sources.cupti.collector\n"
            "bad = [m for m in ('fastapi', 'uvicorn', 'prometheus_client', 'starlette') "
            "if m in sys.modules]\nprint(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


def test_socket_dir_is_private_and_peer_uid_checked(agent, monkeypatch):
    d = os.path.dirname(agent.socket_path)
    assert os.stat(d).st_mode & 0o777 == 0o700
    assert os.stat(agent.socket_path).st_mode & 0o077 == 0
    me = os.getuid()
    monkeypatch.setattr(remote.os, "getuid", lambda: me + 1)  # the peer is now "another user"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(agent.socket_path)
    try:
        s.sendall(encode_message("hello", identity={"rank": "9"}))
    except (BrokenPipeError, ConnectionResetError):
        pass  # refused before the hello arrived: the agent never reads from another user
    assert wait_until(lambda: agent.listener.rejected["uid"] == 1)
    assert not agent.processes


def test_light_collector_windows_reach_agent_with_identity(agent):
    fake = FakeCupti()
    lc = LightCollector(agent.socket_path, cupti=fake, **FAST)
    lc.start()
    try:
        h = fake.instantiate(decode_like(2))
        assert wait_until(lambda: agent.processes and agent.attached()[0].aggregator.snapshot().records_total > 0
                      or fake.launch(h, 7) and False)
        a = agent.attached()[0]
        assert a.proc.identity["pid"] == str(os.getpid()) and a.identity()["state"] == "running"
        assert a.aggregator.snapshot().up
    finally:
        lc.stop()
    assert wait_until(lambda: agent.attached()[0].health().state == "stopped")
    assert agent.lost_total == 0  # said bye: stopped, not lost


def test_untraced_rows_reach_the_agents_windows(agent, monkeypatch):
    decoded = []

    def keep(*a, **kw):  # the agent's decode of each window frame (ingest thread)
        w = remote_decode(*a, **kw)
        decoded.append(w)
        return w

    remote_decode = remote.decode_window
    monkeypatch.setattr(remote, "decode_window", keep)
    fake = FakeCupti(trace_slowdown=3.0)
    lc = LightCollector(agent.socket_path, cupti=fake, **{**FAST, "interval_s": 0.2, "untraced_burst_launches": 8,
                                                          "untraced_burst_interval_s": 0.05})
    lc.source._events_arg = FakeEvents(fake)  # CuptiSource's events seam (the CPU has no libcuda)
    lc.start()
    try:
        h = fake.instantiate(decode_like(4))
        assert wait_until(lambda: any(len(w.untraced["graph"]) > 4 for w in decoded) or fake.launch(h, 7) and False,
                          timeout=10)
    finally:
        lc.stop()
    w = next(w for w in decoded if len(w.untraced["graph"]) > 4)  # a burst's 8 and the reference phase's 4
    assert len(w.untraced["graph"]) % 8 == 4
    assert {w.trace.graphs[g].graph_id for g in w.untraced["graph"].tolist()} == {fake.exec_ids[h]}
    assert set(w.untraced["duration_ns"].tolist()) == {35_264}  # decode_like(4)'s untraced span on the fake


def test_light_collector_status_says_idle_and_empty_windows(tmp_path):
    # no graph launch: idle windows (not traced, not empty); a window that traced no launch:
    # empty, reason no_launches
    fake = FakeCupti()
    lc = LightCollector(str(tmp_path / "none.sock"), cupti=fake, **{**FAST, "interval_s": 0.1, "observer": "off",
                                                                   "window_duration_ms": 30})
    lc.start()
    try:
        assert wait_until(lambda: lc._status()["sampling"]["idle_windows"] >= 2)
        assert wait_until(lambda: lc._status()["sampling"]["armed"])  # (between two idle windows it re-arms)
        st = lc._status()
        assert st["empty_windows_no_launches"] == 0 and st["empty_windows"] == 0
        assert st["sampling"]["late_stamped_records"] == 0
        h = fake.instantiate(decode_like(1))
        fake.launch(h, 7)  # opens the window (no event timing: no reference phase), then no launch while traced
        assert wait_until(lambda: lc._status()["empty_windows_no_launches"] == 1)
    finally:
        lc.stop()


def test_capture_fans_out_to_processes(agent):
    from graphmon.model.window import CaptureRequest

    fake = FakeCupti()
    lc = LightCollector(agent.socket_path, cupti=fake, **{**FAST, "interval_s": 30.0, "first_window_s": 30.0})
    lc.start()
    try:
        h = fake.instantiate(decode_like(2))
        assert wait_until(lambda: bool(agent.processes))
        agent.capture(CaptureRequest(id="cabc", replays=3))
        assert wait_until(lambda: agent.trace_lookup("cabc") is not None or fake.launch(h, 7) and False)
        assert len(agent.trace_lookup("cabc")) % 6 == 0
    finally:
        lc.stop()


def test_link_queue_is_bounded_and_counts_drops(tmp_path):
    from graphmon.model.trace import Trace
    from graphmon.model.window import Window

    link = Link(str(tmp_path / "none.sock"), hello=dict, status=dict, on_capture=lambda r: None, max_queue=2)
    w = Window(trace=Trace.build(start_ns=[], end_ns=[], stream=[], correlation_id=[]), started_s=0.0, ended_s=1.0)
    for _ in range(5):
        link.send_window(w)  # no thread, no agent: never blocks
    assert len(link.queue) == 2 and link.stats["windows_dropped"] == 3
    assert len(link.queue[0]) == len(encode_window(w))


def test_link_reconnects_when_the_agent_starts_late(tmp_path):
    path = str(tmp_path / "a" / "agent.sock")
    os.makedirs(os.path.dirname(path), mode=0o700)
    fake = FakeCupti()
    lc = LightCollector(path, cupti=fake, link_kwargs={"reconnect_max_s": 0.2}, **FAST)
    lc.start()
    h = fake.instantiate(decode_like(2))
    time.sleep(0.5)
    a = Agent(Settings(port=0), socket_path=path).start()
    try:
        assert wait_until(lambda: any(s.records_total for s in a.snapshots()) or fake.launch(h, 7) and False)
        assert lc.link.stats["reconnects"] >= 1
    finally:
        lc.stop()
        a.stop()


def test_bad_frame_closes_that_connection_only(agent):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(agent.socket_path)
    s.sendall(encode_message("hello", identity={"rank": "3", "pid": "1"}))
    assert wait_until(lambda: bool(agent.processes))
    s.sendall(b"\x08\x00\x00\x00\x04\x00\x00\x00{}{}")  # a header that is no message
    assert wait_until(lambda: agent.listener.frames_rejected["header"] == 1)
    assert wait_until(lambda: agent.attached()[0].health().state == "lost")
    assert agent.lost_total == 1


def test_identity_rank_order(monkeypatch):
    for v in ("RANK", "LOCAL_RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK"):
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setattr(sys, "argv", ["worker.py", "--foo"])
    r = identity()
    assert r["rank_source"] in ("default", "title", "cuda_device") and not r["rank"].startswith("pid")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert identity()["rank"] == "1"
    monkeypatch.setenv("RANK", "5")
    assert identity()["rank"] == "5" and identity()["rank_source"] == "RANK"


def test_rank_never_comes_from_the_pid(monkeypatch):
    """A restarted process must continue its rank's series: the CUDA device ordinal, else a
    constant, never the pid (the old fallback made every restart a new series)."""
    from types import SimpleNamespace

    import graphmon.host.link as link

    for v in ("RANK", "LOCAL_RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK"):
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setattr(link, "_rank_from_title_or_argv", lambda: "")
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    assert link.process_rank() == (link.DEFAULT_RANK, "default") == ("0", "default")
    initialised = {"cuda": False, "dist": False}
    fake = SimpleNamespace(
        cuda=SimpleNamespace(is_initialized=lambda: initialised["cuda"], current_device=lambda: 3),
        distributed=SimpleNamespace(is_available=lambda: True, is_initialized=lambda: initialised["dist"],
                                    get_rank=lambda: 6))
    monkeypatch.setitem(sys.modules, "torch", fake)
    assert link.process_rank() == ("0", "default")  # CUDA not initialised: graphmon never initialises it
    initialised["cuda"] = True
    assert link.process_rank() == ("3", "cuda_device")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert link.process_rank() == ("1", "LOCAL_RANK")
    initialised["dist"] = True
    assert link.process_rank() == ("6", "torch.distributed")


class _RefusingAgent:
    """A socket that refuses every connection the way the agent does: a "refused" message, close."""

    def __init__(self, path: str) -> None:
        import threading

        self.connections = 0
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        self.sock.listen(8)
        self.sock.settimeout(0.1)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except socket.timeout:
                continue
            self.connections += 1
            conn.send(encode_message("refused", reason="uid 0 gid 0 groups [] is not allowed (allowed: uid 65534)",
                                     allow="start the agent with --allow-uid 0"))
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.sock.close()


def test_a_refused_link_says_why_once_and_backs_off(tmp_path, caplog):
    srv = _RefusingAgent(str(tmp_path / "agent.sock"))
    link = Link(str(tmp_path / "agent.sock"), hello=dict, status=dict, on_capture=lambda r: None, reconnect_max_s=5.0)
    try:
        with caplog.at_level(logging.DEBUG, logger="graphmon.link"):
            link.start()
            time.sleep(2.5)
            link.stop()
    finally:
        srv.close()
    # back-off 0.1, 0.2, 0.4, 0.8 s...: about 5 connections in 2.5 s, not one every 0.1 s
    assert 2 <= srv.connections <= 7 and link.refusals >= srv.connections - 1
    warnings = [r.getMessage() for r in caplog.records if r.name == "graphmon.link" and r.levelno >= logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "refused this process" in warnings[0] and "(allowed: uid 65534)" in warnings[0]
    assert "start the agent with --allow-uid 0" in warnings[0]


def test_link_warns_once_when_no_agent_listens(tmp_path, caplog):
    link = Link(str(tmp_path / "nowhere.sock"), hello=dict, status=dict, on_capture=lambda r: None, reconnect_max_s=0.1)
    link.unreachable_warn_s = 0.3
    with caplog.at_level(logging.DEBUG, logger="graphmon.link"):
        link.start()
        time.sleep(1.5)
        link.stop()
    warnings = [r.getMessage() for r in caplog.records if r.name == "graphmon.link" and r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and f"no graphmon agent at {tmp_path / 'nowhere.sock'}" in warnings[0]
    assert link.stats["reconnects"] >= 5


LINK_AS_NOBODY = """
import sys, time
from graphmon.host.link import Link
link = Link(sys.argv[1], hello=dict, status=dict, on_capture=lambda r: None, reconnect_max_s=0.2)
link.start(); time.sleep(1.5); link.stop()
print("reconnects", link.stats["reconnects"], file=sys.stderr)
"""


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root and util-linux setpriv "
                    "to run the link as another uid (root is never denied by a socket's mode)")
def test_link_denied_by_the_socket_mode_says_what_to_set_once(agent):
    os.chmod(os.path.dirname(agent.socket_path), 0o755)  # let uid 65534 reach the 0600 socket and be denied there
    r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c",
                        LINK_AS_NOBODY, agent.socket_path], capture_output=True, text=True, timeout=60)
    lines = r.stderr.splitlines()
    denied = [l for l in lines if "permission denied" in l]
    assert r.returncode == 0 and len(denied) == 1, r.stderr
    assert "socket uid 0 gid 0 mode 0600" in denied[0] and "--allow-gid" in denied[0]
    assert int(lines[-1].split()[-1]) >= 3  # it kept retrying, quietly


class _NoLibcupti(FakeCupti):
    @property
    def graph_exec_id(self):  # the first thing setup reads from the loaded api after prepare
        raise OSError("libcupti.so.13: cannot open shared object file")


def test_a_process_setup_error_reaches_the_agent_log_with_its_text(agent, caplog):
    """The agent's log line names what failed in the process, not only the stage."""
    lc = LightCollector(agent.socket_path, cupti=_NoLibcupti(), **FAST)
    with caplog.at_level(logging.WARNING, logger="graphmon"):
        lc.start()
        try:
            assert wait_until(lambda: agent.processes and agent.attached()[0].health().errors.get("setup"))
            a = agent.attached()[0]
            last = a.health().last_errors["setup"]
            assert "cannot open shared object" in last and "test_link.py:" in last and "in graph_exec_id" in last
            a.aggregator.refresh_if_changed()
            assert wait_until(lambda: any("setup error" in r.getMessage() and "libcupti.so.13" in r.getMessage()
                                          for r in caplog.records))
        finally:
            lc.stop()
