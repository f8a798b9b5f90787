"""Agent side of the link: a Unix-socket listener and one Source per connected process.

Each process that replays CUDA graphs connects to the agent's socket (``GRAPHMON_AGENT``),
says hello (its identity), then sends windows and heartbeats. Without a path the socket lives in
a private directory (0700); with one (a volume shared with the engine) its directory must exist.
Every connection's peer is checked against a :class:`PeerPolicy` (SO_PEERCRED, SO_PEERGROUPS):
the agent's own uid, listed uids, or members of listed groups (then the socket is 0660 and
belongs to that group); anyone else is refused before a byte is read, counted, and told why.
Frames are decoded with strict validation (graphmon.model.wire); a connection that sends a bad
frame is counted and closed.
"""

from __future__ import annotations

import array
import errno
import logging
import os
import socket
import stat
import struct
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Optional

from graphmon.model.wire import FrameReader, WireError, decode_window, encode_message, split_frame
from graphmon.model.window import CaptureRequest, SourceHealth
from graphmon.sources.base import Sink, Source

log = logging.getLogger("graphmon.agent")
_UCRED = struct.Struct("3i")  # pid, uid, gid
STATES = ("starting", "running", "degraded", "blocked", "stopped", "error", "lost")
ALLOW_UIDS_ENV = "GRAPHMON_AGENT_ALLOW_UIDS"
ALLOW_GIDS_ENV = "GRAPHMON_AGENT_ALLOW_GIDS"
SO_PEERGROUPS = getattr(socket, "SO_PEERGROUPS", 59)  # Linux >= 4.13; Python's socket module lacks the name
MAX_REFUSAL_LOGS = 64  # distinct refused (uid, gid, groups) logged at WARNING; the rest at DEBUG


def peer_credentials(conn: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end of a Unix socket (Linux SO_PEERCRED).
    The pid is 0 when the peer is in another pid namespace (another container of the pod)."""
    raw = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    return _UCRED.unpack(raw)


def peer_groups(conn: socket.socket) -> tuple[int, ...]:
    """Supplementary groups of the peer (SO_PEERGROUPS), () where the kernel cannot say. A
    Kubernetes pod's fsGroup is a supplementary group of every container, never the primary."""
    for size in (4 * 64, 4 * 65536):
        try:
            raw = conn.getsockopt(socket.SOL_SOCKET, SO_PEERGROUPS, size)
        except OSError as e:
            if e.errno == errno.ERANGE:
                continue  # more groups than the buffer holds: ask again with room for NGROUPS_MAX
            return ()
        return tuple(array.array("I", raw[: len(raw) - len(raw) % 4]))
    return ()


def parse_ids(text: str, source: str) -> tuple[int, ...]:
    """``"0, 1000"`` -> (0, 1000). ValueError naming ``source`` (the flag or variable) otherwise."""
    out = []
    for part in text.replace(",", " ").split():
        if not part.isdigit() or int(part) > 0xFFFFFFFE:  # (uid_t)-1 means "no change", never an id
            raise ValueError(f"{source}: {part!r} is not a numeric id")
        out.append(int(part))
    return tuple(dict.fromkeys(out))


@dataclass(frozen=True)
class PeerPolicy:
    """Who may connect to the agent: its own uid always, the listed ``uids``, and processes that
    have one of ``gids`` as primary or supplementary group. With ``gids`` the socket is 0660 and
    belongs to ``gids[0]``, so the kernel lets that group's members connect at all."""

    uids: tuple[int, ...] = ()
    gids: tuple[int, ...] = ()

    @classmethod
    def from_env(cls, environ=None, uids: Optional[str] = None, gids: Optional[str] = None) -> "PeerPolicy":
        """From flags' text (``uids``/``gids``), else GRAPHMON_AGENT_ALLOW_UIDS / _GIDS."""
        env = os.environ if environ is None else environ
        u = uids if uids is not None else env.get(ALLOW_UIDS_ENV, "")
        g = gids if gids is not None else env.get(ALLOW_GIDS_ENV, "")
        return cls(parse_ids(u, "--allow-uid" if uids is not None else ALLOW_UIDS_ENV),
                   parse_ids(g, "--allow-gid" if gids is not None else ALLOW_GIDS_ENV))

    def allows(self, uid: int, gid: int, groups: Iterable[int] = ()) -> bool:
        if uid == os.getuid() or uid in self.uids:
            return True
        return bool(self.gids) and (gid in self.gids or any(g in self.gids for g in groups))

    def describe(self) -> str:
        who = [f"uid {u}" for u in dict.fromkeys((os.getuid(), *self.uids))]
        who += [f"group {g}" for g in self.gids]
        return ", ".join(who)

    def hint(self, uid: int) -> str:
        """What would let a refused peer in."""
        group = (f"run the process with group {self.gids[0]} (Kubernetes: fsGroup or supplementalGroups {self.gids[0]})"
                 if self.gids else "give the agent --allow-gid GID (GRAPHMON_AGENT_ALLOW_GIDS, e.g. the pod's fsGroup) "
                 "and the process that group")
        return f"start the agent with --allow-uid {uid} ({ALLOW_UIDS_ENV}={uid}), or {group}"


def private_socket_path(prefix: str = "graphmon-agent-") -> str:
    """A socket path inside a fresh 0700 directory (mkdtemp creates it 0700)."""
    d = tempfile.mkdtemp(prefix=prefix)
    os.chmod(d, 0o700)
    return os.path.join(d, "agent.sock")


def _remove_stale_socket(path: str) -> None:
    """Unlink a socket left by an agent that is gone; refuse to touch anything else."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise FileExistsError(errno.EEXIST, f"{path} exists and is not a socket (left as it is)")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(path)
    except (ConnectionRefusedError, FileNotFoundError):
        pass  # nobody listens: stale
    except PermissionError:
        raise PermissionError(errno.EACCES, f"{path} belongs to uid {st.st_uid} (mode {stat.S_IMODE(st.st_mode):04o}) "
                              "and this agent cannot tell whether it is still in use: remove it, or run the agent "
                              "as that user") from None
    except OSError:
        raise OSError(errno.EADDRINUSE, f"another agent is listening on {path}") from None
    else:
        raise OSError(errno.EADDRINUSE, f"another agent is listening on {path}")
    finally:
        probe.close()
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def bind_socket(path: str, peers: PeerPolicy, explicit: bool) -> socket.socket:
    """A listening Unix socket at ``path``: 0600, or 0660 owned by ``peers.gids[0]``. An explicit
    path's directory must exist (a mounted volume): the agent writes nothing but the socket."""
    if explicit:
        d = os.path.dirname(os.path.abspath(path))
        try:
            is_dir = stat.S_ISDIR(os.stat(d).st_mode)
        except FileNotFoundError:
            is_dir = False
        except PermissionError:
            raise PermissionError(errno.EACCES, f"cannot reach directory {d}: permission denied on a folder above it "
                                  f"(the agent runs as uid {os.getuid()})") from None
        if not is_dir:
            raise FileNotFoundError(errno.ENOENT, f"directory {d} does not exist (the agent does not create it: "
                                    "mount the volume shared with the engine there)")
    _remove_stale_socket(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o117 if peers.gids else 0o177)
    try:
        sock.bind(path)  # created 0600 / 0660 under the umask: never wider, not even for a moment
    except OSError as e:
        sock.close()
        if e.errno != errno.EACCES:
            raise
        d = os.path.dirname(os.path.abspath(path))
        st = os.stat(d)
        raise PermissionError(e.errno, f"cannot create a socket in {d} (uid {st.st_uid} gid {st.st_gid} mode "
                              f"{stat.S_IMODE(st.st_mode):04o}): the agent runs as uid {os.getuid()} groups "
                              f"{sorted({os.getgid(), *os.getgroups()})}") from None
    finally:
        os.umask(old)
    if peers.gids and os.stat(path).st_gid != peers.gids[0]:
        try:
            os.chown(path, -1, peers.gids[0])
        except OSError as e:
            sock.close()
            os.unlink(path)
            raise OSError(e.errno, f"cannot give the socket group {peers.gids[0]}: {e.strerror} (the agent "
                          f"must be a member: its groups are {sorted({os.getgid(), *os.getgroups()})})") from None
    if peers.gids:
        d = os.path.dirname(os.path.abspath(path))
        st = os.stat(d)
        reach = stat.S_IXGRP if st.st_gid == peers.gids[0] else stat.S_IXOTH
        if not st.st_mode & reach:
            log.warning("graphmon agent: group %d cannot enter the socket's directory %s (mode %04o, uid %d gid %d): "
                        "its members cannot connect", peers.gids[0], d, stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid)
    return sock


class RemoteProcess(Source):
    """One attached process, as a Source: its windows arrive over the connection."""

    backend = "remote"

    def __init__(self, conn: socket.socket, peer_pid: int) -> None:
        super().__init__()
        self.conn = conn
        self.peer_pid = peer_pid
        self.identity: dict[str, str] = {}
        self.status: dict = {}
        self.connected_s = time.time()
        self.last_heard_s = time.time()
        self.last_window_s: Optional[float] = None
        self.windows = 0
        self.empty_windows = 0
        self.bad_frames = 0
        self.lost = False
        self.closed_reason = ""
        self._sink: Optional[Sink] = None
        self._send_lock = threading.Lock()

    # Source protocol ---------------------------------------------------------------
    def start(self, sink: Sink) -> None:
        self._sink = sink

    def stop(self, timeout_s: float = 5.0) -> None:
        self.close("agent stopping")

    def request_capture(self, request: CaptureRequest) -> None:
        self.send(encode_message("capture", id=request.id, replays=request.replays, duration_ms=request.duration_ms))

    def info(self) -> dict[str, str]:
        return {"backend": "cupti", **{k[8:]: v for k, v in self.identity.items() if k.startswith("backend_")
                                      and k != "backend_backend"}}

    def health(self) -> SourceHealth:
        st = self.status
        if self.lost:
            return SourceHealth(up=False, state="lost", reason=self.closed_reason or "connection lost",
                                errors=dict(st.get("errors") or {}))
        state = str(st.get("state") or "starting")
        if state not in STATES:
            state = "error"  # a bounded label set, whatever a sender says
        return SourceHealth(up=state == "running", state=state, reason=str(st.get("reason") or "")[:200],
                            errors={str(k): int(v) for k, v in (st.get("errors") or {}).items()
                                    if isinstance(v, int)})

    # I/O ----------------------------------------------------------------------------
    def send(self, data: bytes) -> None:
        with self._send_lock:
            self.conn.sendall(data)

    def close(self, reason: str) -> None:
        if not self.closed_reason:
            self.closed_reason = reason
        try:
            self.conn.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            self.conn.close()
        except OSError:
            pass

    def handle(self, header: dict, payload) -> None:
        kind = header["type"]
        self.last_heard_s = time.time()
        ident = header.get("identity")
        if isinstance(ident, dict) and kind != "window":
            self.identity = {str(k)[:64]: str(v)[:256] for k, v in list(ident.items())[:64]}
        st = header.get("status")
        if isinstance(st, dict) and len(st) <= 64:
            self.status = st
        if kind == "window":
            w = decode_window(header, payload)
            self.windows += 1
            self.last_window_s = w.ended_s
            if len(w.trace) == 0 and w.trace.n_launches > 0:
                self.empty_windows += 1
            if self._sink is not None:
                self._sink(w)


class AgentListener:
    """Accepts processes on a Unix socket; one reader thread per connection.

    ``on_connect(proc)`` runs after the hello; ``on_close(proc)`` when the connection ends."""

    def __init__(self, path: Optional[str] = None, *, on_connect: Callable[[RemoteProcess], None],
                 on_close: Callable[[RemoteProcess], None], max_processes: int = 256, max_frame_bytes: Optional[int] = None,
                 peers: Optional[PeerPolicy] = None) -> None:
        self.peers = peers or PeerPolicy()
        self.path = path or private_socket_path()
        self._owned_dir = os.path.dirname(self.path) if path is None else None
        self.on_connect, self.on_close = on_connect, on_close
        self.max_processes = int(max_processes)
        self.max_frame_bytes = max_frame_bytes
        # "uid": a peer whose uid and groups the PeerPolicy does not allow
        self.rejected = {"uid": 0, "bad_frame": 0, "too_many": 0}
        self.procs: list[RemoteProcess] = []
        self._refusals_logged: set = set()
        self._stop = threading.Event()
        self._sock = bind_socket(self.path, self.peers, explicit=path is not None)
        self._sock.listen(64)
        self._sock.settimeout(0.2)
        self._thread = threading.Thread(target=self._accept_loop, name="graphmon-agent-accept", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2.0)
        try:
            self._sock.close()
        except OSError:
            pass
        for p in list(self.procs):
            p.close("agent stopping")
        try:
            os.unlink(self.path)
        except OSError:
            pass
        if self._owned_dir:
            try:
                os.rmdir(self._owned_dir)
            except OSError:
                pass

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except socket.timeout:
                continue
            except OSError:
                if self._stop.is_set():
                    return
                time.sleep(0.05)
                continue
            try:
                pid, uid, gid = peer_credentials(conn)
                groups = peer_groups(conn)
            except OSError:
                conn.close()
                continue
            if not self._peer_allowed(pid, uid, gid, groups):
                self._refuse_peer(conn, pid, uid, gid, groups)  # never reads a byte from it
                continue
            if sum(1 for p in self.procs if not p.lost) >= self.max_processes:
                self.rejected["too_many"] += 1
                conn.close()
                continue
            conn.settimeout(None)
            proc = RemoteProcess(conn, pid)
            threading.Thread(target=self._read_loop, args=(proc,), name=f"graphmon-agent-conn-{pid}",
                             daemon=True).start()

    def _peer_allowed(self, pid: int, uid: int, gid: int, groups: Iterable[int] = ()) -> bool:
        return self.peers.allows(uid, gid, groups)

    def _refuse_peer(self, conn: socket.socket, pid: int, uid: int, gid: int, groups: Iterable[int] = ()) -> None:
        """Count, log once per (uid, gid, groups) at WARNING (a refused process retries every few
        seconds), tell the process why and what to set, close."""
        self.rejected["uid"] += 1
        groups = tuple(sorted(set(groups)))
        key = (uid, gid, groups)
        first = key not in self._refusals_logged and len(self._refusals_logged) < MAX_REFUSAL_LOGS
        if first:
            self._refusals_logged.add(key)
        reason = f"uid {uid} gid {gid} groups {list(groups)} is not allowed (allowed: {self.peers.describe()})"
        fix = self.peers.hint(uid)
        (log.warning if first else log.debug)("graphmon agent: refused a connection from %s%s; to allow it, %s",
                                              f"pid {pid}, " if pid else "", reason, fix)
        try:
            conn.setblocking(False)  # a small frame into an empty buffer; never wait on a refused peer
            conn.send(encode_message("refused", reason=reason, allow=fix))
        except OSError:
            pass
        conn.close()

    def _read_loop(self, proc: RemoteProcess) -> None:
        reader = FrameReader() if self.max_frame_bytes is None else FrameReader(self.max_frame_bytes)
        hello = False
        try:
            while not self._stop.is_set():
                chunk = proc.conn.recv(1 << 20)
                if not chunk:
                    proc.closed_reason = proc.closed_reason or "connection closed"
                    break
                for body in reader.feed(chunk):
                    header, payload = split_frame(body)
                    if not hello:
                        if header["type"] != "hello":
                            raise WireError("first message must be hello")
                        proc.handle(header, payload)
                        hello = True
                        self.procs.append(proc)
                        self.on_connect(proc)
                        continue
                    proc.handle(header, payload)  # a window is decoded and goes to the process's sink
                    if header["type"] == "bye":
                        proc.closed_reason = "process said bye"
        except WireError as e:
            proc.bad_frames += 1
            self.rejected["bad_frame"] += 1
            proc.closed_reason = f"bad frame: {e}"[:200]
            log.warning("graphmon agent: closing pid %d: %s", proc.peer_pid, e)
        except OSError as e:
            proc.closed_reason = proc.closed_reason or f"connection error: {e!r}"[:200]
        finally:
            proc.close(proc.closed_reason or "closed")
            if hello:
                self.on_close(proc)
