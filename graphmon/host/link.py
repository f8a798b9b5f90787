"""The light collector's side of the agent link (runs inside a serving process).

A process that replays CUDA graphs runs only this and the CUPTI source: windows go to the
graphmon agent over a Unix socket (``GRAPHMON_AGENT``); analysis, snapshots and HTTP run in the
agent. The link never blocks the host: windows wait in a bounded queue (drops counted) and a
thread of its own connects, sends, receives capture requests and reconnects.

Imports: stdlib + graphmon.model (numpy). Never fastapi, uvicorn or prometheus_client (tested).
"""

from __future__ import annotations

import errno
import logging
import os
import select
import socket
import sys
import threading
import time
from collections import deque
from typing import Any, Callable, Optional

from graphmon.model.window import CaptureRequest, Window, WindowRecords

log = logging.getLogger("graphmon.link")
AGENT_ENV = "GRAPHMON_AGENT"


# ---------------------------------------------------------------------- identity
def _rank_from_title_or_argv() -> str:
    """Engines that start workers by multiprocessing spawn pass the rank as an argument and
    name the process (vLLM: ``VLLM::Worker_TP1``, SGLang: ``sglang::scheduler_TP1``)."""
    import re

    texts = []
    try:
        with open(f"/proc/{os.getpid()}/comm") as fh:
            texts.append(fh.read())
    except OSError:
        pass
    try:
        with open(f"/proc/{os.getpid()}/cmdline", "rb") as fh:
            texts.append(fh.read().replace(b"\0", b" ").decode(errors="replace"))
    except OSError:
        pass
    texts.append(" ".join(sys.argv))
    for t in texts:
        m = re.search(r"(?:_TP|_tp|[Rr]ank[ _=-]?)(\d+)", t)
        if m:
            return m.group(1)
    return ""


DEFAULT_RANK = "0"  # nothing names a rank and CUDA is not initialised: one GPU process is rank 0


def _cuda_device_ordinal() -> str:
    """torch's current CUDA device in this process, only when torch is imported and CUDA is
    initialised (never initialises CUDA itself); "" otherwise."""
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_initialized():
            return str(int(torch.cuda.current_device()))
    except Exception:
        pass
    return ""


def process_rank() -> tuple[str, str]:
    """(rank, where it came from): torch.distributed once initialised, then RANK-like
    variables, then LOCAL_RANK-like ones, then the process title/arguments, then the CUDA device
    ordinal, else DEFAULT_RANK. Never the pid: the rank names a series that a restarted process
    must continue (the pid stays on graphmon_process_info)."""
    torch = sys.modules.get("torch")
    try:
        dist = getattr(torch, "distributed", None)
        if dist is not None and dist.is_available() and dist.is_initialized():
            return str(dist.get_rank()), "torch.distributed"
    except Exception:
        pass
    for var in ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "LOCAL_RANK", "SLURM_LOCALID",
                "OMPI_COMM_WORLD_LOCAL_RANK"):
        if os.environ.get(var, "").isdigit():
            return os.environ[var], var
    r = _rank_from_title_or_argv()
    if r:
        return r, "title"
    d = _cuda_device_ordinal()
    if d:
        return d, "cuda_device"
    return DEFAULT_RANK, "default"


def _fmt_bus_id(props: Any) -> str:
    bus = getattr(props, "pci_bus_id", None)
    if isinstance(bus, str):
        return bus
    if isinstance(bus, int):  # torch gives ints: domain, bus, device -> nvidia-smi's spelling
        dom = getattr(props, "pci_domain_id", 0) or 0
        dev = getattr(props, "pci_device_id", 0) or 0
        return f"{dom:08X}:{bus:02X}:{dev:02X}.0"
    return ""


def device_identity() -> dict[str, str]:
    """The physical GPU this process uses (stable under CUDA_VISIBLE_DEVICES): UUID and PCI bus
    id from torch's device properties, bus id from NVML by UUID when torch lacks it. Asks torch
    only when torch is imported and CUDA initialised (never initialises CUDA itself)."""
    out = {"device": "", "uuid": "", "pci_bus_id": "", "gpu_name": ""}
    torch = sys.modules.get("torch")
    try:
        if torch is None or not torch.cuda.is_initialized():
            return out
        idx = torch.cuda.current_device()
        props = torch.cuda.get_device_properties(idx)
        out["device"] = str(idx)
        uuid = str(getattr(props, "uuid", "") or "")
        out["uuid"] = uuid if not uuid or uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"
        out["pci_bus_id"] = _fmt_bus_id(props)
        out["gpu_name"] = str(getattr(props, "name", ""))
    except Exception:
        return out
    if out["uuid"] and not out["pci_bus_id"]:
        try:
            import pynvml  # optional: only when the engine's environment has it

            pynvml.nvmlInit()
            h = pynvml.nvmlDeviceGetHandleByUUID(out["uuid"])
            bus = pynvml.nvmlDeviceGetPciInfo(h).busId
            out["pci_bus_id"] = bus.decode() if isinstance(bus, bytes) else str(bus)
        except Exception:
            pass
    return out


def identity(extra: Optional[dict] = None) -> dict[str, str]:
    rank, source = process_rank()
    from graphmon.host.workload import PROCESS_START_S, workload_identity

    out = {"rank": rank, "rank_source": source, "pid": str(os.getpid()), "host": socket.gethostname(),
           "process_start_s": PROCESS_START_S, **workload_identity(), **device_identity()}
    torch = sys.modules.get("torch")
    out["torch_version"] = str(getattr(torch, "__version__", "")) if torch is not None else ""
    out.update({k: str(v) for k, v in (extra or {}).items()})
    return out


# ---------------------------------------------------------------------- the link
class Link:
    """Process -> agent: hello, windows, heartbeats; agent -> process: capture, stop, refused.

    ``send_window`` is called from the collector thread and only encodes and enqueues. A refusal
    by the agent, a socket this process may not open, or no agent for ``unreachable_warn_s`` is
    logged once at WARNING (the link keeps retrying with back-off)."""

    unreachable_warn_s = 30.0

    def __init__(self, path: str, *, hello: Callable[[], dict], status: Callable[[], dict],
                 on_capture: Callable[[CaptureRequest], None], on_stop: Callable[[], None] = lambda: None,
                 max_queue: int = 8, heartbeat_s: float = 1.0, reconnect_max_s: float = 5.0) -> None:
        self.path = path
        self._hello, self._status = hello, status
        self._on_capture, self._on_stop = on_capture, on_stop
        self.queue: deque[bytes] = deque()
        self.max_queue = int(max_queue)
        self.heartbeat_s = float(heartbeat_s)
        self.reconnect_max_s = float(reconnect_max_s)
        self.stats = {"windows_sent": 0, "windows_dropped": 0, "reconnects": 0, "bad_messages": 0, "connected": 0}
        self.refusals = 0  # connections the agent refused (it said why in a "refused" message)
        self._warned: set = set()  # what was logged at WARNING already: once each, the link retries for ever
        self._unreachable_since: Optional[float] = None
        self._lock = threading.Lock()
        # A self-pipe wakes the link thread's select() when a window is queued: the thread sleeps
        # until there is something to do (no polling: no GIL taken from the host 20 times a second).
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._sock: Optional[socket.socket] = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="graphmon-link", daemon=True)
            self._thread.start()

    def send_window(self, w: Window | WindowRecords, status: Optional[dict] = None) -> None:
        from graphmon.model.wire import encode_window

        data = encode_window(w, status=status)
        with self._lock:
            if len(self.queue) >= self.max_queue:
                self.queue.popleft()  # the newest window is the most useful one: drop the oldest
                self.stats["windows_dropped"] += 1
            self.queue.append(data)
        self._wakeup()

    def _wakeup(self) -> None:
        if self._wake_w < 0:
            return
        try:
            os.write(self._wake_w, b"\0")
        except (BlockingIOError, OSError):
            pass  # the pipe is full: the thread is awake already

    def stop(self, timeout_s: float = 2.0) -> None:
        """Send what is queued (bounded by ``timeout_s``), say bye, close."""
        self._stop.set()
        self._wakeup()
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                return  # still sending: it may use the pipe; the daemon thread ends with the process
            self._thread = None
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass
        self._wake_r = self._wake_w = -1

    # ------------------------------------------------------------------ thread
    def _run(self) -> None:
        backoff = 0.1
        while not self._stop.is_set():
            connected_s = None
            try:
                self._connect()
                connected_s = time.monotonic()
                self._serve()
            except OSError as e:
                if not self._read_refusal():  # the agent refused us, said why, and closed
                    self._connect_failed(e)
            except Exception:
                self.stats["bad_messages"] += 1
            finally:
                self._close()
            if self._stop.is_set():
                break
            self.stats["reconnects"] += 1
            # Back off again at once only after a connection that lasted (an agent restart); one
            # that ends at once (a refusal) keeps backing off: not 10 reconnects a second.
            if connected_s is not None and time.monotonic() - connected_s > self.reconnect_max_s:
                backoff = 0.1
            self._stop.wait(backoff)
            backoff = min(self.reconnect_max_s, backoff * 2)

    def _warn_once(self, key: str, msg: str, *args: Any) -> None:
        (log.debug if key in self._warned else log.warning)(msg, *args)
        self._warned.add(key)

    def _connect_failed(self, e: OSError) -> None:
        if e.errno in (errno.EACCES, errno.EPERM):
            try:
                st = os.stat(self.path)
                sock = f"socket uid {st.st_uid} gid {st.st_gid} mode {st.st_mode & 0o777:04o}"
            except OSError:
                sock = "socket"
            self._warn_once(f"perm:{self.path}", "graphmon link: permission denied on the graphmon agent's %s (%s); this "
                            "process is uid %d gid %d groups %s: start the agent with --allow-gid set to one of this "
                            "process's groups (the socket is then 0660 in that group; Kubernetes: the pod's fsGroup), "
                            "see docs/deployment.md. Windows are dropped (counted) until then.", self.path, sock,
                            os.getuid(), os.getgid(), sorted(os.getgroups()))
        elif e.errno in (errno.ENOENT, errno.ECONNREFUSED):
            now = time.monotonic()
            if self._unreachable_since is None:
                self._unreachable_since = now
            elif now - self._unreachable_since >= self.unreachable_warn_s:
                self._warn_once(f"absent:{self.path}", "graphmon link: no graphmon agent at %s for %.0f s (%s); "
                                "windows are dropped (counted) until it listens there: check %s and the volume "
                                "shared with the agent", self.path, now - self._unreachable_since,
                                os.strerror(e.errno), AGENT_ENV)
        elif e.errno not in (errno.EPIPE, errno.ECONNRESET, None):
            log.debug("graphmon link: %r", e)

    def _read_refusal(self) -> bool:
        """After a broken connection: did the agent leave a "refused" message? (It sends one and
        closes without reading, so our next send fails before we read it.)"""
        from graphmon.model.wire import FrameReader, WireError, split_frame

        s = self._sock
        if s is None:
            return False
        reader = FrameReader(max_frame_bytes=1 << 16)
        try:
            s.setblocking(False)
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                for body in reader.feed(chunk):
                    header, _ = split_frame(body)
                    if header.get("type") == "refused":
                        self._refused(header)
                        return True
        except (OSError, WireError):
            pass
        return False

    def _refused(self, header: dict) -> None:
        self.refusals += 1
        reason, allow = str(header.get("reason", ""))[:300], str(header.get("allow", ""))[:300]
        self._warn_once(f"refused:{reason}", "graphmon link: the graphmon agent at %s refused this process (pid %d): "
                        "%s; to be let in, %s. Windows are dropped (counted) until then.", self.path, os.getpid(),
                        reason, allow)

    def _connect(self) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(5.0)  # a stuck agent blocks this thread at most 5 s per send, never the host
        self._sock = s  # kept before connect: _read_refusal / _close see it whatever fails
        s.connect(self.path)
        self._unreachable_since = None
        from graphmon.model.wire import encode_message

        s.sendall(encode_message("hello", identity=self._hello(), status=self._safe_status()))
        self.stats["connected"] = 1

    def _close(self) -> None:
        self.stats["connected"] = 0
        s, self._sock = self._sock, None
        if s is not None:
            try:
                s.close()
            except OSError:
                pass

    def _serve(self) -> None:
        from graphmon.model.wire import FrameReader, encode_message, split_frame

        s = self._sock
        assert s is not None
        reader = FrameReader(max_frame_bytes=1 << 20)  # the agent only sends small control frames
        next_hb = 0.0
        while True:
            stopping = self._stop.is_set()
            while True:
                with self._lock:
                    data = self.queue.popleft() if self.queue else None
                if data is None:
                    break
                s.sendall(data)
                self.stats["windows_sent"] += 1
                next_hb = 0.0  # the state that goes with the window: at once
            now = time.monotonic()
            if stopping:
                s.sendall(encode_message("bye", status=self._safe_status()))
                return
            if now >= next_hb:
                s.sendall(encode_message("heartbeat", status=self._safe_status(), identity=self._hello()))
                next_hb = now + self.heartbeat_s
            r, _, _ = select.select([s, self._wake_r], [], [], max(0.0, next_hb - now))
            if self._wake_r in r:
                try:
                    os.read(self._wake_r, 4096)
                except BlockingIOError:
                    pass
            if s in r:
                chunk = s.recv(65536)
                if not chunk:
                    raise ConnectionResetError("agent closed the connection")
                for body in reader.feed(chunk):
                    self._handle(*split_frame(body))

    def _handle(self, header: dict, payload) -> None:
        kind = header.get("type")
        if kind == "capture":
            try:
                req = CaptureRequest(id=str(header["id"])[:64], replays=header.get("replays"),
                                     duration_ms=header.get("duration_ms"))
                self._on_capture(req)
            except Exception:
                self.stats["bad_messages"] += 1
        elif kind == "stop":
            self._on_stop()
        elif kind == "refused":
            self._refused(header)

    def _safe_status(self) -> dict:
        try:
            st = dict(self._status())
        except Exception as e:
            st = {"state": "error", "reason": f"status failed: {e!r}"[:200]}
        st["link"] = dict(self.stats)
        return st


# ---------------------------------------------------------------------- the light collector
class LightCollector:
    """CUPTI source + link: what runs in a serving process under the agent."""

    def __init__(self, path: str, *, cupti: Any = None, link_kwargs: Optional[dict] = None, settings: Any = None,
                 **source_kwargs) -> None:
        from graphmon.settings import CuptiSettings
        from graphmon.sources.cupti.collector import CuptiSource

        if settings is None:
            settings = CuptiSettings(**source_kwargs)
        self.source = CuptiSource(cupti=cupti, settings=settings)
        self.source.records_sink = True  # ship records unfiltered: the agent filters and validates
        # the longest wait between windows (the tracing budget can stretch interval_s up to
        # max_interval_s): the agent's no-window check counts in these
        self.interval_s = max(float(settings.interval_s), float(settings.max_interval_s))
        self.first_window_s = float(settings.first_window_s)
        self.windows = 0
        self.empty_windows = 0  # saw graph launches, kept no record
        self.link = Link(path, hello=self._hello, status=self._status, on_capture=self._capture,
                         on_stop=self._stop_async, **(link_kwargs or {}))

    def _hello(self) -> dict:
        return identity({"interval_s": self.interval_s, "first_window_s": self.first_window_s,
                         **{f"backend_{k}": v for k, v in _safe_info(self.source).items()}})

    def _status(self) -> dict:
        h = self.source.health()
        st = self.source.stats  # the tracing budget at work: the wait it chose after the last window
        return {"state": h.state, "reason": h.reason, "errors": dict(h.errors),
                "last_errors": dict(h.last_errors), "windows": self.windows,
                "empty_windows": self.empty_windows,
                # traced, and no graph launch came (the collector's closed set of empty-window
                # reasons: no_records above, no_launches here; idle windows are not empty: nothing ran)
                "empty_windows_no_launches": int(st.get("empty_no_launches") or 0),
                "sampling": {"next_interval_s": float(st.get("interval_s") or 0.0),
                             "last_traced_ms": float(st.get("traced_ms") or 0.0),
                             # False between windows once idle (idle_unsubscribe_s): no CUPTI in the process
                             "cupti_subscribed": bool(getattr(self.source, "subscribed", False)),
                             "idle_unsubscribes": int(st.get("idle_unsubscribes") or 0),
                             # windows with no graph launch to open them (not traced), and whether
                             # one waits for a launch now
                             "idle_windows": int(st.get("idle_windows") or 0),
                             # kernel ends a forced flush made up, dropped (their replays excluded)
                             "late_stamped_records": int(st.get("late_stamped_records") or 0),
                             "armed": bool(getattr(self.source, "armed", False))}}

    def _capture(self, req: CaptureRequest) -> None:
        try:
            self.source.request_capture(req)
        except Exception:
            self.source.count_error("capture_request")

    def _stop_async(self) -> None:
        threading.Thread(target=self.source.stop, name="graphmon-stop", daemon=True).start()

    def _on_window(self, w: WindowRecords) -> None:
        self.windows += 1
        if len(w) == 0 and w.n_launches > 0:  # graph launches traced, not one kernel record came back
            self.empty_windows += 1
        self.link.send_window(w, status=self._status())

    def start(self, subscribe_wait_s: float = 5.0) -> None:
        """Start collecting; wait (bounded) until CUPTI is subscribed, so that the graph whose
        capture triggered this is instantiated under the subscription (its upload mode known).
        The link thread's first imports are done here, in attach's time, rather than in the
        host's first steps after it."""
        import graphmon.model.wire  # noqa: F401

        self.link.start()
        self.source.start(self._on_window)
        self.source.wait_started(subscribe_wait_s)

    def stop(self, timeout_s: float = 5.0) -> None:
        self.source.stop(timeout_s=timeout_s)  # flushes its pending window to the link
        self.link.stop(timeout_s=min(2.0, timeout_s))


def _safe_info(source: Any) -> dict[str, str]:
    try:
        return {k: str(v) for k, v in source.info().items()}
    except Exception:
        return {}
