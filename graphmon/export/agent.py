"""The graphmon agent: one graph-free process per host or pod that owns aggregation, snapshots,
HTTP and health for every process that replays CUDA graphs.

Processes attach over a Unix socket (graphmon.sources.remote). Cumulative series belong to a
**rank**, not to a process: each rank has one :class:`RankSeries` (its Aggregator and its part
of the shared trace store), and a process that connects with the rank of a process that is gone
takes it over, so counters and histograms continue through a restart (one line per rank, graph
and stream). A second *live* process claiming a rank gets ``<rank>@2`` (``@3`` ...: the lowest
free one, so a restarted duplicate takes its series over too); the pid is never part of a rank.
Only a process of the same workload (the hello's namespace, workload and container: one agent of
a DaemonSet serves several engines' pods) takes a rank's series over; another gets ``@n`` too.
A rank without a live process keeps its series (``graphmon_up`` 0, state stopped or lost) for
``keep_gone_s``, then they are dropped; graphs a successor no longer replays expire by
``stale_after_s`` in the aggregator.

Threads: a reader thread per connection does I/O only; one ingest thread decodes and analyses
windows, round robin over processes (a busy process cannot starve the others), then calls
``window_hooks``; the monitor thread checks heartbeats, empty processes and expiry. Nothing
renders here: the HTTP layer renders /metrics at most once per interval on a thread of its own.

Health (agreed metric names): ``graphmon_process_info``, ``graphmon_process_last_window_timestamp_seconds``,
``graphmon_empty_windows_total{reason}`` (no_records | no_windows), ``graphmon_processes_lost_total``,
``graphmon_processes{state}``; a process's ``graphmon_up`` is 1 only while windows with records flow.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from typing import Callable, Optional, Sequence

from graphmon.export.aggregator import Aggregator
from graphmon.export.identity import takeover_key, workload_labels
from graphmon.export.ranks import Attached, RankSeries
from graphmon.export.snapshot import Snapshot
from graphmon.export.tracestore import SharedTraceStore
from graphmon.model.window import CaptureRequest, Window
from graphmon.model.wire import WireError, encode_message
from graphmon.export.untraced import status_graphs
from graphmon.settings import Settings
from graphmon.sources.peers import LimitedLog
from graphmon.sources.remote import STATES, AgentListener, PeerPolicy, RemoteProcess

log = logging.getLogger("graphmon.agent")
EMPTY_REASONS = ("no_records", "no_windows")
NO_WINDOW_INTERVALS = 3  # a process that replays graphs and sends no window for this many intervals
HEARTBEAT_LOST_S = 5.0  # no byte for this long: the process is lost (hung or SIGSTOPped)
KEEP_GONE_S = 600.0  # a rank without a live process keeps its series this long
MAX_GONE_RANKS = 256  # ranks without a live process kept at most (more: the oldest dropped early, counted)
RANK_DROP_REASONS = ("expired", "cap")


class Agent:
    """Listener + per-rank aggregators + health. HTTP is added by :func:`graphmon.export.agent_http.serve`."""

    def __init__(self, settings: Optional[Settings] = None, *, socket_path: Optional[str] = None,
                 recorder_factory: Optional[Callable[[dict], Callable[[Window], None]]] = None,
                 keep_gone_s: float = KEEP_GONE_S, heartbeat_lost_s: float = HEARTBEAT_LOST_S,
                 tick_s: float = 0.2, max_gone_ranks: int = MAX_GONE_RANKS, peers: Optional[PeerPolicy] = None,
                 listener_kwargs: Optional[dict] = None) -> None:
        self.settings = settings or Settings()
        self.keep_gone_s = float(keep_gone_s)
        self.heartbeat_lost_s = float(heartbeat_lost_s)
        self.tick_s = float(tick_s)
        self.max_gone_ranks = int(max_gone_ranks)
        self.recorder_factory = recorder_factory
        self.started_s = time.time()
        # Called with each new snapshot of any rank, on the thread that published it: keep them
        # cheap (the HTTP layer only marks /metrics for its next render).
        self.publish_hooks: list[Callable] = []
        # Called on the ingest thread after a rank's aggregator ingested a window, as
        # hook(attached, window); an exception is counted (errors_total["window_hook"]), never raised.
        self.window_hooks: list[Callable[[Attached, Window], None]] = []
        # Called by stop(), after the agent's own threads ended (the deploy verdict's thread)
        self.stop_hooks: list[Callable[[], None]] = []
        self.processes: dict[str, Attached] = {}  # connection key -> the rank holder (live or gone)
        self.ranks: dict[str, RankSeries] = {}
        self._by_tag: dict[str, RankSeries] = {}
        self.traces = SharedTraceStore(self.settings.trace_store_count, self.settings.trace_store_bytes)
        self.lost_total = 0
        self.empty_total = {r: {} for r in EMPTY_REASONS}  # reason -> rank -> count
        self.ranks_dropped = dict.fromkeys(RANK_DROP_REASONS, 0)
        self.errors: dict[str, int] = {}
        # rank tag -> (snapshot, its /status graphs): formatted once per snapshot, not per request
        self._graphs: dict[str, tuple[Snapshot, list]] = {}
        self._seq = itertools.count(1)
        self._tags = itertools.count(1)
        self._lock = threading.Lock()  # processes and ranks: held for dict updates only
        self._stop = threading.Event()
        self._changed = threading.Event()
        self._ready: deque[Attached] = deque()  # processes with queued windows, round robin
        self._ready_cv = threading.Condition()
        self.log = LimitedLog(log)
        self.listener = AgentListener(socket_path, on_connect=self._on_connect, on_close=self._on_close,
                                      on_window=self._on_window, peers=peers, **(listener_kwargs or {}))
        self.socket_path = self.listener.path
        self._monitor = threading.Thread(target=self._monitor_loop, name="graphmon-agent-monitor", daemon=True)
        self._ingester = threading.Thread(target=self._ingest_loop, name="graphmon-agent-ingest", daemon=True)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> "Agent":
        limit_malloc_arenas()
        self.listener.start()
        self._monitor.start()
        self._ingester.start()
        return self

    def stop(self, timeout_s: float = 2.0) -> None:
        self._stop.set()
        self.listener.close()
        with self._ready_cv:
            self._ready_cv.notify_all()
        self._monitor.join(timeout_s)
        self._ingester.join(timeout_s)
        for fn in self.stop_hooks:
            try:
                fn()
            except Exception as e:  # noqa: BLE001 - stopping goes on
                self._count("stop", e)

    def _count(self, stage: str, exc: Optional[BaseException] = None) -> None:
        self.errors[stage] = self.errors.get(stage, 0) + 1
        if exc is not None:
            self.log(logging.WARNING, stage, "graphmon agent %s error (counted in /status errors_total): %r", stage, exc)

    # ------------------------------------------------------------------ listener callbacks (reader threads)
    def _free_rank(self, want: str, workload: tuple = ()) -> str:
        # Two live processes claiming one rank would give duplicate series (a failed scrape). A
        # rank's series are taken over only by a process of the same workload (namespace, workload,
        # container): in a DaemonSet one agent serves several engines' pods, each with a rank 0,
        # and the deploy verdict compares a rank's process with the one before it.
        def free(r: str) -> bool:
            s = self.ranks.get(r)
            if s is None:
                return True
            h = s.holder
            return h is None or (h.gone_s is not None and takeover_key(h.proc.identity) == workload)

        r, n = want, 1
        while not free(r):
            n += 1
            r = f"{want}@{n}"
        return r

    def _new_series(self, rank: str) -> RankSeries:
        st = self.settings
        tag = f"r{next(self._tags)}"
        s = RankSeries(rank=rank, tag=tag, store=self.traces.view(tag))
        s.aggregator = Aggregator(rank=rank, max_graphs=st.max_graphs, max_streams=st.max_streams, trace_store=s.store,
                                  backend_info=s.backend_info, health=s.health, max_devices=st.max_devices,
                                  max_label_length=st.max_label_length, stale_after_s=st.stale_after_s,
                                  detail_graphs=st.detail_graphs)
        s.aggregator.on_publish.append(self._published)
        return s

    def _published(self, snap: Snapshot) -> None:
        for fn in list(self.publish_hooks):
            fn(snap)  # the aggregator counts an exception (stage "publish")

    def _on_connect(self, proc: RemoteProcess) -> None:
        with self._lock:
            key = f"i{next(self._seq)}"
            rank = self._free_rank(proc.identity.get("rank") or "unknown", takeover_key(proc.identity))
            series = self.ranks.get(rank)
            if series is None:
                series = self.ranks[rank] = self._new_series(rank)
                self._by_tag[series.tag] = series
            old = series.holder
            if old is not None:  # a successor: the rank's series are its own now
                self.processes.pop(old.key, None)
            a = Attached(key=key, proc=proc, series=series)
            series.holder, series.gone_s = a, None
            proc.attached = a
            proc.count_drop = series.count_drop
            proc.on_status = lambda p, a=a: a.series.on_status(a)
            self.processes[key] = a
            for r in EMPTY_REASONS:
                self.empty_total[r].setdefault(rank, 0)
        ident = proc.identity
        series.aggregator.process = {"rank": rank, "pid": ident.get("pid", str(proc.peer_pid)),
                                     "host": ident.get("host", ""), "device": ident.get("device", ""),
                                     "uuid": ident.get("uuid", ""), "pci_bus_id": ident.get("pci_bus_id", ""),
                                     "gpu_name": ident.get("gpu_name", ""),
                                     "process_start_s": ident.get("process_start_s", ""),
                                     **workload_labels(ident, self.settings.max_label_length)}
        series.on_status(a)
        if self.recorder_factory is not None:
            a.recorder = self.recorder_factory({**proc.identity, **a.identity()})
        series.aggregator.refresh()
        self.log(logging.INFO, "attach", "graphmon agent: process attached: rank %s pid %s (peer pid %d) device %s%s",
                 rank, ident.get("pid", "?"), proc.peer_pid, ident.get("uuid") or ident.get("device") or "?",
                 " (takes over the rank's series)" if old is not None else "")
        self._changed.set()

    def _on_close(self, proc: RemoteProcess) -> None:
        a = getattr(proc, "attached", None)
        if a is None:
            return
        now = time.time()
        a.gone_s = now
        if proc.closed_reason != "process said bye" and not self._stop.is_set():
            proc.lost = True
            with self._lock:  # reader threads close at once (a burst)
                self.lost_total += 1
            self.log(logging.WARNING, "lost", "graphmon agent: lost rank %s (pid %s): %s", a.rank,
                     proc.identity.get("pid", proc.peer_pid), proc.closed_reason)
        else:
            proc.status = {**proc.status, "state": "stopped"}
        with self._lock:
            if a.series.holder is a:
                a.series.gone_s = now
        a.aggregator.refresh()
        self._changed.set()

    def _on_window(self, proc: RemoteProcess) -> None:
        a = getattr(proc, "attached", None)
        if a is None:
            return
        with self._ready_cv:
            if not a.scheduled:
                a.scheduled = True
                self._ready.append(a)
                self._ready_cv.notify()

    # ------------------------------------------------------------------ ingest thread
    def _ingest_loop(self) -> None:
        while not self._stop.is_set():
            with self._ready_cv:
                while not self._ready and not self._stop.is_set():
                    self._ready_cv.wait(0.5)
                if self._stop.is_set():
                    return
                a = self._ready.popleft()
            w = None
            try:
                w = a.proc.next_window()
            except WireError as e:
                self.listener.count_bad_window(a.proc, e)
            except Exception as e:  # contained: one window, counted
                self._count("decode", e)
            with self._ready_cv:  # one window per turn: round robin over processes
                if a.proc.queued:
                    self._ready.append(a)
                else:
                    a.scheduled = False
            if w is not None:
                self._ingest(a, w)

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
                    a.proc.send(encode_message("stop"))
            except Exception:
                self.errors["record"] = self.errors.get("record", 0) + 1
        for hook in list(self.window_hooks):
            try:
                hook(a, w)
            except Exception as e:
                self._count("window_hook", e)
        self._changed.set()

    # ------------------------------------------------------------------ monitor
    def _monitor_loop(self) -> None:
        while not self._stop.wait(self.tick_s):
            try:
                self.check()
            except Exception as e:
                self._count("monitor", e)

    def check(self, now: Optional[float] = None) -> None:
        """Lost heartbeats, processes that produce no windows, expiry; refresh snapshots."""
        now = time.time() if now is None else now
        for a in self.attached():
            p = a.proc
            if a.gone_s is not None:
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
        self._expire(now)

    def _expire(self, now: float) -> None:
        with self._lock:
            gone = sorted((s for s in self.ranks.values() if s.gone_s is not None), key=lambda s: s.gone_s)
            drop = [(s, "expired") for s in gone if now - s.gone_s > self.keep_gone_s]
            kept = [s for s in gone if now - s.gone_s <= self.keep_gone_s]
            drop += [(s, "cap") for s in kept[: max(0, len(kept) - self.max_gone_ranks)]]
            for s, reason in drop:
                del self.ranks[s.rank]
                self._by_tag.pop(s.tag, None)
                if s.holder is not None:
                    self.processes.pop(s.holder.key, None)
                for r in EMPTY_REASONS:
                    self.empty_total[r].pop(s.rank, None)
                self._graphs.pop(s.tag, None)
                self.ranks_dropped[reason] += 1
        for s, _ in drop:
            self.traces.drop(s.tag)
        if drop:
            self._changed.set()
            self._published(None)  # the rank's series are gone: /metrics is due

    # ------------------------------------------------------------------ read side (HTTP)
    def attached(self) -> list[Attached]:
        with self._lock:  # never half a takeover (a rank missing, or twice)
            procs = list(self.processes.values())
        return sorted(procs, key=lambda a: (_rank_key(a.rank), a.key))

    def snapshots(self) -> Sequence[Snapshot]:
        """One snapshot per rank (the agreed ``get_snapshots`` of the exporter)."""
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
        e = self.window_lookup(trace_id)
        return e[0] if e else None

    def window_lookup(self, trace_id: str):
        """(Trace, untraced rows) of a kept window. ``r<n>-w<k>`` names one rank's window; a
        capture id is looked up everywhere (the first process that answered)."""
        tag, sep, wid = trace_id.partition("-")
        s = self._by_tag.get(tag) if sep else None
        if s is not None:
            return s.store.entry(wid)
        for a in self.attached():
            e = a.store.entry(trace_id)
            if e is not None:
                return e
        return None

    def window_id(self, a: Attached, wid: str) -> str:
        return wid if wid.startswith("c") else f"{a.series.tag}-{wid}"

    def last_window_id(self) -> Optional[str]:
        """The newest window of any rank, as ``r<n>-w<k>`` (the live boundary attribution's window)."""
        best: tuple = (-1.0, None)
        for a in self.attached():
            s = a.aggregator.snapshot()
            if s.windows and (s.last_window_s or 0.0) > best[0]:
                best = (s.last_window_s or 0.0, self.window_id(a, s.windows[-1]))
        return best[1]

    def _status_graphs(self, tag: str, s: Snapshot) -> list:
        hit = self._graphs.get(tag)
        if hit is None or hit[0] is not s:
            hit = self._graphs[tag] = (s, status_graphs(s))
        return hit[1]

    def process_status(self) -> list[dict]:
        """/status's list of processes: rank, device, pid, state and last window age."""
        now = time.time()
        out = []
        for a in self.attached():
            try:
                s = a.aggregator.snapshot()
                ident = a.identity()
                out.append({**ident, "incarnation": a.incarnation, "peer_pid": a.proc.peer_pid,
                            "last_window_age_s": None if a.proc.last_window_s is None
                            else max(0.0, now - a.proc.last_window_s),
                            "windows_total": s.windows_total, "records_total": s.records_total,
                            "empty_windows": a.proc.empty_windows,
                            "windows": [self.window_id(a, w) for w in s.windows],
                            "link": dict(a.proc.status.get("link") or {}),
                            "windows_dropped_by_agent": dict(a.series.dropped),
                            "sampling": dict(a.proc.status.get("sampling") or {}),
                            "graphs": self._status_graphs(a.series.tag, s)})
            except Exception as e:  # contained: one process's entry says so; /status answers for the others
                self._count("status", e)
                out.append({"rank": str(a.rank), "incarnation": a.incarnation, "state": "unknown",
                            "error": f"status failed: {e!r}"[:300]})
        return out

    def state_counts(self) -> dict[str, int]:
        counts = {s: 0 for s in STATES}
        for a in self.attached():
            st = a.health().state
            counts[st] = counts.get(st, 0) + 1
        return counts


MALLOC_ARENAS = 2


def limit_malloc_arenas(n: int = MALLOC_ARENAS) -> bool:
    """glibc gives each thread that allocates its own malloc arena (up to 8 per core) and keeps
    the freed pages of each: with a reader thread per connection receiving frames of a few MiB,
    the agent's RSS rose 412 -> 632 MiB in a 10-minute soak while what it held stayed put, and
    held at 404-422 MiB with 2 arenas (bench/results/soak-agent*, same CPU). Only the agent's own
    process calls this (graphmon agent, graphmon run), never a serving process; an explicit
    MALLOC_ARENA_MAX wins. False where the C library has no mallopt (musl) or refuses."""
    import ctypes
    import os

    if "MALLOC_ARENA_MAX" in os.environ:
        return False
    try:
        return ctypes.CDLL(None).mallopt(-8, int(n)) == 1  # -8: M_ARENA_MAX
    except (OSError, AttributeError):
        return False


def _float(v, default: float) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return default


def _rank_key(rank: str):
    head = rank.split("@", 1)[0]
    return (0, int(head), rank) if head.isdigit() and len(head) < 18 else (1, 0, rank)
