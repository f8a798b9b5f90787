"""Agent side of the link: a Unix-socket listener and one Source per connected process.

Each process that replays CUDA graphs connects to the agent's socket (``GRAPHMON_AGENT``),
says hello (its identity), then sends windows and heartbeats. Where the socket lives and who may
connect (a :class:`PeerPolicy` of uids and groups, checked with SO_PEERCRED and SO_PEERGROUPS
before a byte is read) is graphmon.sources.agent_socket. Frames are decoded with strict
validation (graphmon.model.wire).

A process is its connection. Neither the pid a sender announces nor SO_PEERCRED's pid names it:
SO_PEERCRED's pid is the peer's pid translated into the agent's pid namespace, 0 when the peer
lives in another one (the sidecar and DaemonSet deployments), so every peer of another
container would share pid 0; an announced pid is whatever the sender says (containers in their
own namespaces are often all pid 1 or 7, and a sender could name a live process). The announced
pid is only shown (graphmon_process_info); SO_PEERCRED's pid only logged and in /status.

Hostile or clumsy peers are bounded before hello (one small frame, a timeout, a cap on such
connections) and after (process cap, one byte budget for all buffered frames, a frame deadline,
a short window queue per process); all is counted and logged rate-limited. The bounds and their
defaults: docs/reliability.md, "The agent and its peers".

Reader threads do I/O only: a window is queued as received and decoded on the agent's ingest
thread (``on_window``); heartbeats are read while windows wait, so a busy agent never declares
a healthy process lost.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections import OrderedDict, deque
from typing import Callable, Iterable, Optional

from graphmon.model.edges import GraphKernels
from graphmon.model.window import CaptureRequest, SourceHealth, Window
from graphmon.model.wire import (MAX_FRAME_BYTES, MAX_HELLO_FRAME_BYTES, PROCESS_STATES, WIRE_REASONS, FrameReader,
                                 WireError, decode_identity, decode_status, decode_window, encode_message, split_frame)
from graphmon.sources.agent_socket import (ALLOW_GIDS_ENV, ALLOW_UIDS_ENV, MAX_REFUSAL_LOGS, PeerPolicy,  # noqa: F401
                                           bind_socket, parse_ids, peer_credentials, peer_groups, private_socket_path)
from graphmon.sources.base import Sink, Source
from graphmon.sources.peers import (CLOSING_REASONS, DROP_REASONS, FRAME_TIMEOUT_S, HELLO_TIMEOUT_S,  # noqa: F401
                                    MAX_BUFFERED_BYTES, MAX_PROCESSES, MAX_QUEUED_WINDOWS, MAX_UNIDENTIFIED,
                                    REJECT_REASONS, ByteBudget, LimitedLog)

log = logging.getLogger("graphmon.agent")
STATES = PROCESS_STATES
RECV_BYTES = 256 * 1024


class RemoteProcess(Source):
    """One connection, as a Source: its windows arrive over the connection and wait in a short
    queue for the agent's ingest thread (:meth:`next_window`)."""

    backend = "remote"

    def __init__(self, conn: socket.socket, peer_pid: int, *, budget: Optional[ByteBudget] = None,
                 max_queued_windows: int = MAX_QUEUED_WINDOWS) -> None:
        super().__init__()
        self.conn = conn
        self.peer_pid = peer_pid  # SO_PEERCRED: 0 when the process is in another pid namespace
        self.identity: dict[str, str] = {}
        self.status: dict = {}
        self.connected_s = time.time()
        self.last_heard_s = time.time()  # any byte received: a process sending a big window is alive
        self.last_window_s: Optional[float] = None
        self.windows = 0
        self.empty_windows = 0
        self.bad_frames = 0
        self.lost = False
        self.said_hello = False
        self.closed_reason = ""
        self.budget = budget
        self.held = 0  # bytes of the budget this connection holds
        self.max_queued_windows = int(max_queued_windows)
        # windows dropped here, by reason; the agent points this at the rank's counter
        self.count_drop: Callable[[str], None] = self._count_drop
        self.dropped = dict.fromkeys(DROP_REASONS, 0)
        self.on_status: Optional[Callable[["RemoteProcess"], None]] = None
        self.attached = None  # the agent's record of this process, set when it said hello
        self._queue: deque[tuple[dict, memoryview, int]] = deque()
        self._queue_lock = threading.Lock()
        self._sink: Optional[Sink] = None
        self._send_lock = threading.Lock()
        self.graph_kernels = GraphKernels()  # what this process's graphs hold, learned from its windows

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
        st = self.status  # validated at the wire (graphmon.model.wire.decode_status)
        if self.lost:
            return SourceHealth(up=False, state="lost", reason=self.closed_reason or "connection lost",
                                errors=dict(st.get("errors") or {}), last_errors=dict(st.get("last_errors") or {}))
        state = st.get("state") or "starting"
        return SourceHealth(up=state == "running", state=state, reason=st.get("reason", ""),
                            errors=dict(st.get("errors") or {}), last_errors=dict(st.get("last_errors") or {}))

    # I/O ----------------------------------------------------------------------------
    def send(self, data: bytes) -> None:
        """A small control frame (capture, stop), never waiting: a process that does not read its
        socket must not block the caller (POST /capture runs on the HTTP event loop). A frame that
        does not fit whole in the socket's buffer is an OSError; a partial one closes the
        connection (the stream would be out of step)."""
        with self._send_lock:
            try:
                n = self.conn.send(data, socket.MSG_DONTWAIT)
            except BlockingIOError:
                raise OSError("the process does not read its socket") from None
            if n < len(data):
                self.close("the process does not read its socket")
                raise OSError("the process does not read its socket")

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

    def reserve(self, n: int) -> bool:
        if self.budget is None:
            return True
        ok = self.budget.reserve(n, self.held)
        if ok:
            self.held += n
        return ok

    def release(self, n: int) -> None:
        if n and self.budget is not None:
            self.held -= n
            self.budget.release(n)

    def _count_drop(self, reason: str) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + 1

    def handle(self, header: dict, payload: memoryview, reserved: int = 0) -> None:
        """One frame after hello (on the reader thread); it owns ``reserved`` (bytes of the
        shared budget): a window is queued with them (released when it is decoded or dropped),
        anything else releases them now. A malformed identity or status is refused (WireError,
        raised after the rest of the frame was handled) and the previous one kept."""
        kind = header["type"]
        self.last_heard_s = time.time()
        err: Optional[WireError] = None
        try:
            ident = header.get("identity")
            if ident is not None and kind != "window":
                self.set_identity(ident)
            st = header.get("status")
            if st is not None:
                self.status = decode_status(st)
                if self.on_status is not None:
                    self.on_status(self)
        except WireError as e:
            err = e
        if kind == "window":
            self._enqueue(header, payload, reserved)
        else:
            self.release(reserved)
        if err is not None:
            raise err

    def set_identity(self, ident) -> None:
        new = decode_identity(ident)
        if self.identity:  # who the process is was settled by its hello: later frames add facts only
            new.update({k: self.identity[k] for k in ("rank", "pid") if k in self.identity})
        self.identity = new

    def _enqueue(self, header: dict, payload: memoryview, reserved: int) -> None:
        with self._queue_lock:
            if len(self._queue) >= self.max_queued_windows:
                _, _, n = self._queue.popleft()  # the newest window is the most useful one
                self.release(n)
                self.count_drop("queue_full")
            self._queue.append((header, payload, reserved))

    @property
    def queued(self) -> int:
        return len(self._queue)

    def next_window(self) -> Optional[Window]:
        """Decode the oldest queued window (on the ingest thread); None when none is queued or
        it did not decode (counted, WireError re-raised for the caller to count by reason)."""
        with self._queue_lock:
            if not self._queue:
                return None
            header, payload, reserved = self._queue.popleft()
        try:
            w = decode_window(header, payload, self.graph_kernels)
        except WireError:
            self.bad_frames += 1
            self.count_drop("invalid")
            raise
        finally:
            del payload
            self.release(reserved)
        self.windows += 1
        self.last_window_s = w.ended_s
        if len(w.trace) == 0 and w.trace.n_launches > 0:
            self.empty_windows += 1
        return w

    def discard_queue(self) -> None:
        with self._queue_lock:
            items, self._queue = list(self._queue), deque()
        for _, _, n in items:
            self.release(n)


class AgentListener:
    """Accepts processes on a Unix socket; one reader thread per connection.

    ``on_connect(proc)`` runs after the hello; ``on_window(proc)`` when a window was queued;
    ``on_close(proc)`` when the connection of a process that said hello ends."""

    def __init__(self, path: Optional[str] = None, *, on_connect: Callable[[RemoteProcess], None],
                 on_close: Callable[[RemoteProcess], None], on_window: Optional[Callable[[RemoteProcess], None]] = None,
                 max_processes: int = MAX_PROCESSES, max_frame_bytes: Optional[int] = None,
                 max_unidentified: int = MAX_UNIDENTIFIED, hello_timeout_s: float = HELLO_TIMEOUT_S,
                 max_buffered_bytes: int = MAX_BUFFERED_BYTES, max_queued_windows: int = MAX_QUEUED_WINDOWS,
                 frame_timeout_s: float = FRAME_TIMEOUT_S, peers: Optional[PeerPolicy] = None) -> None:
        self.peers = peers or PeerPolicy()
        self.path = path or private_socket_path()
        self._owned_dir = os.path.dirname(self.path) if path is None else None
        self.on_connect, self.on_close, self.on_window = on_connect, on_close, on_window
        self.max_processes = int(max_processes)
        self.max_frame_bytes = int(max_frame_bytes or MAX_FRAME_BYTES)
        self.max_unidentified = int(max_unidentified)
        self.hello_timeout_s = float(hello_timeout_s)
        self.max_queued_windows = int(max_queued_windows)
        self.frame_timeout_s = float(frame_timeout_s)
        self.budget = ByteBudget(max_buffered_bytes)
        self.rejected = dict.fromkeys(REJECT_REASONS, 0)
        self.frames_rejected = dict.fromkeys(WIRE_REASONS, 0)
        self.procs: list[RemoteProcess] = []  # live connections that said hello
        self.unidentified: OrderedDict[RemoteProcess, None] = OrderedDict()  # not yet: oldest first
        self.log = LimitedLog(log)
        self._refusals_logged: set = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._sock = bind_socket(self.path, self.peers, explicit=path is not None)
        self._sock.listen(max(64, self.max_processes))  # a burst of processes connecting at once: none refused by the kernel
        self._sock.settimeout(0.2)
        self._thread = threading.Thread(target=self._accept_loop, name="graphmon-agent-accept", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread.ident is not None:  # started
            self._thread.join(2.0)
        try:
            self._sock.close()
        except OSError:
            pass
        with self._lock:
            procs = list(self.procs) + list(self.unidentified)
        for p in procs:
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

    def _reject(self, reason: str, msg: str, *args) -> None:
        with self._lock:  # reader threads count at once (a += on a dict item is no atomic step)
            self.rejected[reason] = self.rejected.get(reason, 0) + 1
        self.log(logging.WARNING, reason, "graphmon agent: " + msg + " (counted in graphmon_agent_connections_"
                 "rejected_total{reason=\"%s\"})", *args, reason)

    def _peer_allowed(self, pid: int, uid: int, gid: int, groups: Iterable[int] = ()) -> bool:
        return self.peers.allows(uid, gid, groups)

    def _refuse_peer(self, conn: socket.socket, pid: int, uid: int, gid: int, groups: Iterable[int] = ()) -> None:
        """Count, log once per (uid, gid, groups) at WARNING (a refused process retries every few
        seconds), tell the process why and what to set, close."""
        self.rejected["uid"] += 1  # REJECT_REASONS' "uid": a peer whose uid and groups the PeerPolicy does not allow
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

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except socket.timeout:
                continue
            except OSError:
                if self._stop.is_set():
                    return
                time.sleep(0.05)  # e.g. out of descriptors: retry, do not spin
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
            proc = RemoteProcess(conn, pid, budget=self.budget, max_queued_windows=self.max_queued_windows)
            with self._lock:
                self.unidentified[proc] = None
                evict = []
                while len(self.unidentified) > self.max_unidentified:
                    evict.append(self.unidentified.popitem(last=False)[0])
            for old in evict:  # a real process says hello at once: the oldest silent one goes
                self._reject("unidentified_evicted", "closed a connection that said nothing for %.1f s (pid %d): "
                             "more than %d connections without hello", time.time() - old.connected_s, old.peer_pid,
                             self.max_unidentified)
                old.closed_reason = "evicted before hello"
                old.close(old.closed_reason)
            try:
                threading.Thread(target=self._read_loop, args=(proc,), name=f"graphmon-agent-conn-{pid}",
                                 daemon=True).start()
            except RuntimeError:  # no thread to be had: refuse rather than fail the accept loop
                with self._lock:
                    self.unidentified.pop(proc, None)
                proc.close("no thread")

    def _hello(self, proc: RemoteProcess, reader: FrameReader, header: dict, payload) -> bool:
        """Handle the first frame; False when the connection is refused."""
        if header["type"] != "hello":
            raise WireError("first message must be hello", "protocol")
        proc.set_identity(header.get("identity", {}))
        st = header.get("status")
        if st is not None:
            proc.status = decode_status(st)
        with self._lock:
            self.unidentified.pop(proc, None)
            if len(self.procs) >= self.max_processes:
                full = True
            else:
                full = False
                self.procs.append(proc)
                proc.said_hello = True
        if full:
            self._reject("too_many_processes", "refused rank %s (pid %s): %d processes are attached",
                         proc.identity.get("rank", "?"), proc.identity.get("pid", proc.peer_pid), self.max_processes)
            proc.closed_reason = "too many processes"
            return False
        reader.max_frame_bytes, reader.one_frame = self.max_frame_bytes, False
        reader._reserve = proc.reserve
        self.on_connect(proc)
        return True

    def _read_loop(self, proc: RemoteProcess) -> None:
        reader = FrameReader(MAX_HELLO_FRAME_BYTES, one_frame=True)
        buf = bytearray(RECV_BYTES)
        view = memoryview(buf)
        deadline = time.monotonic() + self.hello_timeout_s
        frame_deadline: Optional[float] = None
        try:
            while not self._stop.is_set():
                if not proc.said_hello:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise TimeoutError
                    proc.conn.settimeout(left)
                elif reader.in_frame:
                    if frame_deadline is None:
                        frame_deadline = time.monotonic() + self.frame_timeout_s
                    left = frame_deadline - time.monotonic()
                    if left <= 0:
                        raise WireError(f"frame not complete {self.frame_timeout_s:g} s after its first byte", "stalled")
                    proc.conn.settimeout(left)
                elif frame_deadline is not None:
                    frame_deadline = None
                    proc.conn.settimeout(None)
                try:
                    n = proc.conn.recv_into(buf)
                except TimeoutError:
                    if proc.said_hello:
                        continue  # the frame deadline: checked at the top of the loop
                    raise
                if not n:
                    proc.closed_reason = proc.closed_reason or "connection closed"
                    break
                proc.last_heard_s = time.time()
                skipped = reader.skipped
                frames = reader.feed(view[:n])
                for i, body in enumerate(frames):  # (the hello's branch may append to frames)
                    reserved = len(body) if proc.said_hello else 0
                    try:
                        header, payload = split_frame(body)
                        if not proc.said_hello:
                            if not self._hello(proc, reader, header, payload):
                                return
                            proc.conn.settimeout(None)
                            frames += reader.feed(b"")  # what came with the hello, now under the process's bounds
                            continue
                        kind = header["type"]
                        owned, reserved = reserved, 0  # handle() releases or queues them
                        try:
                            proc.handle(header, payload, owned)
                        finally:
                            if kind == "window" and self.on_window is not None:
                                self.on_window(proc)
                        if kind == "bye":
                            proc.closed_reason = "process said bye"
                    except WireError as e:
                        proc.release(reserved)
                        self._bad_frame(proc, e)
                        if not proc.said_hello or e.reason in CLOSING_REASONS:
                            for rest in frames[i + 1:]:  # the stream is out of step or is no process's
                                if proc.said_hello:
                                    proc.release(len(rest))
                            raise
                if reader.skipped != skipped:
                    for _ in range(reader.skipped - skipped):
                        proc.count_drop("memory")
                    self.log(logging.WARNING, "memory", "graphmon agent: dropped a frame of rank %s: the %d-byte "
                             "budget for buffered frames is full", proc.identity.get("rank", "?"), self.budget.max_bytes)
        except TimeoutError:
            if proc.closed_reason:  # evicted meanwhile: counted once, as that
                return
            self._reject("hello_timeout", "closed a connection (pid %d) that sent no hello within %.1f s",
                         proc.peer_pid, self.hello_timeout_s)
            proc.closed_reason = "no hello in time"
        except WireError as e:
            proc.closed_reason = f"bad frame: {e}"[:200]
            if not getattr(e, "counted", False):  # from the frame splitter (e.g. a frame over the bound)
                self._bad_frame(proc, e)
            if not proc.said_hello:
                self._reject("bad_hello", "closed a connection (pid %d) before hello: %s", proc.peer_pid, str(e)[:200])
        except OSError as e:
            proc.closed_reason = proc.closed_reason or f"connection error: {e!r}"[:200]
        except Exception as e:  # the agent's own callbacks: contained, the connection closed
            proc.closed_reason = f"agent error: {e!r}"[:200]
            self.log(logging.ERROR, "internal", "graphmon agent: error on the connection of pid %d: %r", proc.peer_pid, e)
        finally:
            proc.release(reader.discard())
            proc.close(proc.closed_reason or "closed")
            with self._lock:
                self.unidentified.pop(proc, None)
                if proc in self.procs:
                    self.procs.remove(proc)
            if proc.said_hello:
                self.on_close(proc)

    def _bad_frame(self, proc: RemoteProcess, e: WireError) -> None:
        e.counted = True  # type: ignore[attr-defined]
        proc.bad_frames += 1
        with self._lock:
            self.frames_rejected[e.reason] = self.frames_rejected.get(e.reason, 0) + 1
        self.log(logging.WARNING, "frame:" + e.reason, "graphmon agent: refused a frame of rank %s (pid %s): %s",
                 proc.identity.get("rank", "?"), proc.identity.get("pid", proc.peer_pid), str(e)[:200])

    def count_bad_window(self, proc: RemoteProcess, e: WireError) -> None:
        """A queued window that did not decode (the ingest thread found out)."""
        with self._lock:
            self.frames_rejected[e.reason] = self.frames_rejected.get(e.reason, 0) + 1
        self.log(logging.WARNING, "frame:" + e.reason, "graphmon agent: dropped a window of rank %s (pid %s): %s",
                 proc.identity.get("rank", "?"), proc.identity.get("pid", proc.peer_pid), str(e)[:200])

    def counts(self) -> dict[str, int]:
        with self._lock:
            return {"unidentified": len(self.unidentified), "attached": len(self.procs)}
