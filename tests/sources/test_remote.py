"""graphmon.sources.remote (and agent_socket): the agent's socket (where, which mode, stale files),
who may connect, and what hostile or clumsy peers can make it hold: connections are keyed by
connection, forgotten when closed, bounded before hello, and what they buffer is bounded
together. The hostile-peer tests failed on the code before these bounds.

The peer tests run real processes as other uids (setpriv), so they need root; CI runs as root.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import stat
import struct
import subprocess
import sys
import textwrap
import time

import pytest

from graphmon.export.agent import Agent
from graphmon.model.wire import FrameReader, encode_message, split_frame
from graphmon.settings import Settings
from graphmon.sources import remote
from graphmon.sources.remote import AgentListener, PeerPolicy, parse_ids

from helpers import AgentClient, wait_until

NOBODY = 65534
AS_ROOT = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"),
                             reason="runs peers as other uids: needs root and util-linux setpriv")


@pytest.fixture
def shared_dir():
    """A directory other uids can enter (pytest's tmp_path sits under a 0700 directory)."""
    import tempfile

    d = tempfile.mkdtemp(prefix="graphmon-test-remote-")
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _listener(path=None, **kw) -> AgentListener:
    lst = AgentListener(None if path is None else str(path), on_connect=lambda p: None, on_close=lambda p: None, **kw)
    lst.start()
    return lst


def test_explicit_socket_directory_must_exist_and_is_not_created(tmp_path):
    missing = tmp_path / "run" / "graphmon"
    with pytest.raises(FileNotFoundError) as e:
        _listener(missing / "agent.sock")
    assert e.value.strerror.startswith(f"directory {missing} does not exist")
    assert not (tmp_path / "run").exists()  # nothing written: no makedirs, no temporary directory


def test_private_default_socket_is_0600_in_a_0700_directory():
    lst = _listener()
    try:
        assert stat.S_IMODE(os.stat(os.path.dirname(lst.path)).st_mode) == 0o700
        assert stat.S_IMODE(os.stat(lst.path).st_mode) == 0o600
    finally:
        lst.close()
    assert not os.path.exists(os.path.dirname(lst.path))


def test_stale_socket_is_replaced_a_live_one_or_another_file_is_not(shared_dir):
    from pathlib import Path

    tmp_path = Path(shared_dir)
    path = tmp_path / "agent.sock"
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(path))
    dead.close()  # a crashed agent's socket file: nobody listens
    lst = _listener(path)
    try:
        assert stat.S_ISSOCK(os.stat(path).st_mode)
        with pytest.raises(OSError, match="another agent is listening"):
            _listener(path)  # never steals a live agent's socket
        assert lst._sock.fileno() >= 0 and os.path.exists(path)
    finally:
        lst.close()
    if os.geteuid() == 0 and shutil.which("setpriv"):  # another user's socket: cannot tell if it is live, left alone
        os.chmod(tmp_path, 0o777)
        gone = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        gone.bind(str(path))
        gone.close()
        os.chmod(path, 0o600)
        code = ("from graphmon.sources.remote import AgentListener\n"
                "AgentListener(__import__('sys').argv[1], on_connect=print, on_close=print)")
        r = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", sys.executable, "-c",
                            code, str(path)], capture_output=True, text=True, timeout=60)
        assert r.returncode == 1 and "belongs to uid 0 (mode 0600) and this agent cannot tell" in r.stderr, r.stderr
        assert stat.S_ISSOCK(os.lstat(path).st_mode)
        path.unlink()
    path.write_text("not a socket")
    with pytest.raises(FileExistsError, match="is not a socket"):
        _listener(path)
    assert path.read_text() == "not a socket"


@AS_ROOT
def test_a_socket_folder_the_agent_cannot_reach_or_write_is_one_clear_error(shared_dir, tmp_path):
    code = ("from graphmon.sources.remote import AgentListener\n"
            "AgentListener(__import__('sys').argv[1], on_connect=print, on_close=print)")
    r = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", sys.executable, "-c", code,
                        os.path.join(shared_dir, "agent.sock")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and (f"PermissionError: [Errno 13] cannot create a socket in {shared_dir} "
                                  f"(uid 0 gid 0 mode 0755): the agent runs as uid {NOBODY} groups [{NOBODY}]") in r.stderr
    hidden = tmp_path / "volume"  # pytest's tmp_path lies under a 0700 folder of root's
    hidden.mkdir()
    r = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", sys.executable, "-c", code,
                        str(hidden / "agent.sock")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and f"cannot reach directory {hidden}: permission denied" in r.stderr, r.stderr


def test_socket_is_0660_in_the_first_allowed_group(tmp_path):
    gid = os.getgid() if os.geteuid() != 0 else NOBODY  # root may give it any group; others their own
    lst = _listener(tmp_path / "agent.sock", peers=PeerPolicy(gids=(gid,)))
    try:
        st = os.stat(lst.path)
        assert stat.S_IMODE(st.st_mode) == 0o660 and st.st_gid == gid
    finally:
        lst.close()
    lst = _listener(tmp_path / "agent.sock", peers=PeerPolicy(uids=(1234,)))
    try:
        assert stat.S_IMODE(os.stat(lst.path).st_mode) == 0o600
    finally:
        lst.close()


def test_peer_policy():
    me = os.getuid()
    assert PeerPolicy().allows(me, 12345) and not PeerPolicy().allows(me + 1, os.getgid())
    p = PeerPolicy(uids=(0, 1000), gids=(NOBODY,))
    assert p.allows(1000, 5) and p.allows(0, 5)
    assert p.allows(4242, NOBODY) and p.allows(4242, 0, (1, NOBODY))  # primary or supplementary group
    assert not p.allows(4242, 0, (1, 2))
    assert PeerPolicy.from_env({"GRAPHMON_AGENT_ALLOW_UIDS": "0, 1000", "GRAPHMON_AGENT_ALLOW_GIDS": "65534"}) == p
    # a flag's value wins over the variable
    assert PeerPolicy.from_env({"GRAPHMON_AGENT_ALLOW_UIDS": "7"}, uids="8").uids == (8,)
    assert parse_ids("", "x") == () and parse_ids("3 3,4", "x") == (3, 4)
    for bad in ("root", "-1", "4294967295", "1.5"):
        with pytest.raises(ValueError, match="GRAPHMON_AGENT_ALLOW_GIDS: .* is not a numeric id"):
            PeerPolicy.from_env({"GRAPHMON_AGENT_ALLOW_GIDS": bad})


PEER = """
    import socket, sys
    from graphmon.model.wire import encode_message
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(1.5)  # an accepted peer hears nothing: stop listening after this
    try:
        s.connect(sys.argv[1])
    except PermissionError:
        sys.stdout.write("EACCES"); sys.exit(0)
    try:
        s.sendall(encode_message("hello", identity={"rank": "0"}))
    except (BrokenPipeError, ConnectionResetError):
        pass  # refused before the hello went out; the refusal is still there to read
    data = b""
    while True:
        try:
            chunk = s.recv(65536)
        except (socket.timeout, ConnectionResetError):
            break
        if not chunk:
            break
        data += chunk
    sys.stdout.buffer.write(data)
"""


def _peer(path: str, uid: int, gid: int, groups: tuple[int, ...] = ()) -> bytes:
    """Connect as another user (setpriv) and return what the agent sent before closing."""
    cmd = ["setpriv", f"--reuid={uid}", f"--regid={gid}",
           f"--groups={','.join(map(str, groups))}" if groups else "--clear-groups",
           sys.executable, "-c", textwrap.dedent(PEER), path]
    r = subprocess.run(cmd, capture_output=True, timeout=30)
    assert r.returncode == 0, r.stderr.decode()
    return r.stdout


def _frames(data: bytes) -> list[dict]:
    return [split_frame(b)[0] for b in FrameReader().feed(data)]


@AS_ROOT
def test_refused_peer_is_counted_logged_once_and_told_why(shared_dir, caplog):
    connected = []
    lst = AgentListener(os.path.join(shared_dir, "agent.sock"), on_connect=connected.append, on_close=lambda p: None)
    lst.start()
    try:
        os.chmod(lst.path, 0o666)  # let the kernel pass it: the agent's own check must refuse
        with caplog.at_level(logging.DEBUG, logger="graphmon.agent"):
            replies = [_peer(lst.path, 1000, 1000) for _ in range(3)]
            assert wait_until(lambda: lst.rejected["uid"] == 3)
        (msg,) = _frames(replies[0])
        assert msg["type"] == "refused" and "uid 1000 gid 1000" in msg["reason"]
        assert "--allow-uid 1000" in msg["allow"] and "GRAPHMON_AGENT_ALLOW_UIDS=1000" in msg["allow"]
        warnings = [r for r in caplog.records if r.name == "graphmon.agent" and r.levelno == logging.WARNING]
        assert len(warnings) == 1 and "uid 1000 gid 1000" in warnings[0].getMessage()
        assert len([r for r in caplog.records if "refused a connection" in r.getMessage()]) == 3  # 2 at DEBUG
        assert not connected and lst.rejected == {**dict.fromkeys(remote.REJECT_REASONS, 0), "uid": 3}
    finally:
        lst.close()


@AS_ROOT
def test_group_mode_lets_members_in_by_a_supplementary_group(shared_dir):
    """Kubernetes: fsGroup is a supplementary group of both containers; the engine runs as root
    or as any uid. Members get in; a uid outside the group cannot even open the 0660 socket."""
    connected = []
    lst = AgentListener(os.path.join(shared_dir, "agent.sock"), on_connect=connected.append, on_close=lambda p: None,
                        peers=PeerPolicy(gids=(NOBODY,)))
    lst.start()
    try:
        assert _frames(_peer(lst.path, 1000, 1000, groups=(NOBODY,))) == []  # accepted: nothing said, hello read
        assert wait_until(lambda: len(connected) == 1)
        assert _peer(lst.path, 1001, 1001) == b"EACCES"  # the kernel keeps non-members out
        os.chmod(lst.path, 0o666)  # past the kernel, the agent's own check still refuses a non-member
        (refusal,) = _frames(_peer(lst.path, 1001, 1001))
        assert refusal["type"] == "refused" and "group 65534 (Kubernetes: fsGroup or supplementalGroups 65534)" in refusal["allow"]
        assert lst.rejected["uid"] == 1 and len(connected) == 1
    finally:
        lst.close()


def test_peer_groups_of_a_local_pair():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        assert set(remote.peer_groups(a)) == set(os.getgroups())
    finally:
        a.close()
        b.close()


def test_refusal_message_type_is_on_the_wire():
    (h,) = _frames(bytes(encode_message("refused", reason="r", allow="a")))
    assert h == {"type": "refused", "v": 1, "reason": "r", "allow": "a"}


# ---------------------------------------------------------------------- hostile and clumsy peers (issue 31)
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


def test_a_process_that_never_reads_cannot_block_a_capture(agent):
    """Old code wrote capture requests with a blocking sendall from POST /capture's handler (on
    the HTTP event loop): a process that never reads its socket would hang /capture, then
    /healthz and /metrics, once its socket buffer was full."""
    from graphmon.model.window import CaptureRequest

    deaf = AgentClient(agent.socket_path, rank="0")
    deaf.s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    assert wait_until(lambda: len(_live(agent)) == 1)
    t0 = time.monotonic()
    refused = 0
    for i in range(5000):  # ~100 bytes each: far past what the socket buffers hold
        try:
            agent.capture(CaptureRequest(id=f"c{i:06d}", replays=1))
        except RuntimeError:
            refused += 1
    assert time.monotonic() - t0 < 10 and refused > 0
    deaf.close()


def test_a_burst_of_processes_connecting_at_once_is_not_refused_by_the_kernel():
    """The listen backlog holds max_processes connects: with 64, a burst of 100 processes
    connecting at once (a restart of many workers) got EAGAIN from connect before the accept
    loop could take them (seen in bench/agent/soak_agent.py)."""
    lst = AgentListener(None, on_connect=lambda p: None, on_close=lambda p: None)  # not started: nothing accepts
    socks = []
    try:
        for _ in range(200):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(5)  # as the link does: connect does not wait for a full backlog
            s.connect(lst.path)
            socks.append(s)
        assert len(socks) == 200
    finally:
        for s in socks:
            s.close()
        lst.close()
