"""The agent's HTTP side: its own metric families, /metrics rendered per rank, /status, the server.

/metrics is rendered by one thread, at most once per ``render_interval_s`` and only in the
formats (and with the gzip) scrapers asked for recently; a scrape answers the last body
(rendering only when there is none yet). Each rank's sample lines are written once per snapshot
of that rank and reused until the rank publishes a new one, and each family's block is compressed
only when its lines changed (graphmon.export.body), so a gzip scrape is a concatenation. The
server is ``serve``'s limited one (graphmon.export.limits): connection cap, header-read timeout,
rate-limited logs.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Iterable, Mapping, Optional, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import CollectorRegistry

from graphmon.export.agent import EMPTY_REASONS, RANK_DROP_REASONS, Agent
from graphmon.export.ranks import LINK_COUNTERS
from graphmon.export.body import DEDUPE, Blocks, Body, RankPieces, skeleton
from graphmon.export.exposition import FORMATS, TEXT, render_formats
from graphmon.export.families import build_info
from graphmon.model.wire import WIRE_REASONS
from graphmon.sources.remote import DROP_REASONS, REJECT_REASONS

log = logging.getLogger("graphmon.agent")
PROCESS_INFO_LABELS = ["rank", "pid", "device", "host", "state"]
DEVICE_INFO_LABELS = ["rank", "device", "UUID", "pci_bus_id", "gpu_name", "host"]
RENDER_INTERVAL_S = 1.0
FORMAT_IDLE_S = 300.0  # a format nobody asked for this long is no longer rendered ahead


def health_families(agent: Agent, device_info: bool = True) -> Iterable[Metric]:
    """The agent's process-health families (names agreed in interfaces.md). ``device_info=False``
    where the export layer's collector already emits graphmon_device_info from Snapshot.process."""
    atts = agent.attached()
    info = GaugeMetricFamily("graphmon_process_info", "One series per process attached to the agent.",
                             labels=PROCESS_INFO_LABELS)
    dev = GaugeMetricFamily("graphmon_device_info", "The physical GPU of each rank (join on UUID with DCGM).",
                            labels=DEVICE_INFO_LABELS)
    last = GaugeMetricFamily("graphmon_process_last_window_timestamp_seconds",
                             "Unix time of the last window the agent received from the process.", labels=["rank", "pid"])
    dropped = CounterMetricFamily("graphmon_agent_windows_dropped",
                                  "Windows of a rank the agent did not ingest: queue_full (the process sent faster than "
                                  "the agent ingests), memory (the buffered-bytes budget was full), invalid (failed "
                                  "validation).", labels=["rank", "reason"])
    link = {k: CounterMetricFamily(f"graphmon_link_{k}", doc, labels=["rank"]) for k, doc in (
        ("windows_dropped", "Windows a rank's collector dropped before sending (agent unreachable or slow), "
                            "summed over its processes and reconnects."),
        ("reconnects", "Times a rank's collector reconnected to the agent, summed over its processes."))}
    for a in atts:
        i = a.identity()
        info.add_metric([i["rank"], i["pid"], i["device"], i["host"], i["state"]], 1)
        dev.add_metric([i["rank"], i["device"], i["uuid"], i["pci_bus_id"], i["gpu_name"], i["host"]], 1)
        if a.proc.last_window_s is not None:
            last.add_metric([i["rank"], i["pid"]], a.proc.last_window_s)
        for reason in DROP_REASONS:
            dropped.add_metric([a.rank, reason], a.series.dropped.get(reason, 0))
        for k in LINK_COUNTERS:
            link[k].add_metric([a.rank], a.series.link.total.get(k, 0))
    yield info
    if device_info:
        yield dev
    yield last
    empty = CounterMetricFamily("graphmon_empty_windows",
                                "no_records: a window saw graph launches and kept no record; no_windows: a process "
                                "that replays graphs sent no window within 3 intervals.", labels=["rank", "reason"])
    for reason in EMPTY_REASONS:
        for rank, n in sorted(agent.empty_total[reason].items()):
            empty.add_metric([rank, reason], n)
    yield empty
    lost = CounterMetricFamily("graphmon_processes_lost",
                               "Processes whose connection dropped or that stopped sending heartbeats.")
    lost.add_metric([], agent.lost_total)
    yield lost
    procs = GaugeMetricFamily("graphmon_processes", "Attached processes by state.", labels=["state"])
    for st, n in agent.state_counts().items():
        procs.add_metric([st], n)
    yield procs
    yield dropped
    yield from link.values()
    yield from agent_families(agent)


def agent_families(agent: Agent) -> Iterable[Metric]:
    """The agent's own: liveness, build, what it refused or dropped, what it buffers."""
    up = GaugeMetricFamily("graphmon_agent_up", "1 while the agent answers: there from the start, with or without "
                           "processes (dashboards build their variables from it).")
    up.add_metric([], 1)
    yield up
    expects = GaugeMetricFamily("graphmon_agent_expects_processes", "1 when a graph-replaying process is expected to "
                                "attach (a sidecar, graphmon run), 0 where none may be (a DaemonSet agent: "
                                "--no-expect-processes); GraphmonNoProcessAttached pages only at 1.")
    expects.add_metric([], 1 if agent.settings.expect_processes else 0)
    yield expects
    labels = build_info({})
    bi = GaugeMetricFamily("graphmon_build_info", "Versions of graphmon and what it runs with (\"\" = unknown).",
                           labels=list(labels))
    bi.add_metric(list(labels.values()), 1)
    yield bi
    lst = agent.listener
    rej = CounterMetricFamily("graphmon_agent_connections_rejected",
                              "Connections to the agent's socket refused or closed before they became a process: "
                              "uid (another user), too_many_processes, unidentified_evicted (more connections without "
                              "hello than the cap), hello_timeout, bad_hello.", labels=["reason"])
    for reason in REJECT_REASONS:
        rej.add_metric([reason], lst.rejected.get(reason, 0))
    yield rej
    bad = CounterMetricFamily("graphmon_agent_frames_rejected", "Frames from processes that failed validation, by "
                              "what failed (the frame's window or status is dropped; framing errors close the "
                              "connection).", labels=["reason"])
    for reason in WIRE_REASONS:
        bad.add_metric([reason], lst.frames_rejected.get(reason, 0))
    yield bad
    conns = GaugeMetricFamily("graphmon_agent_connections", "Open connections to the agent's socket: unidentified "
                              "(no hello yet) or attached.", labels=["state"])
    for st, n in lst.counts().items():
        conns.add_metric([st], n)
    yield conns
    buf = GaugeMetricFamily("graphmon_agent_buffered_bytes", "Bytes of frames being received or waiting for ingest, "
                            "all connections together (bounded by the agent's buffered-bytes budget).")
    buf.add_metric([], lst.budget.used)
    yield buf
    ts = GaugeMetricFamily("graphmon_agent_trace_store_bytes", "Bytes of windows kept for GET /trace, all ranks "
                           "together (bounded by trace_store_bytes).")
    ts.add_metric([], agent.traces.nbytes)
    yield ts
    gone = CounterMetricFamily("graphmon_agent_ranks_dropped", "Ranks whose series the agent dropped: expired (no "
                               "process for keep_gone_s) or cap (too many ranks without a process).", labels=["reason"])
    for reason in RANK_DROP_REASONS:
        gone.add_metric([reason], agent.ranks_dropped[reason])
    yield gone


class AgentHealthCollector:
    """The agent's own families (process list and health), beside the per-process snapshots."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent

    def collect(self) -> Iterable[Metric]:
        # graphmon_device_info comes from each Snapshot.process (the export layer's collector)
        yield from health_families(self.agent, device_info=False)


def _registry(*collectors) -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    for c in collectors:
        reg.register(c)
    return reg


class AgentMetrics:
    """The agent's /metrics bodies, from per-rank pieces (see the module docstring).

    ``extra_errors()``: the HTTP layer's contained errors, added to the first rank (as ``serve``
    does); ``on_error(stage, exc)`` counts a rank whose families failed to render (it is then
    exported with its health families only)."""

    def __init__(self, agent: Agent, *, cardinality: str = "standard", render_interval_s: float = RENDER_INTERVAL_S,
                 extra_errors: Callable[[], Mapping[str, int]] = dict,
                 on_error: Optional[Callable[[str, BaseException], None]] = None,
                 collectors: Optional[Sequence] = None) -> None:
        self.agent = agent
        # agent-level collectors (not per rank), rendered at every render: cheap families only
        self.collectors = list(collectors) if collectors is not None else [AgentHealthCollector(agent)]
        self.cardinality = cardinality
        self.render_interval_s = float(render_interval_s)
        self._extra_errors = extra_errors
        self._on_error = on_error
        self._bodies: dict[str, Body] = {}
        self._asked: dict[tuple[str, bool], float] = {}  # (format, gzip) -> when a scrape last asked for it
        self.pieces = RankPieces(cardinality, on_error=on_error)
        self.blocks = Blocks()
        self._skeleton = {fmt: skeleton(cardinality, fmt) for fmt in FORMATS}
        self._lock = threading.Lock()  # one render at a time
        self.renders = 0  # bodies rendered
        self.render_threads: set[str] = set()  # names of the threads that rendered (tests: never a reader thread)
        self.last_render_s = 0.0
        self.last_render_cpu_s = 0.0  # CPU time of the last render (this thread's)
        self._thread: Optional[threading.Thread] = None

    @property
    def piece_renders(self) -> int:
        return self.pieces.renders

    # -------------------------------------------------------------- what a scrape calls
    def cached(self, fmt: str, gzip: bool = False) -> Optional[Body]:
        self._asked[(fmt, gzip)] = time.monotonic()
        got = self._bodies.get(fmt)
        return got if got is not None and (got.gz is not None or not gzip) else None

    def body(self, fmt: str, gzip: bool = False) -> Body:
        """The last body; rendered now only when there is none yet (the first scrape)."""
        got = self.cached(fmt, gzip)
        if got is not None:
            return got
        self.render([fmt])
        return self._bodies[fmt]

    # -------------------------------------------------------------- rendering
    def start(self, stop: threading.Event) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, args=(stop,), name="graphmon-agent-render", daemon=True)
            self._thread.start()

    def _run(self, stop: threading.Event) -> None:
        while not stop.wait(self.render_interval_s):
            now = time.monotonic()
            formats = [f for f in FORMATS if any(now - self._asked.get((f, z), -1e18) < FORMAT_IDLE_S
                                                 for z in (False, True))]
            if formats:
                try:
                    self.render(formats)
                except Exception as e:  # contained: the previous bodies stay
                    if self._on_error is not None:
                        self._on_error("scrape", e)

    def render(self, formats=FORMATS) -> None:
        with self._lock:
            c0 = time.thread_time()
            self.render_threads.add(threading.current_thread().name)
            now = time.monotonic()
            ranks = [(a.series.tag, a.aggregator.snapshot()) for a in self.agent.attached()]
            parts = self.pieces.parts(ranks, self._extra_errors)
            agent_parts = self._agent_parts(formats)
            for fmt in formats:
                gz = now - self._asked.get((fmt, True), -1e18) < FORMAT_IDLE_S
                self._bodies[fmt] = self.blocks.build(fmt, [self._skeleton[fmt], *parts, agent_parts[fmt]], DEDUPE, gz)
                self.renders += 1
            self.last_render_s = time.time()
            self.last_render_cpu_s = time.thread_time() - c0

    def _agent_parts(self, formats) -> dict:
        # One registry per collector: a collector that raises loses its own families for this
        # render (counted as a scrape error), not the agent's health and the deploy verdict with it.
        out: dict = {fmt: [] for fmt in formats}
        for c in self.collectors:
            try:
                parts = render_formats(_registry(c), formats)
            except Exception as e:
                if self._on_error is not None:
                    self._on_error("scrape", e)
                continue
            for fmt in formats:
                out[fmt].extend(parts[fmt])
        return out


def status(agent: Agent) -> dict:
    from graphmon.version import __version__

    procs = agent.process_status()
    lst = agent.listener
    return {"version": __version__, "mode": "agent", "socket": agent.socket_path,
            "expect_processes": agent.settings.expect_processes,
            "up": any(p["state"] == "running" for p in procs), "processes": procs,
            "processes_by_state": agent.state_counts(), "processes_lost_total": agent.lost_total,
            "empty_windows_total": {r: dict(v) for r, v in agent.empty_total.items()},
            "link_rejected": dict(lst.rejected), "frames_rejected": dict(lst.frames_rejected),
            "connections": lst.counts(), "buffered_bytes": lst.budget.used,
            "trace_store_bytes": agent.traces.nbytes, "ranks_dropped": dict(agent.ranks_dropped),
            "errors_total": dict(agent.errors)}


def _workload_labels(agent: Agent) -> dict[str, dict[str, str]]:
    """rank -> the workload labels of its (last) process, as its series carry them."""
    from graphmon.export.identity import workload_labels

    return {r: labels for r, s in dict(agent.ranks).items() if (labels := workload_labels(s.aggregator.process))}


def _live_incarnations(agent: Agent) -> set[str]:
    """The processes connected now, as the deploy verdict names them (Attached.incarnation)."""
    return {a.incarnation for a in agent.attached() if a.gone_s is None}


def create_agent_app(agent: Agent, render_interval_s: float = RENDER_INTERVAL_S):
    from graphmon.export import deploy_metrics
    from graphmon.export.baseline import PooledBaseline
    from graphmon.export.deploy import DeployVerdict
    from graphmon.export.server import create_app

    st = agent.settings
    # The deploy verdict: each window is queued on the ingest thread, pooled and compared on its own
    # thread; /baseline pins through it (the same pooling).
    state = None
    if st.state_dir:  # the CLI checked it is writable; an error here is the agent's start failing, said once
        from graphmon.export.deploy_state import StateDir

        state = StateDir(st.state_dir)
    verdict = DeployVerdict(lookup=agent.window_lookup, state=state)
    agent.window_hooks.append(verdict.on_window)
    agent.stop_hooks.append(verdict.stop)
    def detail(rank: str):  # the rank's detail graphs (None at full: every graph has series)
        s = agent.ranks.get(rank)
        return frozenset() if s is None else s.aggregator.snapshot().detail_graphs

    deploy = deploy_metrics.DeployCollector(verdict, lambda: _live_incarnations(agent), max_graphs=st.max_graphs,
                                            max_streams=st.max_streams, max_label_length=st.max_label_length,
                                            detail=None if st.cardinality == "full" else detail,
                                            detail_graphs=st.detail_graphs, labels=lambda: _workload_labels(agent))

    def extra_status() -> dict:
        return {**status(agent), "deploy": deploy_metrics.status(verdict, _live_incarnations(agent), st.max_graphs)}

    # The agent-level collectors of /metrics (AgentMetrics renders them beside the ranks' pieces at
    # every render, so a new verdict shows within render_interval_s; create_app's own renderer, and
    # its extra_collectors, do not serve the agent).
    collectors: list = [AgentHealthCollector(agent), deploy]
    app = create_app(snapshots=agent.snapshots, capture=agent.capture, trace_lookup=agent.trace_lookup,
                     window_lookup=agent.window_lookup, settings=st, extra_status=extra_status, last_window=agent.last_window_id,
                     baseline=PooledBaseline(verdict))
    app.state.deploy = verdict
    errors = app.state.errors
    metrics = AgentMetrics(agent, cardinality=agent.settings.cardinality, render_interval_s=render_interval_s,
                           extra_errors=errors.snapshot, on_error=errors.count, collectors=collectors)
    app.state.renderer.serve_from(metrics)
    app.state.agent_metrics = metrics
    metrics.start(agent._stop)
    return app


def render_metrics(agent: Agent, fmt: str = TEXT) -> bytes:
    """/metrics as the agent serves it (without process_*), rendered now: tests and diagnostics."""
    m = AgentMetrics(agent, cardinality=agent.settings.cardinality)
    m.render([fmt])
    return m._bodies[fmt].text


def serve_background(agent: Agent, host: str, port: int, timeout_s: float = 10.0,
                     render_interval_s: float = RENDER_INTERVAL_S):
    """The limited uvicorn server (graphmon.export.limits, as ``serve``) in a daemon thread;
    returns (server, thread, bound_port) once it listens. The socket is bound here first, so a
    taken port is one clear error (not a uvicorn log line)."""
    from graphmon.export.limits import bind, make_server

    try:
        sock = bind(host, port)
    except OSError as e:
        raise RuntimeError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    bound = sock.getsockname()[1]
    app = create_agent_app(agent, render_interval_s=render_interval_s)
    server = make_server(app, agent.settings)
    t = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="graphmon-agent-http", daemon=True)
    t.start()
    deadline = time.monotonic() + timeout_s
    while not server.started:
        if not t.is_alive():
            raise RuntimeError(f"graphmon agent: HTTP server failed to start on {host}:{bound}")
        if time.monotonic() > deadline:
            raise RuntimeError("graphmon agent: HTTP server did not start in time")
        time.sleep(0.01)
    return server, t, bound
