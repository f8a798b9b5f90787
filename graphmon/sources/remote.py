"""Agent side of the link: a Unix-socket listener and one Source per connected process.

Each process that replays CUDA graphs connects to the agent's socket (``GRAPHMON_AGENT``),
says hello (its identity), then sends windows and heartbeats. The socket lives in a private
directory (0700) and every connection's peer uid is checked (SO_PEERCRED): another user on the
host can neither connect nor inject windows. Frames are decoded with strict validation
(graphmon.model.wire); a connection that sends a bad frame is counted and closed.
"""

from __future__ import annotations

import logging
import os
import socket
import struct
import tempfile
import threading
import time
from typing import Callable, Optional

from graphmon.model.wire import FrameReader, WireError, decode_window, encode_message, split_frame
from graphmon.model.window import CaptureRequest, SourceHealth
from graphmon.sources.base import Sink, Source

log = logging.getLogger("graphmon.agent")
_UCRED = struct.Struct("3i")  # pid, uid, gid
STATES = ("starting", "running", "degraded", "blocked", "stopped", "error", "lost")


def peer_credentials(conn: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end of a Unix socket (Linux SO_PEERCRED)."""
    raw = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    return _UCRED.unpack(raw)


def private_socket_path(prefix: str = "graphmon-agent-") -> str:
    """A socket path inside a fresh 0700 directory (mkdtemp creates it 0700)."""
    d = tempfile.mkdtemp(prefix=prefix)
    os.chmod(d, 0o700)
    return os.path.join(d, "agent.sock")


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
                 on_close: Callable[[RemoteProcess], None], max_processes: int = 256, max_frame_bytes: Optional[int] = None) -> None:
        self.path = path or private_socket_path()
        self._owned_dir = os.path.dirname(self.path) if path is None else None
        self.on_connect, self.on_close = on_connect, on_close
        self.max_processes = int(max_processes)
        self.max_frame_bytes = max_frame_bytes
        self.rejected = {"uid": 0, "bad_frame": 0, "too_many": 0}
        self.procs: list[RemoteProcess] = []
        self._stop = threading.Event()
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        if os.path.exists(self.path):
            os.unlink(self.path)  # a stale socket from a crashed agent
        old = os.umask(0o177)
        try:
            self._sock.bind(self.path)  # created 0600 under the umask
        finally:
            os.umask(old)
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
                pid, uid, _ = peer_credentials(conn)
            except OSError:
                conn.close()
                continue
            if uid != os.getuid():
                self.rejected["uid"] += 1  # another user: never read a byte from it
                log.warning("graphmon agent: refused a connection from uid %d (pid %d)", uid, pid)
                conn.close()
                continue
            if sum(1 for p in self.procs if not p.lost) >= self.max_processes:
                self.rejected["too_many"] += 1
                conn.close()
                continue
            conn.settimeout(None)
            proc = RemoteProcess(conn, pid)
            threading.Thread(target=self._read_loop, args=(proc,), name=f"graphmon-agent-conn-{pid}",
                             daemon=True).start()

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
