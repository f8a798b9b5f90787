"""graphmon.sources.remote: the agent's socket (where, which mode, stale files) and who may connect.

The peer tests run real processes as other uids (setpriv), so they need root; CI runs as root.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import stat
import subprocess
import sys
import textwrap

import pytest

from graphmon.model.wire import FrameReader, encode_message, split_frame
from graphmon.sources import remote
from graphmon.sources.remote import AgentListener, PeerPolicy, parse_ids

from helpers import wait_until

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
        assert not connected and lst.rejected == {"uid": 3, "bad_frame": 0, "too_many": 0}
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
