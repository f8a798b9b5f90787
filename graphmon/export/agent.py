"""The graphmon agent: one graph-free process per host or pod that owns aggregation, snapshots,
HTTP and health for every process that replays CUDA graphs.

Processes attach over a Unix socket (graphmon.sources.remote); each gets its own Aggregator, so
analysis and rendering never run inside a serving process. The agent runs standalone
(``graphmon agent``, e.g. a Kubernetes sidecar or DaemonSet) or as the ``graphmon run`` process.

Health (agreed metric names): ``graphmon_process_info``, ``graphmon_process_last_window_timestamp_seconds``,
``graphmon_empty_windows_total{reason}`` (no_records | no_windows), ``graphmon_processes_lost_total``,
``graphmon_processes{state}``; a process's ``graphmon_up`` is 1 only while windows with records flow.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

from graphmon.export.aggregator import Aggregator
from graphmon.export.snapshot import Snapshot
from graphmon.export.tracestore import TraceStore
from graphmon.report.summary import snapshot_graphs
from graphmon.model.window import CaptureRequest, SourceHealth, Window
from graphmon.settings import Settings
from graphmon.sources.remote import STATES, AgentListener, PeerPolicy, RemoteProcess

log = logging.getLogger("graphmon.agent")
EMPTY_REASONS = ("no_records", "no_windows")
NO_WINDOW_INTERVALS = 3  # a process that replays graphs and sends no window for this many intervals
HEARTBEAT_LOST_S = 5.0  # no heartbeat for this long: the process is lost (hung or SIGSTOPped)


@dataclass
class Attached:
    """One process as the agent sees it."""

    key: str
    proc: RemoteProcess
    aggregator: Aggregator
    store: TraceStore
    rank: str
    degraded: str = ""  # reason when the process is up but data does not flow
    no_windows_counted: bool = False
    gone_s: Optional[float] = None  # when it disconnected (lost or stopped)
    recorder: Optional[Callable[[Window], None]] = None
    windows_seen: int = 0
    extra: dict = field(default_factory=dict)

    def identity(self) -> dict[str, str]:
        i = self.proc.identity
        h = self.health()
        return {"rank": self.rank, "pid": i.get("pid", str(self.proc.peer_pid)), "host": i.get("host", ""),
                "device": i.get("device", ""), "uuid": i.get("uuid", ""), "pci_bus_id": i.get("pci_bus_id", ""),
                "gpu_name": i.get("gpu_name", ""), "state": h.state, "reason": h.reason}

    def health(self) -> SourceHealth:
        h = self.proc.health()
        if h.state == "running" and self.degraded:
            return SourceHealth(up=False, state="degraded", reason=self.degraded, errors=h.errors)
        return h


class Agent:
    """Listener + per-process aggregators + health. HTTP is added by :func:`graphmon.export.agent_http.serve`."""

    def __init__(self, settings: Optional[Settings] = None, *, socket_path: Optional[str] = None,
                 recorder_factory: Optional[Callable[[dict], Callable[[Window], None]]] = None,
                 keep_gone_s: float = 600.0, heartbeat_lost_s: float = HEARTBEAT_LOST_S,
                 tick_s: float = 0.2, peers: Optional[PeerPolicy] = None) -> None:
        self.settings = settings or Settings()
        self.keep_gone_s = float(keep_gone_s)
        self.heartbeat_lost_s = float(heartbeat_lost_s)
        self.tick_s = float(tick_s)
        self.recorder_factory = recorder_factory
        self.publish_hooks: list[Callable] = []  # called with each new snapshot of any process (HTTP pre-render)
        self.processes: dict[str, Attached] = {}
        self.lost_total = 0
        self.empty_total = {r: {} for r in EMPTY_REASONS}  # reason -> rank -> count
        self.errors: dict[str, int] = {}
        # process key -> (snapshot, its /status graphs): formatted once per snapshot, not per request
        self._graphs: dict[str, tuple[Snapshot, list]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._changed = threading.Event()
        self.listener = AgentListener(socket_path, on_connect=self._on_connect, on_close=self._on_close, peers=peers)
        self.socket_path = self.listener.path
        self._monitor = threading.Thread(target=self._monitor_loop, name="graphmon-agent-monitor", daemon=True)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> "Agent":
        self.listener.start()
        self._monitor.start()
        return self

    def stop(self, timeout_s: float = 2.0) -> None:
        self._stop.set()
        self.listener.close()
        self._monitor.join(timeout_s)

    # ------------------------------------------------------------------ listener callbacks
    def _unique_rank(self, rank: str, pid: int) -> str:
        # Two live processes claiming one rank would give duplicate series (a failed scrape).
        taken = {a.rank for a in self.processes.values() if a.gone_s is None}
        return rank if rank not in taken else f"{rank}@{pid}"

    def _on_connect(self, proc: RemoteProcess) -> None:
        with self._lock:
            # the pid the process names (same uid as the agent: checked); the socket's peer pid otherwise
            pid = int(proc.identity["pid"]) if proc.identity.get("pid", "").isdigit() else proc.peer_pid
            proc.key = key = f"p{pid}"
            rank = self._unique_rank(proc.identity.get("rank", "") or f"pid{pid}", pid)
            store = TraceStore(self.settings.trace_store_count, self.settings.trace_store_bytes)
            box: dict = {}
            st = self.settings
            ident = proc.identity
            process = {"rank": rank, "pid": str(pid), "host": ident.get("host", ""), "device": ident.get("device", ""),
                       "uuid": ident.get("uuid", ""), "pci_bus_id": ident.get("pci_bus_id", ""),
                       "gpu_name": ident.get("gpu_name", "")}
            agg = Aggregator(rank=rank, max_graphs=st.max_graphs, max_streams=st.max_streams,
                             trace_store=store, backend_info=proc.info,
                             health=lambda: box["a"].health() if "a" in box else proc.health(),
                             max_devices=st.max_devices, max_label_length=st.max_label_length,
                             stale_after_s=st.stale_after_s, process=process)
            agg.on_publish.extend(self.publish_hooks)
            a = Attached(key=key, proc=proc, aggregator=agg, store=store, rank=rank)
            box["a"] = a
            if self.recorder_factory is not None:
                a.recorder = self.recorder_factory({**proc.identity, **a.identity()})
            old = self.processes.get(key)
            if old is not None and old.gone_s is None:
                old.proc.close("replaced by a new connection of the same pid")
            self.processes[key] = a
            for r in EMPTY_REASONS:
                self.empty_total[r].setdefault(rank, 0)
        proc.start(lambda w, a=a: self._ingest(a, w))
        agg.refresh()
        log.info("graphmon agent: process attached: rank %s pid %d device %s", rank, proc.peer_pid,
                 proc.identity.get("uuid") or proc.identity.get("device") or "?")
        self._changed.set()

    def _on_close(self, proc: RemoteProcess) -> None:
        a = self.processes.get(getattr(proc, "key", ""))
        if a is None or a.proc is not proc:
            return
        a.gone_s = time.time()
        if proc.closed_reason != "process said bye" and not self._stop.is_set():
            proc.lost = True
            self.lost_total += 1
            log.warning("graphmon agent: lost rank %s (pid %d): %s", a.rank, proc.peer_pid, proc.closed_reason)
        else:
            proc.status = {**proc.status, "state": "stopped"}
        a.aggregator.refresh()
        self._changed.set()

    def _ingest(self, a: Attached, w: Window) -> None:
        a.windows_seen += 1
        if len(w.trace) == 0 and w.trace.n_launches > 0:
            a.degraded = "no_records: a window saw graph launches and kept no record"
            self.empty_total["no_records"][a.rank] = self.empty_total["no_records"].get(a.rank, 0) + 1
        elif len(w.trace) > 0:
            a.degraded, a.no_windows_counted = "", False
        a.aggregator.ingest(w)
        if a.recorder is not None:
            try:
                a.recorder(w)
                done = getattr(a.recorder, "done", None)
                if done is not None and done.is_set() and not a.extra.get("stop_sent"):
                    a.extra["stop_sent"] = True  # enough windows from this process: it stops sampling
                    from graphmon.model.wire import encode_message

                    a.proc.send(encode_message("stop"))
            except Exception:
                self.errors["record"] = self.errors.get("record", 0) + 1
        self._changed.set()

    # ------------------------------------------------------------------ monitor
    def _monitor_loop(self) -> None:
        while not self._stop.wait(self.tick_s):
            try:
                self.check()
            except Exception:
                self.errors["monitor"] = self.errors.get("monitor", 0) + 1
                log.exception("graphmon agent monitor error")

    def check(self, now: Optional[float] = None) -> None:
        """Lost heartbeats, processes that produce no windows, expiry; refresh snapshots."""
        now = time.time() if now is None else now
        for key, a in list(self.processes.items()):
            p = a.proc
            if a.gone_s is not None:
                if now - a.gone_s > self.keep_gone_s:
                    self.processes.pop(key, None)
                    self._graphs.pop(key, None)
                continue
            if now - p.last_heard_s > self.heartbeat_lost_s:
                p.closed_reason = f"no heartbeat for {now - p.last_heard_s:.1f} s"
                p.close(p.closed_reason)  # its reader thread ends and _on_close counts it lost
                continue
            interval = _float(p.identity.get("interval_s"), 10.0)
            first = _float(p.identity.get("first_window_s"), 1.0)
            since = p.last_window_s if p.last_window_s is not None else p.connected_s + first
            if (now - since > NO_WINDOW_INTERVALS * interval and p.health().state == "running"
                    and not a.no_windows_counted):
                a.no_windows_counted = True
                a.degraded = f"no_windows: no window for {now - since:.0f} s ({NO_WINDOW_INTERVALS} intervals)"
                self.empty_total["no_windows"][a.rank] = self.empty_total["no_windows"].get(a.rank, 0) + 1
            a.aggregator.refresh_if_changed()

    # ------------------------------------------------------------------ read side (HTTP)
    def attached(self) -> list[Attached]:
        return sorted(self.processes.values(), key=lambda a: (_rank_key(a.rank), a.key))

    def snapshots(self) -> Sequence[Snapshot]:
        """One snapshot per attached process (the agreed ``get_snapshots`` of the exporter)."""
        return [a.aggregator.snapshot() for a in self.attached()]

    def capture(self, req: CaptureRequest) -> None:
        """POST /capture: fan out to every live process (each answers with a window tagged req.id)."""
        live = [a for a in self.attached() if a.gone_s is None]
        if not live:
            raise NotImplementedError("no process that replays CUDA graphs is attached to the agent")
        sent = 0
        for a in live:
            try:
                a.proc.request_capture(req)
                sent += 1
            except OSError:
                pass
        if not sent:
            raise RuntimeError("no attached process took the capture request")

    def wait_for(self, trace_id: str, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while True:
            if self.trace_lookup(trace_id) is not None:
                return True
            if time.monotonic() >= deadline:
                return False
            self._changed.wait(min(0.05, max(0.0, deadline - time.monotonic())))
            self._changed.clear()

    def trace_lookup(self, trace_id: str):
        """``p<pid>-w<n>`` names one process's window; a capture id is looked up everywhere
        (the first process that answered)."""
        key, sep, wid = trace_id.partition("-")
        if sep and key in self.processes:
            return self.processes[key].store.get(wid)
        for a in self.attached():
            t = a.store.get(trace_id)
            if t is not None:
                return t
        return None

    def last_window_id(self) -> Optional[str]:
        """The newest window of any attached process, as ``p<pid>-w<n>`` (the live boundary attribution's window)."""
        best: tuple = (-1.0, None)
        for a in self.attached():
            s = a.aggregator.snapshot()
            if s.windows and (s.last_window_s or 0.0) > best[0]:
                w = s.windows[-1]
                best = (s.last_window_s or 0.0, w if w.startswith("c") else f"{a.key}-{w}")
        return best[1]

    def _status_graphs(self, key: str, s: Snapshot) -> list:
        hit = self._graphs.get(key)
        if hit is None or hit[0] is not s:
            hit = self._graphs[key] = (s, snapshot_graphs(s))
        return hit[1]

    def process_status(self) -> list[dict]:
        """/status's list of processes: rank, device, pid, state and last window age."""
        now = time.time()
        out = []
        for a in self.attached():
            s = a.aggregator.snapshot()
            ident = a.identity()
            out.append({**ident,
                        "last_window_age_s": None if a.proc.last_window_s is None else max(0.0, now - a.proc.last_window_s),
                        "windows_total": s.windows_total, "records_total": s.records_total,
                        "empty_windows": a.proc.empty_windows,
                        "windows": [f"{a.key}-{w}" if not w.startswith("c") else w for w in s.windows],
                        "link": dict(a.proc.status.get("link") or {}),
                        "sampling": _sampling(a.proc.status.get("sampling")),
                        "graphs": self._status_graphs(a.key, s)})
        return out

    def state_counts(self) -> dict[str, int]:
        counts = {s: 0 for s in STATES}
        for a in self.processes.values():
            st = a.health().state
            counts[st] = counts.get(st, 0) + 1
        return counts


def _sampling(v: Any) -> dict:
    """A process's sampling status as it reported it (known keys of known types only: the agent
    never trusts a sender)."""
    if not isinstance(v, dict):
        return {}
    out: dict = {k: float(x) for k, x in v.items() if k in ("next_interval_s", "last_traced_ms")
                 and isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)}
    if isinstance(v.get("cupti_subscribed"), bool):  # False between windows with idle_unsubscribe_s
        out["cupti_subscribed"] = v["cupti_subscribed"]
    n = v.get("idle_unsubscribes")
    if isinstance(n, int) and not isinstance(n, bool) and n >= 0:
        out["idle_unsubscribes"] = n
    return out


def _float(v, default: float) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return default


def _rank_key(rank: str):
    head = rank.split("@", 1)[0]
    return (0, int(head), rank) if head.isdigit() else (1, 0, rank)
