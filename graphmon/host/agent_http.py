"""The agent's HTTP side: /metrics over every attached process, /status with the process list.

Plugs into the export layer through the agreed narrow interface
``create_app(snapshots=, capture=, trace_lookup=, settings=, extra_status=)`` when the export
layer offers it; until then (today's ``create_app(exporter)``) a small adapter stands in and
the per-process snapshots are merged family by family here (``merged_families``).
"""

from __future__ import annotations

import inspect
import threading
import time
from typing import Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import CollectorRegistry

from graphmon.export.collector import SnapshotCollector, render_text
from graphmon.host.agent import EMPTY_REASONS, Agent

PROCESS_INFO_LABELS = ["rank", "pid", "device", "host", "state"]
DEVICE_INFO_LABELS = ["rank", "device", "UUID", "pci_bus_id", "gpu_name", "host"]


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
    for a in atts:
        i = a.identity()
        info.add_metric([i["rank"], i["pid"], i["device"], i["host"], i["state"]], 1)
        dev.add_metric([i["rank"], i["device"], i["uuid"], i["pci_bus_id"], i["gpu_name"], i["host"]], 1)
        if a.proc.last_window_s is not None:
            last.add_metric([i["rank"], i["pid"]], a.proc.last_window_s)
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


def merged_families(snapshots) -> Iterable[Metric]:
    """Each family once, with the samples of every process (compat for today's one-snapshot
    SnapshotCollector; the export layer's collector over ``get_snapshots`` replaces it)."""
    fams: dict[str, Metric] = {}
    for s in snapshots:
        for m in SnapshotCollector(lambda s=s: s).collect():
            have = fams.get(m.name)
            if have is None:
                fams[m.name] = m
            else:
                have.samples.extend(m.samples)
    return fams.values()


class _AgentCollector:
    def __init__(self, agent: Agent) -> None:
        self.agent = agent

    def describe(self):
        return []

    def collect(self):
        yield from merged_families(self.agent.snapshots())
        yield from health_families(self.agent)


def render_metrics(agent: Agent) -> bytes:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(_AgentCollector(agent))
    return render_text(reg)


def status(agent: Agent) -> dict:
    from graphmon import __version__

    procs = agent.process_status()
    return {"version": __version__, "mode": "agent", "socket": agent.socket_path,
            "up": any(p["state"] == "running" for p in procs), "processes": procs,
            "processes_by_state": agent.state_counts(), "processes_lost_total": agent.lost_total,
            "empty_windows_total": {r: dict(v) for r, v in agent.empty_total.items()},
            "link_rejected": dict(agent.listener.rejected), "errors_total": dict(agent.errors)}


def create_agent_app(agent: Agent):
    from graphmon.export import server

    params = inspect.signature(server.create_app).parameters
    if "snapshots" in params:  # the export layer's narrow interface
        return server.create_app(snapshots=agent.snapshots, capture=agent.capture, trace_lookup=agent.trace_lookup,
                                 settings=agent.settings, extra_status=lambda: status(agent))
    return _compat_app(agent)


class _Compat:
    """Quacks like today's Exporter for server.create_app(exporter); /metrics, /status and
    /healthz are replaced below, so only capture, traces and settings go through it."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.settings = agent.settings
        self.rendered: dict = {}
        self.aggregator = self  # count_error / wait_for / _errors
        self.source = self  # request_capture
        self.store = self  # get
        self._errors = agent.errors

    def snapshot(self):
        snaps = self.agent.snapshots()
        if snaps:
            return snaps[0]
        from graphmon.export.snapshot import Aggregator

        return Aggregator(rank="", health=lambda: _NO_PROCESS).snapshot()

    def count_error(self, stage, exc=None):
        self._errors[stage] = self._errors.get(stage, 0) + 1

    def wait_for(self, wid, timeout_s):
        return self.agent.wait_for(wid, timeout_s)

    def request_capture(self, req):
        self.agent.capture(req)

    def get(self, trace_id):
        return self.agent.trace_lookup(trace_id)


def _compat_app(agent: Agent):
    from fastapi.responses import Response
    from graphmon.export.collector import TEXT_CONTENT_TYPE
    from graphmon.export.server import create_app
    from graphmon.model.window import SourceHealth

    global _NO_PROCESS
    _NO_PROCESS = SourceHealth(up=False, state="starting", reason="no process attached yet")
    app = create_app(_Compat(agent))
    replaced = {"/metrics", "/status", "/healthz"}
    app.router.routes[:] = [r for r in app.router.routes if getattr(r, "path", None) not in replaced]
    lock = threading.Lock()

    @app.get("/metrics", summary="Prometheus metrics of every attached process")
    def metrics() -> Response:
        with lock:  # one render at a time: a scrape storm must not multiply the agent's CPU
            body = render_metrics(agent)
        return Response(content=body, media_type=TEXT_CONTENT_TYPE)

    @app.get("/status", summary="Every attached process: rank, device, pid, state, last window age")
    def status_route() -> dict:
        return status(agent)

    @app.get("/healthz", summary="Liveness of the agent itself")
    def healthz() -> dict:
        return {"status": "ok", "processes": len(agent.processes), "time_s": time.time()}

    return app


_NO_PROCESS = None


def serve_background(agent: Agent, host: str, port: int, timeout_s: float = 10.0):
    """uvicorn in a daemon thread; returns (server, thread, bound_port) once it listens. The
    socket is bound here first, so a taken port is one clear error (not a uvicorn log line)."""
    import socket

    import uvicorn

    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise RuntimeError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    bound = sock.getsockname()[1]
    app = create_agent_app(agent)
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=bound, log_level="warning", access_log=False,
                                          lifespan="off"))
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
